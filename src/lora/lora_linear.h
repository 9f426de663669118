// The fused LoRA linear: base linear and low-rank update in one autograd Function.
//
// [Fused LoRA Linear]
// peft's adapter computes y = base(x) + (x A^T) B^T * scaling as four full-size passes
// beyond the base GEMM in each direction: the scaling multiply and the add in forward
// (again in a checkpointed recompute), and in backward the multiply of the output gradient
// by the scaling and autograd's sum of x's two gradients (the base's and the branch's). On
// a Llama-3-8B LoRA step (7 adapters x 32 layers) these were 30 ms of 247 ms of kernels
// (issue 21). When the adapter's input is not dropped out (dropout 0 or eval), the base
// is frozen (weight and bias without requires_grad) and A, B, the base weight and x share
// one dtype, lora_linear computes the same thing with the update folded into GEMMs:
//   forward   y = x W^T (+ b)                     one mm / addmm   (M, out)
//             mid = x A^T                                          (M, r)
//             y += scaling * mid B^T              addmm_'s alpha: no full-size pass
//   backward  gmid = (gy B) * scaling                              (M, r), small
//             grad_B = scaling * gy^T mid                          (out, r), small
//             grad_A = gmid^T x                                    (r, in)
//             grad_x = gy W, then += gmid A       addmm_ in place: no separate add
// Saved: x, mid, A, B, and the base: the weight itself (as GPT-2's LinearFn keeps the
// parameter: at ZeRO-3 it is re-gathered into the same storage before the unit's backward,
// param_gatherer.cpp) or, for an NF4 base, only the NF4 tensors ([QLoRA Base] in
// lora/qlora.h): the weight is dequantized in forward and again in backward.
// Numerics: the same products as the unfused path, rounded in another order (the update is
// scaled and added inside the GEMM's fp32 accumulator instead of after rounding); fp32
// results agree to ~1e-6 relative (tests/unit/test_lora_fused.cpp). Every other case
// (dropout in training, mixed dtypes, a trainable base) keeps the unfused path.
#pragma once
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "quant/nf4.h"

namespace zt::lora {

// x (..., in); weight (out, in); bias (out) or undefined; A (r, in); B (out, r); all of
// x's dtype and device, weight and bias without requires_grad. Returns (..., out).
torch::Tensor lora_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          const torch::Tensor& A, const torch::Tensor& B, double scaling);
// The same with the base weight dequant(q) (dequantized in x's dtype on x's device, in
// forward and again in backward; q on x's device).
torch::Tensor lora_nf4_linear(const torch::Tensor& x, const quant::Nf4Tensor& q, const torch::Tensor& bias,
                              const torch::Tensor& A, const torch::Tensor& B, double scaling);

// An autograd Function's record of an NF4 weight ([QLoRA Base]: only the NF4 storage is
// kept for backward, never the dequantized weight): save_nf4 in forward, load_nf4 in backward.
void save_nf4(torch::autograd::AutogradContext* ctx, const quant::Nf4Tensor& q);
quant::Nf4Tensor load_nf4(torch::autograd::AutogradContext* ctx);

}  // namespace zt::lora
