// CPU Adam: kernel selection, the parallel tile loop, the tensor wrapper, and the scalar
// kernel that is both the portable fallback and the test oracle of the SIMD kernels.
#include "optim/cpu_adam.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "optim/cpu_adam_impl.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::optim {
namespace detail {

AdamConsts make_adam_consts(const AdamHyper& h) {
  AdamConsts c{};
  double lr = h.lr, b1 = h.beta1, b2 = h.beta2, wd = h.weight_decay;
  c.beta1 = h.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - b1);
  c.beta2 = h.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - b2);
  c.grad_scale = h.grad_scale;
  c.has_l2 = !h.adamw && h.weight_decay != 0.f;
  c.l2 = h.weight_decay;
  c.has_decay = h.adamw && h.weight_decay != 0.f;
  c.decay = static_cast<float>(1.0 - lr * wd);
  double bc1 = 1.0, bc2 = 1.0;
  if (h.bias_correction) {
    bc1 = 1.0 - std::pow(b1, static_cast<double>(h.step));
    bc2 = 1.0 - std::pow(b2, static_cast<double>(h.step));
  }
  c.neg_step_size = static_cast<float>(-lr / bc1);
  c.rbc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = h.eps;
  return c;
}

namespace {

template <Dt G>
inline float load_grad(const void* g, int64_t i) {
  if constexpr (G == Dt::kF32) return static_cast<const float*>(g)[i];
  if constexpr (G == Dt::kBf16) return bf16_to_f32(static_cast<const uint16_t*>(g)[i]);
  if constexpr (G == Dt::kF16) return f16_to_f32(static_cast<const uint16_t*>(g)[i]);
}

// See [CPU Adam numerics]: this is the operation sequence every SIMD kernel reproduces.
template <Dt G, Dt O>
void scalar_loop(const AdamConsts& c, float* p, float* m, float* v, const void* grad, void* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float g = load_grad<G>(grad, i) * c.grad_scale;
    float pi = p[i];
    if (c.has_l2) g = std::fma(pi, c.l2, g);
    float mi = std::fma(m[i], c.beta1, c.one_minus_beta1 * g);
    float vi = std::fma(v[i], c.beta2, (g * g) * c.one_minus_beta2);
    float den = std::fma(std::sqrt(vi), c.rbc2, c.eps);
    float upd = mi / den;
    if (c.has_decay) pi = pi * c.decay;
    pi = std::fma(upd, c.neg_step_size, pi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (O == Dt::kBf16) static_cast<uint16_t*>(out)[i] = f32_to_bf16(pi);
    if constexpr (O == Dt::kF16) static_cast<uint16_t*>(out)[i] = f32_to_f16(pi);
  }
}

template <Dt G>
void scalar_out(const AdamConsts& c, Dt o, float* p, float* m, float* v, const void* g, void* out, int64_t n) {
  switch (o) {
    case Dt::kBf16: return scalar_loop<G, Dt::kBf16>(c, p, m, v, g, out, n);
    case Dt::kF16: return scalar_loop<G, Dt::kF16>(c, p, m, v, g, out, n);
    default: return scalar_loop<G, Dt::kNone>(c, p, m, v, g, out, n);
  }
}

}  // namespace

void adam_range_scalar(const AdamConsts& c, Dt grad_dt, Dt out_dt, float* p, float* m, float* v,
                       const void* grad, void* out, int64_t n) {
  switch (grad_dt) {
    case Dt::kBf16: return scalar_out<Dt::kBf16>(c, out_dt, p, m, v, grad, out, n);
    case Dt::kF16: return scalar_out<Dt::kF16>(c, out_dt, p, m, v, grad, out, n);
    default: return scalar_out<Dt::kF32>(c, out_dt, p, m, v, grad, out, n);
  }
}

bool cpu_has_avx512bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

}  // namespace detail

namespace {

using detail::Dt;

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

Dt to_dt(at::ScalarType t, bool allow_f32, const char* what) {
  switch (t) {
    case at::kBFloat16: return Dt::kBf16;
    case at::kHalf: return Dt::kF16;
    case at::kFloat:
      if (allow_f32) return Dt::kF32;
      break;
    case at::ScalarType::Undefined:
      if (!allow_f32) return Dt::kNone;
      break;
    default: break;
  }
  throw Error(zt::detail::cat("cpu_adam_step: ", what, " dtype ", c10::toString(t), " is not supported (",
                          allow_f32 ? "fp32, bf16 or fp16" : "bf16, fp16 or Undefined for none", ")"));
}

void log_kernel_once(CpuKernel used) {
  static std::atomic<bool> logged{false};
  if (logged.exchange(true)) return;
  CpuKernel best = best_cpu_kernel();
  log::info("CPU Adam kernel %s (best on this CPU: %s%s), %d OpenMP threads",
               kernel_name(used), kernel_name(best),
               best == CpuKernel::kAvx512
                   ? (detail::cpu_has_avx512bf16() ? ", bf16 via avx512bf16" : ", bf16 via integer rounding")
                   : "",
               omp_get_max_threads());
}

void check_hyper(const AdamHyper& h) {
  ZT_CHECK(std::isfinite(h.lr) && h.lr >= 0, "cpu_adam_step: lr must be finite and >= 0, got ", h.lr);
  ZT_CHECK(h.beta1 >= 0 && h.beta1 < 1, "cpu_adam_step: beta1 must be in [0, 1), got ", h.beta1);
  ZT_CHECK(h.beta2 >= 0 && h.beta2 < 1, "cpu_adam_step: beta2 must be in [0, 1), got ", h.beta2);
  ZT_CHECK(std::isfinite(h.eps) && h.eps >= 0, "cpu_adam_step: eps must be finite and >= 0, got ", h.eps);
  ZT_CHECK(std::isfinite(h.weight_decay), "cpu_adam_step: weight_decay must be finite, got ", h.weight_decay);
  ZT_CHECK(!h.bias_correction || h.step >= 1, "cpu_adam_step: step is 1-based, got ", h.step);
  // grad_scale may legitimately be inf/NaN only through a caller bug: the overflow check
  // runs before the step, so reject it rather than poison the master weights.
  ZT_CHECK(std::isfinite(h.grad_scale), "cpu_adam_step: grad_scale must be finite, got ", h.grad_scale);
}

}  // namespace

CpuKernel best_cpu_kernel() {
  if (has_avx512()) return CpuKernel::kAvx512;
  if (has_avx2()) return CpuKernel::kAvx2;
  return CpuKernel::kScalar;
}

bool cpu_kernel_supported(CpuKernel k) {
  switch (k) {
    case CpuKernel::kAvx512: return has_avx512();
    case CpuKernel::kAvx2: return has_avx2();
    default: return true;
  }
}

const char* kernel_name(CpuKernel k) {
  switch (k) {
    case CpuKernel::kAuto: return "auto";
    case CpuKernel::kScalar: return "scalar";
    case CpuKernel::kAvx2: return "avx2";
    case CpuKernel::kAvx512: return "avx512";
  }
  return "?";
}

CpuKernel parse_cpu_kernel(const char* name) {
  for (CpuKernel k : {CpuKernel::kAuto, CpuKernel::kScalar, CpuKernel::kAvx2, CpuKernel::kAvx512})
    if (std::strcmp(name, kernel_name(k)) == 0) return k;
  throw Error(zt::detail::cat("unknown CPU Adam kernel '", name, "': use auto, scalar, avx2 or avx512"));
}

void cpu_adam_step(float* param, float* exp_avg, float* exp_avg_sq, const void* grad, at::ScalarType grad_dtype,
                   int64_t n, const AdamHyper& hyper, void* out_half, at::ScalarType out_dtype, CpuKernel kernel) {
  ZT_CHECK(n >= 0, "cpu_adam_step: n must be >= 0, got ", n);
  check_hyper(hyper);
  Dt gdt = to_dt(grad_dtype, true, "grad");
  Dt odt = to_dt(out_dtype, false, "out_half");
  if (kernel == CpuKernel::kAuto) kernel = best_cpu_kernel();
  ZT_CHECK(cpu_kernel_supported(kernel), "cpu_adam_step: kernel ", kernel_name(kernel),
           " needs instructions this CPU lacks (best here: ", kernel_name(best_cpu_kernel()), ")");
  log_kernel_once(kernel);
  if (n == 0) return;
  ZT_CHECK(param && exp_avg && exp_avg_sq && grad, "cpu_adam_step: null buffer");
  ZT_CHECK(odt == Dt::kNone || out_half, "cpu_adam_step: out_dtype given but out_half is null");

  const detail::AdamConsts c = detail::make_adam_consts(hyper);
  const bool native_bf16 = kernel == CpuKernel::kAvx512 && detail::cpu_has_avx512bf16();
  const int gsz = detail::dt_size(gdt), osz = detail::dt_size(odt);
  const int64_t tiles = (n + kCpuAdamTile - 1) / kCpuAdamTile;
  // schedule(static): each thread gets one contiguous run of tiles, i.e. one stream per
  // array, which the hardware prefetchers follow.
#pragma omp parallel for schedule(static) if (tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t * kCpuAdamTile;
    const int64_t len = std::min(kCpuAdamTile, n - b);
    const void* g = static_cast<const char*>(grad) + b * gsz;
    void* o = odt == Dt::kNone ? nullptr : static_cast<char*>(out_half) + b * osz;
    switch (kernel) {
      case CpuKernel::kAvx512:
        detail::adam_range_avx512(c, gdt, odt, param + b, exp_avg + b, exp_avg_sq + b, g, o, len, native_bf16);
        break;
      case CpuKernel::kAvx2:
        detail::adam_range_avx2(c, gdt, odt, param + b, exp_avg + b, exp_avg_sq + b, g, o, len);
        break;
      default:
        detail::adam_range_scalar(c, gdt, odt, param + b, exp_avg + b, exp_avg_sq + b, g, o, len);
        break;
    }
  }
}

void cpu_adam_step(at::Tensor param_fp32, at::Tensor exp_avg, at::Tensor exp_avg_sq, const at::Tensor& grad,
                   const AdamHyper& hyper, at::Tensor out_half, CpuKernel kernel) {
  auto check = [](const at::Tensor& t, const char* name, int64_t numel) {
    ZT_CHECK(t.defined(), "cpu_adam_step: ", name, " is undefined");
    ZT_CHECK(t.device().is_cpu(), "cpu_adam_step: ", name, " must be on the CPU, is on ", t.device().str());
    ZT_CHECK(t.is_contiguous(), "cpu_adam_step: ", name, " must be contiguous");
    ZT_CHECK(numel < 0 || t.numel() == numel, "cpu_adam_step: ", name, " has ", t.numel(),
             " elements, param_fp32 has ", numel);
  };
  check(param_fp32, "param_fp32", -1);
  const int64_t n = param_fp32.numel();
  check(exp_avg, "exp_avg", n);
  check(exp_avg_sq, "exp_avg_sq", n);
  check(grad, "grad", n);
  for (auto [t, name] : {std::pair{&param_fp32, "param_fp32"}, {&exp_avg, "exp_avg"}, {&exp_avg_sq, "exp_avg_sq"}})
    ZT_CHECK(t->scalar_type() == at::kFloat, "cpu_adam_step: ", name, " must be fp32, is ",
             c10::toString(t->scalar_type()));
  at::ScalarType out_dtype = at::ScalarType::Undefined;
  void* out = nullptr;
  if (out_half.defined()) {
    check(out_half, "out_half", n);
    out_dtype = out_half.scalar_type();
    out = out_half.data_ptr();
  }
  cpu_adam_step(param_fp32.data_ptr<float>(), exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
                grad.data_ptr(), grad.scalar_type(), n, hyper, out, out_dtype, kernel);
}

}  // namespace zt::optim
