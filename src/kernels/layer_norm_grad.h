// zerotrain's LayerNorm parameter gradients: for y = (x - mean) * rstd * gamma + beta over
// the last dimension of a (rows, cols) block,
//   grad_weight[j] = sum_i grad_out[i][j] * (x[i][j] - mean[i]) * rstd[i]   (dgamma)
//   grad_bias[j]   = sum_i grad_out[i][j]                                  (dbeta)
// in place of the gamma/beta part of ATen's LayerNorm backward
// (GammaBetaBackwardCUDAKernelTemplate: GPT-2 Large, (8192, 1280) bf16, about 3x the
// memory-bandwidth time). The input gradient stays ATen's (output_mask {true, false, false}).
//
// Plain C++ (no torch): included by library .cpp files and by layer_norm_grad.cu. Like
// fused_adam.h, compiled only where nvcc is found (ZT_WITH_KERNELS); elsewhere
// layer_norm_grad_stub.cpp supplies a layer_norm_param_grads() that throws.
//
// Deterministic two-pass scheme, no atomics (the result is bitwise reproducible for a
// given device, shape and dtype), the same as column_sum.h's:
//   pass 1: grid (column tiles) x (S row splits); each block of 256 threads takes a tile
//           of columns over its split's rows (the 8 warps take every 8th row, 16-byte
//           loads where the rows allow it) and accumulates, per column, in fp32 registers
//           dgamma += dy * ((x - mean) * rstd) and dbeta += dy; it merges its warps
//           through shared memory in warp order and writes partial[0][split][col]
//           (dgamma) and partial[1][split][col] (dbeta) to the workspace.
//   pass 2: one thread per column adds the S partials in split order and rounds once to
//           the dtype (nearest even).
// S is chosen on the host so that the grid has about 4 blocks per multiprocessor, at
// most kReductionMaxSplits and at least kReductionMinRowsPerSplit rows per split (row_splits.h).
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/fused_adam.h"  // DType, cudaStream_t
#include "kernels/row_splits.h"

namespace zt::kernels {

struct LayerNormParamGradArgs {
  const void* grad_out = nullptr; // (rows, cols) row-major contiguous, dtype `type` (bf16, f16 or f32): dL/dy
  const void* input = nullptr;    // (rows, cols) row-major contiguous, dtype `type`: the LayerNorm's input x
  const float* mean = nullptr;    // (rows) fp32, as at::native_layer_norm returns for bf16/f16/f32 input
  const float* rstd = nullptr;    // (rows) fp32
  DType type = DType::kBF16;
  int64_t rows = 0, cols = 0;
  void* grad_weight = nullptr;    // (cols) dtype `type`, may be null: sum_i grad_out[i][j] * (x[i][j] - mean[i]) * rstd[i]
  void* grad_bias = nullptr;      // (cols) dtype `type`, may be null: sum_i grad_out[i][j]
  float* workspace = nullptr;     // fp32 scratch, >= layer_norm_param_grad_workspace_floats(rows, cols) floats (need not be zeroed)
};

// fp32 elements of workspace layer_norm_param_grads() needs: 2 x max splits x cols (0 when
// rows or cols is <= 0, and then the workspace may be null). Plain host math, the same on
// every device and in builds without the kernels (inline here, so the stub needs no copy).
inline int64_t layer_norm_param_grad_workspace_floats(int64_t rows, int64_t cols) {
  if (cols <= 0) return 0;
  return 2 * reduction_max_splits(rows) * cols;
}

// Two launches on `stream`, asynchronous; all pointers are device pointers of the current
// CUDA device; the outputs must not overlap the inputs or the workspace. Outputs are
// written, not accumulated into. The vectorized path (16-byte loads) is taken when
// grad_out (and input, when grad_weight is wanted) is 16-byte aligned and cols is a
// multiple of the vector width (8 for bf16/f16, 4 for f32); a scalar one otherwise.
// When grad_weight is null, input, mean and rstd are not read (and may be null); when
// both outputs are null nothing is done. rows == 0 writes zeros to the outputs; cols == 0
// does nothing. Throws std::invalid_argument on bad arguments (rows < 0, cols < 0, a null
// pointer that is needed, an unknown dtype) and std::runtime_error on a launch error (the
// message names the kernel and the shape).
void layer_norm_param_grads(const LayerNormParamGradArgs& a, cudaStream_t stream);

}  // namespace zt::kernels
