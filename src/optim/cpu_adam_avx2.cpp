// CPU Adam, AVX2 + FMA + F16C: 8 floats per step. Reproduces adam_range_scalar's operation
// sequence exactly; see [CPU Adam numerics] in cpu_adam_impl.h.
#include <immintrin.h>

#include <cstring>

#include "optim/cpu_adam_impl.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace zt::optim::detail {
namespace {

struct Vec8Consts {
  __m256 beta1, omb1, beta2, omb2, gscale, l2, decay, nss, rbc2, eps;
  bool has_l2, has_decay;
};

template <Dt G>
inline __m256 load_grad8(const void* g) {
  if constexpr (G == Dt::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(g));
  } else {
    __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(g));
    if constexpr (G == Dt::kBf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
  }
}

// 8 x u32 (each <= 0xFFFF) -> 8 x u16, in order.
inline __m128i narrow8(__m256i x) {
  return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

// kStream: non-temporal store of the write-only half copy (out 16-byte aligned); see the
// AVX-512 kernel for why.
template <Dt O, bool kStream>
inline void store_out8(void* out, __m256 x) {
  __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  __m128i h;
  if constexpr (O == Dt::kBf16) {
    // at::BFloat16's round-to-nearest-even: (u + 0x7FFF + lsb) >> 16, NaN -> 0x7FC0.
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan32);
    h = narrow8(r);
  } else {
    h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (_mm256_movemask_ps(_mm256_castsi256_ps(nan32))) {
      __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
      h = _mm_blendv_epi8(h, _mm_set1_epi16(0x7E00), nan16);
    }
  }
  if constexpr (kStream)
    _mm_stream_si128(static_cast<__m128i*>(out), h);
  else
    _mm_storeu_si128(static_cast<__m128i*>(out), h);
}

template <Dt G, Dt O, bool kStream>
inline void step8(const Vec8Consts& c, float* p, float* m, float* v, const void* grad, void* out) {
  __m256 g = _mm256_mul_ps(load_grad8<G>(grad), c.gscale);
  __m256 pp = _mm256_loadu_ps(p);
  if (c.has_l2) g = _mm256_fmadd_ps(pp, c.l2, g);
  __m256 mm = _mm256_fmadd_ps(_mm256_loadu_ps(m), c.beta1, _mm256_mul_ps(c.omb1, g));
  __m256 vv = _mm256_fmadd_ps(_mm256_loadu_ps(v), c.beta2, _mm256_mul_ps(_mm256_mul_ps(g, g), c.omb2));
  __m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), c.rbc2, c.eps);
  __m256 upd = _mm256_div_ps(mm, den);
  if (c.has_decay) pp = _mm256_mul_ps(pp, c.decay);
  pp = _mm256_fmadd_ps(upd, c.nss, pp);
  _mm256_storeu_ps(p, pp);
  _mm256_storeu_ps(m, mm);
  _mm256_storeu_ps(v, vv);
  if constexpr (O != Dt::kNone) store_out8<O, kStream>(out, pp);
}

template <Dt G, Dt O>
void loop8(const AdamConsts& k, float* p, float* m, float* v, const void* grad, void* out, int64_t n) {
  const Vec8Consts c{_mm256_set1_ps(k.beta1), _mm256_set1_ps(k.one_minus_beta1), _mm256_set1_ps(k.beta2),
                     _mm256_set1_ps(k.one_minus_beta2), _mm256_set1_ps(k.grad_scale), _mm256_set1_ps(k.l2),
                     _mm256_set1_ps(k.decay), _mm256_set1_ps(k.neg_step_size), _mm256_set1_ps(k.rbc2),
                     _mm256_set1_ps(k.eps), k.has_l2, k.has_decay};
  constexpr int gsz = G == Dt::kF32 ? 4 : 2;
  const auto* g8 = static_cast<const char*>(grad);
  auto* o8 = static_cast<char*>(out);
  int64_t i = 0;
  const bool stream = O != Dt::kNone && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (stream) {
    for (; i + 8 <= n; i += 8) step8<G, O, true>(c, p + i, m + i, v + i, g8 + i * gsz, o8 + i * 2);
    _mm_sfence();  // non-temporal stores are weakly ordered: publish before returning
  } else {
    for (; i + 8 <= n; i += 8)
      step8<G, O, false>(c, p + i, m + i, v + i, g8 + i * gsz, O == Dt::kNone ? nullptr : o8 + i * 2);
  }
  if (i < n) {
    // Tail: one vector step on a zero-padded copy, so no element takes a different path.
    const size_t r = static_cast<size_t>(n - i);
    alignas(32) float tp[8] = {}, tm[8] = {}, tv[8] = {};
    alignas(32) char tg[32] = {}, to[16] = {};
    std::memcpy(tp, p + i, r * 4);
    std::memcpy(tm, m + i, r * 4);
    std::memcpy(tv, v + i, r * 4);
    std::memcpy(tg, g8 + i * gsz, r * gsz);
    step8<G, O, false>(c, tp, tm, tv, tg, to);
    std::memcpy(p + i, tp, r * 4);
    std::memcpy(m + i, tm, r * 4);
    std::memcpy(v + i, tv, r * 4);
    if constexpr (O != Dt::kNone) std::memcpy(o8 + i * 2, to, r * 2);
  }
}

template <Dt G>
void by_out(const AdamConsts& c, Dt o, float* p, float* m, float* v, const void* g, void* out, int64_t n) {
  switch (o) {
    case Dt::kBf16: return loop8<G, Dt::kBf16>(c, p, m, v, g, out, n);
    case Dt::kF16: return loop8<G, Dt::kF16>(c, p, m, v, g, out, n);
    default: return loop8<G, Dt::kNone>(c, p, m, v, g, out, n);
  }
}

}  // namespace

void adam_range_avx2(const AdamConsts& c, Dt grad_dt, Dt out_dt, float* p, float* m, float* v,
                     const void* grad, void* out, int64_t n) {
  switch (grad_dt) {
    case Dt::kBf16: return by_out<Dt::kBf16>(c, out_dt, p, m, v, grad, out, n);
    case Dt::kF16: return by_out<Dt::kF16>(c, out_dt, p, m, v, grad, out, n);
    default: return by_out<Dt::kF32>(c, out_dt, p, m, v, grad, out, n);
  }
}

}  // namespace zt::optim::detail

#pragma GCC pop_options
