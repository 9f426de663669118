// [Shared-Input Linears] (shared_linear.h).
#include "models/shared_linear.h"

#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include "models/deferred_grad.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Inputs: x2 (N, in), then the n weights (out_i, in). Outputs: y_i (N, out_i).
struct SharedInputLinearFn : torch::autograd::Function<SharedInputLinearFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x2, at::TensorList ws) {
    ctx->save_for_backward({x2});
    // The parameters themselves: backward reads their .grad.
    ctx->saved_data["w"] = ws.vec();
    // An unused output's gradient stays undefined: no zeros and no GEMM for it.
    ctx->set_materialize_grads(false);
    variable_list ys;
    ys.reserve(ws.size());
    for (const auto& w : ws) ys.push_back(at::mm(x2, w.t()));  // (N, out_i)
    return ys;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto x2 = ctx->get_saved_variables()[0];  // (N, in)
    const auto ws = ctx->saved_data["w"].toTensorVector();
    variable_list grads(ws.size() + 1);  // dx, then dW_i
    torch::Tensor& dx = grads[0];
    for (size_t i = 0; i < ws.size(); ++i) {
      const auto& g = grad_out[i];  // (N, out_i), or undefined when y_i was unused
      if (!g.defined()) continue;
      auto w = ws[i];
      if (ctx->needs_input_grad(0)) {
        if (dx.defined()) dx.addmm_(g, w);  // dx += g W_i, in the GEMM
        else dx = at::mm(g, w);             // (N, in)
      }
      if (!ctx->needs_input_grad(i + 1)) {
        // zb-h1's input-gradient pass: W_i's gradient later, in W. [Deferred Weight Gradients]
        defer_weight_grads({w}, [w, g, x2] { return std::vector<torch::Tensor>{weight_grad(w, g, x2)}; });
        continue;
      }
      grads[i + 1] = weight_grad(w, g, x2);
    }
    return grads;
  }

  // g^T x2 added into W.grad by the GEMM when W.grad can take it (then undefined is
  // returned), else a fresh (out, in) gradient.
  static torch::Tensor weight_grad(torch::Tensor w, const torch::Tensor& g, const torch::Tensor& x2) {
    if (accumulates_in_place(w, g.scalar_type(), g.device())) {
      accumulate_mm(w.mutable_grad(), g.t(), x2);
      return {};
    }
    return at::mm(g.t(), x2);  // (out_i, in), contiguous
  }
};

// y = r + x2 W^T as one addmm (the residual read in the GEMM's epilogue). Inputs: x2
// (N, in), W (out, in), r (N, out). Backward: r's gradient is dy itself, x2's dy W, W's
// as SharedInputLinearFn's (into W.grad in the GEMM, or deferred in zb-h1's B).
struct ResidualLinearFn : torch::autograd::Function<ResidualLinearFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x2, const torch::Tensor& w,
                               const torch::Tensor& r2) {
    ctx->save_for_backward({x2});
    ctx->saved_data["w"] = w;
    return at::addmm(r2, x2, w.t());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto x2 = ctx->get_saved_variables()[0];
    auto w = ctx->saved_data["w"].toTensor();
    const auto& g = grad_out[0];
    torch::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = at::mm(g, w);
    if (ctx->needs_input_grad(1)) {
      dw = SharedInputLinearFn::weight_grad(w, g, x2);
    } else {
      defer_weight_grads({w}, [w, g, x2] { return std::vector<torch::Tensor>{SharedInputLinearFn::weight_grad(w, g, x2)}; });
    }
    return {dx, dw, ctx->needs_input_grad(2) ? g : torch::Tensor()};
  }
};

}  // namespace

torch::Tensor residual_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& residual) {
  const int64_t in = x.size(-1);
  ZT_CHECK(w.dim() == 2 && w.size(1) == in, "residual_linear: weight ", w.sizes(), " does not take x ", x.sizes());
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  ZT_CHECK(residual.sizes() == c10::IntArrayRef(sizes), "residual_linear: residual ", residual.sizes(),
           " is not the output's ", c10::IntArrayRef(sizes));
  const auto y = ResidualLinearFn::apply(x.reshape({-1, in}), w, residual.reshape({-1, w.size(0)}));
  return y.view(sizes);
}

void accumulate_mm(torch::Tensor grad, const torch::Tensor& a, const torch::Tensor& b) {
  if (take_grad_stale(grad)) {
    at::mm_out(grad, a, b);  // [Stale Gradients] the first write overwrites: a beta-0 GEMM
  } else {
    grad.addmm_(a, b);  // grad += a b, in the GEMM's epilogue
  }
}

bool accumulates_in_place(const torch::Tensor& w, at::ScalarType dtype, const at::Device& device) {
  const auto& acc = w.grad();
  if (!(acc.defined() && !torch::GradMode::is_enabled() && acc.is_contiguous() && acc.sizes() == w.sizes() &&
        acc.scalar_type() == dtype && acc.device() == device)) {
    return false;
  }
  // The running graph task: no execution info = a plain backward, where every node runs.
  const auto* info = torch::autograd::get_current_graph_task_exec_info();
  if (info == nullptr || info->empty()) return true;
  const auto node = torch::autograd::impl::try_get_grad_accumulator(w);
  if (!node) return false;
  const auto it = info->find(node.get());
  return it != info->end() && it->second.needed_;  // needed_: AccumulateGrad runs (captures_: grad() takes it)
}

std::vector<torch::Tensor> shared_input_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights) {
  ZT_CHECK(!weights.empty(), "shared_input_linear: no weights");
  const int64_t in = x.size(-1);
  for (const auto& w : weights) {
    ZT_CHECK(w.dim() == 2 && w.size(1) == in, "shared_input_linear: weight ", w.sizes(), " does not take x ",
             x.sizes());
  }
  const auto x2 = x.reshape({-1, in});  // (N, in)
  // As an at::TensorList (not the vector) so that each weight is an input of the node.
  auto ys = SharedInputLinearFn::apply(x2, at::TensorList(weights));
  auto sizes = x.sizes().vec();
  for (size_t i = 0; i < ys.size(); ++i) {
    sizes.back() = weights[i].size(0);
    ys[i] = ys[i].view(sizes);  // (..., out_i)
  }
  return ys;
}

}  // namespace zt::models
