// zerotrain's fused Llama elementwise ops: RMSNorm (forward and input gradient), rotary
// position embedding (forward and its transpose) and SwiGLU (forward and both gradients),
// each one kernel in place of the chain of ATen elementwise kernels the unfused
// formulation launches (models/llama.cpp; about 40% of the kernel time of a Llama step on
// an H100 before, issues 17 and 21). models/llama_fused.h wraps them as autograd Functions.
//
// Plain C++ (no torch): included by library .cpp files and by llama_ops.cu. Like
// fused_adam.h, compiled only where nvcc is found (ZT_WITH_KERNELS); elsewhere
// llama_ops_stub.cpp supplies functions that throw.
//
// Math, per element, in fp32 registers; every output is rounded once to the dtype
// (nearest even), except where noted to reproduce Hugging Face's rounding:
//   RMSNorm:  r = rsqrt(sum_j x_j^2 / cols + eps)  (one block per row, fixed-order sums)
//             y_j = T(w_j * float(T(x_j * r)))    (HF: normalize in fp32, cast to the input
//                                                  dtype, multiply by the weight in it)
//   backward: gn_j = dy_j * w_j, gx_j = r * gn_j - x_j * r^3 / cols * sum_k gn_k x_k
//             (gn unrounded; ATen's autograd of the unfused chain rounds dy * w to T first)
//             The weight gradient is layer_norm_param_grads() with mean 0 and this rstd.
//   RoPE:     h = head_dim / 2, per row (b, head, t) of x and its (cos, sin) row
//             forward  o_j = x_j c_j - x_{j+h} s_j,  o_{j+h} = x_{j+h} c_{j+h} + x_j s_{j+h}  (j < h)
//             backward o_j = g_j c_j + g_{j+h} s_{j+h},  o_{j+h} = g_{j+h} c_{j+h} - g_j s_j
//   SwiGLU:   s = 1 / (1 + exp(-g)), out = g s u
//             backward: grad_u = dy g s, grad_g = dy u s (1 + g (1 - s))
#pragma once
#include <cstdint>

#include "kernels/fused_adam.h"  // DType, cudaStream_t

namespace zt::kernels {

struct RmsNormArgs {
  const void* x = nullptr;       // (rows, cols) row-major contiguous, dtype `type`
  const void* weight = nullptr;  // (cols) contiguous, dtype `type`
  DType type = DType::kBF16;
  int64_t rows = 0, cols = 0;
  float eps = 1e-6f;
  void* y = nullptr;        // (rows, cols) dtype `type`: the output (must not overlap x)
  float* rstd = nullptr;    // (rows) fp32: r of each row, for the backward
  // Optional, together: the input normalised is x + residual (rounded to `type`, as a
  // separate add stores it), written to `sum` (rows, cols); neither may overlap y.
  const void* residual = nullptr;
  void* sum = nullptr;
};

struct RmsNormGradArgs {
  const void* grad_out = nullptr;  // (rows, cols) contiguous, dtype `type`: dL/dy
  const void* x = nullptr;         // (rows, cols) contiguous: the forward's input
  const void* weight = nullptr;    // (cols)
  const float* rstd = nullptr;     // (rows) fp32, as rms_norm_forward wrote it
  DType type = DType::kBF16;
  int64_t rows = 0, cols = 0;
  void* grad_x = nullptr;          // (rows, cols) dtype `type`: dL/dx (written, not accumulated)
  // Optional: the gradient of the norm's input from its other uses (the residual stream),
  // added to dL/dx after it is rounded to `type` (what autograd's accumulation computes).
  const void* grad_sum = nullptr;
  // Optional: dL/dw (cols, dtype `type`, written) from the same read of dy and x, with an
  // fp32 `workspace` of rms_norm_weight_grad_workspace_floats(type, rows, cols) floats;
  // only where that is > 0.
  void* grad_weight = nullptr;
  float* workspace = nullptr;
};

// The workspace rms_norm_backward_input needs to form dL/dw in its pass (floats), or 0
// when it cannot for this shape (then form it separately: layer_norm_param_grads with mean
// 0). Depends on the current device's SM count.
int64_t rms_norm_weight_grad_workspace_floats(DType type, int64_t rows, int64_t cols);

// Rows of a (batch, heads, seq, head_dim) tensor whose last dimension is contiguous, the
// other three at the given element strides (q/k as the (B, T, H, hd) projection viewed
// (B, H, T, hd)); `out` has the same strides. cos/sin: (seq, head_dim) contiguous
// (cos_batch_stride 0) or (batch, 1, seq, head_dim) contiguous (cos_batch_stride
// seq * head_dim), dtype `type`.
struct RopeArgs {
  const void* in = nullptr;   // x (forward) or dL/d(out) (backward)
  void* out = nullptr;        // the rotated x, or dL/dx (must not overlap `in`)
  const void* cos = nullptr;
  const void* sin = nullptr;
  DType type = DType::kBF16;
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;  // head_dim even
  int64_t stride_batch = 0, stride_head = 0, stride_seq = 0;
  int64_t cos_batch_stride = 0;
  bool backward = false;      // false: the forward; true: its transpose (the input gradient)
};

struct SwigluArgs {
  const void* gate = nullptr;  // (n) contiguous, dtype `type`
  const void* up = nullptr;    // (n) contiguous
  DType type = DType::kBF16;
  int64_t n = 0;
  void* out = nullptr;         // forward: silu(gate) * up
  // Backward only (swiglu_backward): dL/d(out) in, the two gradients out.
  const void* grad_out = nullptr;
  void* grad_gate = nullptr;
  void* grad_up = nullptr;
};

// dst += src * *scale per element, in fp32, rounded once to dst's dtype (the LM head adds
// its fp32 (V, C) gradient sum into the engine's gradient buffer in one pass; ATen's
// mixed-dtype addcmul_ ran unvectorized at half the bandwidth on an H100).
struct AddScaledArgs {
  void* dst = nullptr;           // (n) contiguous, dtype `type`
  const float* src = nullptr;    // (n) contiguous fp32
  const float* scale = nullptr;  // one fp32 on the device
  DType type = DType::kBF16;
  int64_t n = 0;
  bool overwrite = false;  // dst = src * *scale instead (dst is not read)
};

// An embedding's weight gradient added into an existing one: for each token t of `ids`,
// grad_weight[t] += the sum of grad_out's rows at t's positions. `sorted` holds the ids in
// ascending order and `order` the position each came from, equal ids in position order (a
// stable sort): each distinct id's rows are summed in fp32 in that order, rounded to
// `type` (the dense gradient ATen's embedding backward forms), then added to its row of
// grad_weight and rounded again (what the accumulation into .grad computes). Only the
// touched rows are read and written (ATen forms the whole (V, C) gradient, zeros included,
// and adds all of it). The id `padding_idx` (if >= 0) gets nothing. Deterministic.
struct EmbeddingGradArgs {
  void* grad_weight = nullptr;     // (V, cols) contiguous, dtype `type`: accumulated into
  const void* grad_out = nullptr;  // (n, cols) contiguous, dtype `type`
  const int* sorted = nullptr;     // (n) ids in [0, V), ascending
  const int64_t* order = nullptr;  // (n) the row of grad_out each sorted id came from
  DType type = DType::kBF16;
  int64_t n = 0, cols = 0;
  int64_t padding_idx = -1;
};

// Each: one launch on `stream`, asynchronous; all pointers are device pointers of the
// current CUDA device. 16-byte loads and stores where sizes, strides and pointers allow,
// a scalar path otherwise. Empty shapes do nothing. Throws std::invalid_argument on bad
// arguments (a negative size, a null pointer that is needed, an odd head_dim, an unknown
// dtype) and std::runtime_error on a launch error (the message names the kernel and the
// shape).
void rms_norm_forward(const RmsNormArgs& a, cudaStream_t stream);
void rms_norm_backward_input(const RmsNormGradArgs& a, cudaStream_t stream);
void rope(const RopeArgs& a, cudaStream_t stream);
void swiglu_forward(const SwigluArgs& a, cudaStream_t stream);
void swiglu_backward(const SwigluArgs& a, cudaStream_t stream);
void add_scaled(const AddScaledArgs& a, cudaStream_t stream);
void embedding_backward_add(const EmbeddingGradArgs& a, cudaStream_t stream);

}  // namespace zt::kernels
