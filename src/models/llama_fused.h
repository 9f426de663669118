// [Llama Fused Ops] The Llama family's elementwise ops, each as one CUDA kernel on CUDA
// tensors (kernels/llama_ops.h, wrapped here as autograd Functions) and as the ATen
// formulation everywhere else. The CPU path is the reference formulation, unchanged (the
// CPU tests pin transformers' numerics); on CUDA the fused path replaces about 40% of the
// kernel time of a Llama step (RMSNorm's cast/pow/mean/rsqrt/mul chain, RoPE's
// cat/neg/mul/add, SwiGLU's silu/mul and their backwards; issues 17 and 21).
//
// Numerics of the fused path against the reference (same dtype, same device):
//  - RMSNorm: the reference's rounding exactly (fp32 normalize, round to the input dtype,
//    times the weight rounded once); r's fp32 row sum in another order (a few fp32 ulps).
//    The input gradient is formed from dy * w unrounded (the reference's autograd rounds
//    it to the dtype first), the weight gradient from dy * x * r unrounded (the reference
//    rounds x * r to the dtype, then dy * that): within 1-2 ulps of the dtype.
//  - RoPE: x * cos + rotate_half(x) * sin in fp32 and one rounding; the reference in bf16
//    rounds after each of the two products and the sum (three roundings), so the fused
//    output is at least as accurate; they differ by up to about 2 bf16 ulps.
//  - SwiGLU: silu(g) * u in fp32 and one rounding (the reference rounds silu(g) first).
//    Saves g and u for the backward (the reference also keeps silu(g)).
// fp32: all within a few fp32 ulps of the reference.
// ATen's own at::_fused_rms_norm (libtorch 2.11's CUDA kernel, shared with LayerNorm's)
// is not used: it multiplies by the weight in fp32 and rounds once, T(w * x * r), where
// transformers rounds x * r to the dtype before the weight (in bf16 the two differ in 26%
// of the elements, x ~ N(0, 4), w ~ N(1, 0.01), measured on the CPU); this kernel keeps
// transformers' rounding.
//
// The switch: ZT_LLAMA_FUSED=0 in the environment turns the fused path off (read once per
// process, logged when off), for A/B timing on one machine; set_llama_fused() overrides it
// (tests).
#pragma once
#include <torch/torch.h>

namespace zt::models {

// Whether the fused CUDA ops are on (default on; ZT_LLAMA_FUSED=0 turns them off).
bool llama_fused_enabled();
// Overrides the environment for the rest of the process (tests compare both paths).
void set_llama_fused(bool on);

// HF's LlamaRMSNorm: weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype).
torch::Tensor llama_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// [Residual Norm] The decoder layer's norms with the residual stream around them:
// (rms_norm(x), x), where on CUDA the returned x carries its gradient into the norm's
// backward kernel (one pass instead of the norm's and a separate accumulation), and
// (x + delta, rms_norm(x + delta)) with the add in the norm's forward kernel and h's
// gradient likewise added in its backward. Bit-equal to the separate ops (the sum rounded
// to the dtype first, the norm's input gradient rounded before the accumulation); the
// reference formulation off CUDA or with the fused ops off.
std::pair<torch::Tensor, torch::Tensor> llama_rms_norm_keep(const torch::Tensor& x, const torch::Tensor& weight,
                                                            double eps);
std::pair<torch::Tensor, torch::Tensor> llama_add_rms_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                                           const torch::Tensor& weight, double eps);
// torch::embedding(weight, idx, padding_idx); on CUDA with a trainable weight its weight
// gradient is added into weight.grad row by row ([Embedding Grad] in llama_fused.cpp).
torch::Tensor llama_embedding(const torch::Tensor& weight, const torch::Tensor& idx, int64_t padding_idx);
// x * cos + rotate_half(x) * sin, x (B, H, T, hd), cos/sin (T, hd) or (B, 1, T, hd).
torch::Tensor llama_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// silu(gate) * up.
torch::Tensor llama_swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// The reference formulations (what the CPU always runs, and CUDA with the switch off).
torch::Tensor llama_rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor llama_rope_reference(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
torch::Tensor llama_swiglu_reference(const torch::Tensor& gate, const torch::Tensor& up);

}  // namespace zt::models
