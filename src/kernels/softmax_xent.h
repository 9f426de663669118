// zerotrain's fused softmax cross-entropy over a block of logits, in place: for every
// row, the loss logsumexp(row) - row[target] is added to a device scalar and the row is
// overwritten with its gradient (softmax(row) - onehot(target)) * grad_scale, in the
// logits' own dtype. It replaces the fp32 ATen passes of the LM head loss
// (models/lm_head_loss.cpp: cast to fp32, log_softmax, gather, exp, scatter_add, mask,
// cast back): two reads and one write of the bf16 row instead of a dozen fp32 passes.
//
// Plain C++ (no torch): included by library .cpp files and by softmax_xent.cu. Like
// fused_adam.h, compiled only where nvcc is found (ZT_WITH_KERNELS); elsewhere
// kernels_stub.cpp supplies a softmax_xent() that throws.
//
// Math, per row, in fp32 registers (one thread block per row):
//   pass 1: m = max_j x_j and s = sum_j exp(x_j - m) over the real columns j < cols,
//           in one read (the online-softmax recurrence: per-thread (m, s) pairs, merged
//           across the block as (max(m1, m2), s1 * exp(m1 - m) + s2 * exp(m2 - m)))
//   loss  = log(s) - (x_t - m)             (x_t read before pass 2 overwrites the row)
//   pass 2: grad_j = (exp(x_j - m) * (1 / s) - [j == t]) * grad_scale, rounded to
//           nearest even into the dtype; 0 for the padding columns j >= cols
// The probabilities are formed as exp(x_j - m) / s rather than exp(x_j - logsumexp):
// logsumexp is large (≈ max logit) and its fp32 rounding would add ulp(logsumexp)/2 of
// relative error to every probability; this way each probability is within a few fp32
// ulps (plus the rounding of s's sum).
#pragma once
#include <cstdint>

#include "kernels/fused_adam.h"  // DType, cudaStream_t

namespace zt::kernels {

struct SoftmaxXentArgs {
  // (rows, ld) row-major, dtype `type`; on return row r holds d(loss_r)/d(logits_r) =
  // (softmax(row) - onehot(target_r)) * grad_scale * valid_r, in the same dtype.
  void* logits = nullptr;
  DType type = DType::kBF16;
  int64_t rows = 0;
  // Columns that are real classes (V); columns [cols, ld) are padding: treated as -inf
  // (probability 0; their values are never used, so whatever they hold, NaN included,
  // does not matter) and their gradient written as 0.
  int64_t cols = 0;
  int64_t ld = 0;  // row stride in elements (>= cols), e.g. the padded vocabulary Vp
  // (rows) int64 on the device; -1 = ignored row (loss 0, gradient row all 0; its logits
  // are not read, so they may hold anything). Any other value outside [0, cols) is a
  // caller bug: the loss of that row is NaN (so loss_sum becomes NaN and it surfaces)
  // and so are its real columns' gradients.
  const int64_t* targets = nullptr;
  // Device fp32 scalar, ATOMICALLY ADDED to (one atomicAdd per valid row, in no fixed
  // order, so the last bits of the sum may vary from run to run): sum over the valid
  // rows of logsumexp(row) - row[target]. The caller zeroes it.
  float* loss_sum = nullptr;
  float grad_scale = 1.0f;  // gradient rows are multiplied by this (e.g. 1/count for a mean loss)
};

// One launch over all rows, asynchronous on `stream`; all pointers are device pointers
// of the current CUDA device. A vectorized path (16-byte loads and stores) is taken when
// every row starts 16-byte aligned (logits aligned and ld * element size a multiple of
// 16), a scalar one otherwise. rows == 0 does nothing. Throws std::invalid_argument on
// bad arguments (rows < 0, cols < 1, ld < cols, ld > 2^30, a null pointer, an unknown
// dtype) and std::runtime_error on a launch error (the message names the kernel and the
// shape).
// Non-finite logits in the real columns: NaN or +inf make that row's loss and
// gradients NaN; -inf is an ordinary class of probability 0 (a row whose real columns
// are all -inf has no distribution: NaN, as at::log_softmax gives).
void softmax_xent(const SoftmaxXentArgs& a, cudaStream_t stream);

}  // namespace zt::kernels
