// zt::kernels::fused_adam (src/kernels/fused_adam.cu) against ATen's own fused kernels,
// at::_fused_adamw_ and at::_fused_adam_, on fp32 copies of the same data.
//
//   build/zt_gpu --gtest_filter='FusedAdam*'
//
// Skipped without a CUDA build, without the kernels (no nvcc at build time) or without a
// GPU. Runs on cuda:LOCAL_RANK (cuda:0 outside `zerotrain launch`).
//
// Tolerance: fp32 results (master, exp_avg, exp_avg_sq) must satisfy
// |ours - aten| <= kAtol + kRtol * |aten| with kRtol = 1e-6 and kAtol = 1e-7. The math is
// written as ATen writes it (same fp32 operations, same explicit fmas) and the bias
// corrections are computed as ATen computes them, so the results are expected to be
// identical (they were, bit for bit, on an H200 with nvcc 13.0 and torch 2.11.0+cu130);
// the tolerance leaves room only for another compiler contracting a multiply-add
// differently (an ulp or two of the values involved).
// Values are O(1) (master ~ N(0,1), m ~ 0.1 N(0,1), v ~ 0.01 U(0,1), grads ~ N(0,1)) and one
// step moves master by ~lr = 1e-3, so any real difference in the math (a missing bias
// correction, the wrong weight-decay form, grad_scale divided instead of multiplied)
// is orders of magnitude above it. param_out must equal master.to(dtype) bit for bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/gpu_util.h"
#include "kernels/fused_adam.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt::kernels {
namespace test_fused_adam {
namespace {

#ifndef ZT_WITH_CUDA
TEST(FusedAdam, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else

using zt::test_support::bits;
using zt::test_support::name;
using zt::test_support::to_dtype;

constexpr int64_t kN = 1'000'003;  // odd: a tail after the groups of 4
constexpr int64_t kGuard = 5;      // sentinel elements after every buffer
constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-7;
constexpr float kLr = 1e-3f, kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f, kWeightDecay = 0.01f;
constexpr float kStep = 7.0f;
constexpr float kSentinel = -3.0f;  // exact in every dtype

::testing::AssertionResult same_bits(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.scalar_type() != expected.scalar_type() || actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "got " << actual.sizes() << " " << actual.scalar_type() << ", expected "
                                         << expected.sizes() << " " << expected.scalar_type();
  }
  at::Tensor bad = (bits(actual) != bits(expected)).nonzero();
  if (bad.size(0) == 0) return ::testing::AssertionSuccess();
  int64_t k = bad[0][0].item<int64_t>();
  return ::testing::AssertionFailure() << bad.size(0) << " of " << actual.numel() << " elements differ in their bits; first at ["
                                       << k << "]: got " << actual[k].item<double>() << ", expected "
                                       << expected[k].item<double>();
}

// |actual - expected| <= atol + rtol * |expected| everywhere (NaN matching NaN when
// equal_nan; equal infinities match); names the count, the first offender and the
// largest absolute difference.
::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected, double rtol = kRtol,
                                 double atol = kAtol, bool equal_nan = false) {
  if (actual.scalar_type() != expected.scalar_type() || actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "got " << actual.sizes() << " " << actual.scalar_type() << ", expected "
                                         << expected.sizes() << " " << expected.scalar_type();
  }
  at::Tensor ok = at::isclose(actual, expected, rtol, atol, equal_nan);
  at::Tensor bad = at::logical_not(ok).nonzero();
  if (bad.size(0) == 0) return ::testing::AssertionSuccess();
  int64_t k = bad[0][0].item<int64_t>();
  at::Tensor diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().masked_fill(ok, 0).nan_to_num(INFINITY);
  return ::testing::AssertionFailure() << bad.size(0) << " of " << actual.numel() << " elements differ beyond rtol "
                                       << rtol << " atol " << atol << "; first at [" << k << "]: got "
                                       << actual[k].item<double>() << ", expected " << expected[k].item<double>()
                                       << "; largest difference " << diff.max().item<double>();
}

// A length-n view `offset` elements into a buffer that has kGuard more elements after
// it; everything outside the view holds kSentinel and must keep it.
struct Buf {
  at::Tensor storage, view;
  int64_t offset = 0;
  Buf() = default;
  Buf(const at::Tensor& values, int64_t off) : offset(off) {
    storage = at::full({off + values.numel() + kGuard}, kSentinel, values.options());
    view = storage.narrow(0, off, values.numel());
    view.copy_(values);
  }
  ::testing::AssertionResult guards_intact() const {
    const int64_t n = view.numel();
    at::Tensor outside = at::cat({storage.narrow(0, 0, offset), storage.narrow(0, offset + n, kGuard)});
    if (at::equal(outside, at::full_like(outside, kSentinel))) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "an element outside the " << n << "-element view (offset " << offset
                                         << ") was written";
  }
};

// Where each buffer starts, in elements past a fresh (512-byte aligned) allocation.
struct Layout {
  const char* what;
  int64_t state;  // master, exp_avg, exp_avg_sq
  int64_t grad;
  int64_t out;
};
// aligned: the vectorized path from element 0. offset1: every buffer starts at element 1
// (unaligned pointers): a scalar head of 3 elements, then the vectorized path.
// mismatched: no element where all buffers are aligned at once: the scalar path throughout.
const Layout kLayouts[] = {{"aligned", 0, 0, 0}, {"offset1", 1, 1, 1}, {"mismatched", 1, 0, 1}};

struct Scalars {
  bool adamw = true;
  float weight_decay = kWeightDecay;
  float step = kStep;
  std::optional<float> grad_scale = 0.5f;  // ours multiplies by it; ATen is given 1/it
};

class FusedAdam : public zt::test_support::KernelTest {
 protected:
  at::Tensor scalar(float x) const { return at::full({}, x, on(at::kFloat)); }

  // 1 - beta^step as ATen's fused kernel forms it: pow in fp32 on the device.
  float bias_correction(float beta, float step) const {
    return 1.0f - at::pow(scalar(beta), static_cast<double>(step)).item<float>();
  }

  // One state: master, m, v (fp32) and the gradient in grad_dt.
  struct State {
    at::Tensor master, exp_avg, exp_avg_sq, grad;
  };
  State random_state(int64_t n, at::ScalarType grad_dt, uint64_t seed) const {
    at::manual_seed(seed);
    State s;
    s.master = at::randn({n}, on(at::kFloat));
    s.exp_avg = at::randn({n}, on(at::kFloat)) * 0.1;
    s.exp_avg_sq = at::rand({n}, on(at::kFloat)) * 0.01;
    s.grad = at::randn({n}, on(at::kFloat)).to(grad_dt);
    return s;
  }

  // ATen's step on fp32 copies of `s` (the gradient converted to fp32, exactly).
  State aten_step(const State& s, const Scalars& k) const {
    // Copies throughout: ATen writes the unscaled gradient back into r.grad (and
    // Tensor::to(kFloat) of an fp32 gradient would return the same tensor).
    State r{s.master.clone(), s.exp_avg.clone(), s.exp_avg_sq.clone(), s.grad.to(at::kFloat).clone()};
    at::Tensor step = scalar(k.step);
    std::optional<at::Tensor> grad_scale;
    if (k.grad_scale) grad_scale = scalar(1.0f / *k.grad_scale);  // ATen divides by it
    if (k.adamw) {
      at::_fused_adamw_({r.master}, {r.grad}, {r.exp_avg}, {r.exp_avg_sq}, {}, {step}, kLr, kBeta1, kBeta2,
                        k.weight_decay, kEps, /*amsgrad=*/false, /*maximize=*/false, grad_scale, std::nullopt);
    } else {
      at::_fused_adam_({r.master}, {r.grad}, {r.exp_avg}, {r.exp_avg_sq}, {}, {step}, kLr, kBeta1, kBeta2,
                       k.weight_decay, kEps, /*amsgrad=*/false, /*maximize=*/false, grad_scale, std::nullopt);
    }
    return r;
  }

  // Our buffers for `s` in `layout`, param_out (if any) prefilled with kSentinel.
  struct Ours {
    Buf master, exp_avg, exp_avg_sq, grad;
    std::optional<Buf> out;
  };
  Ours place(const State& s, const Layout& layout, std::optional<at::ScalarType> out_dt) const {
    Ours o;
    o.master = Buf(s.master, layout.state);
    o.exp_avg = Buf(s.exp_avg, layout.state);
    o.exp_avg_sq = Buf(s.exp_avg_sq, layout.state);
    o.grad = Buf(s.grad, layout.grad);
    if (out_dt) o.out = Buf(at::full({s.master.numel()}, kSentinel, on(*out_dt)), layout.out);
    return o;
  }

  void run(Ours& o, const Scalars& k, const at::Tensor* grad_scale, const at::Tensor* found_inf) const {
    AdamArgs a;
    a.master = o.master.view.data_ptr<float>();
    a.exp_avg = o.exp_avg.view.data_ptr<float>();
    a.exp_avg_sq = o.exp_avg_sq.view.data_ptr<float>();
    a.grad = o.grad.view.data_ptr();
    a.grad_type = to_dtype(o.grad.view.scalar_type());
    if (o.out) {
      a.param_out = o.out->view.data_ptr();
      a.param_type = to_dtype(o.out->view.scalar_type());
    }
    a.n = o.master.view.numel();
    a.lr = kLr;
    a.beta1 = kBeta1;
    a.beta2 = kBeta2;
    a.eps = kEps;
    a.weight_decay = k.weight_decay;
    a.bias_correction1 = bias_correction(kBeta1, k.step);
    a.bias_correction2 = bias_correction(kBeta2, k.step);
    a.adamw = k.adamw;
    a.grad_scale = grad_scale ? grad_scale->data_ptr<float>() : nullptr;
    a.found_inf = found_inf ? found_inf->data_ptr<float>() : nullptr;
    fused_adam(a, stream());
  }

  // Ours (with k.grad_scale as a device scalar) against ATen on the same state.
  void expect_matches_aten(const State& s, const Layout& layout, std::optional<at::ScalarType> out_dt,
                           const Scalars& k) const {
    const State want = aten_step(s, k);
    Ours o = place(s, layout, out_dt);
    const at::Tensor grad_before = o.grad.view.clone();
    const at::Tensor scale = scalar(k.grad_scale.value_or(1.0f));
    run(o, k, k.grad_scale ? &scale : nullptr, nullptr);

    EXPECT_TRUE(close(o.master.view, want.master)) << "master";
    EXPECT_TRUE(close(o.exp_avg.view, want.exp_avg)) << "exp_avg";
    EXPECT_TRUE(close(o.exp_avg_sq.view, want.exp_avg_sq)) << "exp_avg_sq";
    EXPECT_FALSE(at::equal(o.master.view, s.master)) << "the step changed nothing";
    EXPECT_TRUE(same_bits(o.grad.view, grad_before)) << "the gradient must not be modified";
    EXPECT_TRUE(o.master.guards_intact()) << "master";
    EXPECT_TRUE(o.exp_avg.guards_intact()) << "exp_avg";
    EXPECT_TRUE(o.exp_avg_sq.guards_intact()) << "exp_avg_sq";
    EXPECT_TRUE(o.grad.guards_intact()) << "grad";
    if (o.out) {
      EXPECT_TRUE(same_bits(o.out->view, o.master.view.to(*out_dt))) << "param_out == master.to(" << name(*out_dt) << ")";
      EXPECT_TRUE(o.out->guards_intact()) << "param_out";
    }
  }
};

const at::ScalarType kGradDtypes[] = {at::kFloat, at::kBFloat16, at::kHalf};
const std::optional<at::ScalarType> kOutDtypes[] = {std::nullopt, at::kBFloat16, at::kHalf};

TEST_F(FusedAdam, MatchesAtenEveryModeDtypeAndLayout) {
  uint64_t seed = 1;
  for (bool adamw : {true, false}) {
    for (at::ScalarType grad_dt : kGradDtypes) {
      const State s = random_state(kN, grad_dt, seed++);
      for (const auto& out_dt : kOutDtypes) {
        for (const Layout& layout : kLayouts) {
          SCOPED_TRACE(std::string(adamw ? "adamw" : "adam") + " grad=" + name(grad_dt) +
                       " param_out=" + (out_dt ? name(*out_dt) : "none") + " layout=" + layout.what);
          Scalars k;
          k.adamw = adamw;
          expect_matches_aten(s, layout, out_dt, k);
        }
      }
    }
  }
}

// No grad_scale, no weight decay, step 1; and fp32 param_out.
TEST_F(FusedAdam, MatchesAtenWithoutScaleOrWeightDecay) {
  for (bool adamw : {true, false}) {
    SCOPED_TRACE(adamw ? "adamw" : "adam");
    Scalars k;
    k.adamw = adamw;
    k.weight_decay = 0;
    k.step = 1;
    k.grad_scale = std::nullopt;
    expect_matches_aten(random_state(kN, at::kHalf, 100), kLayouts[1], at::kHalf, k);
    expect_matches_aten(random_state(kN, at::kFloat, 101), kLayouts[0], at::kFloat, k);
  }
}

// Every start and length around the vector width: head, body and tail in every combination.
TEST_F(FusedAdam, SmallSizesEveryOffset) {
  uint64_t seed = 200;
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 13, 64, 67}) {
    for (int64_t off = 0; off < 4; ++off) {
      for (at::ScalarType grad_dt : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " offset=" + std::to_string(off) + " grad=" + name(grad_dt));
        expect_matches_aten(random_state(n, grad_dt, seed++), Layout{"small", off, off, off}, at::kBFloat16, Scalars{});
      }
    }
  }
}

// found_inf != 0: nothing changes, bit for bit; found_inf == 0: the normal step.
TEST_F(FusedAdam, FoundInfSkipsTheStep) {
  struct Combo {
    at::ScalarType grad;
    std::optional<at::ScalarType> out;
  };
  uint64_t seed = 300;
  for (const Combo& c : {Combo{at::kBFloat16, at::kBFloat16}, Combo{at::kFloat, std::nullopt}, Combo{at::kHalf, at::kHalf}}) {
    for (const Layout& layout : kLayouts) {
      SCOPED_TRACE("grad=" + name(c.grad) + " param_out=" + (c.out ? name(*c.out) : "none") + " layout=" + layout.what);
      const State s = random_state(kN, c.grad, seed++);
      Scalars k;
      const at::Tensor scale = scalar(*k.grad_scale);

      Ours o = place(s, layout, c.out);
      const at::Tensor storages_before[] = {o.master.storage.clone(), o.exp_avg.storage.clone(),
                                            o.exp_avg_sq.storage.clone(), o.grad.storage.clone()};
      const at::Tensor out_before = o.out ? o.out->storage.clone() : at::Tensor();
      const at::Tensor inf = scalar(1.0f);
      run(o, k, &scale, &inf);
      EXPECT_TRUE(same_bits(o.master.storage, storages_before[0])) << "master";
      EXPECT_TRUE(same_bits(o.exp_avg.storage, storages_before[1])) << "exp_avg";
      EXPECT_TRUE(same_bits(o.exp_avg_sq.storage, storages_before[2])) << "exp_avg_sq";
      EXPECT_TRUE(same_bits(o.grad.storage, storages_before[3])) << "grad";
      if (o.out) {
        EXPECT_TRUE(same_bits(o.out->storage, out_before)) << "param_out";
      }

      const at::Tensor no_inf = scalar(0.0f);
      run(o, k, &scale, &no_inf);
      const State want = aten_step(s, k);
      EXPECT_TRUE(close(o.master.view, want.master)) << "master";
      EXPECT_TRUE(close(o.exp_avg.view, want.exp_avg)) << "exp_avg";
      EXPECT_TRUE(close(o.exp_avg_sq.view, want.exp_avg_sq)) << "exp_avg_sq";
      if (o.out) {
        EXPECT_TRUE(same_bits(o.out->view, o.master.view.to(*c.out))) << "param_out";
      }
    }
  }
}

// Without found_inf, an inf or NaN gradient propagates as in ATen: that element's
// master, m and v become NaN; the others are unaffected.
TEST_F(FusedAdam, NonFiniteGradientsPropagateLikeAten) {
  const int64_t bad_at[] = {10, 20, 30, 4097};
  const float bad_value[] = {INFINITY, -INFINITY, NAN, NAN};
  uint64_t seed = 400;
  for (bool adamw : {true, false}) {
    for (at::ScalarType grad_dt : kGradDtypes) {
      SCOPED_TRACE(std::string(adamw ? "adamw" : "adam") + " grad=" + name(grad_dt));
      State s = random_state(8191, grad_dt, seed++);
      for (int i = 0; i < 4; ++i) s.grad[bad_at[i]].fill_(bad_value[i]);
      Scalars k;
      k.adamw = adamw;
      const State want = aten_step(s, k);
      Ours o = place(s, kLayouts[1], at::kBFloat16);
      const at::Tensor scale = scalar(*k.grad_scale);
      run(o, k, &scale, nullptr);

      EXPECT_TRUE(close(o.master.view, want.master, kRtol, kAtol, /*equal_nan=*/true)) << "master";
      EXPECT_TRUE(close(o.exp_avg.view, want.exp_avg, kRtol, kAtol, true)) << "exp_avg";
      EXPECT_TRUE(close(o.exp_avg_sq.view, want.exp_avg_sq, kRtol, kAtol, true)) << "exp_avg_sq";
      const at::Tensor master = o.master.view.cpu();
      for (int64_t i : bad_at) EXPECT_TRUE(std::isnan(master[i].item<float>())) << "master[" << i << "]";
      EXPECT_EQ(at::isnan(o.master.view).sum().item<int64_t>(), 4) << "only the non-finite gradients' elements";
      // param_out: NaN where master is NaN (NaN payloads may differ), equal elsewhere.
      const at::Tensor nan = at::isnan(o.master.view);
      EXPECT_TRUE(at::equal(at::isnan(o.out->view), nan)) << "param_out NaNs";
      EXPECT_TRUE(same_bits(o.out->view.masked_fill(nan, 0), o.master.view.masked_fill(nan, 0).to(at::kBFloat16)))
          << "param_out";
    }
  }
}

TEST_F(FusedAdam, ArgumentChecks) {
  AdamArgs a;  // n == 0: nothing to do, not even pointers to check
  EXPECT_NO_THROW(fused_adam(a, stream()));
  a.n = -1;
  EXPECT_THROW(fused_adam(a, stream()), std::invalid_argument);
  a.n = 4;  // null buffers
  EXPECT_THROW(fused_adam(a, stream()), std::invalid_argument);
}

#endif  // ZT_WITH_CUDA

}  // namespace
}  // namespace test_fused_adam
}  // namespace zt::kernels
