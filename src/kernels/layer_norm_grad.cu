// The deterministic LayerNorm parameter gradients declared in layer_norm_grad.h. No torch
// headers: compiled by nvcc as part of the zerotrain library when CMake finds a CUDA
// compiler.
//
// Memory-bound: every element of grad_out and input is read once (2 + 2 bytes for bf16)
// for 4 flops. Pass 1 lays a warp's 32 lanes across 32 * kVec consecutive columns of a
// row (512 contiguous bytes per tensor per warp-row on the vectorized path), its 8 warps
// on rows r, r + 8, r + 16, ... of the block's split, with 4 rows' loads (grad_out, input,
// mean, rstd) issued before their math to keep enough bytes in flight. Every sum is
// formed in a fixed order (rows in increasing order per thread, then warps 0..7, then
// splits 0..S-1), so the result depends only on the shape, the dtype and S (a function
// of the device's multiprocessor count).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/layer_norm_grad.h"
#include "kernels/common.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace zt::kernels {

namespace {

constexpr const char* kName = "layer_norm_param_grads";  // in error messages
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
// partial[split * cols + col] (dgamma, only when kGamma) and
// partial[(splits + split) * cols + col] (dbeta) for the tile's columns. On the
// vectorized path cols is a multiple of kVec, so a lane's kVec columns are either all
// inside or all outside. When !kGamma, x, mean and rstd are not read.
template <typename T, int kVec, bool kGamma>
__global__ void __launch_bounds__(kThreads)
    layer_norm_param_grad_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                         const float* __restrict__ mean, const float* __restrict__ rstd,
                                         int64_t rows, int64_t cols, int64_t rows_per_split,
                                         float* __restrict__ partial) {
  constexpr int kTile = kWarpSize * kVec;
  static_assert(kTile <= kThreads, "pass 1 merges one column per thread");
  __shared__ float warp_dgamma[kGamma ? kWarps : 1][kTile];
  __shared__ float warp_dbeta[kWarps][kTile];

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col = tile_begin + static_cast<int64_t>(lane) * kVec;
  const int64_t split = blockIdx.y;
  const int64_t splits = gridDim.y;
  const int64_t r_begin = split * rows_per_split;
  const int64_t r_end = rows - r_begin < rows_per_split ? rows : r_begin + rows_per_split;

  float acc_g[kVec], acc_b[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc_g[k] = acc_b[k] = 0.f;

  if (col < cols) {
    using P = Pack<T, kVec>;
    const T* pdy = dy + col;
    const T* px = x + col;
    int64_t r = r_begin + warp;
    for (; r + (kUnroll - 1) * kWarps < r_end; r += kUnroll * kWarps) {
      P g[kUnroll], v[kUnroll];
      float m[kUnroll], s[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t ru = r + u * kWarps;
        g[u] = *reinterpret_cast<const P*>(pdy + ru * cols);
        if constexpr (kGamma) {
          v[u] = *reinterpret_cast<const P*>(px + ru * cols);
          m[u] = mean[ru];
          s[u] = rstd[ru];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float gk = to_float(g[u].v[k]);
          if constexpr (kGamma) acc_g[k] += gk * ((to_float(v[u].v[k]) - m[u]) * s[u]);
          acc_b[k] += gk;
        }
      }
    }
    for (; r < r_end; r += kWarps) {
      const P g = *reinterpret_cast<const P*>(pdy + r * cols);
      if constexpr (kGamma) {
        const P v = *reinterpret_cast<const P*>(px + r * cols);
        const float m = mean[r], s = rstd[r];
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc_g[k] += to_float(g.v[k]) * ((to_float(v.v[k]) - m) * s);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc_b[k] += to_float(g.v[k]);
    }
  }

#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if constexpr (kGamma) warp_dgamma[warp][lane * kVec + k] = acc_g[k];
    warp_dbeta[warp][lane * kVec + k] = acc_b[k];
  }
  __syncthreads();

  const int t = static_cast<int>(threadIdx.x);
  if (t < kTile && tile_begin + t < cols) {
    if constexpr (kGamma) {
      float sg = warp_dgamma[0][t];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) sg += warp_dgamma[w][t];
      partial[split * cols + tile_begin + t] = sg;
    }
    float sb = warp_dbeta[0][t];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sb += warp_dbeta[w][t];
    partial[(splits + split) * cols + tile_begin + t] = sb;
  }
}

// Sum over s = 0..splits-1 of p[s * cols], in that order (0 when splits == 0).
__device__ __forceinline__ float sum_splits(const float* __restrict__ p, int64_t splits, int64_t cols) {
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
  return s;
}

// Pass 2: grad_weight[j] = sum of the dgamma partials of column j, grad_bias[j] = sum of
// its dbeta partials (each output skipped when null; zeros when splits == 0, i.e. rows == 0).
template <typename T>
__global__ void __launch_bounds__(kFinalThreads)
    layer_norm_param_grad_final_kernel(const float* __restrict__ partial, int64_t splits, int64_t cols,
                                       T* __restrict__ grad_weight, T* __restrict__ grad_bias) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kFinalThreads + threadIdx.x;
  if (j >= cols) return;
  if (grad_weight != nullptr) grad_weight[j] = from_float<T>(sum_splits(partial + j, splits, cols));
  if (grad_bias != nullptr) grad_bias[j] = from_float<T>(sum_splits(partial + splits * cols + j, splits, cols));
}

std::string shape_of(const LayerNormParamGradArgs& a) {
  return "rows=" + std::to_string(a.rows) + " cols=" + std::to_string(a.cols);
}

void check_launch(const std::string& kernel, const LayerNormParamGradArgs& a, int64_t splits) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    throw std::runtime_error("zt::kernels::" + kernel + " launch failed for " + shape_of(a) +
                             " splits=" + std::to_string(splits) + ": " + cudaGetErrorString(rc));
  }
}

template <typename T, int kVec, bool kGamma>
void launch_partial(const LayerNormParamGradArgs& a, int64_t splits, int64_t rows_per_split, cudaStream_t stream) {
  constexpr int64_t kTile = kWarpSize * kVec;
  const int64_t tiles = (a.cols + kTile - 1) / kTile;
  if (tiles > 0x7fffffff) {
    throw std::invalid_argument("zt::kernels::layer_norm_param_grads: too many columns (" + shape_of(a) + ")");
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  layer_norm_param_grad_partial_kernel<T, kVec, kGamma><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(a.grad_out), static_cast<const T*>(a.input), a.mean, a.rstd, a.rows, a.cols,
      rows_per_split, a.workspace);
  check_launch(std::string("layer_norm_param_grad_partial_kernel<") + DTypeName<T>::value +
                   ", vec=" + std::to_string(kVec) + (kGamma ? ", dgamma+dbeta>" : ", dbeta>"),
               a, splits);
}

template <typename T, int kVec>
void launch_partial_mode(const LayerNormParamGradArgs& a, int64_t splits, int64_t rows_per_split,
                         cudaStream_t stream) {
  if (a.grad_weight != nullptr) {
    launch_partial<T, kVec, true>(a, splits, rows_per_split, stream);
  } else {
    launch_partial<T, kVec, false>(a, splits, rows_per_split, stream);
  }
}

template <typename T>
void launch(const LayerNormParamGradArgs& a, cudaStream_t stream) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  const bool gamma = a.grad_weight != nullptr;
  const bool vec = aligned(a.grad_out, 16) && (!gamma || aligned(a.input, 16)) && a.cols % kVec == 0;
  const int64_t tile = kWarpSize * static_cast<int64_t>(vec ? kVec : 1);
  const int64_t tiles = (a.cols + tile - 1) / tile;

  int64_t splits = 0;  // rows == 0: pass 2 alone writes the zeros
  if (a.rows > 0) {
    const RowSplits plan = plan_row_splits(a.rows, tiles, blocks_on_current_device(kBlocksPerSm, kName));
    splits = plan.splits;
    const int64_t rows_per_split = plan.rows_per_split;
    if (vec) {
      launch_partial_mode<T, kVec>(a, splits, rows_per_split, stream);
    } else {
      launch_partial_mode<T, 1>(a, splits, rows_per_split, stream);
    }
  }

  const int64_t blocks = (a.cols + kFinalThreads - 1) / kFinalThreads;
  if (blocks > 0x7fffffff) {
    throw std::invalid_argument("zt::kernels::layer_norm_param_grads: too many columns (" + shape_of(a) + ")");
  }
  layer_norm_param_grad_final_kernel<T><<<static_cast<unsigned>(blocks), kFinalThreads, 0, stream>>>(
      a.workspace, splits, a.cols, static_cast<T*>(a.grad_weight), static_cast<T*>(a.grad_bias));
  check_launch(std::string("layer_norm_param_grad_final_kernel<") + DTypeName<T>::value + ">", a, splits);
}

}  // namespace

void layer_norm_param_grads(const LayerNormParamGradArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.cols < 0) {
    throw std::invalid_argument("zt::kernels::layer_norm_param_grads: negative shape (" + shape_of(a) + ")");
  }
  if (a.type != DType::kF32 && a.type != DType::kBF16 && a.type != DType::kF16) {
    throw std::invalid_argument("zt::kernels::layer_norm_param_grads: unknown dtype " +
                                std::to_string(static_cast<int>(a.type)));
  }
  if (a.cols == 0 || (a.grad_weight == nullptr && a.grad_bias == nullptr)) return;
  if (a.rows > 0) {
    if (a.grad_out == nullptr || a.workspace == nullptr) {
      throw std::invalid_argument("zt::kernels::layer_norm_param_grads: grad_out and workspace must be non-null (" +
                                  shape_of(a) + ")");
    }
    if (a.grad_weight != nullptr && (a.input == nullptr || a.mean == nullptr || a.rstd == nullptr)) {
      throw std::invalid_argument(
          "zt::kernels::layer_norm_param_grads: input, mean and rstd must be non-null for grad_weight (" +
          shape_of(a) + ")");
    }
  }
  switch (a.type) {
    case DType::kF32: return launch<float>(a, stream);
    case DType::kBF16: return launch<__nv_bfloat16>(a, stream);
    case DType::kF16: return launch<__half>(a, stream);
  }
}

}  // namespace zt::kernels
