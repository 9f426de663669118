// zerotrain's column sum of a 2-D block: out[j] = sum_i in[i][j], the bias gradient
// g.sum(0) of a linear layer (GPT-2 Large: g is (8192, 1280 / 3840 / 5120) bf16), in
// place of ATen's reduce_kernel, which reaches about 65% of the memory bandwidth there.
//
// Plain C++ (no torch): included by library .cpp files and by column_sum.cu. Like
// fused_adam.h, compiled only where nvcc is found (ZT_WITH_KERNELS); elsewhere
// kernels_stub.cpp supplies a column_sum() that throws.
//
// Deterministic two-pass scheme, no atomics (the result is bitwise reproducible for a
// given device, shape and dtype):
//   pass 1: grid (column tiles) x (S row splits); each block of 256 threads sums a tile
//           of columns over its split's rows in fp32 registers (the 8 warps take every
//           8th row, 16-byte loads where the rows allow it), merges its warps through
//           shared memory in warp order and writes partial[split][col] to the workspace.
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

struct ColumnSumArgs {
  const void* in = nullptr;   // (rows, cols) row-major, row stride ld elements, dtype `type`
  DType type = DType::kBF16;  // bf16, f16 or f32
  int64_t rows = 0, cols = 0, ld = 0;
  void* out = nullptr;        // (cols), dtype `type`: out[j] = sum_i in[i][j] (fp32 accumulation, rounded once to the dtype)
  float* workspace = nullptr; // device fp32 scratch of at least column_sum_workspace_floats(rows, cols) floats (contents need not be zeroed)
};

// fp32 elements of workspace column_sum() needs: max splits x cols (0 when rows or cols
// is <= 0, and then the workspace may be null). Plain host math, the same on every device
// and in builds without the kernels (inline here, so kernels_stub.cpp needs no copy).
inline int64_t column_sum_workspace_floats(int64_t rows, int64_t cols) {
  if (cols <= 0) return 0;
  return reduction_max_splits(rows) * cols;
}

// Two launches on `stream`, asynchronous; all pointers are device pointers of the current
// CUDA device; `out` must not overlap `in` or the workspace. The vectorized path (16-byte
// loads) is taken when `in` is 16-byte aligned, ld * element size is a multiple of 16
// and cols a multiple of the vector width (8 for bf16/f16, 4 for f32); a scalar one
// otherwise. The padding columns [cols, ld) are never read. rows == 0 writes zeros to
// out; cols == 0 does nothing. Throws std::invalid_argument on bad arguments (rows < 0,
// cols < 0, ld < cols with rows > 0, a null pointer that is needed, an unknown dtype) and
// std::runtime_error on a launch error (the message names the kernel and the shape).
void column_sum(const ColumnSumArgs& a, cudaStream_t stream);

}  // namespace zt::kernels
