// CPU Adam/AdamW for ZeRO-Offload: one streaming pass over an owned fp32 shard.
//
// Per element, in this order (every kernel, so that all kernels give bit-identical fp32
// results; see [CPU Adam numerics] in cpu_adam_impl.h):
//   g  = grad * grad_scale                      (grad read as fp32, bf16 or fp16)
//   g += weight_decay * p                       (Adam, L2, only when !adamw)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p *= 1 - lr * weight_decay                  (AdamW, decoupled, only when adamw)
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),  bc_i = 1 - beta_i^step (1 without
//                                                     bias_correction)
//   out = half(p)                               (optional bf16/fp16 copy for the H2D upload)
// which is torch.optim.Adam / AdamW (and DeepSpeed's DeepSpeedCPUAdam) math.
#pragma once
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace zt::optim {

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  bool adamw = true;            // decoupled weight decay (AdamW); false = L2 added to the gradient
  bool bias_correction = true;
  int64_t step = 1;             // 1-based index of this update (torch's state.step after increment)
  float grad_scale = 1.f;       // multiplies the gradient: clip_coef / loss_scale, from the caller
};

enum class CpuKernel { kAuto, kScalar, kAvx2, kAvx512 };

// The fastest kernel this CPU (and OS) supports: kAvx512 (avx512f+bw+vl), else kAvx2
// (avx2+fma+f16c), else kScalar.
CpuKernel best_cpu_kernel();
// Whether `kernel` can run here (kAuto and kScalar always can).
bool cpu_kernel_supported(CpuKernel kernel);
// "auto", "scalar", "avx2", "avx512".
const char* kernel_name(CpuKernel kernel);
// Parses kernel_name()'s spelling; throws zt::Error on anything else.
CpuKernel parse_cpu_kernel(const char* name);

// One Adam step over n elements, in place on param/exp_avg/exp_avg_sq (fp32). grad_dtype is
// at::kFloat, at::kBFloat16 or at::kHalf. When out_dtype is at::kBFloat16 or at::kHalf the
// updated params are also written, rounded to nearest even, to out_half; at::ScalarType::Undefined
// means no output. NaN results are written as the canonical quiet NaN (bf16 0x7FC0, as
// at::BFloat16; fp16 0x7E00). Runs on the calling thread's OpenMP team (omp_get_max_threads()),
// in tiles of kCpuAdamTile elements so each thread streams one contiguous range; buffers must
// not overlap. kAuto picks best_cpu_kernel(); an explicit kernel the CPU lacks throws
// zt::Error. The kernel in use is logged to stderr once per process.
void cpu_adam_step(float* param, float* exp_avg, float* exp_avg_sq, const void* grad,
                   at::ScalarType grad_dtype, int64_t n, const AdamHyper& hyper, void* out_half,
                   at::ScalarType out_dtype, CpuKernel kernel = CpuKernel::kAuto);

// Tensor form for the engine: checks that the tensors are defined, on the CPU, contiguous,
// of the same numel, param/exp_avg/exp_avg_sq fp32, grad fp32/bf16/fp16 and out_half (if
// defined) bf16/fp16; throws zt::Error naming the offending tensor otherwise.
void cpu_adam_step(at::Tensor param_fp32, at::Tensor exp_avg, at::Tensor exp_avg_sq,
                   const at::Tensor& grad, const AdamHyper& hyper, at::Tensor out_half = {},
                   CpuKernel kernel = CpuKernel::kAuto);

// Elements per tile of the parallel loop: 64 Ki elements = 1.75 MiB of traffic at 28 B per
// element, large enough to amortise scheduling, small enough to balance threads.
inline constexpr int64_t kCpuAdamTile = int64_t{1} << 16;

}  // namespace zt::optim
