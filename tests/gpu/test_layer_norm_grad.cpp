// zt::kernels::layer_norm_param_grads (src/kernels/layer_norm_grad.cu) against an fp64
// ATen reference: x, grad_out (and weight, bias) converted to fp64 exactly, mean/rstd
// recomputed in fp64 by at::native_layer_norm, and the weight/bias gradients taken from
// at::native_layer_norm_backward(..., {false, true, true}). The kernel itself is given the
// fp32 mean/rstd that at::native_layer_norm returns for the dtype's own input, as the
// training code does.
//
//   build/zt_gpu --gtest_filter='LayerNormGrad*'
//
// Skipped without a CUDA build, without the kernels (no nvcc at build time) or without a
// GPU. Runs on cuda:LOCAL_RANK (cuda:0 outside `zerotrain launch`).
//
// Tolerances, per column j, with mag_j = sum_i |term_ij| the sum of the magnitudes of the
// summed terms (|dy * xhat| for grad_weight, |dy| for grad_bias, in fp64) and
// kMagAllow = 16 * 2^-24 (a few fp32 ulps of mag_j: the kernel's fp32 sums and, for
// grad_weight, the fp32 mean/rstd differ from the fp64 ones by a few fp32 ulps per term,
// which only matters where the column's sum nearly cancels to 0):
//  - bf16/fp16: |ours - r| <= 2 * ulp(r) + kMagAllow * mag_j, r = ref rounded to the dtype
//    and ulp(r) its spacing at r (2^(floor(log2 |r|) - 7) for bf16, - 10 for fp16, never
//    below the subnormal spacing), i.e. ours is within 2 ulps of r away from cancellation.
//  - fp32: |ours - ref| <= 1e-4 * |ref| + 1e-5 + kMagAllow * mag_j.
// Also: a null grad_weight or grad_bias gives the other bit for bit (and then input, mean
// and rstd may be null); two runs are bitwise identical (the workspace filled with NaN in
// between: it need not be zeroed); rows == 0 writes +0 everywhere.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>

#include "support/gpu_util.h"
#include "kernels/layer_norm_grad.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt::kernels {
namespace test_layer_norm_grad {
namespace {

#ifndef ZT_WITH_CUDA
TEST(LayerNormGrad, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else

using zt::test_support::bits;
using zt::test_support::name;
using zt::test_support::to_dtype;
using zt::test_support::ulp_of;
using zt::test_support::within;

constexpr double kMagAllow = 16.0 / (1 << 24);
constexpr double kF32Rtol = 1e-4, kF32Atol = 1e-5;
constexpr double kEps = 1e-5;

::testing::AssertionResult all_zero_bits(const at::Tensor& t) {
  if (t.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor bad = (bits(t) != 0).nonzero();
  if (bad.size(0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad.size(0) << " of " << t.numel() << " elements are not +0";
}

::testing::AssertionResult same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (at::equal(bits(a), bits(b))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << (bits(a) != bits(b)).sum().item<int64_t>() << " of " << a.numel()
                                       << " elements differ";
}

struct Shape {
  int64_t rows, cols;
  int64_t offset;  // elements between a fresh allocation and grad_out (1 = unaligned: scalar path)
};
const Shape kShapes[] = {
    {8192, 1280, 0},  // GPT-2 Large hidden (vectorized)
    {8192, 5120, 0},  // vectorized, wide
    {1, 7, 0},        // scalar (cols not a multiple of the vector width)
    {3, 1000, 0},     // vectorized, few rows
    {777, 33, 0},     // scalar
    {300, 1024, 1},   // grad_out not 16-byte aligned: scalar
};
const at::ScalarType kDtypes[] = {at::kBFloat16, at::kHalf, at::kFloat};

class LayerNormGrad : public zt::test_support::KernelTest {
 protected:
  // A LayerNorm's forward inputs and an upstream gradient, with the forward's fp32 mean/rstd.
  struct Problem {
    at::ScalarType dt;
    int64_t rows = 0, cols = 0;
    at::Tensor x, weight, bias, grad_out, mean, rstd;  // grad_out may start unaligned
  };

  Problem make(at::ScalarType dt, const Shape& s, uint64_t seed) const {
    at::manual_seed(seed);
    Problem p;
    p.dt = dt;
    p.rows = s.rows;
    p.cols = s.cols;
    const int64_t n = s.rows * s.cols;
    p.x = (at::randn({s.rows, s.cols}, on(at::kFloat)) * 2 + 0.5).to(dt);
    p.weight = at::randn({s.cols}, on(at::kFloat)).to(dt);
    p.bias = at::randn({s.cols}, on(at::kFloat)).to(dt);
    const at::Tensor storage = at::randn({n + s.offset}, on(at::kFloat)).to(dt);
    p.grad_out = storage.narrow(0, s.offset, n).view({s.rows, s.cols});
    auto fwd = at::native_layer_norm(p.x, {s.cols}, p.weight, p.bias, kEps);
    p.mean = std::get<1>(fwd).contiguous();
    p.rstd = std::get<2>(fwd).contiguous();
    return p;
  }

  // Runs the kernel; grad_weight / grad_bias as given (undefined tensor = null).
  void run(const Problem& p, const at::Tensor& gw, const at::Tensor& gb, bool pass_input = true,
           at::Tensor* workspace_out = nullptr) const {
    const int64_t floats = layer_norm_param_grad_workspace_floats(p.rows, p.cols);
    at::Tensor ws = at::empty({std::max<int64_t>(floats, 1)}, on(at::kFloat));
    if (workspace_out != nullptr) {
      if (workspace_out->defined() && workspace_out->numel() >= ws.numel()) ws = *workspace_out;
      *workspace_out = ws;
    }
    LayerNormParamGradArgs a;
    a.grad_out = p.grad_out.data_ptr();
    a.input = pass_input ? p.x.data_ptr() : nullptr;
    a.mean = pass_input ? p.mean.data_ptr<float>() : nullptr;
    a.rstd = pass_input ? p.rstd.data_ptr<float>() : nullptr;
    a.type = to_dtype(p.dt);
    a.rows = p.rows;
    a.cols = p.cols;
    a.grad_weight = gw.defined() ? gw.data_ptr() : nullptr;
    a.grad_bias = gb.defined() ? gb.data_ptr() : nullptr;
    a.workspace = floats > 0 ? ws.data_ptr<float>() : nullptr;
    layer_norm_param_grads(a, stream());
  }

  // Checks ours (grad_weight, grad_bias in the dtype) against the fp64 reference.
  void expect_matches_reference(const Problem& p, const at::Tensor& gw, const at::Tensor& gb,
                                const std::string& what) const {
    const at::Tensor x64 = p.x.to(at::kDouble), go64 = p.grad_out.to(at::kDouble);
    const at::Tensor w64 = p.weight.to(at::kDouble), b64 = p.bias.to(at::kDouble);
    auto fwd = at::native_layer_norm(x64, {p.cols}, w64, b64, kEps);
    const at::Tensor mean64 = std::get<1>(fwd), rstd64 = std::get<2>(fwd);
    auto bwd = at::native_layer_norm_backward(go64, x64, {p.cols}, mean64, rstd64, w64, b64, {false, true, true});
    const at::Tensor ref_w = std::get<1>(bwd), ref_b = std::get<2>(bwd);
    const at::Tensor xhat = (x64 - mean64.view({p.rows, 1})) * rstd64.view({p.rows, 1});
    const at::Tensor mag_w = (go64 * xhat).abs().sum(0), mag_b = go64.abs().sum(0);

    const auto check = [&](const at::Tensor& ours, const at::Tensor& ref, const at::Tensor& mag, const char* which) {
      at::Tensor expected, tol;
      if (p.dt == at::kFloat) {
        expected = ref;
        tol = ref.abs() * kF32Rtol + kF32Atol + mag * kMagAllow;
      } else {
        expected = ref.to(p.dt).to(at::kDouble);
        tol = ulp_of(expected, p.dt) * 2 + mag * kMagAllow;
      }
      EXPECT_TRUE(within(ours.to(at::kDouble), expected, tol, "columns")) << which << ", " << what;
    };
    check(gw, ref_w, mag_w, "grad_weight");
    check(gb, ref_b, mag_b, "grad_bias");
  }

  static std::string describe(at::ScalarType dt, const Shape& s) {
    return name(dt) + " rows=" + std::to_string(s.rows) + " cols=" + std::to_string(s.cols) +
           " offset=" + std::to_string(s.offset);
  }
};

TEST_F(LayerNormGrad, MatchesReferenceEveryDtypeAndShape) {
  uint64_t seed = 1;
  for (const at::ScalarType dt : kDtypes) {
    for (const Shape& s : kShapes) {
      const Problem p = make(dt, s, seed++);
      ASSERT_EQ(p.mean.scalar_type(), at::kFloat);
      ASSERT_EQ(p.rstd.scalar_type(), at::kFloat);
      const at::Tensor gw = at::full({s.cols}, 7.0, on(dt)), gb = at::full({s.cols}, 7.0, on(dt));
      run(p, gw, gb);
      expect_matches_reference(p, gw, gb, describe(dt, s));
    }
  }
}

TEST_F(LayerNormGrad, BitwiseReproducible) {
  uint64_t seed = 100;
  for (const at::ScalarType dt : kDtypes) {
    for (const Shape& s : {kShapes[0], kShapes[4]}) {
      const Problem p = make(dt, s, seed++);
      const at::Tensor gw1 = at::empty({s.cols}, on(dt)), gb1 = at::empty({s.cols}, on(dt));
      const at::Tensor gw2 = at::empty({s.cols}, on(dt)), gb2 = at::empty({s.cols}, on(dt));
      at::Tensor ws;
      run(p, gw1, gb1, true, &ws);
      ws.fill_(std::numeric_limits<float>::quiet_NaN());  // stale scratch must not leak in
      run(p, gw2, gb2, true, &ws);
      EXPECT_TRUE(same_bits(gw1, gw2)) << "grad_weight, " << describe(dt, s);
      EXPECT_TRUE(same_bits(gb1, gb2)) << "grad_bias, " << describe(dt, s);
    }
  }
}

TEST_F(LayerNormGrad, NullWeightOrBiasGradient) {
  uint64_t seed = 200;
  for (const at::ScalarType dt : kDtypes) {
    for (const Shape& s : {kShapes[0], kShapes[4], kShapes[5]}) {
      const Problem p = make(dt, s, seed++);
      const at::Tensor gw = at::empty({s.cols}, on(dt)), gb = at::empty({s.cols}, on(dt));
      run(p, gw, gb);
      // Only grad_bias: input, mean and rstd are not needed (passed as null).
      const at::Tensor gb_only = at::full({s.cols}, 7.0, on(dt));
      run(p, at::Tensor(), gb_only, /*pass_input=*/false);
      EXPECT_TRUE(same_bits(gb_only, gb)) << "grad_bias alone, " << describe(dt, s);
      // Only grad_weight.
      const at::Tensor gw_only = at::full({s.cols}, 7.0, on(dt));
      run(p, gw_only, at::Tensor());
      EXPECT_TRUE(same_bits(gw_only, gw)) << "grad_weight alone, " << describe(dt, s);
      // Neither: nothing to do, no error.
      EXPECT_NO_THROW(run(p, at::Tensor(), at::Tensor()));
    }
  }
}

TEST_F(LayerNormGrad, ZeroRowsWritesZeros) {
  for (const at::ScalarType dt : kDtypes) {
    for (const int64_t cols : {int64_t{1280}, int64_t{33}}) {
      EXPECT_EQ(layer_norm_param_grad_workspace_floats(0, cols), 0);
      const at::Tensor gw = at::full({cols}, 7.0, on(dt)), gb = at::full({cols}, 7.0, on(dt));
      LayerNormParamGradArgs a;  // grad_out, input, mean, rstd and workspace all null
      a.type = to_dtype(dt);
      a.rows = 0;
      a.cols = cols;
      a.grad_weight = gw.data_ptr();
      a.grad_bias = gb.data_ptr();
      layer_norm_param_grads(a, stream());
      EXPECT_TRUE(all_zero_bits(gw)) << "grad_weight, " << name(dt) << " cols=" << cols;
      EXPECT_TRUE(all_zero_bits(gb)) << "grad_bias, " << name(dt) << " cols=" << cols;
    }
  }
}

TEST_F(LayerNormGrad, ArgumentChecks) {
  const Problem p = make(at::kBFloat16, {16, 64, 0}, 300);
  const at::Tensor gw = at::empty({64}, on(at::kBFloat16)), gb = at::empty({64}, on(at::kBFloat16));
  const at::Tensor ws = at::empty({layer_norm_param_grad_workspace_floats(16, 64)}, on(at::kFloat));
  const auto args = [&] {
    LayerNormParamGradArgs a;
    a.grad_out = p.grad_out.data_ptr();
    a.input = p.x.data_ptr();
    a.mean = p.mean.data_ptr<float>();
    a.rstd = p.rstd.data_ptr<float>();
    a.type = DType::kBF16;
    a.rows = 16;
    a.cols = 64;
    a.grad_weight = gw.data_ptr();
    a.grad_bias = gb.data_ptr();
    a.workspace = ws.data_ptr<float>();
    return a;
  };
  EXPECT_NO_THROW(layer_norm_param_grads(args(), stream()));
  LayerNormParamGradArgs a = args();
  a.rows = -1;
  EXPECT_THROW(layer_norm_param_grads(a, stream()), std::invalid_argument);
  a = args();
  a.cols = -1;
  EXPECT_THROW(layer_norm_param_grads(a, stream()), std::invalid_argument);
  a = args();
  a.grad_out = nullptr;
  EXPECT_THROW(layer_norm_param_grads(a, stream()), std::invalid_argument);
  a = args();
  a.workspace = nullptr;
  EXPECT_THROW(layer_norm_param_grads(a, stream()), std::invalid_argument);
  a = args();
  a.input = nullptr;
  EXPECT_THROW(layer_norm_param_grads(a, stream()), std::invalid_argument);
  a = args();
  a.rstd = nullptr;
  EXPECT_THROW(layer_norm_param_grads(a, stream()), std::invalid_argument);
  a = args();
  a.type = static_cast<DType>(7);
  EXPECT_THROW(layer_norm_param_grads(a, stream()), std::invalid_argument);
}

#endif  // ZT_WITH_CUDA

}  // namespace
}  // namespace test_layer_norm_grad
}  // namespace zt::kernels
