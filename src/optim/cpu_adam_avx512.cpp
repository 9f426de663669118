// CPU Adam, AVX-512 (F + BW + VL): 16 floats per step, masked tail. Two builds of one body
// (cpu_adam_avx512.inc): bf16 output through vcvtneps2bf16 where the CPU has avx512bf16,
// through integer round-to-nearest-even otherwise. Both round exactly like at::BFloat16.
#include <immintrin.h>

#include "optim/cpu_adam_impl.h"

// GCC 12 reports its own _mm512_undefined_ps() (used inside _mm512_sqrt_ps and friends)
// as maybe-uninitialized once inlined; the value is never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace zt::optim::detail {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
namespace {
namespace avx512_int {
#define ZT_NATIVE_BF16 0
#include "optim/cpu_adam_avx512.inc"
#undef ZT_NATIVE_BF16
}  // namespace avx512_int
}  // namespace
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
namespace {
namespace avx512_bf16 {
#define ZT_NATIVE_BF16 1
#include "optim/cpu_adam_avx512.inc"
#undef ZT_NATIVE_BF16
}  // namespace avx512_bf16
}  // namespace
#pragma GCC pop_options

void adam_range_avx512(const AdamConsts& c, Dt grad_dt, Dt out_dt, float* p, float* m, float* v,
                       const void* grad, void* out, int64_t n, bool native_bf16) {
  if (native_bf16)
    avx512_bf16::range(c, grad_dt, out_dt, p, m, v, grad, out, n);
  else
    avx512_int::range(c, grad_dt, out_dt, p, m, v, grad, out, n);
}

}  // namespace zt::optim::detail
