// A probe on a parameter's AccumulateGrad node, for tests of the backward functions that add
// a weight's gradient straight into an existing W.grad (GPT-2's LinearFn, the shared-input
// linears, the LM-head loss; [Shared-Input Linears] in src/models/shared_linear.h): counts the
// node's runs (its post hooks, which the gradient reducer relies on, must still fire) and the
// runs in which autograd handed it a gradient (none when the GEMM accumulated in place).
#pragma once
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <memory>
#include <stdexcept>

namespace test_support {

class GradAccumulatorProbe {
 public:
  explicit GradAccumulatorProbe(const torch::Tensor& w) : node_(torch::autograd::impl::grad_accumulator(w)) {
    if (!node_) throw std::invalid_argument("GradAccumulatorProbe: the tensor has no gradient accumulator");
    node_->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list& inputs) {
          ++calls;
          if (!inputs.empty() && inputs[0].defined()) ++handed;
          return outputs;
        }));
  }
  GradAccumulatorProbe(const GradAccumulatorProbe&) = delete;
  GradAccumulatorProbe& operator=(const GradAccumulatorProbe&) = delete;

  int calls = 0;   // runs of the AccumulateGrad node
  int handed = 0;  // runs that received a gradient to add

 private:
  // Held here: a variable holds its accumulator weakly, and a hook on a dropped node never runs.
  std::shared_ptr<torch::autograd::Node> node_;
};

}  // namespace test_support
