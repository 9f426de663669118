// zerotrain's NF4 dequantization on the GPU: the frozen QLoRA base weight (quant/nf4.h,
// [NF4 Format]: bitsandbytes' quantize_4bit(nf4, blocksize 64, compress_statistics)) made
// whole in the activations' dtype directly, with no fp32 copy of the weight.
//
// Plain C++ (no torch): included by library .cpp files and by nf4.cu. Like fused_adam.h,
// compiled only where nvcc is found (ZT_WITH_KERNELS); elsewhere nf4_stub.cpp supplies an
// nf4_dequantize() that throws.
//
// Math, per element i (block b = i / 64), exactly the CPU reference quant::dequantize_nf4
// followed by Tensor::to(dtype):
//   absmax = fp32(fp32(code2[qabsmax[b]] * absmax2[b / 256]) + offset)   (no FMA contraction)
//   out[i] = round_to_dtype(fp32(nf4[code_i] * absmax))                   (nearest even)
// code_i is the high nibble of packed[i / 2] for even i, the low nibble for odd i. One
// thread per packed byte writes its two outputs (the last byte of an odd count: one).
#pragma once
#include <cstdint>

#include "kernels/fused_adam.h"  // DType, cudaStream_t

namespace zt::kernels {

inline constexpr int64_t kNf4KernelBlock = 64;        // quant::kNf4BlockSize
inline constexpr int64_t kNf4KernelStatsBlock = 256;  // quant::kNf4StatsBlockSize

struct Nf4DequantArgs {
  const uint8_t* packed = nullptr;   // device (ceil(numel/2)): two codes a byte, first element in the high nibble
  const uint8_t* qabsmax = nullptr;  // device (ceil(numel/64)): 8-bit codes of (absmax - offset)
  const float* absmax2 = nullptr;    // device (ceil(ceil(numel/64)/256)): second-level absmaxes
  float offset = 0.0f;               // mean of the first-level absmaxes
  int64_t numel = 0;                 // elements of the weight
  const float* nf4_code = nullptr;   // HOST pointer to the 16 NF4 values (quant::nf4_code())
  const float* code2 = nullptr;      // HOST pointer to the 256 dynamic-map values (quant::dynamic_map_code())
  void* out = nullptr;               // device (numel) of dtype `type`, must not overlap the inputs
  DType type = DType::kBF16;
};

// One launch on `stream`, asynchronous; device pointers of the current CUDA device. The
// two tables are copied into the launch's parameters (no device copy of them is needed).
// numel == 0 does nothing. Throws std::invalid_argument on bad arguments (numel < 0, a null
// pointer that is needed, an unknown dtype) and std::runtime_error on a launch error (the
// message names the kernel and numel).
void nf4_dequantize(const Nf4DequantArgs& a, cudaStream_t stream);

}  // namespace zt::kernels
