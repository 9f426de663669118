// The deterministic column sum declared in column_sum.h. No torch headers: compiled by
// nvcc as part of the zerotrain library when CMake finds a CUDA compiler.
//
// Memory-bound: every element is read once (2 bytes for bf16) and added once. Pass 1
// lays a warp's 32 lanes across 32 * kVec consecutive columns of a row (512 contiguous
// bytes per warp-row on the vectorized path), its 8 warps on rows r, r + 8, r + 16, ...
// of the block's split, with 4 rows' loads issued before their adds to keep enough bytes
// in flight. Every sum is formed in a fixed order (rows in increasing order per thread,
// then warps 0..7, then splits 0..S-1), so the result depends only on the shape, the
// dtype and S (a function of the device's multiprocessor count).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/column_sum.h"
#include "kernels/common.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace zt::kernels {

namespace {

constexpr const char* kName = "column_sum";  // in error messages
using detail::aligned;
using detail::DTypeName;
using detail::from_float;
using detail::Pack;
using detail::blocks_on_current_device;
using detail::to_float;

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kUnroll = 4;         // rows per thread whose loads are issued together
constexpr int kBlocksPerSm = 4;    // pass-1 grid target: about this many blocks per multiprocessor
constexpr int kFinalThreads = 256;
constexpr int kFinalBatch = 8;     // partials loaded together in pass 2 (added in order)


// Pass 1. Block (tile, split): columns [tile * 32 * kVec, +32 * kVec) (clipped to cols),
// rows [split * rows_per_split, +rows_per_split) (clipped to rows); writes
// partial[split * cols + col] for the tile's columns. On the vectorized path cols is a
// multiple of kVec, so a lane's kVec columns are either all inside or all outside.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    column_sum_partial_kernel(const T* __restrict__ in, int64_t rows, int64_t cols, int64_t ld,
                              int64_t rows_per_split, float* __restrict__ partial) {
  constexpr int kTile = kWarpSize * kVec;
  static_assert(kTile <= kThreads, "pass 1 merges one column per thread");
  __shared__ float warp_sums[kWarps][kTile];

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col = tile_begin + static_cast<int64_t>(lane) * kVec;
  const int64_t split = blockIdx.y;
  const int64_t r_begin = split * rows_per_split;
  const int64_t r_end = rows - r_begin < rows_per_split ? rows : r_begin + rows_per_split;

  float acc[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc[k] = 0.f;

  if (col < cols) {
    using P = Pack<T, kVec>;
    const T* p = in + col;
    int64_t r = r_begin + warp;
    for (; r + (kUnroll - 1) * kWarps < r_end; r += kUnroll * kWarps) {
      P x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) x[u] = *reinterpret_cast<const P*>(p + (r + u * kWarps) * ld);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] += to_float(x[u].v[k]);
      }
    }
    for (; r < r_end; r += kWarps) {
      const P x = *reinterpret_cast<const P*>(p + r * ld);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += to_float(x.v[k]);
    }
  }

#pragma unroll
  for (int k = 0; k < kVec; ++k) warp_sums[warp][lane * kVec + k] = acc[k];
  __syncthreads();

  const int t = static_cast<int>(threadIdx.x);
  if (t < kTile && tile_begin + t < cols) {
    float s = warp_sums[0][t];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s += warp_sums[w][t];
    partial[split * cols + tile_begin + t] = s;
  }
}

// Pass 2: out[j] = sum over s = 0..splits-1 of partial[s * cols + j], in that order
// (0 when splits == 0, i.e. rows == 0).
template <typename T>
__global__ void __launch_bounds__(kFinalThreads)
    column_sum_final_kernel(const float* __restrict__ partial, int64_t splits, int64_t cols, T* __restrict__ out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kFinalThreads + threadIdx.x;
  if (j >= cols) return;
  const float* p = partial + j;
  float s = 0.f;
  int64_t k = 0;
  for (; k + kFinalBatch <= splits; k += kFinalBatch) {
    float x[kFinalBatch];
#pragma unroll
    for (int u = 0; u < kFinalBatch; ++u) x[u] = p[(k + u) * cols];
#pragma unroll
    for (int u = 0; u < kFinalBatch; ++u) s += x[u];
  }
  for (; k < splits; ++k) s += p[k * cols];
  out[j] = from_float<T>(s);
}

std::string shape_of(const ColumnSumArgs& a) {
  return "rows=" + std::to_string(a.rows) + " cols=" + std::to_string(a.cols) + " ld=" + std::to_string(a.ld);
}

void check_launch(const std::string& kernel, const ColumnSumArgs& a, int64_t splits) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    throw std::runtime_error("zt::kernels::" + kernel + " launch failed for " + shape_of(a) +
                             " splits=" + std::to_string(splits) + ": " + cudaGetErrorString(rc));
  }
}

template <typename T, int kVec>
void launch_partial(const ColumnSumArgs& a, int64_t splits, int64_t rows_per_split, cudaStream_t stream) {
  constexpr int64_t kTile = kWarpSize * kVec;
  const int64_t tiles = (a.cols + kTile - 1) / kTile;
  if (tiles > 0x7fffffff) throw std::invalid_argument("zt::kernels::column_sum: too many columns (" + shape_of(a) + ")");
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  column_sum_partial_kernel<T, kVec><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(a.in), a.rows, a.cols, a.ld,
                                                                    rows_per_split, a.workspace);
  check_launch(std::string("column_sum_partial_kernel<") + DTypeName<T>::value + ", vec=" + std::to_string(kVec) + ">",
               a, splits);
}

template <typename T>
void launch(const ColumnSumArgs& a, cudaStream_t stream) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  const bool vec = aligned(a.in, 16) && (a.ld * static_cast<int64_t>(sizeof(T))) % 16 == 0 && a.cols % kVec == 0;
  const int64_t tile = kWarpSize * static_cast<int64_t>(vec ? kVec : 1);
  const int64_t tiles = (a.cols + tile - 1) / tile;

  int64_t splits = 0;  // rows == 0: pass 2 alone writes the zeros
  if (a.rows > 0) {
    const RowSplits plan = plan_row_splits(a.rows, tiles, blocks_on_current_device(kBlocksPerSm, kName));
    splits = plan.splits;
    const int64_t rows_per_split = plan.rows_per_split;
    if (vec) {
      launch_partial<T, kVec>(a, splits, rows_per_split, stream);
    } else {
      launch_partial<T, 1>(a, splits, rows_per_split, stream);
    }
  }

  const int64_t blocks = (a.cols + kFinalThreads - 1) / kFinalThreads;
  if (blocks > 0x7fffffff) throw std::invalid_argument("zt::kernels::column_sum: too many columns (" + shape_of(a) + ")");
  column_sum_final_kernel<T><<<static_cast<unsigned>(blocks), kFinalThreads, 0, stream>>>(a.workspace, splits, a.cols,
                                                                                          static_cast<T*>(a.out));
  check_launch(std::string("column_sum_final_kernel<") + DTypeName<T>::value + ">", a, splits);
}

}  // namespace

void column_sum(const ColumnSumArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.cols < 0) {
    throw std::invalid_argument("zt::kernels::column_sum: negative shape (" + shape_of(a) + ")");
  }
  if (a.rows > 0 && a.ld < a.cols) {
    throw std::invalid_argument("zt::kernels::column_sum: ld < cols (" + shape_of(a) + ")");
  }
  if (a.cols == 0) return;
  if (a.out == nullptr || (a.rows > 0 && (a.in == nullptr || a.workspace == nullptr))) {
    throw std::invalid_argument("zt::kernels::column_sum: in, out and workspace must be non-null (" + shape_of(a) + ")");
  }
  switch (a.type) {
    case DType::kF32: return launch<float>(a, stream);
    case DType::kBF16: return launch<__nv_bfloat16>(a, stream);
    case DType::kF16: return launch<__half>(a, stream);
  }
  throw std::invalid_argument("zt::kernels::column_sum: unknown dtype " + std::to_string(static_cast<int>(a.type)));
}

}  // namespace zt::kernels
