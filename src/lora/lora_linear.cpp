// lora_linear (lora_linear.h): [Fused LoRA Linear].
#include "lora/lora_linear.h"

#include <torch/csrc/autograd/custom_function.h>

#include "zerotrain/error.h"

namespace zt::lora {
namespace {

// x2 (M, in), A (r, in), B (out, r); weight (out, in), or null with q set; bias (out) or
// null. The base (weight, bias, q) has no gradient.
struct LoraLinearFunction : public torch::autograd::Function<LoraLinearFunction> {
  // weight, bias: pointers (the base is no autograd input: it gets no gradient, and an
  // undefined tensor cannot be one).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x2, const torch::Tensor& A,
                               const torch::Tensor& B, const torch::Tensor* weight, const torch::Tensor* bias,
                               const quant::Nf4Tensor* q, double scaling) {
    const bool nf4 = weight == nullptr;
    const torch::Tensor w = nf4 ? quant::dequantize_nf4_as(*q, x2.scalar_type()) : *weight;  // (out, in)
    auto y = bias ? at::addmm(*bias, x2, w.t()) : at::mm(x2, w.t());                        // (M, out)
    auto mid = at::mm(x2, A.t());                                                             // (M, r)
    y.addmm_(mid, B.t(), /*beta=*/1, /*alpha=*/scaling);
    ctx->save_for_backward({x2, mid, A, B, nf4 ? torch::Tensor() : *weight});
    if (nf4) save_nf4(ctx, *q);
    ctx->saved_data["nf4"] = nf4;
    ctx->saved_data["scaling"] = scaling;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x2 = saved[0], &mid = saved[1], &A = saved[2], &B = saved[3];
    const double scaling = ctx->saved_data["scaling"].toDouble();
    const torch::Tensor& gy = grads[0];  // (M, out)
    torch::Tensor gx, gA, gB;
    const bool need_x = ctx->needs_input_grad(0), need_A = ctx->needs_input_grad(1);
    if (ctx->needs_input_grad(2)) gB = at::mm(gy.t(), mid).mul_(scaling);  // (out, r)
    if (need_x || need_A) {
      auto gmid = at::mm(gy, B).mul_(scaling);  // (M, r)
      if (need_A) gA = at::mm(gmid.t(), x2);   // (r, in)
      if (need_x) {
        const torch::Tensor w = ctx->saved_data["nf4"].toBool()
                                    ? quant::dequantize_nf4_as(load_nf4(ctx), gy.scalar_type())
                                    : saved[4];
        gx = at::mm(gy, w);        // (M, in)
        gx.addmm_(gmid, A);        // += gmid A, in the GEMM's epilogue
      }
    }
    return {gx, gA, gB, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor fused_apply(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                    const quant::Nf4Tensor* q, const torch::Tensor& A, const torch::Tensor& B, double scaling) {
  const int64_t out = B.size(0);
  ZT_CHECK_T(x.dim() >= 1 && x.size(-1) == A.size(1), ConfigError, "lora: input of shape ", x.sizes(),
             " does not fit the adapter's A ", A.sizes());
  ZT_CHECK_T((weight.defined() && !weight.requires_grad()) || !weight.defined(), ConfigError,
             "lora: the fused path needs a frozen base weight");
  ZT_CHECK_T(!bias.defined() || !bias.requires_grad(), ConfigError, "lora: the fused path needs a frozen base bias");
  const auto x2 = x.reshape({-1, x.size(-1)});
  auto y = LoraLinearFunction::apply(x2, A, B, weight.defined() ? &weight : nullptr, bias.defined() ? &bias : nullptr,
                                     q, scaling);
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  return y.view(sizes);
}

}  // namespace

void save_nf4(torch::autograd::AutogradContext* ctx, const quant::Nf4Tensor& q) {
  ctx->saved_data["packed"] = q.packed;
  ctx->saved_data["qabsmax"] = q.qabsmax;
  ctx->saved_data["absmax2"] = q.absmax2;
  ctx->saved_data["offset"] = static_cast<double>(q.offset);
  ctx->saved_data["shape"] = q.shape;
}

quant::Nf4Tensor load_nf4(torch::autograd::AutogradContext* ctx) {
  quant::Nf4Tensor q;
  q.packed = ctx->saved_data["packed"].toTensor();
  q.qabsmax = ctx->saved_data["qabsmax"].toTensor();
  q.absmax2 = ctx->saved_data["absmax2"].toTensor();
  q.offset = static_cast<float>(ctx->saved_data["offset"].toDouble());
  q.shape = ctx->saved_data["shape"].toIntVector();
  q.numel = 1;
  for (int64_t d : q.shape) q.numel *= d;
  return q;
}


torch::Tensor lora_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          const torch::Tensor& A, const torch::Tensor& B, double scaling) {
  ZT_CHECK_T(weight.defined() && weight.dim() == 2 && weight.size(0) == B.size(0) && weight.size(1) == A.size(1),
             ConfigError, "lora: base weight of shape ", weight.sizes(), " does not fit the adapter (A ", A.sizes(),
             ", B ", B.sizes(), ")");
  return fused_apply(x, weight, bias, nullptr, A, B, scaling);
}

torch::Tensor lora_nf4_linear(const torch::Tensor& x, const quant::Nf4Tensor& q, const torch::Tensor& bias,
                              const torch::Tensor& A, const torch::Tensor& B, double scaling) {
  ZT_CHECK_T(q.shape.size() == 2 && q.shape[0] == B.size(0) && q.shape[1] == A.size(1), ConfigError,
             "qlora: NF4 base of shape ", c10::IntArrayRef(q.shape), " does not fit the adapter (A ", A.sizes(), ", B ",
             B.sizes(), ")");
  ZT_CHECK_T(quant::nf4_on(q, x.device()), ConfigError, "qlora: the NF4 weight is on ", q.packed.device(),
             ", the input on ", x.device());
  return fused_apply(x, torch::Tensor(), bias, &q, A, B, scaling);
}

}  // namespace zt::lora
