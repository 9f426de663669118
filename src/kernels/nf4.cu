// The NF4 dequantization declared in nf4.h. No torch headers: compiled by nvcc as part of
// the zerotrain library when CMake finds a CUDA compiler.
//
// Memory-bound and simple on purpose: each thread reads one packed byte (two codes) and
// one 8-bit absmax code, and writes two outputs; a warp covers 64 consecutive elements,
// i.e. exactly one NF4 block, so its absmax loads hit one address. The 16 + 256 table
// values arrive as a launch parameter and are staged in shared memory once per block
// (a grid-stride loop keeps the grid at a few blocks per multiprocessor). The products
// and the sum use __fmul_rn / __fadd_rn so that nvcc cannot contract them into an FMA:
// the CPU reference rounds after each operation, and the result must equal it bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/nf4.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace zt::kernels {

namespace {

constexpr const char* kNf4Name = "nf4_dequantize";  // in error messages
constexpr int kNf4Threads = 256;
constexpr int kNf4BlocksPerSm = 8;

struct Nf4Tables {
  float nf4[16];
  float code2[256];
};

template <typename T>
__global__ void __launch_bounds__(kNf4Threads)
    nf4_dequantize_kernel(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ qabsmax,
                          const float* __restrict__ absmax2, float offset, int64_t numel, Nf4Tables tables,
                          T* __restrict__ out) {
  __shared__ float nf4[16];
  __shared__ float code2[256];
  for (int k = static_cast<int>(threadIdx.x); k < 256; k += kNf4Threads) code2[k] = tables.code2[k];
  if (threadIdx.x < 16) nf4[threadIdx.x] = tables.nf4[threadIdx.x];
  __syncthreads();

  const int64_t bytes = (numel + 1) / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kNf4Threads;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kNf4Threads + threadIdx.x; j < bytes; j += stride) {
    const int64_t i = 2 * j;                // the byte's first element; i + 1 is in the same block (64 is even)
    const int64_t b = i / kNf4KernelBlock;  // NF4 block
    const float absmax = __fadd_rn(__fmul_rn(code2[qabsmax[b]], absmax2[b / kNf4KernelStatsBlock]), offset);
    const uint8_t byte = packed[j];
    out[i] = detail::from_float<T>(__fmul_rn(nf4[byte >> 4], absmax));
    if (i + 1 < numel) out[i + 1] = detail::from_float<T>(__fmul_rn(nf4[byte & 0x0F], absmax));
  }
}

template <typename T>
void launch_nf4(const Nf4DequantArgs& a, const Nf4Tables& tables, cudaStream_t stream) {
  const int64_t bytes = (a.numel + 1) / 2;
  const int64_t needed = (bytes + kNf4Threads - 1) / kNf4Threads;
  const int64_t blocks = std::max<int64_t>(1, std::min(needed, detail::blocks_on_current_device(kNf4BlocksPerSm, kNf4Name)));
  nf4_dequantize_kernel<T><<<static_cast<unsigned>(blocks), kNf4Threads, 0, stream>>>(
      a.packed, a.qabsmax, a.absmax2, a.offset, a.numel, tables, static_cast<T*>(a.out));
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    throw std::runtime_error(std::string("zt::kernels::nf4_dequantize_kernel<") + detail::DTypeName<T>::value +
                             "> launch failed for numel=" + std::to_string(a.numel) + ": " + cudaGetErrorString(rc));
  }
}

}  // namespace

void nf4_dequantize(const Nf4DequantArgs& a, cudaStream_t stream) {
  if (a.numel < 0) throw std::invalid_argument("zt::kernels::nf4_dequantize: numel < 0 (" + std::to_string(a.numel) + ")");
  if (a.numel == 0) return;
  if (a.packed == nullptr || a.qabsmax == nullptr || a.absmax2 == nullptr || a.out == nullptr ||
      a.nf4_code == nullptr || a.code2 == nullptr) {
    throw std::invalid_argument("zt::kernels::nf4_dequantize: packed, qabsmax, absmax2, out and both tables must be "
                                "non-null (numel=" + std::to_string(a.numel) + ")");
  }
  Nf4Tables tables{};
  std::copy(a.nf4_code, a.nf4_code + 16, tables.nf4);
  std::copy(a.code2, a.code2 + 256, tables.code2);
  switch (a.type) {
    case DType::kF32: return launch_nf4<float>(a, tables, stream);
    case DType::kBF16: return launch_nf4<__nv_bfloat16>(a, tables, stream);
    case DType::kF16: return launch_nf4<__half>(a, tables, stream);
  }
  throw std::invalid_argument("zt::kernels::nf4_dequantize: unknown dtype " + std::to_string(static_cast<int>(a.type)));
}

}  // namespace zt::kernels
