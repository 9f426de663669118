// A standalone probe (no torch, no repo headers) of how fast zerotrain's fused AdamW kernel
// (src/kernels/fused_adam.cu) moves its bytes on one GPU, at the Llama-3.2-1B step's shape:
// n = 1,236,000,000 elements split into 25 contiguous segments (one launch per gradient
// bucket, as DeviceStep::kernel_step does), bf16 gradient, fp32 master/exp_avg/exp_avg_sq,
// bf16 param_out, AdamW with weight decay, a grad_scale pointer (the clip coefficient).
// 28 bytes per element: read 4+4+4+2, write 4+4+4+2.
//
// Variant A is fused_adam.cu's kernel and launcher logic copied verbatim (bf16 grad, bf16
// out, AdamW instantiation); every other Adam variant shares its per-element adam_update
// (copied verbatim too) and differs only in how bytes are loaded and stored, how many
// groups a thread takes per trip, and the grid. Each Adam variant is checked bitwise against
// A on identical inputs (one step); G/G2 are byte-moving rooflines (no Adam math).
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90 scripts/device/adam_bw.cu -o /tmp/adam_bw
// Run:   /tmp/adam_bw [--n N] [--segments S] [--reps R] [--warmup W] [--rounds K]
//                     [--scale X] [--no-check] [--json PATH]
// Prints one line per variant (median over rounds of ms per step of S launches, effective
// TB/s at 28 B/element, ratio to A, blocks, registers, bitwise equality to A) and writes
// JSON to PATH (default $OUT/adam_bw.json when OUT is set, else /tmp/adam_bw.json).
// Driven by scripts/device/adam_bw.sh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#define CK(x) ck((x), #x, __LINE__)
static void ck(cudaError_t rc, const char* what, int line) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "adam_bw: %s (line %d): %s\n", what, line, cudaGetErrorString(rc));
    std::exit(1);
  }
}

namespace {

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------------------
// Copied from src/kernels/common.cuh (only what the bf16 kernels use).
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <typename T, int N>
struct alignas(sizeof(T) * N) PackN {  // detail::Pack in common.cuh
  T v[N];
};

// ---------------------------------------------------------------------------------------
// Copied from src/kernels/fused_adam.cu.
constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
struct NoOut {};

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

// One element, in fp32 registers, in ATen's order (fused_adam_utils.cuh, adam_math). VERBATIM.
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

namespace orig {  // variant A: fused_adam_kernel as in fused_adam.cu
constexpr int kVec = 4;
template <typename T>
using Pack = PackN<T, kVec>;
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& x) {
  *reinterpret_cast<Pack<T>*>(p) = x;
}

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
}  // namespace orig

// ---------------------------------------------------------------------------------------
// The generic variant kernel: A's structure with knobs. Only bf16 grad, bf16 out, AdamW.
using Buf = Buffers<bf16, bf16>;
using KernelFn = void (*)(Buf, Scalars, int64_t, int64_t, int64_t);

enum Ld : int { kLdPlain = 0, kLdCs, kLdNc, kLdNcNa, kLdLu };  // default, .cs, .nc (__ldg), .nc.L1::no_allocate, .lu
enum St : int { kStPlain = 0, kStCs, kStWb };  // default, .cs, __stwb (.wb: the default, forces the vector store)

template <int K>
__device__ __forceinline__ float4 ld_f4(const float* p) {
  const float4* q = reinterpret_cast<const float4*>(p);
  if constexpr (K == kLdPlain) {
    return *q;
  } else if constexpr (K == kLdCs) {
    return __ldcs(q);
  } else if constexpr (K == kLdNc) {
    return __ldg(q);
  } else if constexpr (K == kLdLu) {
    return __ldlu(q);
  } else {
    float4 r;
    asm("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
        : "l"(q));
    return r;
  }
}
template <int K>
__device__ __forceinline__ uint2 ld_u2(const void* p) {
  const uint2* q = reinterpret_cast<const uint2*>(p);
  if constexpr (K == kLdPlain) {
    return *q;
  } else if constexpr (K == kLdCs) {
    return __ldcs(q);
  } else if constexpr (K == kLdNc) {
    return __ldg(q);
  } else if constexpr (K == kLdLu) {
    return __ldlu(q);
  } else {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(q));
    return r;
  }
}
template <int K>
__device__ __forceinline__ uint4 ld_u4(const void* p) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
  if constexpr (K == kLdPlain) {
    return *q;
  } else if constexpr (K == kLdCs) {
    return __ldcs(q);
  } else if constexpr (K == kLdNc) {
    return __ldg(q);
  } else if constexpr (K == kLdLu) {
    return __ldlu(q);
  } else {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(q));
    return r;
  }
}
template <int K>
__device__ __forceinline__ void st_f4(float* p, float4 x) {
  if constexpr (K == kStPlain) {
    *reinterpret_cast<float4*>(p) = x;
  } else if constexpr (K == kStWb) {
    __stwb(reinterpret_cast<float4*>(p), x);
  } else {
    __stcs(reinterpret_cast<float4*>(p), x);
  }
}
template <int K>
__device__ __forceinline__ void st_u2(void* p, uint2 x) {
  if constexpr (K == kStPlain) {
    *reinterpret_cast<uint2*>(p) = x;
  } else if constexpr (K == kStWb) {
    __stwb(reinterpret_cast<uint2*>(p), x);
  } else {
    __stcs(reinterpret_cast<uint2*>(p), x);
  }
}
template <int K>
__device__ __forceinline__ void st_u4(void* p, uint4 x) {
  if constexpr (K == kStPlain) {
    *reinterpret_cast<uint4*>(p) = x;
  } else if constexpr (K == kStWb) {
    __stwb(reinterpret_cast<uint4*>(p), x);
  } else {
    __stcs(reinterpret_cast<uint4*>(p), x);
  }
}

// V consecutive fp32 (V = 4: one 16-byte access; V = 8: two) or bf16 (8 or 16 bytes).
template <int V, int K>
__device__ __forceinline__ void ld_f32(PackN<float, V>& d, const float* p) {
#pragma unroll
  for (int j = 0; j < V / 4; ++j) {
    const float4 t = ld_f4<K>(p + 4 * j);
    d.v[4 * j] = t.x;
    d.v[4 * j + 1] = t.y;
    d.v[4 * j + 2] = t.z;
    d.v[4 * j + 3] = t.w;
  }
}
template <int V, int K>
__device__ __forceinline__ void st_f32(float* p, const PackN<float, V>& d) {
#pragma unroll
  for (int j = 0; j < V / 4; ++j) st_f4<K>(p + 4 * j, make_float4(d.v[4 * j], d.v[4 * j + 1], d.v[4 * j + 2], d.v[4 * j + 3]));
}
template <int V, int K>
__device__ __forceinline__ void ld_b16(PackN<bf16, V>& d, const bf16* p) {
  static_assert(V == 4 || V == 8, "V");
  if constexpr (V == 4) {
    *reinterpret_cast<uint2*>(&d) = ld_u2<K>(p);
  } else {
    *reinterpret_cast<uint4*>(&d) = ld_u4<K>(p);
  }
}
template <int V, int K>
__device__ __forceinline__ void st_b16(bf16* p, const PackN<bf16, V>& d) {
  if constexpr (V == 4) {
    st_u2<K>(p, *reinterpret_cast<const uint2*>(&d));
  } else {
    st_u4<K>(p, *reinterpret_cast<const uint4*>(&d));
  }
}

// kV elements per group, kU groups per trip (stride apart, all loads before any math, as A),
// load kinds for the fp32 rows (kLF) and the gradient (kLG), store kind (kS) for all four
// outputs, kPre: the next trip's loads issued before this trip's math (kU = 1), kTriv: no
// Adam math (the streaming roofline G: p += g, m += g, v += g * g (stays positive), out = bf16(p)).
template <int V, int U, int LF, int LG, int S, bool Pre, bool Triv>
struct Cfg {
  static constexpr int kV = V, kU = U, kLF = LF, kLG = LG, kS = S;
  static constexpr bool kPre = Pre, kTriv = Triv;
};

template <class C>
__device__ __forceinline__ void load_group(const Buf& b, int64_t e, PackN<float, C::kV>& p, PackN<float, C::kV>& m,
                                           PackN<float, C::kV>& v, PackN<bf16, C::kV>& g) {
  ld_f32<C::kV, C::kLF>(p, b.master + e);
  ld_f32<C::kV, C::kLF>(m, b.exp_avg + e);
  ld_f32<C::kV, C::kLF>(v, b.exp_avg_sq + e);
  ld_b16<C::kV, C::kLG>(g, b.grad + e);
}

template <class C>
__device__ __forceinline__ void update_store_group(const Buf& b, const Scalars& s, float scale, int64_t e,
                                                   PackN<float, C::kV>& p, PackN<float, C::kV>& m,
                                                   PackN<float, C::kV>& v, const PackN<bf16, C::kV>& g) {
#pragma unroll
  for (int k = 0; k < C::kV; ++k) {
    if constexpr (C::kTriv) {
      const float gf = to_float(g.v[k]);
      p.v[k] += gf;
      m.v[k] += gf;
      v.v[k] += gf * gf;
    } else {
      adam_update<true>(p.v[k], m.v[k], v.v[k], to_float(g.v[k]), scale, s);
    }
  }
  st_f32<C::kV, C::kS>(b.master + e, p);
  st_f32<C::kV, C::kS>(b.exp_avg + e, m);
  st_f32<C::kV, C::kS>(b.exp_avg_sq + e, v);
  PackN<bf16, C::kV> o;
#pragma unroll
  for (int k = 0; k < C::kV; ++k) o.v[k] = from_float<bf16>(p.v[k]);
  st_b16<C::kV, C::kS>(b.out + e, o);
}

template <class C>
__device__ __forceinline__ void generic_body(const Buf& b, const Scalars& s, int64_t n, int64_t vec_begin, int64_t nvec) {
  constexpr int V = C::kV, U = C::kU;
  __shared__ float block_flags[2];
  if (threadIdx.x == 0) {
    block_flags[0] = b.found_inf != nullptr ? *b.found_inf : 0.f;
    block_flags[1] = b.grad_scale != nullptr ? *b.grad_scale : 1.f;
  }
  __syncthreads();
  if (block_flags[0] != 0.f) return;
  const float scale = block_flags[1];

  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t i = tid;
  if constexpr (C::kPre) {
    static_assert(U == 1, "prefetch takes one group per trip");
    PackN<float, V> p, m, v;
    PackN<bf16, V> g;
    if (i < nvec) load_group<C>(b, vec_begin + i * V, p, m, v, g);
    while (i < nvec) {
      const int64_t nx = i + stride;
      PackN<float, V> pn, mn, vn;
      PackN<bf16, V> gn;
      if (nx < nvec) load_group<C>(b, vec_begin + nx * V, pn, mn, vn, gn);
      update_store_group<C>(b, s, scale, vec_begin + i * V, p, m, v, g);
      p = pn;
      m = mn;
      v = vn;
      g = gn;
      i = nx;
    }
  } else {
    for (; i + (U - 1) * stride < nvec; i += U * stride) {
      PackN<float, V> p[U], m[U], v[U];
      PackN<bf16, V> g[U];
      int64_t e[U];
#pragma unroll
      for (int u = 0; u < U; ++u) e[u] = vec_begin + (i + u * stride) * V;
      // A's order: every master load, then m, v, grad; math interleaved; stores row by row.
#pragma unroll
      for (int u = 0; u < U; ++u) ld_f32<V, C::kLF>(p[u], b.master + e[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) ld_f32<V, C::kLF>(m[u], b.exp_avg + e[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) ld_f32<V, C::kLF>(v[u], b.exp_avg_sq + e[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) ld_b16<V, C::kLG>(g[u], b.grad + e[u]);
#pragma unroll
      for (int k = 0; k < V; ++k) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if constexpr (C::kTriv) {
            const float gf = to_float(g[u].v[k]);
            p[u].v[k] += gf;
            m[u].v[k] += gf;
            v[u].v[k] += gf * gf;
          } else {
            adam_update<true>(p[u].v[k], m[u].v[k], v[u].v[k], to_float(g[u].v[k]), scale, s);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) st_f32<V, C::kS>(b.master + e[u], p[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) st_f32<V, C::kS>(b.exp_avg + e[u], m[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) st_f32<V, C::kS>(b.exp_avg_sq + e[u], v[u]);
      PackN<bf16, V> o[U];
#pragma unroll
      for (int k = 0; k < V; ++k) {
#pragma unroll
        for (int u = 0; u < U; ++u) o[u].v[k] = from_float<bf16>(p[u].v[k]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) st_b16<V, C::kS>(b.out + e[u], o[u]);
    }
    if constexpr (U > 1) {
      for (; i < nvec; i += stride) {
        const int64_t e = vec_begin + i * V;
        PackN<float, V> p, m, v;
        PackN<bf16, V> g;
        load_group<C>(b, e, p, m, v, g);
        update_store_group<C>(b, s, scale, e, p, m, v, g);
      }
    }
  }

  // The scalar head/tail, as A (empty or nearly so here: segments start 64-element aligned).
  const int64_t vec_end = vec_begin + nvec * V;
  const int64_t n_scalar = vec_begin + (n - vec_end);
  for (int64_t j = tid; j < n_scalar; j += stride) {
    const int64_t e = j < vec_begin ? j : vec_end + (j - vec_begin);
    float p = b.master[e], m = b.exp_avg[e], v = b.exp_avg_sq[e];
    if constexpr (C::kTriv) {
      const float gf = to_float(b.grad[e]);
      p += gf;
      m += gf;
      v += gf * gf;
    } else {
      adam_update<true>(p, m, v, to_float(b.grad[e]), scale, s);
    }
    b.master[e] = p;
    b.exp_avg[e] = m;
    b.exp_avg_sq[e] = v;
    b.out[e] = from_float<bf16>(p);
  }
}

template <class C>
__global__ void __launch_bounds__(kThreads) gen_kernel(Buf b, Scalars s, int64_t n, int64_t vec_begin, int64_t nvec) {
  generic_body<C>(b, s, n, vec_begin, nvec);
}
// The same with __launch_bounds__(256, MinB): at most 65536 / (256 MinB) registers (8: 32, 6: 40).
template <class C, int MinB>
__global__ void __launch_bounds__(kThreads, MinB)
    gen_kernel_minb(Buf b, Scalars s, int64_t n, int64_t vec_begin, int64_t nvec) {
  generic_body<C>(b, s, n, vec_begin, nvec);
}

// ---------------------------------------------------------------------------------------
// Inputs, deterministic per element index (same seed: same bits).
__device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float normal01(uint64_t i, uint64_t salt) {  // Box-Muller on a hash
  const uint64_t h = mix64(i * 8 + salt);
  const float u1 = (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
  const float u2 = static_cast<float>((h >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}
__global__ void init_kernel(float* master, float* m, float* v, bf16* grad, bf16* out, int64_t n, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t k = i ^ (seed << 40);
    master[i] = 0.02f * normal01(k, 1);
    m[i] = 1e-4f * normal01(k, 2);
    const float t = 1e-3f * normal01(k, 3);
    v[i] = t * t + 1e-12f;  // positive
    grad[i] = __float2bfloat16_rn(1e-3f * normal01(k, 4));
    out[i] = __float2bfloat16_rn(0.f);
  }
}

// Counts elements of a and b whose bits differ.
template <typename T>
__global__ void count_diff(const T* a, const T* b, int64_t n, unsigned long long* count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned long long c = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) c += a[i] != b[i];
  if (c) atomicAdd(count, c);
}

// ---------------------------------------------------------------------------------------
// Host.
struct Options {
  int64_t n = 1236000000;
  int segments = 25;
  int reps = 10;
  int warmup = 2;
  int rounds = 3;
  float scale = 0.7f;  // *grad_scale (the clip coefficient); < 0: no grad_scale pointer
  bool check = true;
  std::string json;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr,
               "adam_bw: %s\nusage: adam_bw [--n N] [--segments S] [--reps R] [--warmup W] [--rounds K] "
               "[--scale X] [--no-check] [--json PATH]\n",
               msg.c_str());
  std::exit(2);
}

int64_t parse_int(const char* flag, const char* text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  double d = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno == 0 && end != text && *end == '\0') {
    d = static_cast<double>(v);
  } else {  // also accept 1.236e9
    errno = 0;
    d = std::strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || d != std::floor(d)) {
      usage_error(std::string(flag) + " wants an integer, got '" + text + "'");
    }
  }
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
    usage_error(std::string(flag) + " = " + text + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "]");
  }
  return v == static_cast<long long>(d) ? static_cast<int64_t>(v) : static_cast<int64_t>(d);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int a = 1; a < argc; ++a) {
    const std::string f = argv[a];
    auto value = [&]() -> const char* {
      if (a + 1 >= argc) usage_error(f + " needs a value");
      return argv[++a];
    };
    if (f == "--n") {
      o.n = parse_int("--n", value(), 1, int64_t{1} << 40);
    } else if (f == "--segments") {
      o.segments = static_cast<int>(parse_int("--segments", value(), 1, 100000));
    } else if (f == "--reps") {
      o.reps = static_cast<int>(parse_int("--reps", value(), 1, 100000));
    } else if (f == "--warmup") {
      o.warmup = static_cast<int>(parse_int("--warmup", value(), 0, 100000));
    } else if (f == "--rounds") {
      o.rounds = static_cast<int>(parse_int("--rounds", value(), 1, 1000));
    } else if (f == "--scale") {
      const char* t = value();
      char* end = nullptr;
      errno = 0;
      o.scale = std::strtof(t, &end);
      if (errno != 0 || end == t || *end != '\0' || !std::isfinite(o.scale)) {
        usage_error(std::string("--scale wants a number, got '") + t + "'");
      }
    } else if (f == "--no-check") {
      o.check = false;
    } else if (f == "--json") {
      o.json = value();
    } else if (f == "--help" || f == "-h") {
      usage_error("help");
    } else {
      usage_error("unknown argument '" + f + "'");
    }
  }
  if (o.n / o.segments < 64) {
    usage_error("--n " + std::to_string(o.n) + " over --segments " + std::to_string(o.segments) +
                " gives segments under 64 elements; lower --segments or raise --n");
  }
  if (o.json.empty()) {
    const char* out = std::getenv("OUT");
    o.json = (out != nullptr && *out != '\0') ? std::string(out) + "/adam_bw.json" : "/tmp/adam_bw.json";
  }
  return o;
}

enum class Grid { kResident, kPerGroup };
enum class Kind { kKernel, kMemcpy };

struct Variant {
  std::string name, desc;
  Kind kind = Kind::kKernel;
  KernelFn fn = nullptr;
  int vec = 4;        // elements per group (alignment and nvec)
  Grid grid = Grid::kResident;
  int factor = 1;     // x resident blocks
  bool single = false;  // one launch over all n instead of one per segment
  bool compare = true;  // Adam math: bitwise comparable with A
  // filled in
  int regs = 0, local_bytes = 0, occ = 0;
  int64_t blocks0 = 0;  // blocks of the first launch
  std::vector<double> ms;
  int equal = -1;  // 1 yes, 0 no, -1 n/a
  unsigned long long diff[4] = {0, 0, 0, 0};
};

struct Launch {
  int64_t at, n, vec_begin, nvec, blocks;
};

struct Device {
  float *master, *m, *v;
  bf16 *grad, *out;
  float *rmaster = nullptr, *rm = nullptr, *rv = nullptr;
  bf16* rout = nullptr;
  float* scale = nullptr;  // device scalar or nullptr
  int sms = 0;
};

bool aligned(const void* p, size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

// fused_adam.cu's launch(): vectorize from master's first 16-byte boundary if every other
// buffer is aligned to its own pack at that element; grid = resident blocks (<= 8 per SM).
Launch plan(const Device& d, const Variant& var, int64_t at, int64_t n) {
  Launch l{at, n, n, 0, 1};
  const float* master = d.master + at;
  const auto addr = reinterpret_cast<std::uintptr_t>(master);
  const size_t gpack = sizeof(bf16) * var.vec;  // 8 or 16 bytes
  if (addr % sizeof(float) == 0) {
    const int64_t head = std::min<int64_t>(n, static_cast<int64_t>((16 - addr % 16) % 16 / sizeof(float)));
    const bool ok = aligned(d.m + at + head, 16) && aligned(d.v + at + head, 16) &&
                    aligned(d.grad + at + head, gpack) && aligned(d.out + at + head, gpack);
    if (ok && (n - head) / var.vec > 0) {
      l.vec_begin = head;
      l.nvec = (n - head) / var.vec;
    }
  }
  const int64_t n_scalar = n - l.nvec * var.vec;
  const int64_t work = std::max(l.nvec, n_scalar);
  const int64_t want = (work + kThreads - 1) / kThreads;
  if (var.grid == Grid::kPerGroup) {
    l.blocks = std::max<int64_t>(1, want);
  } else {
    const int64_t max_blocks = static_cast<int64_t>(d.sms) * std::min(var.occ, kBlocksPerSm) * var.factor;
    l.blocks = std::max<int64_t>(1, std::min<int64_t>(want, max_blocks));
  }
  if (l.blocks > 0x7fffffff) {
    std::fprintf(stderr, "adam_bw: %s needs %lld blocks (> 2^31-1)\n", var.name.c_str(), (long long)l.blocks);
    std::exit(1);
  }
  return l;
}

void run_step(const Device& d, const Variant& var, const std::vector<Launch>& ls, const Scalars& s) {
  for (const Launch& l : ls) {
    if (var.kind == Kind::kMemcpy) {  // read 14 B, write 14 B per element
      CK(cudaMemcpyAsync(d.rmaster + l.at, d.master + l.at, l.n * sizeof(float), cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(d.rm + l.at, d.m + l.at, l.n * sizeof(float), cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(d.rv + l.at, d.v + l.at, l.n * sizeof(float), cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(d.rout + l.at, d.grad + l.at, l.n * sizeof(bf16), cudaMemcpyDeviceToDevice));
      continue;
    }
    Buf b{d.master + l.at, d.m + l.at, d.v + l.at, d.grad + l.at, d.out + l.at, d.scale, nullptr};
    var.fn<<<static_cast<unsigned>(l.blocks), kThreads>>>(b, s, l.n, l.vec_begin, l.nvec);
  }
}

void init_inputs(const Device& d, int64_t n) {
  init_kernel<<<d.sms * 8, 256>>>(d.master, d.m, d.v, d.grad, d.out, n, 1234);
  CK(cudaGetLastError());
}

template <typename T>
unsigned long long diff_count(const T* a, const T* b, int64_t n, unsigned long long* dcount, int sms) {
  CK(cudaMemset(dcount, 0, sizeof(unsigned long long)));
  count_diff<T><<<sms * 8, 256>>>(a, b, n, dcount);
  CK(cudaGetLastError());
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, dcount, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t k = x.size();
  return k % 2 ? x[k / 2] : 0.5 * (x[k / 2 - 1] + x[k / 2]);
}

std::string json_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);

  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  Device d{};
  d.sms = prop.multiProcessorCount;

  // Variants. Cfg<V, U, load fp32, load grad, store, prefetch, trivial>.
  using CA = Cfg<4, 2, kLdPlain, kLdPlain, kStPlain, false, false>;
  using CB = Cfg<4, 2, kLdCs, kLdCs, kStCs, false, false>;
  using CC = Cfg<4, 2, kLdPlain, kLdNcNa, kStCs, false, false>;
  using CD = Cfg<4, 1, kLdPlain, kLdPlain, kStPlain, false, false>;
  using CF = Cfg<8, 1, kLdPlain, kLdPlain, kStPlain, false, false>;
  using CF2 = Cfg<8, 2, kLdPlain, kLdPlain, kStPlain, false, false>;
  using CG = Cfg<4, 2, kLdPlain, kLdPlain, kStPlain, false, true>;
  using CH2 = Cfg<4, 1, kLdPlain, kLdPlain, kStPlain, true, false>;
  using CH3 = Cfg<4, 4, kLdPlain, kLdPlain, kStWb, false, false>;  // plain stores split into scalars at U = 4
  using CH6 = Cfg<4, 2, kLdLu, kLdLu, kStCs, false, false>;
  using CH7 = Cfg<8, 1, kLdPlain, kLdPlain, kStPlain, true, false>;
  using CH8 = Cfg<4, 1, kLdCs, kLdCs, kStCs, false, false>;

  const KernelFn kA = orig::fused_adam_kernel<bf16, bf16, true>;
  std::vector<Variant> vs;
  auto add = [&](const char* name, const char* desc, KernelFn fn, int vec = 4, Grid grid = Grid::kResident,
                 int factor = 1, bool single = false, bool compare = true) {
    Variant v;
    v.name = name;
    v.desc = desc;
    v.fn = fn;
    v.vec = vec;
    v.grid = grid;
    v.factor = factor;
    v.single = single;
    v.compare = compare;
    vs.push_back(v);
  };
  add("A", "fused_adam.cu's kernel as is (resident grid, kVec 4, 2 groups/trip)", kA);
  add("A'", "generic template at A's settings (control: should equal A)", gen_kernel<CA>);
  add("B", "A, ld.global.cs for all loads, st.global.cs for all stores", gen_kernel<CB>);
  add("C", "A, grad via ld.global.nc.L1::no_allocate, st.global.cs stores", gen_kernel<CC>);
  add("D", "A, one group per trip", gen_kernel<CD>);
  add("E2", "A, grid 2x resident", kA, 4, Grid::kResident, 2);
  add("E4", "A, grid 4x resident", kA, 4, Grid::kResident, 4);
  add("E1", "A, one group per thread (grid = ceil(nvec/256), loop runs once)", kA, 4, Grid::kPerGroup);
  add("F", "kVec 8 (two 16 B loads per fp32 row), one group per trip", gen_kernel<CF>, 8);
  add("F2", "kVec 8, two groups per trip", gen_kernel<CF2>, 8);
  add("G", "roofline: A's loop, 14 B read + 14 B written, trivial math", gen_kernel<CG>, 4, Grid::kResident, 1, false,
      false);
  {
    Variant v;
    v.name = "G2";
    v.desc = "roofline: cudaMemcpyAsync D2D of 14 B/element (4 copies per segment)";
    v.kind = Kind::kMemcpy;
    v.compare = false;
    vs.push_back(v);
  }
  add("H1", "A + __launch_bounds__(256, 8) (<= 32 registers: spills)", gen_kernel_minb<CA, 8>);
  add("H1b", "A + __launch_bounds__(256, 6) (<= 40 registers)", gen_kernel_minb<CA, 6>);
  add("H2", "one group per trip, next trip's loads issued before this trip's math", gen_kernel<CH2>);
  add("H3", "four groups per trip (stores via __stwb to keep them 16 B)", gen_kernel<CH3>);
  add("H4", "A, one launch over all n (not one per segment)", kA, 4, Grid::kResident, 1, true);
  add("H5", "B + __launch_bounds__(256, 6)", gen_kernel_minb<CB, 6>);
  add("H6", "A, ld.global.lu loads, st.global.cs stores", gen_kernel<CH6>);
  add("H7", "kVec 8, one group per trip, next trip prefetched", gen_kernel<CH7>, 8);
  add("H8", "D with .cs loads and stores, one group per thread (grid = ceil(nvec/256))", gen_kernel<CH8>, 4,
      Grid::kPerGroup);
  add("H9", "H2 + __launch_bounds__(256, 6)", gen_kernel_minb<CH2, 6>);

  for (Variant& v : vs) {
    if (v.kind != Kind::kKernel) continue;
    cudaFuncAttributes attr{};
    CK(cudaFuncGetAttributes(&attr, v.fn));
    v.regs = attr.numRegs;
    v.local_bytes = static_cast<int>(attr.localSizeBytes);
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v.occ, v.fn, kThreads, 0));
    v.occ = std::max(1, v.occ);
  }

  // Memory: the state (16 B/element), and for the check and G2 a second copy of the outputs (14 B).
  const int64_t n = o.n;
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  const double state_b = 16.0 * n, ref_b = 14.0 * n, slack = 1.0 * (1 << 30);
  if (state_b + slack > free_b) {
    std::fprintf(stderr, "adam_bw: --n %lld needs %.1f GB for the state, %.1f GB free; lower --n\n", (long long)n,
                 state_b / 1e9, free_b / 1e9);
    return 1;
  }
  const bool have_ref = state_b + ref_b + slack <= free_b;
  CK(cudaMalloc(&d.master, n * sizeof(float)));
  CK(cudaMalloc(&d.m, n * sizeof(float)));
  CK(cudaMalloc(&d.v, n * sizeof(float)));
  CK(cudaMalloc(&d.grad, n * sizeof(bf16)));
  CK(cudaMalloc(&d.out, n * sizeof(bf16)));
  if (have_ref) {
    CK(cudaMalloc(&d.rmaster, n * sizeof(float)));
    CK(cudaMalloc(&d.rm, n * sizeof(float)));
    CK(cudaMalloc(&d.rv, n * sizeof(float)));
    CK(cudaMalloc(&d.rout, n * sizeof(bf16)));
  } else {
    std::printf("note: %.1f GB free is too little for the reference copy (%.1f GB more): no bitwise check, no G2\n",
                free_b / 1e9, ref_b / 1e9);
  }
  float* dscale = nullptr;
  CK(cudaMalloc(&dscale, sizeof(float)));
  CK(cudaMemcpy(dscale, &o.scale, sizeof(float), cudaMemcpyHostToDevice));
  d.scale = o.scale >= 0.f ? dscale : nullptr;
  unsigned long long* dcount = nullptr;
  CK(cudaMalloc(&dcount, sizeof(unsigned long long)));

  // Scalars as fused_adam.cu's launch() derives them from DeviceStep's AdamArgs (step 100).
  const double beta1 = 0.9, beta2 = 0.95, step = 100;
  const float lr = 3e-4f, wd = 0.1f;
  const float bc1 = static_cast<float>(1.0 - std::pow(beta1, step));
  const float bc2 = static_cast<float>(1.0 - std::pow(beta2, step));
  Scalars s{};
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = 1e-8f;
  s.weight_decay = wd;
  s.lr_wd = lr * wd;
  s.step_size = lr / bc1;
  s.bc2_sqrt = std::sqrt(bc2);

  // Segments: S contiguous pieces of about n / S elements, starts rounded down to 64.
  std::vector<std::pair<int64_t, int64_t>> segs;  // (at, len)
  {
    int64_t prev = 0;
    for (int k = 1; k <= o.segments; ++k) {
      const int64_t end = k == o.segments ? n : (static_cast<int64_t>(k) * n / o.segments) & ~int64_t{63};
      segs.emplace_back(prev, end - prev);
      prev = end;
    }
  }
  std::vector<std::vector<Launch>> plans(vs.size());
  bool all_vec = true;
  for (size_t i = 0; i < vs.size(); ++i) {
    if (vs[i].single) {
      plans[i].push_back(plan(d, vs[i], 0, n));
    } else {
      for (auto [at, len] : segs) plans[i].push_back(plan(d, vs[i], at, len));
    }
    for (const Launch& l : plans[i]) all_vec = all_vec && l.n - l.nvec * vs[i].vec < vs[i].vec + 4;
    vs[i].blocks0 = plans[i][0].blocks;
  }

  std::printf("device: %s, %d SMs, %.1f GB\n", prop.name, d.sms, prop.totalGlobalMem / 1e9);
  std::printf("n = %lld elements in %zu launches per step (segment 0: %lld elements), %d reps x %d rounds after %d "
              "warm-up steps; grad_scale %s; 28 B/element = %.2f GB per step\n",
              (long long)n, segs.size(), (long long)segs[0].second, o.reps, o.rounds, o.warmup,
              d.scale ? std::to_string(o.scale).c_str() : "none", 28.0 * n / 1e9);
  if (!all_vec) std::printf("WARNING: some launch left more than a few elements to the scalar path\n");

  // Bitwise check: identical inputs, one step each, all four outputs against A's.
  if (o.check && have_ref) {
    init_inputs(d, n);
    run_step(d, vs[0], plans[0], s);
    CK(cudaGetLastError());
    CK(cudaMemcpy(d.rmaster, d.master, n * sizeof(float), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d.rm, d.m, n * sizeof(float), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d.rv, d.v, n * sizeof(float), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(d.rout, d.out, n * sizeof(bf16), cudaMemcpyDeviceToDevice));
    // Sanity: A changed master and wrote out (out starts at 0).
    init_inputs(d, n);
    const unsigned long long moved = diff_count(reinterpret_cast<const uint32_t*>(d.master),
                                                reinterpret_cast<const uint32_t*>(d.rmaster), n, dcount, d.sms);
    std::printf("check: A's step changed %.4f of master elements\n", static_cast<double>(moved) / n);
    for (size_t i = 0; i < vs.size(); ++i) {
      Variant& v = vs[i];
      if (!v.compare) continue;
      init_inputs(d, n);
      run_step(d, v, plans[i], s);
      CK(cudaGetLastError());
      v.diff[0] = diff_count(reinterpret_cast<const uint32_t*>(d.master), reinterpret_cast<const uint32_t*>(d.rmaster),
                             n, dcount, d.sms);
      v.diff[1] = diff_count(reinterpret_cast<const uint32_t*>(d.m), reinterpret_cast<const uint32_t*>(d.rm), n,
                             dcount, d.sms);
      v.diff[2] = diff_count(reinterpret_cast<const uint32_t*>(d.v), reinterpret_cast<const uint32_t*>(d.rv), n,
                             dcount, d.sms);
      v.diff[3] = diff_count(reinterpret_cast<const uint16_t*>(d.out), reinterpret_cast<const uint16_t*>(d.rout), n,
                             dcount, d.sms);
      v.equal = (v.diff[0] | v.diff[1] | v.diff[2] | v.diff[3]) == 0 ? 1 : 0;
    }
  }

  // Timing: per round every variant (order rotated each round), W warm-up steps then R timed
  // steps between two events; ms per step = elapsed / R. The state keeps evolving (not reset).
  init_inputs(d, n);
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int r = 0; r < o.rounds; ++r) {
    for (size_t j = 0; j < vs.size(); ++j) {
      const size_t i = (j + r) % vs.size();
      Variant& v = vs[i];
      if (v.kind == Kind::kMemcpy && !have_ref) continue;
      for (int w = 0; w < o.warmup; ++w) run_step(d, v, plans[i], s);
      CK(cudaGetLastError());
      CK(cudaEventRecord(e0));
      for (int k = 0; k < o.reps; ++k) run_step(d, v, plans[i], s);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaGetLastError());
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      v.ms.push_back(static_cast<double>(ms) / o.reps);
    }
  }

  const double bytes = 28.0 * n;
  const double a_ms = median(vs[0].ms);
  std::printf("\n%-3s %9s %9s %7s %6s %8s %4s %5s %4s  %-16s %s\n", "var", "ms/step", "min ms", "TB/s", "xA",
              "blocks", "regs", "spill", "occ", "bitwise equal A", "what");
  for (const Variant& v : vs) {
    if (v.ms.empty()) {
      std::printf("%-3s %9s  (not run)  %s\n", v.name.c_str(), "-", v.desc.c_str());
      continue;
    }
    const double med = median(v.ms), mn = *std::min_element(v.ms.begin(), v.ms.end());
    char eq[64];
    if (v.equal == 1) {
      std::snprintf(eq, sizeof eq, "yes");
    } else if (v.equal == 0) {
      std::snprintf(eq, sizeof eq, "NO (%llu/%llu/%llu/%llu)", v.diff[0], v.diff[1], v.diff[2], v.diff[3]);
    } else {
      std::snprintf(eq, sizeof eq, "n/a");
    }
    if (v.kind == Kind::kMemcpy) {
      std::printf("%-3s %9.3f %9.3f %7.3f %6.3f %8s %4s %5s %4s  %-16s %s\n", v.name.c_str(), med, mn,
                  bytes / (med * 1e-3) / 1e12, a_ms / med, "-", "-", "-", "-", eq, v.desc.c_str());
    } else {
      std::printf("%-3s %9.3f %9.3f %7.3f %6.3f %8lld %4d %5d %4d  %-16s %s\n", v.name.c_str(), med, mn,
                  bytes / (med * 1e-3) / 1e12, a_ms / med, (long long)v.blocks0, v.regs, v.local_bytes, v.occ, eq,
                  v.desc.c_str());
    }
  }
  std::printf("\nms/step: median over rounds of (R steps / R); TB/s = 28 B x n / ms; xA = A's ms / this ms (> 1 is "
              "faster); blocks: first launch; occ: resident blocks/SM by the occupancy API (grid uses min(occ, 8)); "
              "bitwise NO lists differing master/m/v/out elements\n");

  // JSON.
  FILE* f = std::fopen(o.json.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "adam_bw: cannot write %s: %s\n", o.json.c_str(), std::strerror(errno));
    return 1;
  }
  std::fprintf(f, "{\n  \"device\": \"%s\", \"sms\": %d, \"n\": %lld, \"segments\": %zu, \"reps\": %d, "
                  "\"warmup\": %d, \"rounds\": %d, \"grad_scale\": %s, \"bytes_per_element\": 28,\n  \"variants\": [\n",
               json_escape(prop.name).c_str(), d.sms, (long long)n, segs.size(), o.reps, o.warmup, o.rounds,
               d.scale ? std::to_string(o.scale).c_str() : "null");
  for (size_t i = 0; i < vs.size(); ++i) {
    const Variant& v = vs[i];
    std::fprintf(f, "    {\"name\": \"%s\", \"what\": \"%s\"", json_escape(v.name).c_str(), json_escape(v.desc).c_str());
    if (!v.ms.empty()) {
      const double med = median(v.ms);
      std::fprintf(f, ", \"ms_per_step\": %.5f, \"ms_min\": %.5f, \"tb_per_s\": %.4f, \"ratio_to_A\": %.4f, \"ms_rounds\": [",
                   med, *std::min_element(v.ms.begin(), v.ms.end()), bytes / (med * 1e-3) / 1e12, a_ms / med);
      for (size_t k = 0; k < v.ms.size(); ++k) std::fprintf(f, "%s%.5f", k ? ", " : "", v.ms[k]);
      std::fprintf(f, "]");
    }
    if (v.kind == Kind::kKernel) {
      std::fprintf(f, ", \"blocks_first_launch\": %lld, \"regs\": %d, \"local_bytes\": %d, \"occupancy_blocks_per_sm\": %d",
                   (long long)v.blocks0, v.regs, v.local_bytes, v.occ);
    }
    if (v.equal < 0) {
      std::fprintf(f, ", \"bitwise_equal_to_A\": null");
    } else {
      std::fprintf(f, ", \"bitwise_equal_to_A\": %s, \"diff_master_m_v_out\": [%llu, %llu, %llu, %llu]",
                   v.equal ? "true" : "false", v.diff[0], v.diff[1], v.diff[2], v.diff[3]);
    }
    std::fprintf(f, "}%s\n", i + 1 < vs.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("wrote %s\n", o.json.c_str());
  return 0;
}
