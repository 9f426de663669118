// The fused softmax cross-entropy kernel declared in softmax_xent.h. No torch headers:
// compiled by nvcc as part of the zerotrain library when CMake finds a CUDA compiler.
//
// One block of kThreads threads per row (a grid-stride loop over rows when there are
// more than a grid holds). The row is read twice and written once: pass 1 reduces it to
// (max m, sum s of exp(x - m)), pass 2 rereads it (mostly from L2: a bf16 row of the
// GPT-2 vocabulary is 100 KB) and overwrites it with the gradient. Memory-bound: on an
// 8192 x 50304 bf16 block that is 2.5 GB of traffic against about 2 exps per element.
//
// Each thread takes groups of kPack consecutive elements, strided by the block: 16 bytes
// per group (8 bf16/fp16 or 4 fp32) when every row starts 16-byte aligned, 1 element
// otherwise (the scalar path: same code, groups of one). Pass 1 folds a group into the
// thread's (m, s) with one rescale: m' = max(m, group max), s' = s exp(m - m') + sum
// exp(x - m'). Masked elements (columns >= cols inside the last group) enter as -inf.
// Pairs are then merged across the warp with shuffles and across warps through shared
// memory. Subtracting m' is made safe for m' = -inf (nothing seen yet, or only -inf
// logits) by subtracting 0 instead: exp(-inf) = 0 then, where -inf - -inf would be NaN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include "kernels/softmax_xent.h"
#include "kernels/common.cuh"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace zt::kernels {

namespace {

using detail::DTypeName;
using detail::from_float;
using detail::Pack;
using detail::to_float;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// Column indices are ints: ld (and so a group index plus kThreads) must stay well inside int.
constexpr int64_t kMaxLd = int64_t{1} << 30;
constexpr int kMinBlocks = 2048 / kThreads;  // a full SM on sm_80 and sm_90 (caps registers at 32 per thread)


// The value to subtract from logits when the running max is m: m itself, or 0 while m is
// -inf (then exp(x - 0) is 0 for x = -inf, and NaN for x = NaN, which must propagate).
__device__ __forceinline__ float shift_of(float m) { return m == -CUDART_INF_F ? 0.f : m; }

// (m, s) <- the merge of (m, s) and (m2, s2): both sums are over exp(x - their max).
// fmaxf ignores NaN; a NaN logit reaches s instead (exp(NaN) = NaN) and s stays NaN.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  const float c = shift_of(mn);
  s = s * expf(m - c) + s2 * expf(m2 - c);
  m = mn;
}

// The block's merged (m, s), returned to every thread. Shared memory is reused by the
// next call only after every thread has passed this call's second barrier.
__device__ __forceinline__ void block_merge(float& m, float& s) {
  __shared__ float warp_m[kWarps], warp_s[kWarps];
  __shared__ float block_m, block_s;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
    merge(m, s, m2, s2);
  }
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kWarps ? warp_m[lane] : -CUDART_INF_F;
    s = lane < kWarps ? warp_s[lane] : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      block_m = m;
      block_s = s;
    }
  }
  __syncthreads();
  m = block_m;
  s = block_s;
}

// kPack = 16 / sizeof(T) (rows 16-byte aligned, ld a multiple of kPack) or 1. Column
// indices are 32-bit (the host checks ld <= kMaxLd), row offsets 64-bit.
template <typename T, int kPack>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    softmax_xent_kernel(T* __restrict__ logits, int64_t rows, int cols, int ld, const int64_t* __restrict__ targets,
                        float* __restrict__ loss_sum, float grad_scale) {
  using P = Pack<T, kPack>;
  const int groups_real = (cols + kPack - 1) / kPack;  // groups holding a real column
  const int groups_all = ld / kPack;                  // every group of the row
  const T zero = from_float<T>(0.f);

  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* row = logits + r * static_cast<int64_t>(ld);
    P* packs = reinterpret_cast<P*>(row);
    const int64_t t = targets[r];  // the same for the whole block: the branches below are uniform

    if (t == -1) {  // ignored row: gradient 0, no loss
      P z;
#pragma unroll
      for (int k = 0; k < kPack; ++k) z.v[k] = zero;
      for (int g = threadIdx.x; g < groups_all; g += kThreads) packs[g] = z;
      continue;
    }
    const bool bad = t < 0 || t >= cols;  // out of range: NaN loss and gradients
    const int tj = bad ? -1 : static_cast<int>(t);  // the target's column (-1: none)

    // The target's original logit, read before pass 2 overwrites it (by thread 0, which
    // is also the one adding the loss).
    float x_t = 0.f;
    if (threadIdx.x == 0 && !bad) x_t = to_float(row[tj]);

    // Pass 1: this thread's (m, s) over its groups.
    float m = -CUDART_INF_F, s = 0.f;
    for (int g = threadIdx.x; g < groups_real; g += kThreads) {
      const P p = packs[g];
      float x[kPack];
      float gm = -CUDART_INF_F;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        x[k] = g * kPack + k < cols ? to_float(p.v[k]) : -CUDART_INF_F;
        gm = fmaxf(gm, x[k]);
      }
      const float mn = fmaxf(m, gm);
      const float c = shift_of(mn);
      float acc = s * expf(m - c);
#pragma unroll
      for (int k = 0; k < kPack; ++k) acc += expf(x[k] - c);
      s = acc;
      m = mn;
    }
    block_merge(m, s);

    if (threadIdx.x == 0) atomicAdd(loss_sum, bad ? CUDART_NAN_F : logf(s) - (x_t - m));

    // Pass 2: overwrite with the gradient.
    const float inv_s = bad ? CUDART_NAN_F : 1.f / s;
    for (int g = threadIdx.x; g < groups_all; g += kThreads) {
      P out;
      if (g < groups_real) {
        const P p = packs[g];
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          const int j = g * kPack + k;
          const float prob = expf(to_float(p.v[k]) - m) * inv_s;
          const float grad = (j == tj ? prob - 1.f : prob) * grad_scale;
          out.v[k] = j < cols ? from_float<T>(grad) : zero;
        }
      } else {
#pragma unroll
        for (int k = 0; k < kPack; ++k) out.v[k] = zero;
      }
      packs[g] = out;
    }
  }
}

template <typename T, int kPack>
void launch(const SoftmaxXentArgs& a, cudaStream_t stream) {
  const int64_t grid = std::min<int64_t>(a.rows, INT_MAX);
  softmax_xent_kernel<T, kPack><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      static_cast<T*>(a.logits), a.rows, static_cast<int>(a.cols), static_cast<int>(a.ld), a.targets, a.loss_sum,
      a.grad_scale);
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    throw std::runtime_error(std::string("zt::kernels::softmax_xent_kernel<") + DTypeName<T>::value +
                             (kPack > 1 ? ", vectorized" : ", scalar") + "> launch failed for rows=" +
                             std::to_string(a.rows) + " cols=" + std::to_string(a.cols) + " ld=" +
                             std::to_string(a.ld) + ": " + cudaGetErrorString(rc));
  }
}

template <typename T>
void dispatch_path(const SoftmaxXentArgs& a, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool aligned = reinterpret_cast<std::uintptr_t>(a.logits) % 16 == 0 &&
                       (a.ld * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  if (aligned) {
    launch<T, kVec>(a, stream);
  } else {
    launch<T, 1>(a, stream);
  }
}

}  // namespace

void softmax_xent(const SoftmaxXentArgs& a, cudaStream_t stream) {
  if (a.rows < 0) throw std::invalid_argument("zt::kernels::softmax_xent: rows=" + std::to_string(a.rows) + " < 0");
  if (a.rows == 0) return;
  if (a.cols < 1 || a.ld < a.cols || a.ld > kMaxLd) {
    throw std::invalid_argument("zt::kernels::softmax_xent: need 1 <= cols <= ld <= 2^30, got cols=" +
                                std::to_string(a.cols) + " ld=" + std::to_string(a.ld));
  }
  if (a.logits == nullptr || a.targets == nullptr || a.loss_sum == nullptr) {
    throw std::invalid_argument("zt::kernels::softmax_xent: logits, targets and loss_sum must be non-null (rows=" +
                                std::to_string(a.rows) + ")");
  }
  switch (a.type) {
    case DType::kF32: return dispatch_path<float>(a, stream);
    case DType::kBF16: return dispatch_path<__nv_bfloat16>(a, stream);
    case DType::kF16: return dispatch_path<__half>(a, stream);
  }
  throw std::invalid_argument("zt::kernels::softmax_xent: unknown type " + std::to_string(static_cast<int>(a.type)));
}

}  // namespace zt::kernels
