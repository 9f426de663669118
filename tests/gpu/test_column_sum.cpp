// zt::kernels::column_sum (src/kernels/column_sum.cu) against an fp64 ATen reference:
// x.to(kDouble).sum(0), rounded to the dtype.
//
//   build/zt_gpu --gtest_filter='ColumnSum*'
//
// Skipped without a CUDA build, without the kernels (no nvcc at build time) or without a
// GPU. Runs on cuda:LOCAL_RANK (cuda:0 outside `zerotrain launch`).
//
// Tolerances (the kernel accumulates in fp32 and rounds once):
//  - bf16/fp16: |ours - r| <= ulp(r) + kAccum * sum_i |x_ij|, r = the fp64 reference
//    rounded to the dtype and ulp(r) its spacing at r (never below the subnormal
//    spacing): ours is r or a neighbour of r. The second term allows for the fp32
//    rounding of the partial sums, which only matters where the column's sum cancels to
//    far below its absolute sum (randn data: a few columns of 8192 rows sum to ~0).
//  - fp32: |ours - ref| <= 1e-5 * |ref| + 1e-6 + kAccum * sum_i |x_ij|.
//  - small-integer data (|x| <= 4): every fp32 partial sum is exact, so ours must equal
//    the reference rounded to the dtype bit for bit (catches any indexing slip that a
//    tolerance could hide).
//  - two runs on the same input, with different garbage in the workspace: bitwise equal.
//  - nothing outside out[0, cols) is written (sentinels before and after it); the
//    padding columns [cols, ld) and the elements before the block hold NaN, so reading
//    any of them would show up as a NaN sum.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "support/gpu_util.h"
#include "kernels/column_sum.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt::kernels {
namespace test_column_sum {
namespace {

// Plain host math, the same in every build.
TEST(ColumnSumWorkspace, Formula) {
  EXPECT_EQ(column_sum_workspace_floats(0, 1280), 0);
  EXPECT_EQ(column_sum_workspace_floats(8192, 0), 0);
  EXPECT_EQ(column_sum_workspace_floats(1, 7), 7);
  EXPECT_EQ(column_sum_workspace_floats(64, 7), 7);
  EXPECT_EQ(column_sum_workspace_floats(65, 7), 14);
  EXPECT_EQ(column_sum_workspace_floats(8192, 1280), kReductionMaxSplits * 1280);
}

#ifndef ZT_WITH_CUDA
TEST(ColumnSum, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else

using zt::test_support::bits;
using zt::test_support::name;
using zt::test_support::to_dtype;
using zt::test_support::ulp_of;
using zt::test_support::within;

constexpr int64_t kGuard = 16;      // sentinel elements on each side of out
constexpr float kSentinel = -3.0f;  // exact in every dtype
constexpr double kF32Rtol = 1e-5, kF32Atol = 1e-6;
constexpr double kAccum = 16.0 / (1 << 24);  // times sum_i |x_ij|: fp32 accumulation allowance

::testing::AssertionResult bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bad = (bits(a) != bits(b)).nonzero();
  if (bad.size(0) == 0) return ::testing::AssertionSuccess();
  const int64_t j = bad[0][0].item<int64_t>();
  return ::testing::AssertionFailure() << bad.size(0) << " of " << a.numel() << " elements differ; first at [" << j
                                       << "]: " << a[j].item<double>() << " vs " << b[j].item<double>();
}

::testing::AssertionResult all_zero_bits(const at::Tensor& t) {
  if (t.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor bad = (bits(t) != 0).nonzero();
  if (bad.size(0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad.size(0) << " of " << t.numel() << " elements are not +0";
}

struct Shape {
  const char* what;
  int64_t rows, cols, ld;
  int64_t offset;  // elements between a fresh (512-byte aligned) allocation and the block
};
// "vec": 16-byte aligned rows and cols a multiple of the vector width in every dtype
// (8 for bf16/f16, 4 for f32). "scalar": not.
const Shape kShapes[] = {
    {"gpt2-large attn/mlp-out bias (vec)", 8192, 1280, 1280, 0},
    {"gpt2-large qkv bias (vec)", 8192, 3840, 3840, 0},
    {"gpt2-large mlp-in bias (vec)", 8192, 5120, 5120, 0},
    {"one row, 7 cols (scalar)", 1, 7, 7, 0},
    {"3 rows (vec)", 3, 1000, 1000, 0},
    {"33 cols (scalar)", 8192, 33, 33, 0},
    {"ld > cols, padding (vec)", 300, 1000, 1024, 0},
    {"ld > cols, odd ld (scalar)", 300, 1000, 1003, 0},
    {"base offset 1 (scalar)", 300, 1000, 1000, 1},
    {"base offset 8, ld > cols (vec)", 5000, 256, 264, 8},
    {"small odd (scalar)", 100, 5, 9, 3},
};
const at::ScalarType kDtypes[] = {at::kBFloat16, at::kHalf, at::kFloat};

enum class Data { kRandn, kSmallIntegers };

class ColumnSum : public zt::test_support::KernelTest {
 protected:
  // A (rows, ld) block `offset` elements into a NaN buffer; x is its first `cols`
  // columns, filled with data (the padding and the elements before stay NaN).
  struct Input {
    at::Tensor storage;
    at::Tensor x;  // (rows, cols), strides (ld, 1)
    int64_t ld = 0;
  };
  Input make_input(at::ScalarType dt, const Shape& s, Data data, uint64_t seed) const {
    at::manual_seed(seed);
    Input in;
    in.ld = s.ld;
    in.storage = at::full({s.offset + s.rows * s.ld}, std::numeric_limits<float>::quiet_NaN(), on(dt));
    in.x = in.storage.narrow(0, s.offset, s.rows * s.ld).view({s.rows, s.ld}).narrow(1, 0, s.cols);
    const at::Tensor v = data == Data::kRandn ? at::randn({s.rows, s.cols}, on(at::kFloat))
                                              : at::randint(-4, 5, {s.rows, s.cols}, on(at::kFloat));
    in.x.copy_(v.to(dt));
    return in;
  }

  // Runs the kernel with a workspace full of `garbage`; returns out (cols) after checking
  // that the sentinels around it are intact.
  at::Tensor run(const Input& in, float garbage) const {
    const int64_t rows = in.x.size(0), cols = in.x.size(1);
    const at::ScalarType dt = in.x.scalar_type();
    const at::Tensor out_buf = at::full({cols + 2 * kGuard}, kSentinel, on(dt));
    const int64_t ws_floats = column_sum_workspace_floats(rows, cols);
    const at::Tensor ws = at::full({std::max<int64_t>(ws_floats, 1)}, garbage, on(at::kFloat));
    ColumnSumArgs a;
    a.in = in.x.data_ptr();
    a.type = to_dtype(dt);
    a.rows = rows;
    a.cols = cols;
    a.ld = in.ld;
    a.out = out_buf.narrow(0, kGuard, cols).data_ptr();
    a.workspace = ws_floats > 0 ? ws.data_ptr<float>() : nullptr;
    column_sum(a, stream());
    const at::Tensor guards = at::cat({out_buf.narrow(0, 0, kGuard), out_buf.narrow(0, kGuard + cols, kGuard)});
    EXPECT_TRUE(at::equal(guards, at::full_like(guards, kSentinel))) << "an element outside out[0, cols) was written";
    return out_buf.narrow(0, kGuard, cols).clone();
  }

  void expect_matches_reference(at::ScalarType dt, const Shape& s, Data data, uint64_t seed) const {
    const Input in = make_input(dt, s, data, seed);
    const at::Tensor xd = in.x.to(at::kDouble);  // exact
    const at::Tensor ref = xd.sum(0);
    const at::Tensor abs_sum = xd.abs().sum(0);
    const at::Tensor out = run(in, std::numeric_limits<float>::quiet_NaN());
    const at::Tensor got = out.to(at::kDouble);

    if (data == Data::kSmallIntegers) {
      EXPECT_TRUE(bitwise_equal(out, ref.to(dt))) << "small-integer sums must be exact";
    } else if (dt == at::kFloat) {
      EXPECT_TRUE(within(got, ref, kF32Rtol * ref.abs() + kF32Atol + kAccum * abs_sum, "column sums"));
    } else {
      const at::Tensor r = ref.to(dt).to(at::kDouble);
      EXPECT_TRUE(within(got, r, ulp_of(r, dt) + kAccum * abs_sum, "column sums"));
    }
    // Deterministic: a second run, with other garbage in the workspace, gives the same bits.
    EXPECT_TRUE(bitwise_equal(run(in, 1e30f), out)) << "second run";
    // Not vacuous.
    EXPECT_GT(got.abs().sum().item<double>(), 0.0) << "all column sums are zero";
  }
};

TEST_F(ColumnSum, MatchesReferenceEveryDtypeAndShape) {
  uint64_t seed = 1;
  for (at::ScalarType dt : kDtypes) {
    for (const Shape& s : kShapes) {
      for (Data data : {Data::kRandn, Data::kSmallIntegers}) {
        SCOPED_TRACE(name(dt) + " " + s.what + ": rows=" + std::to_string(s.rows) + " cols=" + std::to_string(s.cols) +
                     " ld=" + std::to_string(s.ld) + " offset=" + std::to_string(s.offset) +
                     (data == Data::kRandn ? " randn" : " small integers"));
        expect_matches_reference(dt, s, data, seed++);
      }
    }
  }
}

// rows == 0: out is all +0 (the workspace may be null: it needs 0 floats).
TEST_F(ColumnSum, ZeroRowsGivesZeros) {
  for (at::ScalarType dt : kDtypes) {
    for (int64_t cols : {int64_t{7}, int64_t{1280}}) {
      SCOPED_TRACE(name(dt) + " cols=" + std::to_string(cols));
      const Input in = make_input(dt, Shape{"empty", 0, cols, cols, 0}, Data::kRandn, 900);
      EXPECT_EQ(column_sum_workspace_floats(0, cols), 0);
      EXPECT_TRUE(all_zero_bits(run(in, 0.f)));
    }
  }
}

TEST_F(ColumnSum, ArgumentChecks) {
  ColumnSumArgs a;  // cols == 0: nothing to do, not even pointers to check
  EXPECT_NO_THROW(column_sum(a, stream()));
  a.rows = -1;
  EXPECT_THROW(column_sum(a, stream()), std::invalid_argument) << "rows < 0";
  a.rows = 0;
  a.cols = -1;
  EXPECT_THROW(column_sum(a, stream()), std::invalid_argument) << "cols < 0";

  const at::Tensor x = at::ones({4, 8}, on(at::kBFloat16));
  const at::Tensor out = at::zeros({8}, on(at::kBFloat16));
  const at::Tensor ws = at::zeros({column_sum_workspace_floats(4, 8)}, on(at::kFloat));
  a.rows = 4;
  a.cols = 8;
  a.ld = 8;
  EXPECT_THROW(column_sum(a, stream()), std::invalid_argument) << "null pointers";
  a.in = x.data_ptr();
  a.out = out.data_ptr();
  EXPECT_THROW(column_sum(a, stream()), std::invalid_argument) << "null workspace";
  a.workspace = ws.data_ptr<float>();
  a.ld = 7;
  EXPECT_THROW(column_sum(a, stream()), std::invalid_argument) << "ld < cols";
  a.ld = 8;
  a.type = static_cast<DType>(7);
  EXPECT_THROW(column_sum(a, stream()), std::invalid_argument) << "unknown dtype";
  a.type = DType::kBF16;
  EXPECT_NO_THROW(column_sum(a, stream()));
  EXPECT_TRUE(at::equal(out, at::full({8}, 4.0, on(at::kBFloat16))));
}

#endif  // ZT_WITH_CUDA

}  // namespace
}  // namespace test_column_sum
}  // namespace zt::kernels
