// A standalone probe (no torch) of zerotrain's RoPE kernel (src/kernels/llama_ops.cu) at
// Llama-3.2-1B's q (B 4, T 2048, H 32, hd 64, bf16): kernels::rope() as the model launches
// it (llama_ops.cu is compiled into this file), next to the variants that found why its
// earlier 1-D form ran at ~0.6 TB/s (64-bit index division: the int64 variants below stay
// slow with or without the cos/sin loads, the 32-bit ones run near a plain copy) and a
// plain copy of the same bytes.
// Build and run: scripts/device/rope_probe.sh. Prints one line per variant: us, GB/s.
#include <cstdint>
#include <cstdio>

#include "kernels/llama_ops.cu"  // the kernel under test, as built (nvcc -I src)

namespace {

using zt::kernels::detail::Pack;
using zt::kernels::detail::to_float;
using T = __nv_bfloat16;
constexpr int kVec = 8, kThreads = 256;
using P = Pack<T, kVec>;
__device__ __forceinline__ T from_float(float x) { return zt::kernels::detail::from_float<T>(x); }

// Variants of rope_kernel: mode 1 its 32-bit index math; mode 2 its int64 math without the
// cos/sin loads (constants).
template <int kMode>
__global__ void __launch_bounds__(kThreads)
    rope_variant(const T* __restrict__ in, T* __restrict__ out, const T* __restrict__ cs, const T* __restrict__ sn,
         int64_t heads, int64_t seq, int64_t half, int64_t sb, int64_t sh, int64_t st, int64_t cos_sb, int64_t total) {
  const int64_t per_row = half / kVec;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    int64_t off, coff;
    if constexpr (kMode == 1) {
      const uint32_t ii = static_cast<uint32_t>(i), pr = static_cast<uint32_t>(per_row);
      const uint32_t row = ii / pr, j = (ii - row * pr) * kVec, sq = static_cast<uint32_t>(seq);
      const uint32_t t = row % sq, bh = row / sq, hh = static_cast<uint32_t>(heads), h = bh % hh, b = bh / hh;
      off = b * sb + h * sh + t * st + j;
      coff = b * cos_sb + t * 2 * half + j;
    } else {
      const int64_t row = i / per_row;
      const int64_t j = (i - row * per_row) * kVec;
      const int64_t t = row % seq;
      const int64_t bh = row / seq;
      const int64_t h = bh % heads;
      const int64_t b = bh / heads;
      off = b * sb + h * sh + t * st + j;
      coff = b * cos_sb + t * 2 * half + j;
    }
    const P x0 = *reinterpret_cast<const P*>(in + off);
    const P x1 = *reinterpret_cast<const P*>(in + off + half);
    P c0, c1, s0, s1;
    if constexpr (kMode == 2) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) c0.v[k] = c1.v[k] = s0.v[k] = s1.v[k] = from_float(0.5f);
    } else {
      c0 = *reinterpret_cast<const P*>(cs + coff);
      c1 = *reinterpret_cast<const P*>(cs + coff + half);
      s0 = *reinterpret_cast<const P*>(sn + coff);
      s1 = *reinterpret_cast<const P*>(sn + coff + half);
    }
    P o0, o1;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float a = to_float(x0.v[k]), b2 = to_float(x1.v[k]);
      o0.v[k] = from_float(a * to_float(c0.v[k]) - b2 * to_float(s0.v[k]));
      o1.v[k] = from_float(b2 * to_float(c1.v[k]) + a * to_float(s1.v[k]));
    }
    *reinterpret_cast<P*>(out + off) = o0;
    *reinterpret_cast<P*>(out + off + half) = o1;
  }
}

// Variant 3: a 2-D grid (x: rows of one (b, h) in chunks, y: b * heads + h), one thread per
// 8-wide pair of the first/second half, 32-bit index math, no grid-stride loop.
__global__ void __launch_bounds__(kThreads)
    rope_2d(const T* __restrict__ in, T* __restrict__ out, const T* __restrict__ cs, const T* __restrict__ sn,
            int heads, int seq, int half, int64_t sb, int64_t sh, int64_t st, int64_t cos_sb) {
  const int per_row = half / kVec;
  const int local = blockIdx.x * kThreads + threadIdx.x;
  const int t = local / per_row;
  if (t >= seq) return;
  const int j = (local - t * per_row) * kVec;
  const int b = blockIdx.y / heads, h = blockIdx.y - b * heads;
  const int64_t off = b * sb + h * sh + t * st + j;
  const int64_t coff = b * cos_sb + static_cast<int64_t>(t) * 2 * half + j;
  const P x0 = *reinterpret_cast<const P*>(in + off);
  const P x1 = *reinterpret_cast<const P*>(in + off + half);
  const P c0 = *reinterpret_cast<const P*>(cs + coff);
  const P c1 = *reinterpret_cast<const P*>(cs + coff + half);
  const P s0 = *reinterpret_cast<const P*>(sn + coff);
  const P s1 = *reinterpret_cast<const P*>(sn + coff + half);
  P o0, o1;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float a = to_float(x0.v[k]), b2 = to_float(x1.v[k]);
    o0.v[k] = from_float(a * to_float(c0.v[k]) - b2 * to_float(s0.v[k]));
    o1.v[k] = from_float(b2 * to_float(c1.v[k]) + a * to_float(s1.v[k]));
  }
  *reinterpret_cast<P*>(out + off) = o0;
  *reinterpret_cast<P*>(out + off + half) = o1;
}

__global__ void copy(const P* __restrict__ in, P* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    out[i] = in[i];
}

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e = (x);                                                      \
    if (e != cudaSuccess) {                                                   \
      std::printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

}  // namespace

int main() {
  const int64_t B = 4, T_ = 2048, H = 32, D = 64, half = D / 2;
  const int64_t n = B * T_ * H * D;
  T *in, *out, *cs, *sn;
  CK(cudaMalloc(&in, n * sizeof(T)));
  CK(cudaMalloc(&out, n * sizeof(T)));
  CK(cudaMalloc(&cs, B * T_ * D * sizeof(T)));
  CK(cudaMalloc(&sn, B * T_ * D * sizeof(T)));
  CK(cudaMemset(in, 0, n * sizeof(T)));
  CK(cudaMemset(cs, 0, B * T_ * D * sizeof(T)));
  CK(cudaMemset(sn, 0, B * T_ * D * sizeof(T)));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // q as the model makes it: (B, T, H, D) memory viewed (B, H, T, D)
  const int64_t sb = T_ * H * D, sh = D, st = H * D, cos_sb = T_ * D;
  const int64_t total = B * H * T_ * (half / kVec);
  const int64_t capped = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{sms} * 8);
  const int64_t full = (total + kThreads - 1) / kThreads;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const double bytes = 2.0 * n * sizeof(T);
  auto time = [&](const char* name, auto launch) {
    for (int w = 0; w < 5; ++w) launch();
    cudaEventRecord(e0);
    const int reps = 50;
    for (int r = 0; r < reps; ++r) launch();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1000.0 / reps;
    std::printf("%-44s %8.1f us  %7.0f GB/s  (%s)\n", name, us, bytes / (us * 1e-6) / 1e9,
                cudaGetErrorString(cudaGetLastError()));
  };
  zt::kernels::RopeArgs a;
  a.in = in;
  a.out = out;
  a.cos = cs;
  a.sin = sn;
  a.type = zt::kernels::DType::kBF16;
  a.batch = B;
  a.heads = H;
  a.seq = T_;
  a.head_dim = D;
  a.stride_batch = sb;
  a.stride_head = sh;
  a.stride_seq = st;
  a.cos_batch_stride = cos_sb;
  time("kernels::rope() as the model launches it", [&] { zt::kernels::rope(a, nullptr); });
  time("rope int32 index math, grid 8/SM", [&] {
    rope_variant<1><<<capped, kThreads>>>(in, out, cs, sn, H, T_, half, sb, sh, st, cos_sb, total);
  });
  time("rope int32 index math, uncapped", [&] {
    rope_variant<1><<<full, kThreads>>>(in, out, cs, sn, H, T_, half, sb, sh, st, cos_sb, total);
  });
  time("rope no cos/sin loads (int64, 8/SM)", [&] {
    rope_variant<2><<<capped, kThreads>>>(in, out, cs, sn, H, T_, half, sb, sh, st, cos_sb, total);
  });
  time("rope 2-D grid, int32, no loop", [&] {
    rope_2d<<<dim3((T_ * (half / kVec) + kThreads - 1) / kThreads, B * H), kThreads>>>(in, out, cs, sn, H, T_, half,
                                                                                          sb, sh, st, cos_sb);
  });
  time("rope 2-D grid, (B,H,T,D) layout (backward)", [&] {
    rope_2d<<<dim3((T_ * (half / kVec) + kThreads - 1) / kThreads, B * H), kThreads>>>(in, out, cs, sn, H, T_, half,
                                                                                          H * T_ * D, T_ * D, D, cos_sb);
  });
  time("rope() (B,H,T,D) layout (backward)", [&] {
    zt::kernels::RopeArgs c = a;
    c.stride_head = T_ * D;
    c.stride_seq = D;
    c.backward = true;
    zt::kernels::rope(c, nullptr);
  });
  time("rope() cos shared over batch", [&] {
    zt::kernels::RopeArgs c = a;
    c.cos_batch_stride = 0;
    zt::kernels::rope(c, nullptr);
  });
  time("plain 16-byte copy, same bytes, 8/SM", [&] {
    copy<<<capped, kThreads>>>(reinterpret_cast<const P*>(in), reinterpret_cast<P*>(out), n / kVec);
  });
  return 0;
}
