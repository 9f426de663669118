// Bias-less linears that read one input, as one autograd node whose backward accumulates in
// the GEMMs: Llama's q/k/v projections (one normed x), gate/up (one normed x) and, with one
// weight, o_proj and down_proj.
//
// [Shared-Input Linears]
// Through F::linear, each of n linears reading x is its own autograd node, so backward
// pays two kinds of separate elementwise adds: autograd sums the n input gradients of x
// (n - 1 adds of an (N, in) tensor), and AccumulateGrad adds each fresh weight gradient into
// the W.grad that ZeRO stages 0-1 pre-allocate as views of one flat buffer
// (src/zero/grad_reducer.cpp). On Llama-3.2-1B at micro-batch 4 x 2048 that is 195 of the
// step's 259 bf16 add kernels. Here
//   dx   = dy_1 W_1, then dx += dy_i W_i for the others (addmm_, beta 1: in the GEMM);
//   dW_i = dy_i^T x added into W_i.grad by the GEMM (addmm_) when W_i.grad exists, is
//          contiguous, of W_i's sizes, of dy's dtype and device, and grad mode is off (no
//          double backward); otherwise a fresh dy_i^T x that AccumulateGrad adds as usual.
// This is GPT-2's LinearFn rule (models/gpt2.cpp) for several weights. Either way W_i's
// AccumulateGrad node still runs (with an undefined gradient when the GEMM accumulated), so
// its post hooks (the gradient reducer's ready hooks) fire as before. An unused output
// (undefined dy_i) adds nothing to dx and leaves W_i.grad alone; a frozen W_i gets no GEMM.
// Forward is n separate at::mm, the same products as F::linear. Gradients equal F::linear's
// within rounding: the sums are in another order (and rounded once per addmm, not per add).
#pragma once
#include <torch/torch.h>

#include <vector>

namespace zt::models {

// y_i = x W_i^T for each weight W_i (out_i, in) of `weights`, x (..., in) -> y_i (..., out_i).
// One autograd node for all of them. [Shared-Input Linears]
std::vector<torch::Tensor> shared_input_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights);

// residual + x W^T as one addmm: the residual is read by the GEMM's epilogue instead of a
// separate add (Llama's down_proj and its residual, on CUDA). Rounds once where the add
// after a GEMM rounds twice. One node: dx = dy W, dW as shared_input_linear's (into W.grad
// in the GEMM, or deferred in zb-h1's B), and the residual's gradient is dy itself.
torch::Tensor residual_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& residual);

// Whether a backward node may add its gradient for parameter w straight into w.grad instead of
// returning it: w.grad exists as a contiguous tensor of w's sizes, of `dtype` and on `device`
// (the gradient's), grad mode is off (no double backward), and the running backward will
// execute w's AccumulateGrad (a plain backward, or backward(inputs) naming w) -- not
// torch::autograd::grad, which captures the returned gradient and leaves w.grad alone (the
// pipeline's zb-h1 input-gradient pass asks for the tied head weight's gradient that way).
// [Shared-Input Linears]
bool accumulates_in_place(const torch::Tensor& w, at::ScalarType dtype, const at::Device& device);

// grad += a b in place (addmm_), or grad = a b (mm_out, a beta-0 GEMM that never reads grad)
// when grad is marked stale ([Stale Gradients], common/stale_grad.h; the mark is cleared).
// The in-place writers' one entry: every backward that adds into a W.grad goes through it or
// through take_grad_stale itself.
void accumulate_mm(torch::Tensor grad, const torch::Tensor& a, const torch::Tensor& b);

}  // namespace zt::models
