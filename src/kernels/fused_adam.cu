// The fused Adam/AdamW kernel declared in fused_adam.h. No torch headers: compiled by
// nvcc as part of the zerotrain library when CMake finds a CUDA compiler.
//
// Memory-bound: every element reads grad, master, m and v and writes master, m, v and
// (optionally) param_out once (26 to 30 bytes for 8 to 10 flops). Each thread handles 4
// consecutive elements per iteration of a grid-stride loop with 16-byte loads and stores
// of the fp32 rows (8 or 16 bytes for grad and param_out); the few elements before the
// first 16-byte boundary of `master` and after the last full group of 4 go through a
// scalar loop, and so does everything when the buffers are not mutually aligned.
//
// Bit-for-bit, the per-element math follows ATen's adam_math (see fused_adam.h): the
// same fp32 operations in the same order with the same explicit fmas, so that the
// compiler's contraction choices match too (the one product ATen has as a division,
// the gradient scaling, is an unfusable __fmul_rn here). The per-launch scalars ATen derives on the
// device in fp32 (lr * weight_decay, lr / bias_correction1, sqrt(bias_correction2)) are
// derived here on the host in fp32 with the same correctly rounded operations.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/fused_adam.h"
#include "kernels/common.cuh"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace zt::kernels {

bool kernels_available() { return true; }

namespace {

constexpr const char* kName = "fused_adam";  // in error messages
using detail::aligned;
using detail::cached_per_device;
using detail::DTypeName;
using detail::from_float;
using detail::kMaxCachedDevices;
using detail::resident_grids;
using detail::sm_count;
using detail::streaming_grid;
using detail::to_float;

constexpr int kThreads = 256;
constexpr int kVec = 4;         // elements per thread per iteration
// kVec elements of T loaded or stored as one access (16 bytes for fp32, 8 for 16-bit types).
template <typename T>
using Pack = detail::Pack<T, kVec>;
constexpr int kBlocksPerSm = 8;  // ZT_KERNEL_GRID=resident's cap: 8 x 256 = 2048 threads, an SM's maximum on sm_80 and sm_90

struct NoOut {};  // param_out == nullptr: nothing is written

// The output dtype's name in error messages ("none" without param_out).
template <typename P>
constexpr const char* out_name() {
  if constexpr (std::is_same_v<P, NoOut>) {
    return "none";
  } else {
    return DTypeName<P>::value;
  }
}

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& x) {
  *reinterpret_cast<Pack<T>*>(p) = x;
}

// Per-launch fp32 scalars.
struct Scalars {
  float beta1, beta2, eps, weight_decay;
  float lr_wd;      // lr * weight_decay, as ATen's `lr * weight_decay * param` rounds it
  float step_size;  // lr / bias_correction1
  float bc2_sqrt;   // sqrt(bias_correction2)
};

template <typename G, typename P>
struct Buffers {
  float* __restrict__ master;
  float* __restrict__ exp_avg;
  float* __restrict__ exp_avg_sq;
  const G* __restrict__ grad;
  P* __restrict__ out;  // unused when P is NoOut
  const float* grad_scale;
  const float* found_inf;
};

// One element, in fp32 registers, in ATen's order (fused_adam_utils.cuh, adam_math).
template <bool kAdamW>
__device__ __forceinline__ void adam_update(float& p, float& m, float& v, float g, float scale, const Scalars& s) {
  // ATen divides by its scale, which nothing can fuse; __fmul_rn keeps this product out
  // of an fma with the weight-decay term below too (scale is 1 without grad_scale).
  g = __fmul_rn(g, scale);
  if (s.weight_decay != 0.f) {
    if constexpr (kAdamW) {
      p -= s.lr_wd * p;
    } else {
      g += p * s.weight_decay;
    }
  }
  m = fmaf(s.beta1, m, fmaf(-s.beta1, g, g));
  const float g2 = g * g;
  v = fmaf(s.beta2, v, fmaf(-s.beta2, g2, g2));
  const float denom = (sqrtf(v) / s.bc2_sqrt) + s.eps;
  p -= s.step_size * m / denom;
}

// Elements [0, vec_begin) and [vec_begin + kVec * nvec, n) take the scalar loop; the
// nvec groups of kVec in between take the vectorized one. Grid-stride in both.
template <typename G, typename P, bool kAdamW>
__global__ void __launch_bounds__(kThreads)
    fused_adam_kernel(Buffers<G, P> b, Scalars s, int64_t n, int64_t vec_begin, int64_t nvec) {
  __shared__ float block_flags[2];  // {found_inf, grad_scale}, read once per block
  if (threadIdx.x == 0) {
    block_flags[0] = b.found_inf != nullptr ? *b.found_inf : 0.f;
    block_flags[1] = b.grad_scale != nullptr ? *b.grad_scale : 1.f;
  }
  __syncthreads();
  if (block_flags[0] != 0.f) return;  // skipped step: touch nothing
  const float scale = block_flags[1];

  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  // Two groups per thread per trip, every load issued before any math: twice the bytes in
  // flight (the loop is bound by memory; each element's arithmetic is unchanged).
  int64_t i = tid;
  for (; i + stride < nvec; i += 2 * stride) {
    const int64_t e0 = vec_begin + i * kVec, e1 = vec_begin + (i + stride) * kVec;
    Pack<float> p0 = load_pack(b.master + e0), p1 = load_pack(b.master + e1);
    Pack<float> m0 = load_pack(b.exp_avg + e0), m1 = load_pack(b.exp_avg + e1);
    Pack<float> v0 = load_pack(b.exp_avg_sq + e0), v1 = load_pack(b.exp_avg_sq + e1);
    const Pack<G> g0 = load_pack(b.grad + e0), g1 = load_pack(b.grad + e1);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      adam_update<kAdamW>(p0.v[k], m0.v[k], v0.v[k], to_float(g0.v[k]), scale, s);
      adam_update<kAdamW>(p1.v[k], m1.v[k], v1.v[k], to_float(g1.v[k]), scale, s);
    }
    store_pack(b.master + e0, p0);
    store_pack(b.master + e1, p1);
    store_pack(b.exp_avg + e0, m0);
    store_pack(b.exp_avg + e1, m1);
    store_pack(b.exp_avg_sq + e0, v0);
    store_pack(b.exp_avg_sq + e1, v1);
    if constexpr (!std::is_same_v<P, NoOut>) {
      Pack<P> o0, o1;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        o0.v[k] = from_float<P>(p0.v[k]);
        o1.v[k] = from_float<P>(p1.v[k]);
      }
      store_pack(b.out + e0, o0);
      store_pack(b.out + e1, o1);
    }
  }
  for (; i < nvec; i += stride) {
    const int64_t e = vec_begin + i * kVec;
    Pack<float> p = load_pack(b.master + e);
    Pack<float> m = load_pack(b.exp_avg + e);
    Pack<float> v = load_pack(b.exp_avg_sq + e);
    const Pack<G> g = load_pack(b.grad + e);
#pragma unroll
    for (int k = 0; k < kVec; ++k) adam_update<kAdamW>(p.v[k], m.v[k], v.v[k], to_float(g.v[k]), scale, s);
    store_pack(b.master + e, p);
    store_pack(b.exp_avg + e, m);
    store_pack(b.exp_avg_sq + e, v);
    if constexpr (!std::is_same_v<P, NoOut>) {
      Pack<P> o;
#pragma unroll
      for (int k = 0; k < kVec; ++k) o.v[k] = from_float<P>(p.v[k]);
      store_pack(b.out + e, o);
    }
  }

  const int64_t vec_end = vec_begin + nvec * kVec;
  const int64_t n_scalar = vec_begin + (n - vec_end);
  for (int64_t j = tid; j < n_scalar; j += stride) {
    const int64_t e = j < vec_begin ? j : vec_end + (j - vec_begin);
    float p = b.master[e], m = b.exp_avg[e], v = b.exp_avg_sq[e];
    adam_update<kAdamW>(p, m, v, to_float(b.grad[e]), scale, s);
    b.master[e] = p;
    b.exp_avg[e] = m;
    b.exp_avg_sq[e] = v;
    if constexpr (!std::is_same_v<P, NoOut>) b.out[e] = from_float<P>(p);
  }
}

void check(cudaError_t rc, const char* what) { detail::check(rc, kName, what); }

template <typename G, typename P, bool kAdamW>
void launch(const AdamArgs& a, cudaStream_t stream) {
  Buffers<G, P> b{a.master,
                  a.exp_avg,
                  a.exp_avg_sq,
                  static_cast<const G*>(a.grad),
                  std::is_same_v<P, NoOut> ? nullptr : static_cast<P*>(a.param_out),
                  a.grad_scale,
                  a.found_inf};

  Scalars s{};
  s.beta1 = a.beta1;
  s.beta2 = a.beta2;
  s.eps = a.eps;
  s.weight_decay = a.weight_decay;
  s.lr_wd = a.lr * a.weight_decay;
  s.step_size = a.lr / a.bias_correction1;
  s.bc2_sqrt = std::sqrt(a.bias_correction2);

  // Vectorize from the first element where master is 16-byte aligned, if every other
  // buffer is aligned to its own pack size at that same element.
  const int64_t n = a.n;
  int64_t vec_begin = n, nvec = 0;
  const auto addr = reinterpret_cast<std::uintptr_t>(a.master);
  if (addr % sizeof(float) == 0) {
    const int64_t head = std::min<int64_t>(n, static_cast<int64_t>((16 - addr % 16) % 16 / sizeof(float)));
    bool ok = aligned(b.exp_avg + head, 16) && aligned(b.exp_avg_sq + head, 16) &&
              aligned(b.grad + head, sizeof(Pack<G>));
    if constexpr (!std::is_same_v<P, NoOut>) ok = ok && aligned(b.out + head, sizeof(Pack<P>));
    if (ok && (n - head) / kVec > 0) {
      vec_begin = head;
      nvec = (n - head) / kVec;
    }
  }
  const int64_t n_scalar = n - nvec * kVec;
  const int64_t work = std::max(nvec, n_scalar);
  // Grid: one group of kVec (or one scalar element) per thread ([Streaming Grids],
  // common.cuh); under ZT_KERNEL_GRID=resident at most the blocks resident at once (up to
  // kBlocksPerSm per SM), each thread looping.
  int64_t resident_cap = 0;
  if (resident_grids()) {
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    static std::atomic<int> resident_cache[kMaxCachedDevices];  // one per instantiation
    const int per_sm = cached_per_device(resident_cache, dev, [] {
      int nb = 0;
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fused_adam_kernel<G, P, kAdamW>, kThreads, 0),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      return nb;
    });
    resident_cap = static_cast<int64_t>(sm_count(dev, kName)) * std::min(per_sm, kBlocksPerSm);
  }
  const int64_t blocks = streaming_grid(work, kThreads, resident_cap);

  fused_adam_kernel<G, P, kAdamW><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(b, s, n, vec_begin, nvec);
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    throw std::runtime_error(std::string("zt::kernels::fused_adam_kernel<grad=") + DTypeName<G>::value +
                             ", param_out=" + out_name<P>() + (kAdamW ? ", adamw" : ", adam") +
                             "> launch failed for n=" + std::to_string(n) + " (" + std::to_string(blocks) +
                             " blocks of " + std::to_string(kThreads) + "): " + cudaGetErrorString(rc));
  }
}

template <typename G, typename P>
void dispatch_mode(const AdamArgs& a, cudaStream_t stream) {
  if (a.adamw) {
    launch<G, P, true>(a, stream);
  } else {
    launch<G, P, false>(a, stream);
  }
}

template <typename G>
void dispatch_out(const AdamArgs& a, cudaStream_t stream) {
  if (a.param_out == nullptr) return dispatch_mode<G, NoOut>(a, stream);
  switch (a.param_type) {
    case DType::kF32: return dispatch_mode<G, float>(a, stream);
    case DType::kBF16: return dispatch_mode<G, __nv_bfloat16>(a, stream);
    case DType::kF16: return dispatch_mode<G, __half>(a, stream);
  }
  throw std::invalid_argument("zt::kernels::fused_adam: unknown param_type " +
                              std::to_string(static_cast<int>(a.param_type)));
}

}  // namespace

void fused_adam(const AdamArgs& a, cudaStream_t stream) {
  if (a.n < 0) throw std::invalid_argument("zt::kernels::fused_adam: n=" + std::to_string(a.n) + " < 0");
  if (a.n == 0) return;
  if (a.master == nullptr || a.exp_avg == nullptr || a.exp_avg_sq == nullptr || a.grad == nullptr) {
    throw std::invalid_argument("zt::kernels::fused_adam: master, exp_avg, exp_avg_sq and grad must be non-null (n=" +
                                std::to_string(a.n) + ")");
  }
  switch (a.grad_type) {
    case DType::kF32: return dispatch_out<float>(a, stream);
    case DType::kBF16: return dispatch_out<__nv_bfloat16>(a, stream);
    case DType::kF16: return dispatch_out<__half>(a, stream);
  }
  throw std::invalid_argument("zt::kernels::fused_adam: unknown grad_type " +
                              std::to_string(static_cast<int>(a.grad_type)));
}

}  // namespace zt::kernels
