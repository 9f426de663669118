// CPU Adam kernels. Tolerances:
//  - every SIMD kernel vs the scalar kernel: bit-identical fp32 param/exp_avg/exp_avg_sq and
//    bf16/fp16 outputs (memcmp), except that NaN results are compared as "both NaN" (x86 may
//    pick a different NaN operand's payload; see [CPU Adam numerics]);
//  - scalar kernel vs torch::optim::Adam/AdamW after 5 steps: params |a - b| <= 1e-6 |b| + 1e-9,
//    exp_avg / exp_avg_sq within 2 ulps of the tensor's largest magnitude (the two order the
//    same math differently: sqrt(v) * (1/sqrt(bc2)) vs sqrt(v) / sqrt(bc2), FMA vs separate
//    multiply and add).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <omp.h>

#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "optim/cpu_adam.h"
#include "optim/cpu_adam_impl.h"
#include "zerotrain/error.h"

namespace zt_test_cpu_adam {

using namespace zt::optim;
namespace ztd = zt::optim::detail;
using ztd::Dt;

namespace {

// One kernel variant under test. avx512 runs with either bf16 conversion.
struct Variant {
  const char* name;
  CpuKernel kernel;
  bool native_bf16;
};

std::vector<Variant> simd_variants() {
  return {{"avx2", CpuKernel::kAvx2, false},
          {"avx512 (integer bf16 rounding)", CpuKernel::kAvx512, false},
          {"avx512 (avx512bf16 instruction)", CpuKernel::kAvx512, true}};
}

// Empty when the variant can run here, else the reason to skip it.
std::string missing(const Variant& v) {
  if (!cpu_kernel_supported(v.kernel)) return std::string(kernel_name(v.kernel)) + " not supported by this CPU";
  if (v.native_bf16 && !ztd::cpu_has_avx512bf16()) return "avx512bf16 not supported by this CPU";
  return "";
}

void run_range(const Variant* v, const ztd::AdamConsts& c, Dt g, Dt o, float* p, float* m, float* s,
               const void* grad, void* out, int64_t n) {
  if (!v) return ztd::adam_range_scalar(c, g, o, p, m, s, grad, out, n);
  if (v->kernel == CpuKernel::kAvx2) return ztd::adam_range_avx2(c, g, o, p, m, s, grad, out, n);
  ztd::adam_range_avx512(c, g, o, p, m, s, grad, out, n, v->native_bf16);
}

at::ScalarType to_scalar_type(Dt d) {
  switch (d) {
    case Dt::kF32: return at::kFloat;
    case Dt::kBf16: return at::kBFloat16;
    case Dt::kF16: return at::kHalf;
    default: return at::ScalarType::Undefined;
  }
}

// The state of one Adam problem; copies compare bit for bit.
struct Problem {
  std::vector<float> p, m, v;
  std::vector<uint8_t> grad;  // raw storage of grad_dt
  std::vector<uint16_t> out;
  Dt grad_dt, out_dt;
  int64_t n;

  Problem(int64_t n_, Dt g, Dt o, uint64_t seed) : grad_dt(g), out_dt(o), n(n_) {
    torch::manual_seed(seed);
    auto f = [&](torch::Tensor t) { return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + n); };
    p = f(torch::randn({n}));
    m = f(torch::randn({n}) * 0.1);
    v = f(torch::rand({n}) * 0.01);
    auto gt = (torch::randn({n}) * 3).to(to_scalar_type(g)).contiguous();
    grad.assign(static_cast<uint8_t*>(gt.data_ptr()), static_cast<uint8_t*>(gt.data_ptr()) + n * gt.element_size());
    out.assign(o == Dt::kNone ? 0 : n, 0xDEAD);
  }
  void set_grad(int64_t i, float x) {
    if (grad_dt == Dt::kF32) std::memcpy(grad.data() + 4 * i, &x, 4);
    uint16_t h = grad_dt == Dt::kBf16 ? ztd::f32_to_bf16(x) : ztd::f32_to_f16(x);
    if (grad_dt != Dt::kF32) std::memcpy(grad.data() + 2 * i, &h, 2);
  }
  // The output goes through a 64-byte aligned scratch buffer, shifted by one element when
  // misalign_out: aligned outputs take the kernels' non-temporal store path, others not.
  void step(const Variant* var, const ztd::AdamConsts& c, bool misalign_out = false) {
    uint16_t* o = nullptr;
    std::vector<uint16_t> scratch;
    if (!out.empty()) {
      scratch.assign(out.size() + 64, 0);
      auto addr = reinterpret_cast<uintptr_t>(scratch.data());
      o = scratch.data() + (64 - addr % 64) % 64 / 2 + (misalign_out ? 1 : 0);
      std::memcpy(o, out.data(), out.size() * 2);
    }
    run_range(var, c, grad_dt, out_dt, p.data(), m.data(), v.data(), grad.data(), o, n);
    if (o) std::memcpy(out.data(), o, out.size() * 2);
  }
};

// Bitwise equality, NaN == NaN whatever the payload. Reports the first few mismatches.
void expect_same_floats(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  int bad = 0;
  for (size_t i = 0; i < a.size() && bad < 5; ++i) {
    bool same = std::isnan(a[i]) ? std::isnan(b[i]) : std::bit_cast<uint32_t>(a[i]) == std::bit_cast<uint32_t>(b[i]);
    if (!same) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
      ++bad;
    }
  }
}

void expect_same_half(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  int bad = 0;
  for (size_t i = 0; i < a.size() && bad < 5; ++i)
    if (a[i] != b[i]) {
      ADD_FAILURE() << what << "[" << i << "]: 0x" << std::hex << a[i] << " vs 0x" << b[i] << std::dec;
      ++bad;
    }
}

void expect_same(const Problem& ref, const Problem& got, const std::string& ctx) {
  expect_same_floats(ref.p, got.p, ctx + " param");
  expect_same_floats(ref.m, got.m, ctx + " exp_avg");
  expect_same_floats(ref.v, got.v, ctx + " exp_avg_sq");
  expect_same_half(ref.out, got.out, ctx + " out");
}

const char* dt_name(Dt d) { return d == Dt::kF32 ? "f32" : d == Dt::kBf16 ? "bf16" : d == Dt::kF16 ? "f16" : "none"; }

std::vector<AdamHyper> hypers() {
  AdamHyper adamw;
  adamw.lr = 1e-2f;
  adamw.weight_decay = 0.1f;
  adamw.step = 3;
  AdamHyper adam = adamw;
  adam.adamw = false;
  adam.grad_scale = 1.0f / 1024;
  adam.step = 1;
  AdamHyper nobc = adamw;
  nobc.bias_correction = false;
  nobc.weight_decay = 0;
  nobc.eps = 1e-6f;
  return {adamw, adam, nobc};
}

}  // namespace

TEST(CpuAdam, KernelNames) {
  for (CpuKernel k : {CpuKernel::kAuto, CpuKernel::kScalar, CpuKernel::kAvx2, CpuKernel::kAvx512})
    EXPECT_EQ(parse_cpu_kernel(kernel_name(k)), k);
  EXPECT_THROW(parse_cpu_kernel("sse9"), zt::Error);
  EXPECT_TRUE(cpu_kernel_supported(best_cpu_kernel()));
  std::printf("[ info ] best CPU Adam kernel here: %s, avx512bf16: %s\n", kernel_name(best_cpu_kernel()),
              ztd::cpu_has_avx512bf16() ? "yes" : "no");
}

TEST(CpuAdam, HalfConversionsMatchTorch) {
  // fp16 -> fp32: all 65536 inputs.
  for (uint32_t h = 0; h < 65536; ++h) {
    float ours = ztd::f16_to_f32(static_cast<uint16_t>(h));
    float ref = static_cast<float>(c10::Half(static_cast<uint16_t>(h), c10::Half::from_bits()));
    if (std::isnan(ref))
      ASSERT_TRUE(std::isnan(ours)) << h;
    else
      ASSERT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(ref)) << std::hex << h;
  }
  // fp32 -> bf16 / fp16 on random bit patterns of every class plus edge cases.
  std::mt19937 rng(7);
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
                                0xFF800000, 0x477FEFFF, 0x477FF000, 0x477FE000, 0x33000000, 0x33000001, 0x387FFFFF,
                                0x38800000, 0x3F808000, 0x3F818000, 0x3F80C000};
  for (int i = 0; i < 200000; ++i) bits.push_back(rng());
  for (int i = 0; i < 200000; ++i) bits.push_back((rng() & 0x87FFFFFFu) | ((100u + rng() % 30u) << 23));  // near fp16 range
  for (uint32_t u : bits) {
    float f = std::bit_cast<float>(u);
    if (std::isnan(f)) {
      ASSERT_EQ(ztd::f32_to_bf16(f), 0x7FC0);
      ASSERT_EQ(ztd::f32_to_f16(f), 0x7E00);
      continue;
    }
    ASSERT_EQ(ztd::f32_to_bf16(f), c10::BFloat16(f).x) << std::hex << u;
    ASSERT_EQ(ztd::f32_to_f16(f), c10::Half(f).x) << std::hex << u;
  }
}

TEST(CpuAdam, SimdKernelsEqualScalar) {
  std::vector<Variant> vars;
  for (const auto& var : simd_variants()) {
    if (std::string why = missing(var); !why.empty())
      std::printf("[ skip ] %s: %s\n", var.name, why.c_str());
    else
      vars.push_back(var);
  }
  if (vars.empty()) GTEST_SKIP() << "no SIMD kernel available on this CPU";
  const std::vector<int64_t> sizes = {1, 15, 16, 17, 33, 1000003};
  for (int64_t n : sizes)
    for (Dt g : {Dt::kF32, Dt::kBf16, Dt::kF16})
      for (Dt o : {Dt::kNone, Dt::kBf16, Dt::kF16}) {
        auto hs = hypers();
        if (n > 1000) hs.resize(1);  // the 1M case covers every dtype pair with one hyper set
        for (size_t h = 0; h < hs.size(); ++h) {
          const auto c = ztd::make_adam_consts(hs[h]);
          const Problem base(n, g, o, 1234 + n);
          Problem ref = base;
          ref.step(nullptr, c);
          for (const auto& var : vars)
            for (bool misalign : {false, true}) {
              if (misalign && o == Dt::kNone) continue;
              Problem got = base;
              got.step(&var, c, misalign);
              expect_same(ref, got,
                          std::string(var.name) + " n=" + std::to_string(n) + " grad=" + dt_name(g) + " out=" +
                              dt_name(o) + (misalign ? " (misaligned out)" : "") + " hyper#" + std::to_string(h));
              if (HasFailure()) return;
            }
        }
      }
}

TEST(CpuAdam, NonFiniteGradientsPropagateAlike) {
  const int64_t n = 100;
  const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, 0.f, 3e38f};
  for (Dt g : {Dt::kF32, Dt::kBf16, Dt::kF16})
    for (Dt o : {Dt::kBf16, Dt::kF16}) {
      Problem ref(n, g, o, 99);
      for (int64_t i = 0; i < n; i += 7) ref.set_grad(i, specials[(i / 7) % 6]);
      ref.p[50] = NAN;  // a poisoned master weight stays NaN
      ref.v[51] = 0.f;  // zero variance with a zero gradient: update 0 / eps
      ref.m[51] = 0.f;
      ref.set_grad(51, 0.f);
      Problem base = ref;
      AdamHyper hy;
      hy.weight_decay = 0.01f;
      const auto c = ztd::make_adam_consts(hy);
      ref.step(nullptr, c);
      // What the scalar reference does: inf grad -> m, v inf -> update inf/inf = NaN.
      EXPECT_TRUE(std::isinf(ref.m[0]) && std::isinf(ref.v[0]) && std::isnan(ref.p[0]));
      EXPECT_TRUE(std::isnan(ref.m[14]) && std::isnan(ref.v[14]) && std::isnan(ref.p[14]));
      EXPECT_TRUE(std::isnan(ref.p[50]));
      EXPECT_EQ(ref.p[51], base.p[51] * c.decay);
      EXPECT_EQ(ref.out[0], o == Dt::kBf16 ? 0x7FC0 : 0x7E00);  // canonical NaN
      // 3e38 fits fp32 and bf16 but is inf in fp16: g*g = inf -> v = inf -> update m/inf = 0.
      EXPECT_TRUE(std::isinf(ref.v[35]));
      EXPECT_EQ(std::isfinite(ref.p[35]), g != Dt::kF16) << dt_name(g);
      for (const auto& var : simd_variants()) {
        if (!missing(var).empty()) continue;
        Problem got = base;
        got.step(&var, c);
        expect_same(ref, got, std::string(var.name) + " grad=" + dt_name(g) + " out=" + dt_name(o));
      }
    }
}

TEST(CpuAdam, HalfOutputOfEveryFloatClass) {
  // lr = 0, zero grads and moments: the params stay bit-identical, so out = half(p) tests the
  // SIMD conversions against the scalar ones on denormals, ties, overflow, inf and NaN.
  std::mt19937 rng(3);
  std::vector<float> vals;
  for (uint32_t u : {0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00001u, 0xFFFFFFFFu,
                     0x477FF000u, 0x3F808000u, 0x3F818000u, 0x33000000u})
    vals.push_back(std::bit_cast<float>(u));
  while (vals.size() < 4099) vals.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  const int64_t n = static_cast<int64_t>(vals.size());
  AdamHyper hy;
  hy.lr = 0;
  const auto c = ztd::make_adam_consts(hy);
  for (Dt o : {Dt::kBf16, Dt::kF16}) {
    Problem ref(n, Dt::kF32, o, 5);
    ref.p = vals;
    std::fill(ref.m.begin(), ref.m.end(), 0.f);
    std::fill(ref.v.begin(), ref.v.end(), 0.f);
    std::fill(ref.grad.begin(), ref.grad.end(), 0);
    Problem base = ref;
    ref.step(nullptr, c);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(vals[i])) continue;
      ASSERT_EQ(std::bit_cast<uint32_t>(ref.p[i]), std::bit_cast<uint32_t>(vals[i])) << i;
      ASSERT_EQ(ref.out[i], o == Dt::kBf16 ? c10::BFloat16(vals[i]).x : c10::Half(vals[i]).x) << i;
    }
    for (const auto& var : simd_variants()) {
      if (!missing(var).empty()) continue;
      Problem got = base;
      got.step(&var, c);
      expect_same(ref, got, std::string(var.name) + " out=" + dt_name(o));
    }
  }
}

TEST(CpuAdam, ParallelTilesEqualScalar) {
  // The public entry point: OpenMP over 64 Ki-element tiles, kAuto, tensor wrapper.
  const int64_t n = 3 * kCpuAdamTile + 5;
  Problem ref(n, Dt::kBf16, Dt::kBf16, 11);
  Problem got = ref;
  AdamHyper hy;
  hy.weight_decay = 0.01f;
  hy.step = 7;
  hy.grad_scale = 0.25f;
  cpu_adam_step(ref.p.data(), ref.m.data(), ref.v.data(), ref.grad.data(), at::kBFloat16, n, hy, ref.out.data(),
                at::kBFloat16, CpuKernel::kScalar);
  auto opt = torch::TensorOptions().dtype(torch::kFloat);
  auto p = torch::from_blob(got.p.data(), {n}, opt), m = torch::from_blob(got.m.data(), {n}, opt),
       v = torch::from_blob(got.v.data(), {n}, opt);
  auto g = torch::from_blob(got.grad.data(), {n}, torch::TensorOptions().dtype(torch::kBFloat16));
  auto out = torch::from_blob(got.out.data(), {n}, torch::TensorOptions().dtype(torch::kBFloat16));
  // unit_main sets 1 thread (torch and zerotrain share one libgomp); use several here so
  // the tiles really are split between threads.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(3);
  cpu_adam_step(p, m, v, g, hy, out);  // kAuto: the best kernel here
  omp_set_num_threads(saved);
  expect_same(ref, got, std::string("auto=") + kernel_name(best_cpu_kernel()));
}

TEST(CpuAdam, ScalarMatchesTorchAdamAndAdamW) {
  const int64_t n = 4099;
  for (bool adamw : {false, true}) {
    torch::manual_seed(adamw ? 21 : 20);
    auto p0 = torch::randn({n});
    auto p_ref = p0.clone().requires_grad_(true);
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    std::unique_ptr<torch::optim::Optimizer> opt;
    std::vector<torch::Tensor> params = {p_ref};
    if (adamw)
      opt = std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
    else
      opt = std::make_unique<torch::optim::Adam>(params,
                                                 torch::optim::AdamOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
    auto p = p0.clone(), m = torch::zeros({n}), v = torch::zeros({n});
    for (int64_t step = 1; step <= 5; ++step) {
      auto g = torch::randn({n});
      p_ref.mutable_grad() = g.clone();
      opt->step();
      AdamHyper hy{lr, b1, b2, eps, wd, adamw, true, step, 1.f};
      cpu_adam_step(p, m, v, g, hy, {}, CpuKernel::kScalar);
    }
    auto ref = p_ref.detach();
    auto err = (p - ref).abs() - (ref.abs() * 1e-6 + 1e-9);
    EXPECT_LE(err.max().item<float>(), 0.f) << (adamw ? "AdamW" : "Adam") << " max |diff| "
                                            << (p - ref).abs().max().item<float>();
    EXPECT_GT((p - p0).abs().max().item<float>(), 1e-3f);  // it did move
    // Optimizer state too.
    auto& st = *opt->state().at(p_ref.unsafeGetTensorImpl());
    auto m_ref = adamw ? static_cast<torch::optim::AdamWParamState&>(st).exp_avg()
                       : static_cast<torch::optim::AdamParamState&>(st).exp_avg();
    auto v_ref = adamw ? static_cast<torch::optim::AdamWParamState&>(st).exp_avg_sq()
                       : static_cast<torch::optim::AdamParamState&>(st).exp_avg_sq();
    std::printf("[ info ] %s vs torch after 5 steps: max |dp| %.3g, |dm| %.3g, |dv| %.3g\n", adamw ? "AdamW" : "Adam",
                (p - ref).abs().max().item<double>(), (m - m_ref).abs().max().item<double>(),
                (v - v_ref).abs().max().item<double>());
    // Moments: absolute error within 2 float ulps of the tensor's largest magnitude (they
    // are sums of terms of either sign, so a relative bound alone fails near cancellation).
    constexpr double kUlp = 1.1920929e-07;
    EXPECT_LE((m - m_ref).abs().max().item<double>(), 2 * kUlp * m_ref.abs().max().item<double>());
    EXPECT_LE((v - v_ref).abs().max().item<double>(), 2 * kUlp * v_ref.abs().max().item<double>());
  }
}

TEST(CpuAdam, TensorWrapperChecks) {
  auto f = torch::zeros({8});
  auto g = torch::zeros({8});
  AdamHyper hy;
  EXPECT_THROW(cpu_adam_step(f, torch::zeros({7}), torch::zeros({8}), g, hy), zt::Error);
  EXPECT_THROW(cpu_adam_step(f, torch::zeros({8}, torch::kDouble), torch::zeros({8}), g, hy), zt::Error);
  EXPECT_THROW(cpu_adam_step(f, torch::zeros({8}), torch::zeros({8}), torch::zeros({16}).slice(0, 0, 16, 2), hy),
               zt::Error);
  EXPECT_THROW(cpu_adam_step(f, torch::zeros({8}), torch::zeros({8}), torch::zeros({8}, torch::kInt), hy), zt::Error);
  EXPECT_THROW(cpu_adam_step(f, torch::zeros({8}), torch::zeros({8}), g, hy, torch::zeros({8})), zt::Error);
  AdamHyper bad = hy;
  bad.step = 0;
  EXPECT_THROW(cpu_adam_step(f, torch::zeros({8}), torch::zeros({8}), g, bad), zt::Error);
  bad = hy;
  bad.beta2 = 1.0f;
  EXPECT_THROW(cpu_adam_step(f, torch::zeros({8}), torch::zeros({8}), g, bad), zt::Error);
  // Empty shards are fine.
  auto e = torch::zeros({0});
  EXPECT_NO_THROW(cpu_adam_step(e, e.clone(), e.clone(), e.clone(), hy, torch::zeros({0}, torch::kHalf)));
}

}  // namespace zt_test_cpu_adam
