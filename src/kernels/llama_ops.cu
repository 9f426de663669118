// The fused Llama ops declared in llama_ops.h. No torch headers: compiled by nvcc as part
// of the zerotrain library when CMake finds a CUDA compiler.
//
// All memory-bound. RMSNorm: one warp per row with the row in registers where it fits
// (up to 32 x 16 x 16 bytes: 4096 bf16 columns), else one block of 256 threads per row
// (read twice, the second read mostly from L1/L2); optionally fused with the residual add
// before it (forward) and the gradient accumulation after it (backward). The row sums go
// in a fixed order, so a row's result depends only on its values and the shape. RoPE: a
// 2-D grid over (rows of one head, batch x head). SwiGLU: grid-stride loops over vectors.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/llama_ops.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace zt::kernels {

namespace {

using detail::aligned;
using detail::blocks_on_current_device;
using detail::resident_grids;
using detail::streaming_grid;
using detail::DTypeName;
using detail::from_float;
using detail::Pack;
using detail::to_float;

constexpr int kRowThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kRowWarps = kRowThreads / kWarpSize;
constexpr int kThreads = 256;     // RoPE and SwiGLU blocks
constexpr int kBlocksPerSm = 8;   // grid cap of the grid-stride kernels

// The sum of v over the block (every thread gets it), in a fixed order. `scratch` holds
// kRowWarps + 1 floats; the block must call it uniformly.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = scratch[0];
#pragma unroll
    for (int w = 1; w < kRowWarps; ++w) s += scratch[w];
    scratch[kRowWarps] = s;
  }
  __syncthreads();
  return scratch[kRowWarps];
}

// ---- RMSNorm ------------------------------------------------------------------------
// kResidual: the input is x + residual, rounded to T (what a separate add would store),
// written to `sum` and normalised; the backward adds dL/d(sum) from sum's other use into
// the input gradient, after rounding the norm's part to T (what autograd's separate
// accumulation computes). Either way bit-equal to the unfused ops.

template <typename T, int kVec, bool kResidual>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w, int64_t cols,
                            float eps, T* __restrict__ y, T* __restrict__ sum, float* __restrict__ rstd) {
  using P = Pack<T, kVec>;
  __shared__ float scratch[kRowWarps + 1];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float ss = 0.f;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < cols; c += kRowThreads * kVec) {
    P p = *reinterpret_cast<const P*>(xr + c);
    if constexpr (kResidual) {
      const P q = *reinterpret_cast<const P*>(res + row * cols + c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) p.v[k] = from_float<T>(to_float(p.v[k]) + to_float(q.v[k]));
      *reinterpret_cast<P*>(sum + row * cols + c) = p;
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float f = to_float(p.v[k]);
      ss += f * f;
    }
  }
  ss = block_sum(ss, scratch);  // also orders the sum's stores before the reads below
  const float r = rsqrtf(ss / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  const T* hr = kResidual ? sum + row * cols : xr;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < cols; c += kRowThreads * kVec) {
    const P p = *reinterpret_cast<const P*>(hr + c);
    const P pw = *reinterpret_cast<const P*>(w + c);
    P o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float n = to_float(from_float<T>(to_float(p.v[k]) * r));  // HF: .to(input dtype) before the weight
      o.v[k] = from_float<T>(to_float(pw.v[k]) * n);
    }
    *reinterpret_cast<P*>(yr + c) = o;
  }
}

template <typename T, int kVec, bool kResidual>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_backward_input_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                   const float* __restrict__ rstd, const T* __restrict__ gsum, int64_t cols,
                                   T* __restrict__ dx) {
  using P = Pack<T, kVec>;
  __shared__ float scratch[kRowWarps + 1];
  const int64_t row = blockIdx.x;
  const T* dyr = dy + row * cols;
  const T* xr = x + row * cols;
  T* dxr = dx + row * cols;
  float dot = 0.f;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < cols; c += kRowThreads * kVec) {
    const P g = *reinterpret_cast<const P*>(dyr + c);
    const P v = *reinterpret_cast<const P*>(xr + c);
    const P pw = *reinterpret_cast<const P*>(w + c);
#pragma unroll
    for (int k = 0; k < kVec; ++k) dot += to_float(g.v[k]) * to_float(pw.v[k]) * to_float(v.v[k]);
  }
  dot = block_sum(dot, scratch);
  const float r = rstd[row];
  const float coef = dot * r * r * r / static_cast<float>(cols);
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < cols; c += kRowThreads * kVec) {
    const P g = *reinterpret_cast<const P*>(dyr + c);
    const P v = *reinterpret_cast<const P*>(xr + c);
    const P pw = *reinterpret_cast<const P*>(w + c);
    P o;
    if constexpr (kResidual) {
      const P gs = *reinterpret_cast<const P*>(gsum + row * cols + c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float d = to_float(from_float<T>(r * (to_float(g.v[k]) * to_float(pw.v[k])) - to_float(v.v[k]) * coef));
        o.v[k] = from_float<T>(d + to_float(gs.v[k]));
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        o.v[k] = from_float<T>(r * (to_float(g.v[k]) * to_float(pw.v[k])) - to_float(v.v[k]) * coef);
      }
    }
    *reinterpret_cast<P*>(dxr + c) = o;
  }
}

// The forward with one warp per row, the row held in registers (kPer 16-byte vectors per
// lane, cols <= 32 * kVec * kPer): every load of a row is in flight at once, the row is
// read from memory once, and the sum needs no __syncthreads. Used whenever a row fits
// (Llama-3.2-1B's 2048 bf16 columns: 8 vectors per lane); the block-per-row kernel above
// takes wider rows and unaligned ones. The lane sums go through the warp in a fixed order:
// a row's result depends only on its values and the shape.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, int kVec, int kPer, bool kResidual>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_forward_warp_kernel(const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ w,
                                 int64_t rows, int cols, float eps, T* __restrict__ y, T* __restrict__ sum,
                                 float* __restrict__ rstd) {
  using P = Pack<T, kVec>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + static_cast<int64_t>(threadIdx.x) / kWarpSize;
  if (row >= rows) return;  // the whole warp
  const int64_t base = row * cols;
  P v[kPer];
  float ss = 0.f;
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int c = (p * kWarpSize + lane) * kVec;
    if (c < cols) v[p] = *reinterpret_cast<const P*>(x + base + c);
  }
  if constexpr (kResidual) {
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int c = (p * kWarpSize + lane) * kVec;
      if (c < cols) {
        const P q = *reinterpret_cast<const P*>(res + base + c);
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[p].v[k] = from_float<T>(to_float(v[p].v[k]) + to_float(q.v[k]));
        *reinterpret_cast<P*>(sum + base + c) = v[p];
      }
    }
  }
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int c = (p * kWarpSize + lane) * kVec;
    if (c < cols) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float f = to_float(v[p].v[k]);
        ss += f * f;
      }
    }
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(cols) + eps);
  if (lane == 0) rstd[row] = r;
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int c = (p * kWarpSize + lane) * kVec;
    if (c < cols) {
      const P pw = *reinterpret_cast<const P*>(w + c);
      P o;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float n = to_float(from_float<T>(to_float(v[p].v[k]) * r));
        o.v[k] = from_float<T>(to_float(pw.v[k]) * n);
      }
      *reinterpret_cast<P*>(y + base + c) = o;
    }
  }
}

// The backward over rows with each thread owning the same columns of every row (kPer
// 16-byte vectors, cols <= kRowThreads * kVec * kPer), a grid of a few blocks per SM each
// taking every gridDim.x-th row: the weight stays in registers, and with kWeight so does
// this block's part of dL/dw = sum_rows dy * (x * r), written to `partial` (one fp32 row per
// block) and summed over the blocks in order by rms_norm_weight_grad_final_kernel. dx,
// dL/dw and the residual gradient in one read of dy and x (the separate LayerNorm-style
// parameter-gradient kernel read both again).
template <typename T, int kVec, int kPer, bool kResidual, bool kWeight>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_backward_rows_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                  const float* __restrict__ rstd, const T* __restrict__ gsum, int64_t rows, int cols,
                                  T* __restrict__ dx, float* __restrict__ partial) {
  using P = Pack<T, kVec>;
  __shared__ float scratch[kRowWarps + 1];
  P pw[kPer];
  float acc[kPer][kVec];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int c = (static_cast<int>(threadIdx.x) + j * kRowThreads) * kVec;
    if (c < cols) pw[j] = *reinterpret_cast<const P*>(w + c);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[j][k] = 0.f;
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    P g[kPer], v[kPer], gs[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = (static_cast<int>(threadIdx.x) + j * kRowThreads) * kVec;
      if (c < cols) {
        g[j] = *reinterpret_cast<const P*>(dy + base + c);
        v[j] = *reinterpret_cast<const P*>(x + base + c);
        if constexpr (kResidual) gs[j] = *reinterpret_cast<const P*>(gsum + base + c);
      }
    }
    const float r = rstd[row];
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = (static_cast<int>(threadIdx.x) + j * kRowThreads) * kVec;
      if (c < cols) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) dot += to_float(g[j].v[k]) * to_float(pw[j].v[k]) * to_float(v[j].v[k]);
      }
    }
    dot = block_sum(dot, scratch);
    const float coef = dot * r * r * r / static_cast<float>(cols);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = (static_cast<int>(threadIdx.x) + j * kRowThreads) * kVec;
      if (c < cols) {
        P o;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float gk = to_float(g[j].v[k]), xk = to_float(v[j].v[k]);
          const float d = r * (gk * to_float(pw[j].v[k])) - xk * coef;
          if constexpr (kResidual) {
            o.v[k] = from_float<T>(to_float(from_float<T>(d)) + to_float(gs[j].v[k]));
          } else {
            o.v[k] = from_float<T>(d);
          }
          if constexpr (kWeight) acc[j][k] += gk * (xk * r);
        }
        *reinterpret_cast<P*>(dx + base + c) = o;
      }
    }
  }
  if constexpr (kWeight) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = (static_cast<int>(threadIdx.x) + j * kRowThreads) * kVec;
      if (c < cols) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) partial[static_cast<int64_t>(blockIdx.x) * cols + c + k] = acc[j][k];
      }
    }
  }
}

// dL/dw[c] = the blocks' partial sums added in block order, rounded once.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rms_norm_weight_grad_final_kernel(const float* __restrict__ partial, int blocks, int cols, T* __restrict__ dw) {
  const int c = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (c >= cols) return;
  float s = 0.f;
  for (int b = 0; b < blocks; ++b) s += partial[static_cast<int64_t>(b) * cols + c];
  dw[c] = from_float<T>(s);
}

// ---- RoPE ---------------------------------------------------------------------------

// Grid: x covers one (batch, head)'s seq * half / kVec vectors, y (with a stride loop past
// 65 535) the batch * heads pairs. The row and column come from 32-bit math once per thread:
// the earlier 1-D grid-stride form split a 64-bit flat index with four 64-bit divisions per
// vector and ran at ~0.6 TB/s on an H100 (Llama-3.2-1B's q, 115 us); this form, 28 us
// (scripts/device/rope_probe.sh, bench/results/2026-11-27_rope_probe_h100).
template <typename T, int kVec, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(const T* __restrict__ in, T* __restrict__ out, const T* __restrict__ cs, const T* __restrict__ sn,
                int heads, int bh_total, int seq, int half, int64_t sb, int64_t sh, int64_t st, int64_t cos_sb) {
  using P = Pack<T, kVec>;
  const int per_row = half / kVec;
  const int local = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  const int t = local / per_row;
  if (t >= seq) return;
  const int j = (local - t * per_row) * kVec;
  const int64_t coff = static_cast<int64_t>(t) * 2 * half + j;
  const P c0 = *reinterpret_cast<const P*>(cs + coff);
  const P c1 = *reinterpret_cast<const P*>(cs + coff + half);
  const P s0 = *reinterpret_cast<const P*>(sn + coff);
  const P s1 = *reinterpret_cast<const P*>(sn + coff + half);
  for (int bh = static_cast<int>(blockIdx.y); bh < bh_total; bh += static_cast<int>(gridDim.y)) {
    const int b = bh / heads, h = bh - b * heads;
    const int64_t off = b * sb + h * sh + t * st + j;
    const int64_t cb = b * cos_sb;
    P cc0 = c0, cc1 = c1, ss0 = s0, ss1 = s1;
    if (cos_sb != 0) {  // positions per sequence: this batch row's table
      cc0 = *reinterpret_cast<const P*>(cs + cb + coff);
      cc1 = *reinterpret_cast<const P*>(cs + cb + coff + half);
      ss0 = *reinterpret_cast<const P*>(sn + cb + coff);
      ss1 = *reinterpret_cast<const P*>(sn + cb + coff + half);
    }
    const P x0 = *reinterpret_cast<const P*>(in + off);
    const P x1 = *reinterpret_cast<const P*>(in + off + half);
    P o0, o1;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float a = to_float(x0.v[k]), b2 = to_float(x1.v[k]);
      if constexpr (kBackward) {
        o0.v[k] = from_float<T>(a * to_float(cc0.v[k]) + b2 * to_float(ss1.v[k]));
        o1.v[k] = from_float<T>(b2 * to_float(cc1.v[k]) - a * to_float(ss0.v[k]));
      } else {
        o0.v[k] = from_float<T>(a * to_float(cc0.v[k]) - b2 * to_float(ss0.v[k]));
        o1.v[k] = from_float<T>(b2 * to_float(cc1.v[k]) + a * to_float(ss1.v[k]));
      }
    }
    *reinterpret_cast<P*>(out + off) = o0;
    *reinterpret_cast<P*>(out + off + half) = o1;
  }
}

// ---- dst += src * scale -------------------------------------------------------------

// kOverwrite: dst = src * scale (dst not read), the same value as adding it to a zero dst.
template <typename T, int kVec, bool kOverwrite>
__global__ void __launch_bounds__(kThreads)
    add_scaled_kernel(T* __restrict__ dst, const float* __restrict__ src, const float* __restrict__ scale,
                      int64_t vecs) {
  using P = Pack<T, kVec>;
  using F = Pack<float, kVec>;
  const float sc = *scale;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const F f = reinterpret_cast<const F*>(src)[i];
    P o;
    if constexpr (kOverwrite) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) o.v[k] = from_float<T>(f.v[k] * sc);
    } else {
      const P d = reinterpret_cast<const P*>(dst)[i];
#pragma unroll
      for (int k = 0; k < kVec; ++k) o.v[k] = from_float<T>(to_float(d.v[k]) + f.v[k] * sc);
    }
    reinterpret_cast<P*>(dst)[i] = o;
  }
}

// ---- SwiGLU -------------------------------------------------------------------------

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ out, int64_t vecs) {
  using P = Pack<T, kVec>;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const P pg = reinterpret_cast<const P*>(g)[i];
    const P pu = reinterpret_cast<const P*>(u)[i];
    P o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float gf = to_float(pg.v[k]);
      o.v[k] = from_float<T>(gf / (1.f + expf(-gf)) * to_float(pu.v[k]));
    }
    reinterpret_cast<P*>(out)[i] = o;
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ g, const T* __restrict__ u,
                           T* __restrict__ dg, T* __restrict__ du, int64_t vecs) {
  using P = Pack<T, kVec>;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const P pd = reinterpret_cast<const P*>(dy)[i];
    const P pg = reinterpret_cast<const P*>(g)[i];
    const P pu = reinterpret_cast<const P*>(u)[i];
    P og, ou;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float d = to_float(pd.v[k]), gf = to_float(pg.v[k]), uf = to_float(pu.v[k]);
      const float s = 1.f / (1.f + expf(-gf));
      ou.v[k] = from_float<T>(d * (gf * s));
      og.v[k] = from_float<T>(d * uf * (s * (1.f + gf * (1.f - s))));
    }
    reinterpret_cast<P*>(dg)[i] = og;
    reinterpret_cast<P*>(du)[i] = ou;
  }
}

// ---- embedding weight gradient -------------------------------------------------------
// One block per sorted position; the block at the first position of each distinct id sums
// that id's rows (columns over the threads), the others return at once.

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_add_kernel(T* __restrict__ gw, const T* __restrict__ gout, const int* __restrict__ sorted,
                                  const int64_t* __restrict__ order, int64_t n, int64_t cols, int64_t pad) {
  using P = Pack<T, kVec>;
  const int64_t i = blockIdx.x;
  const int tok = sorted[i];
  if ((i > 0 && sorted[i - 1] == tok) || tok == pad) return;
  int64_t end = i + 1;
  while (end < n && sorted[end] == tok) ++end;
  T* dst = gw + static_cast<int64_t>(tok) * cols;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < cols; c += static_cast<int64_t>(kThreads) * kVec) {
    float acc[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] = 0.f;
    for (int64_t r = i; r < end; ++r) {
      const P g = *reinterpret_cast<const P*>(gout + order[r] * cols + c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += to_float(g.v[k]);
    }
    const P d = *reinterpret_cast<const P*>(dst + c);
    P o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) o.v[k] = from_float<T>(to_float(d.v[k]) + to_float(from_float<T>(acc[k])));
    *reinterpret_cast<P*>(dst + c) = o;
  }
}

// ---- launches -----------------------------------------------------------------------

void check_launch(const std::string& kernel, const std::string& shape) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    throw std::runtime_error("zt::kernels::" + kernel + " launch failed for " + shape + ": " + cudaGetErrorString(rc));
  }
}

void require(bool ok, const char* fn, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("zt::kernels::") + fn + ": " + what);
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) for the dtype (C++17: a generic lambda reads T from the tag).
template <typename F>
void dispatch(DType t, const char* fn, F&& f) {
  switch (t) {
    case DType::kF32: f(Tag<float>{}); return;
    case DType::kBF16: f(Tag<__nv_bfloat16>{}); return;
    case DType::kF16: f(Tag<__half>{}); return;
  }
  throw std::invalid_argument(std::string("zt::kernels::") + fn + ": unknown dtype");
}

int64_t grid_for(int64_t work, const char* fn) {
  // One vector per thread ([Streaming Grids], common.cuh); the resident cap only under
  // ZT_KERNEL_GRID=resident (asked of the device only then).
  return streaming_grid(work, kThreads, resident_grids() ? blocks_on_current_device(kBlocksPerSm, fn) : 0);
}

std::string rows_cols(int64_t rows, int64_t cols) {
  return "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
}

// The grid-stride elementwise kernels' launch (SwiGLU, add_scaled): n elements as 16-byte
// vectors of 16 / sizeof(T) when `vec` (n a multiple of it, every pointer aligned), else one
// by one. go(width, grid, count) launches the kernel instantiated for that width.
template <typename T, typename Go>
void launch_elementwise(const char* fn, const char* kernel, int64_t n, bool vec, Go&& go) {
  constexpr int kV = 16 / sizeof(T);
  const int64_t count = vec ? n / kV : n;
  const unsigned grid = static_cast<unsigned>(grid_for(count, fn));
  if (vec) {
    go(std::integral_constant<int, kV>{}, grid, count);
  } else {
    go(std::integral_constant<int, 1>{}, grid, count);
  }
  check_launch(std::string(kernel) + "<" + DTypeName<T>::value + (vec ? ", vec>" : ">"), "n=" + std::to_string(n));
}

// Vectors per lane for the warp-per-row kernels: the smallest of 2, 4, 8, 16 that holds a
// row of `cols` (0: the row is too wide, the block-per-row kernel takes it).
int warp_row_vecs(int64_t cols, int vec) {
  for (int per : {2, 4, 8, 16}) {
    if (cols <= static_cast<int64_t>(kWarpSize) * vec * per) return per;
  }
  return 0;
}

// Calls f(std::integral_constant<int, per>) for per in {2, 4, 8, 16}.
template <typename F>
void dispatch_per(int per, F&& f) {
  switch (per) {
    case 2: f(std::integral_constant<int, 2>{}); return;
    case 4: f(std::integral_constant<int, 4>{}); return;
    case 8: f(std::integral_constant<int, 8>{}); return;
    default: f(std::integral_constant<int, 16>{}); return;
  }
}

}  // namespace

void rms_norm_forward(const RmsNormArgs& a, cudaStream_t stream) {
  constexpr const char* kFn = "rms_norm_forward";
  require(a.rows >= 0 && a.cols >= 0 && a.rows <= 0x7fffffff && a.cols <= 0x7fffffff, kFn,
          "bad shape " + rows_cols(a.rows, a.cols));
  if (a.rows == 0 || a.cols == 0) return;
  require(a.x && a.weight && a.y && a.rstd, kFn, "null pointer");
  require((a.residual == nullptr) == (a.sum == nullptr), kFn, "residual and sum go together");
  dispatch(a.type, kFn, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    const T* x = static_cast<const T*>(a.x);
    const T* res = static_cast<const T*>(a.residual);
    const T* w = static_cast<const T*>(a.weight);
    T* y = static_cast<T*>(a.y);
    T* sum = static_cast<T*>(a.sum);
    const bool with_res = res != nullptr;
    const bool vec = a.cols % kV == 0 && aligned(x, 16) && aligned(w, 16) && aligned(y, 16) &&
                     (!with_res || (aligned(res, 16) && aligned(sum, 16)));
    const int per = vec ? warp_row_vecs(a.cols, kV) : 0;
    const int cols = static_cast<int>(a.cols);
    auto go = [&](auto r) {
      constexpr bool kRes = decltype(r)::value;
      if (per > 0) {
        const unsigned grid = static_cast<unsigned>((a.rows + kRowWarps - 1) / kRowWarps);
        dispatch_per(per, [&](auto pc) {
          rms_norm_forward_warp_kernel<T, kV, decltype(pc)::value, kRes>
              <<<grid, kRowThreads, 0, stream>>>(x, res, w, a.rows, cols, a.eps, y, sum, a.rstd);
        });
      } else if (vec) {
        rms_norm_forward_kernel<T, kV, kRes>
            <<<static_cast<unsigned>(a.rows), kRowThreads, 0, stream>>>(x, res, w, a.cols, a.eps, y, sum, a.rstd);
      } else {
        rms_norm_forward_kernel<T, 1, kRes>
            <<<static_cast<unsigned>(a.rows), kRowThreads, 0, stream>>>(x, res, w, a.cols, a.eps, y, sum, a.rstd);
      }
    };
    if (with_res) go(std::true_type{});
    else go(std::false_type{});
    check_launch(std::string("rms_norm_forward_kernel<") + DTypeName<T>::value +
                     (per > 0 ? ", warp>" : vec ? ", vec>" : ">") + (with_res ? " + residual" : ""),
                 rows_cols(a.rows, a.cols));
  });
}

namespace {

// Vectors per thread for the rows backward: 1, 2 or 4 (cols <= 256 * vec * per), else 0.
int rows_backward_vecs(int64_t cols, int vec) {
  for (int per : {1, 2, 4}) {
    if (cols <= static_cast<int64_t>(kRowThreads) * vec * per) return per;
  }
  return 0;
}

constexpr int kNormBlocksPerSm = 4;  // the rows backward's grid: one resident wave

int64_t rows_backward_grid(int64_t rows, const char* fn) {
  const int64_t cap = blocks_on_current_device(kNormBlocksPerSm, fn);
  return rows < cap ? rows : cap;
}

bool rows_backward_fits(DType type, int64_t cols) {
  const int vec = type == DType::kF32 ? 4 : 8;
  return cols % vec == 0 && rows_backward_vecs(cols, vec) > 0;
}

}  // namespace

int64_t rms_norm_weight_grad_workspace_floats(DType type, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || !rows_backward_fits(type, cols)) return 0;
  return rows_backward_grid(rows, "rms_norm_weight_grad_workspace_floats") * cols;
}

namespace {

void launch_rms_backward(const RmsNormGradArgs& a, cudaStream_t stream) {
  constexpr const char* kFn = "rms_norm_backward_input";
  const bool want_dw = a.grad_weight != nullptr;
  dispatch(a.type, kFn, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    const T* dy = static_cast<const T*>(a.grad_out);
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.weight);
    const T* gs = static_cast<const T*>(a.grad_sum);
    T* dx = static_cast<T*>(a.grad_x);
    const bool with_res = gs != nullptr;
    const bool vec = a.cols % kV == 0 && aligned(dy, 16) && aligned(x, 16) && aligned(w, 16) && aligned(dx, 16) &&
                     (!with_res || aligned(gs, 16));
    const int per = vec ? rows_backward_vecs(a.cols, kV) : 0;
    require(!want_dw || per > 0, kFn,
            "dL/dw in the same pass needs 16-byte aligned rows of at most " + std::to_string(kRowThreads * kV * 4) +
                " columns (" + rows_cols(a.rows, a.cols) + "): check rms_norm_weight_grad_workspace_floats first");
    const int cols = static_cast<int>(a.cols);
    auto go = [&](auto r) {
      constexpr bool kRes = decltype(r)::value;
      if (per > 0) {
        const int64_t grid = rows_backward_grid(a.rows, kFn);
        auto launch = [&](auto pc, auto wt) {
          rms_norm_backward_rows_kernel<T, kV, decltype(pc)::value, kRes, decltype(wt)::value>
              <<<static_cast<unsigned>(grid), kRowThreads, 0, stream>>>(dy, x, w, a.rstd, gs, a.rows, cols, dx,
                                                                        a.workspace);
        };
        auto pick = [&](auto wt) {
          if (per == 1) launch(std::integral_constant<int, 1>{}, wt);
          else if (per == 2) launch(std::integral_constant<int, 2>{}, wt);
          else launch(std::integral_constant<int, 4>{}, wt);
        };
        if (want_dw) {
          pick(std::true_type{});
          check_launch(std::string("rms_norm_backward_rows_kernel<") + DTypeName<T>::value + ", dw>",
                       rows_cols(a.rows, a.cols));
          rms_norm_weight_grad_final_kernel<T>
              <<<static_cast<unsigned>((a.cols + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
                  a.workspace, static_cast<int>(grid), cols, static_cast<T*>(a.grad_weight));
        } else {
          pick(std::false_type{});
        }
      } else if (vec) {
        rms_norm_backward_input_kernel<T, kV, kRes>
            <<<static_cast<unsigned>(a.rows), kRowThreads, 0, stream>>>(dy, x, w, a.rstd, gs, a.cols, dx);
      } else {
        rms_norm_backward_input_kernel<T, 1, kRes>
            <<<static_cast<unsigned>(a.rows), kRowThreads, 0, stream>>>(dy, x, w, a.rstd, gs, a.cols, dx);
      }
    };
    if (with_res) go(std::true_type{});
    else go(std::false_type{});
    check_launch(std::string("rms_norm_backward_input<") + DTypeName<T>::value +
                     (per > 0 ? ", rows>" : vec ? ", vec>" : ">") + (with_res ? " + residual grad" : "") +
                     (want_dw ? " + dw" : ""),
                 rows_cols(a.rows, a.cols));
  });
}

}  // namespace

void rms_norm_backward_input(const RmsNormGradArgs& a, cudaStream_t stream) {
  constexpr const char* kFn = "rms_norm_backward_input";
  require(a.rows >= 0 && a.cols >= 0 && a.rows <= 0x7fffffff && a.cols <= 0x7fffffff, kFn,
          "bad shape " + rows_cols(a.rows, a.cols));
  if (a.rows == 0 || a.cols == 0) return;
  require(a.grad_out && a.x && a.weight && a.rstd && a.grad_x, kFn, "null pointer");
  require(!a.grad_weight || a.workspace, kFn, "grad_weight needs a workspace");
  launch_rms_backward(a, stream);
}

void rope(const RopeArgs& a, cudaStream_t stream) {
  constexpr const char* kFn = "rope";
  const std::string shape = "batch=" + std::to_string(a.batch) + " heads=" + std::to_string(a.heads) +
                            " seq=" + std::to_string(a.seq) + " head_dim=" + std::to_string(a.head_dim);
  require(a.batch >= 0 && a.heads >= 0 && a.seq >= 0 && a.head_dim >= 0 && a.head_dim % 2 == 0, kFn,
          "bad shape " + shape);
  if (a.batch == 0 || a.heads == 0 || a.seq == 0 || a.head_dim == 0) return;
  require(a.in && a.out && a.cos && a.sin, kFn, "null pointer");
  const int64_t half = a.head_dim / 2;
  dispatch(a.type, kFn, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    const T* in = static_cast<const T*>(a.in);
    T* out = static_cast<T*>(a.out);
    const T* cs = static_cast<const T*>(a.cos);
    const T* sn = static_cast<const T*>(a.sin);
    const bool vec = half % kV == 0 && a.stride_batch % kV == 0 && a.stride_head % kV == 0 &&
                     a.stride_seq % kV == 0 && a.cos_batch_stride % kV == 0 && aligned(in, 16) && aligned(out, 16) &&
                     aligned(cs, 16) && aligned(sn, 16);
    const int kVec = vec ? kV : 1;
    const int64_t row_vecs = a.seq * (half / kVec);  // one (batch, head)'s vectors: grid x
    const int64_t bh = a.batch * a.heads;
    require(row_vecs <= 0x7fffffff - kThreads && bh <= 0x7fffffff, kFn, "shape too large for 32-bit rows " + shape);
    const dim3 grid(static_cast<unsigned>((row_vecs + kThreads - 1) / kThreads),
                    static_cast<unsigned>(bh < 65535 ? bh : 65535));
    auto go = [&](auto v, auto b) {
      rope_kernel<T, decltype(v)::value, decltype(b)::value><<<grid, kThreads, 0, stream>>>(
          in, out, cs, sn, static_cast<int>(a.heads), static_cast<int>(bh), static_cast<int>(a.seq),
          static_cast<int>(half), a.stride_batch, a.stride_head, a.stride_seq, a.cos_batch_stride);
    };
    using Fwd = std::false_type;
    using Bwd = std::true_type;
    if (vec && a.backward) go(std::integral_constant<int, kV>{}, Bwd{});
    if (vec && !a.backward) go(std::integral_constant<int, kV>{}, Fwd{});
    if (!vec && a.backward) go(std::integral_constant<int, 1>{}, Bwd{});
    if (!vec && !a.backward) go(std::integral_constant<int, 1>{}, Fwd{});
    check_launch(std::string("rope_kernel<") + DTypeName<T>::value + (vec ? ", vec" : "") +
                     (a.backward ? ", backward>" : ">"),
                 shape);
  });
}

void swiglu_forward(const SwigluArgs& a, cudaStream_t stream) {
  constexpr const char* kFn = "swiglu_forward";
  require(a.n >= 0, kFn, "negative n");
  if (a.n == 0) return;
  require(a.gate && a.up && a.out, kFn, "null pointer");
  dispatch(a.type, kFn, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    const T* g = static_cast<const T*>(a.gate);
    const T* u = static_cast<const T*>(a.up);
    T* o = static_cast<T*>(a.out);
    const bool vec = a.n % kV == 0 && aligned(g, 16) && aligned(u, 16) && aligned(o, 16);
    launch_elementwise<T>(kFn, "swiglu_forward_kernel", a.n, vec, [&](auto w, unsigned grid, int64_t count) {
      swiglu_forward_kernel<T, decltype(w)::value><<<grid, kThreads, 0, stream>>>(g, u, o, count);
    });
  });
}

void swiglu_backward(const SwigluArgs& a, cudaStream_t stream) {
  constexpr const char* kFn = "swiglu_backward";
  require(a.n >= 0, kFn, "negative n");
  if (a.n == 0) return;
  require(a.gate && a.up && a.grad_out && a.grad_gate && a.grad_up, kFn, "null pointer");
  dispatch(a.type, kFn, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    const T* dy = static_cast<const T*>(a.grad_out);
    const T* g = static_cast<const T*>(a.gate);
    const T* u = static_cast<const T*>(a.up);
    T* dg = static_cast<T*>(a.grad_gate);
    T* du = static_cast<T*>(a.grad_up);
    const bool vec = a.n % kV == 0 && aligned(dy, 16) && aligned(g, 16) && aligned(u, 16) && aligned(dg, 16) &&
                     aligned(du, 16);
    launch_elementwise<T>(kFn, "swiglu_backward_kernel", a.n, vec, [&](auto w, unsigned grid, int64_t count) {
      swiglu_backward_kernel<T, decltype(w)::value><<<grid, kThreads, 0, stream>>>(dy, g, u, dg, du, count);
    });
  });
}

void add_scaled(const AddScaledArgs& a, cudaStream_t stream) {
  constexpr const char* kFn = "add_scaled";
  require(a.n >= 0, kFn, "negative n");
  if (a.n == 0) return;
  require(a.dst && a.src && a.scale, kFn, "null pointer");
  dispatch(a.type, kFn, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    T* d = static_cast<T*>(a.dst);
    const bool vec = a.n % kV == 0 && aligned(d, 16) && aligned(a.src, sizeof(float) * kV);
    launch_elementwise<T>(kFn, "add_scaled_kernel", a.n, vec, [&](auto w, unsigned grid, int64_t count) {
      if (a.overwrite) {
        add_scaled_kernel<T, decltype(w)::value, true><<<grid, kThreads, 0, stream>>>(d, a.src, a.scale, count);
      } else {
        add_scaled_kernel<T, decltype(w)::value, false><<<grid, kThreads, 0, stream>>>(d, a.src, a.scale, count);
      }
    });
  });
}

void embedding_backward_add(const EmbeddingGradArgs& a, cudaStream_t stream) {
  constexpr const char* kFn = "embedding_backward_add";
  require(a.n >= 0 && a.cols >= 0 && a.n <= 0x7fffffff, kFn,
          "bad shape n=" + std::to_string(a.n) + " cols=" + std::to_string(a.cols));
  if (a.n == 0 || a.cols == 0) return;
  require(a.grad_weight && a.grad_out && a.sorted && a.order, kFn, "null pointer");
  dispatch(a.type, kFn, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    T* gw = static_cast<T*>(a.grad_weight);
    const T* go = static_cast<const T*>(a.grad_out);
    const bool vec = a.cols % kV == 0 && aligned(gw, 16) && aligned(go, 16);
    const unsigned grid = static_cast<unsigned>(a.n);
    if (vec) {
      embedding_backward_add_kernel<T, kV>
          <<<grid, kThreads, 0, stream>>>(gw, go, a.sorted, a.order, a.n, a.cols, a.padding_idx);
    } else {
      embedding_backward_add_kernel<T, 1>
          <<<grid, kThreads, 0, stream>>>(gw, go, a.sorted, a.order, a.n, a.cols, a.padding_idx);
    }
    check_launch(std::string("embedding_backward_add_kernel<") + DTypeName<T>::value + (vec ? ", vec>" : ">"),
                 "n=" + std::to_string(a.n) + " cols=" + std::to_string(a.cols));
  });
}

}  // namespace zt::kernels
