// [Deferred Weight Gradients] (models/deferred_grad.h), checked op by op on one device:
// the weight gradients of a zb-h1-style split -- B = torch::autograd::grad(y, {x}) under a
// WeightGradCollector, then W = backward over the collector's roots -- against one full
// backward of the same op from the same inputs, with every parameter's .grad undefined
// before (fresh gradients handed to AccumulateGrad) or preset (the in-place paths: LinearFn's
// addmm into W.grad, the LM head's addcmul). Used by tests/unit/test_deferred_grad.cpp (CPU)
// and tests/gpu/test_deferred_grad_gpu.cpp (CUDA: the fused kernels' paths). Header-only.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "models/deferred_grad.h"
#include "models/gpt2.h"
#include "models/llama_fused.h"
#include "models/lm_head_loss.h"
#include "models/shared_linear.h"

namespace zt::test_support {

using DeferredOp = std::function<torch::Tensor(const torch::Tensor& x)>;

// Whether B left every parameter to W (covered) and W's gradients equal the full backward's
// within rtol |ref| + atol max|ref|, the input gradient too. With `expect_covered` false:
// whether B left no closure for any parameter (a plain ATen op) and W has nothing to run.
inline ::testing::AssertionResult deferred_matches_full(const std::string& what, const DeferredOp& op,
                                                        const torch::Tensor& x0,
                                                        const std::vector<torch::Tensor>& params, bool preset_grad,
                                                        double rtol, double atol, bool expect_covered = true) {
  torch::manual_seed(5);
  const auto y0 = [&] {
    torch::NoGradGuard ng;
    return op(x0);
  }();
  const auto gy = torch::randn(y0.sizes(), y0.options().dtype(torch::kFloat)).to(y0.scalar_type());
  std::vector<torch::Tensor> preset;
  for (const auto& p : params)
    preset.push_back(torch::randn(p.sizes(), p.options().dtype(torch::kFloat)).to(p.scalar_type()));
  auto reset = [&] {
    for (size_t i = 0; i < params.size(); ++i) {
      auto& g = const_cast<torch::Tensor&>(params[i]).mutable_grad();
      g = preset_grad ? preset[i].clone() : torch::Tensor();
    }
  };
  // Reference: one backward.
  reset();
  auto xr = x0.detach().clone().requires_grad_(true);
  torch::autograd::backward({op(xr)}, {gy});
  std::vector<torch::Tensor> ref;
  for (const auto& p : params) ref.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  const auto ref_gx = xr.grad().clone();

  // B then W.
  reset();
  auto xd = x0.detach().clone().requires_grad_(true);
  auto y = op(xd);
  models::WeightGradCollector c;
  torch::Tensor gx;
  {
    models::CollectWeightGrads collect(&c);
    gx = torch::autograd::grad({y}, {xd}, {gy}, /*retain_graph=*/true)[0];
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& g = params[i].grad();
    const bool untouched = preset_grad ? (g.defined() && torch::equal(g, preset[i])) : !g.defined();
    if (!untouched) return ::testing::AssertionFailure() << what << ": B changed parameter " << i << "'s .grad";
    if (c.covers(params[i]) != expect_covered)
      return ::testing::AssertionFailure() << what << ": parameter " << i << " covered " << c.covers(params[i]);
  }
  auto close = [&](const torch::Tensor& a, const torch::Tensor& e,
                   const std::string& name) -> ::testing::AssertionResult {
    if (a.defined() != e.defined())
      return ::testing::AssertionFailure()
             << what << " " << name << ": defined " << a.defined() << " vs " << e.defined();
    if (!a.defined()) return ::testing::AssertionSuccess();
    const auto ad = a.detach().to(torch::kCPU, torch::kDouble), ed = e.detach().to(torch::kCPU, torch::kDouble);
    const double m = ed.numel() ? ed.abs().max().item<double>() : 0.0;
    const auto excess = ((ad - ed).abs() - (ed.abs() * rtol + atol * m)).max().item<double>();
    if (excess > 0)
      return ::testing::AssertionFailure()
             << what << " " << name << ": max |diff| " << (ad - ed).abs().max().item<double>()
             << " exceeds the tolerance by " << excess;
    return ::testing::AssertionSuccess();
  };
  if (auto r = close(gx, ref_gx, "input gradient"); !r) return r;
  if (!expect_covered) {
    if (!c.empty()) return ::testing::AssertionFailure() << what << ": closures for a tensor that is not a parameter";
    return ::testing::AssertionSuccess();
  }
  const auto roots = c.roots(params);
  if (roots.size() != params.size()) return ::testing::AssertionFailure() << what << ": " << roots.size() << " roots";
  std::vector<torch::Tensor> ones;
  for (const auto& r : roots) ones.push_back(torch::ones_like(r));
  torch::autograd::backward(roots, ones);
  if (!c.empty()) return ::testing::AssertionFailure() << what << ": closures left after W";
  for (size_t i = 0; i < params.size(); ++i) {
    if (auto r = close(params[i].grad(), ref[i], "parameter " + std::to_string(i)); !r) return r;
  }
  return ::testing::AssertionSuccess();
}

// Every op that defers its weight gradients, in `dt` on `dev`, with .grad undefined and
// preset. `rms_fused`: llama_rms_norm runs RmsNormFn (CUDA) and defers; else it is the ATen
// reference and must leave no closure.
inline void check_deferred_ops(torch::Device dev, torch::ScalarType dt, double rtol, double atol, bool rms_fused) {
  torch::manual_seed(3);
  auto opts = torch::TensorOptions().dtype(dt).device(dev);
  auto rand = [&](std::vector<int64_t> shape) { return torch::randn(shape, torch::kFloat).to(opts); };
  torch::nn::Linear lin(16, 24);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({16}));
  lin->to(dev, dt);
  ln->to(dev, dt);
  {
    torch::NoGradGuard ng;  // LayerNorm starts at weight 1, bias 0: make them matter
    ln->weight.copy_(rand({16}));
    ln->bias.copy_(rand({16}));
  }
  std::vector<torch::Tensor> ws{rand({8, 16}).requires_grad_(), rand({4, 16}).requires_grad_(),
                                rand({12, 16}).requires_grad_()};
  auto head = rand({37, 16}).requires_grad_();  // V 37, padded to 40 below
  auto targets = torch::randint(0, 37, {10}, torch::TensorOptions().dtype(torch::kLong).device(dev));
  targets[3] = -1;  // ignored
  auto rms_w = rand({16}).requires_grad_();
  for (bool preset : {false, true}) {
    const std::string tag = preset ? " (.grad preset)" : " (.grad undefined)";
    EXPECT_TRUE(deferred_matches_full(
        "linear" + tag, [&](const torch::Tensor& x) { return models::linear(lin, x); }, rand({2, 5, 16}),
        {lin->weight, lin->bias}, preset, rtol, atol));
    EXPECT_TRUE(deferred_matches_full(
        "layer_norm" + tag, [&](const torch::Tensor& x) { return models::layer_norm(ln, x); }, rand({2, 5, 16}),
        {ln->weight, ln->bias}, preset, rtol, atol));
    EXPECT_TRUE(deferred_matches_full(
        "shared_input_linear" + tag,
        [&](const torch::Tensor& x) {
          auto ys = models::shared_input_linear(x, ws);
          return torch::cat({ys[0], ys[1], ys[2]}, -1);
        },
        rand({2, 5, 16}), ws, preset, rtol, atol));
    // The head's loss keeps an fp32 sum; its gradient in another dtype is rounded once.
    EXPECT_TRUE(deferred_matches_full(
        "lm_head_cross_entropy" + tag,
        [&](const torch::Tensor& x) { return models::lm_head_cross_entropy(x, head, targets, 8, 3); }, rand({10, 16}),
        {head}, preset, rtol, atol));
    EXPECT_TRUE(deferred_matches_full(
        "llama_rms_norm" + tag, [&](const torch::Tensor& x) { return models::llama_rms_norm(x, rms_w, 1e-5); },
        rand({2, 5, 16}), {rms_w}, preset, rtol, atol, /*expect_covered=*/rms_fused));
  }
}

}  // namespace zt::test_support
