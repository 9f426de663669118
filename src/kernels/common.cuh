// Pieces every zerotrain CUDA kernel file uses (nvcc only): dtype names for error
// messages, fp32 <-> bf16/f16/f32 conversions (round to nearest even, as ATen's
// Tensor::to), vector packs, CUDA error checks, and per-device values asked once.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace zt::kernels::detail {

template <typename T>
struct DTypeName;
template <>
struct DTypeName<float> {
  static constexpr const char* value = "f32";
};
template <>
struct DTypeName<__nv_bfloat16> {
  static constexpr const char* value = "bf16";
};
template <>
struct DTypeName<__half> {
  static constexpr const char* value = "f16";
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Round to nearest even, like at::BFloat16 / at::Half conversions (Tensor::to).
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
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// N consecutive elements of T loaded or stored as one access (N = 1: the scalar path).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Throws std::runtime_error("zt::kernels::<kernel>: <what>: <CUDA error>") unless rc is success.
inline void check(cudaError_t rc, const char* kernel, const char* what) {
  if (rc != cudaSuccess) {
    throw std::runtime_error(std::string("zt::kernels::") + kernel + ": " + what + ": " + cudaGetErrorString(rc));
  }
}

constexpr int kMaxCachedDevices = 64;

// A per-device value (at least 1), asked once per device (devices past
// kMaxCachedDevices: every time). `cache` is zero-initialized static storage.
template <typename Query>
int cached_per_device(std::atomic<int> (&cache)[kMaxCachedDevices], int dev, Query query) {
  const bool cacheable = dev >= 0 && dev < kMaxCachedDevices;
  if (cacheable) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  const int c = std::max(1, query());
  if (cacheable) cache[dev].store(c, std::memory_order_relaxed);
  return c;
}

// Multiprocessors of device `dev` (`kernel` names the caller in a CUDA error).
inline int sm_count(int dev, const char* kernel) {
  static std::atomic<int> cache[kMaxCachedDevices];
  return cached_per_device(cache, dev, [dev, kernel] {
    int c = 0;
    check(cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev), kernel,
          "cudaDeviceGetAttribute(MultiProcessorCount)");
    return c;
  });
}

// `per_sm` blocks on each multiprocessor of the current device.
inline int64_t blocks_on_current_device(int per_sm, const char* kernel) {
  int dev = 0;
  check(cudaGetDevice(&dev), kernel, "cudaGetDevice");
  return static_cast<int64_t>(sm_count(dev, kernel)) * per_sm;
}

// [Streaming Grids] The grid of the grid-stride streaming kernels (the fused Adam, SwiGLU,
// add_scaled): one thread per work item (the loop runs once) unless ZT_KERNEL_GRID=resident,
// which caps the grid at `resident` blocks (the earlier launch: one resident wave, each thread
// looping). Measured on an H100 at the Llama-3.2-1B step's Adam (1.236e9 elements in 25
// launches, 28 B each): 11.64 ms with one item per thread, 12.57 ms with the resident grid and
// 12.32 ms with 4x it (scripts/device/adam_bw.sh, bench/results/2026-11-27_call20_h100).
// Read once per process.
inline bool resident_grids() {
  static const bool resident = [] {
    const char* v = std::getenv("ZT_KERNEL_GRID");
    return v != nullptr && std::string(v) == "resident";
  }();
  return resident;
}

// Blocks of `threads` for `work` items of a grid-stride kernel: ceil(work / threads), capped
// at `resident_cap` under ZT_KERNEL_GRID=resident and at 2^31 - 1 (the grid's x limit; the
// loop covers the rest). At least 1.
inline int64_t streaming_grid(int64_t work, int threads, int64_t resident_cap) {
  int64_t want = (work + threads - 1) / threads;
  if (resident_grids() && want > resident_cap) want = resident_cap;
  const int64_t kMaxGridX = 0x7fffffff;
  if (want > kMaxGridX) want = kMaxGridX;
  return want < 1 ? 1 : want;
}

inline bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

}  // namespace zt::kernels::detail
