// zerotrain's own fused Adam/AdamW step: one pass over a flat fp32 shard (master
// weights, exp_avg, exp_avg_sq) reading a gradient of any of fp32/bf16/fp16 and,
// optionally, writing the updated weights cast to the model's dtype in the same pass.
//
// Plain C++ (no torch): included by library .cpp files and by fused_adam.cu. The kernel
// is compiled only where nvcc is found (CMake then defines ZT_WITH_KERNELS=1 for the
// whole library); elsewhere kernels_stub.cpp supplies kernels_available() == false and
// a fused_adam() that throws.
//
// Math, per element, in fp32 registers, identical to ATen's _fused_adam_/_fused_adamw_
// (torch 2.11, aten/src/ATen/native/cuda/fused_adam_utils.cuh, amsgrad and maximize off):
//   g = grad * (*grad_scale)                 (ATen divides by its grad_scale tensor)
//   AdamW: p -= lr * weight_decay * p         Adam: g += p * weight_decay  (if wd != 0)
//   m = fma(beta1, m, fma(-beta1, g, g))      i.e. beta1*m + (1-beta1)*g
//   v = fma(beta2, v, fma(-beta2, g*g, g*g))  i.e. beta2*v + (1-beta2)*g*g
//   p -= (lr / bias_correction1) * m / (sqrt(v) / sqrt(bias_correction2) + eps)
#pragma once
#include <cstdint>

#if defined(ZT_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime_api.h>  // cudaStream_t
#else
// Builds without CUDA headers: the same type cuda_runtime_api.h declares (an opaque
// pointer), so the declarations below read the same in every build.
struct CUstream_st;
using cudaStream_t = CUstream_st*;
#endif

namespace zt::kernels {

enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct AdamArgs {
  float* master = nullptr;      // fp32 parameters (updated in place)
  float* exp_avg = nullptr;     // fp32 m (in place)
  float* exp_avg_sq = nullptr;  // fp32 v (in place)
  const void* grad = nullptr;   // gradient, dtype grad_type (not modified)
  DType grad_type = DType::kF32;
  void* param_out = nullptr;  // optional: the updated master cast to param_type is written here (nullptr = skip)
  DType param_type = DType::kBF16;
  int64_t n = 0;
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  float bias_correction1 = 1, bias_correction2 = 1;  // 1 - beta^t, or 1 when bias correction is off
  bool adamw = true;  // decoupled weight decay (AdamW); false = L2 added to the gradient (Adam)
  const float* grad_scale = nullptr;  // optional device scalar: every gradient is MULTIPLIED by *grad_scale
  const float* found_inf = nullptr;   // optional device scalar: when != 0 the kernel changes nothing (skipped step)
};

// True when the kernels were compiled into this build (ZT_WITH_KERNELS).
bool kernels_available();

// One pass over n elements: reads grad, master, m, v; writes master, m, v and (optionally)
// param_out. All pointers are device pointers of the current CUDA device (the one `stream`
// belongs to); the buffers may start at any element (a vectorized path is taken whenever
// every buffer reaches 16-byte alignment of its fp32 rows at the same element) and must
// not overlap, except that nothing here reads param_out. Asynchronous on `stream`; throws
// std::invalid_argument on bad arguments (n < 0, a null buffer, an unknown dtype) and
// std::runtime_error on a launch error (the message names the kernel and n).
void fused_adam(const AdamArgs& a, cudaStream_t stream);

}  // namespace zt::kernels
