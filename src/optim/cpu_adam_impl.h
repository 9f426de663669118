// Internals of the CPU Adam kernels (cpu_adam*.cpp): constants, per-ISA range functions
// and the scalar half-precision conversions that the SIMD kernels must reproduce.
//
// [CPU Adam numerics] All kernels execute the same IEEE operations in the same order on
// every element: one multiply for the gradient scale, fused multiply-adds exactly where
// cpu_adam_scalar writes std::fma, correctly rounded sqrt and division (never rsqrt/rcp
// approximations). Every multiply-add is spelled as an explicit FMA and no plain a*b+c
// remains, so compiler contraction (-ffp-contract=fast) has nothing to fuse differently
// between the scalar and the vector code. Results are then bit-identical across kernels,
// except for the payload and sign of NaNs (x86 picks the NaN operand by position, and
// compilers may swap commutative operands); half-precision outputs canonicalise NaN, so
// they are bit-identical too. The SIMD kernels never run a scalar tail: AVX-512 masks it,
// AVX2 runs one vector step on a zero-padded copy.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

#include "optim/cpu_adam.h"

namespace zt::optim::detail {

enum class Dt : uint8_t { kNone, kF32, kBf16, kF16 };

inline int dt_size(Dt d) { return d == Dt::kF32 ? 4 : d == Dt::kNone ? 0 : 2; }

// Per-step constants, computed once (in double, then rounded to float) for all kernels.
struct AdamConsts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float grad_scale;
  bool has_l2;          // Adam with weight decay: g += l2 * p
  float l2;
  bool has_decay;       // AdamW with weight decay: p *= decay
  float decay;          // 1 - lr * weight_decay
  float neg_step_size;  // -lr / bc1
  float rbc2;           // 1 / sqrt(bc2)
  float eps;
};

AdamConsts make_adam_consts(const AdamHyper& h);

// Each kernel updates n consecutive elements; grad/out point at element 0 of the range.
void adam_range_scalar(const AdamConsts& c, Dt grad_dt, Dt out_dt, float* p, float* m, float* v,
                       const void* grad, void* out, int64_t n);
void adam_range_avx2(const AdamConsts& c, Dt grad_dt, Dt out_dt, float* p, float* m, float* v,
                     const void* grad, void* out, int64_t n);
// native_bf16: use the avx512bf16 conversion instruction (only where the CPU has it).
void adam_range_avx512(const AdamConsts& c, Dt grad_dt, Dt out_dt, float* p, float* m, float* v,
                       const void* grad, void* out, int64_t n, bool native_bf16);
bool cpu_has_avx512bf16();

// --- scalar conversions: the reference the SIMD kernels are tested against -------------

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest even, NaN -> 0x7FC0: exactly at::BFloat16(float).
inline uint16_t f32_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Exact IEEE binary16 -> binary32 (subnormals, inf; NaN payload kept).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    float mag = static_cast<float>(m) * 0x1p-24f;  // exact: m < 2^10
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

// IEEE binary32 -> binary16, round to nearest even (what F16C's vcvtps2ph does with
// _MM_FROUND_TO_NEAREST_INT), subnormals kept, NaN -> 0x7E00.
inline uint16_t f32_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return 0x7E00;
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: a binary16 subnormal (or zero)
    uint32_t e = ax >> 23;
    uint32_t shift = 126 - e;  // value / 2^-24 = significand >> shift
    if (shift > 24) return static_cast<uint16_t>(sign);
    uint32_t sig = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t r = sig >> shift, rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (ax - 0x38000000u) >> 13;  // rebias 127 -> 15, keep 10 mantissa bits
  uint32_t rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry may reach the exponent: fine
  return static_cast<uint16_t>(sign | r);
}

}  // namespace zt::optim::detail
