// zt::kernels::softmax_xent (src/kernels/softmax_xent.cu) against an fp64 ATen reference
// computed from the same logits (converted to fp64 exactly): at::log_softmax over the
// first `cols` columns of each row, the target's log-probability gathered, gradient
// (exp(log_softmax) - onehot(target)) * grad_scale, ignored rows (target -1) masked.
//
//   build/zt_gpu --gtest_filter='SoftmaxXent*'
//
// Skipped without a CUDA build, without the kernels (no nvcc at build time) or without a
// GPU. Runs on cuda:LOCAL_RANK (cuda:0 outside `zerotrain launch`).
//
// Tolerances (the kernel works in fp32 throughout):
//  - loss_sum: |ours - ref| <= 1e-5 * |ref| (fp32 per-row losses, fp32 atomic sum).
//  - fp32 gradients: |ours - ref| <= 1e-6 * grad_scale + 1e-5 * |ref|.
//  - bf16/fp16 gradients: |ours - r| <= ulp(r), r = ref rounded to the dtype and ulp(r)
//    its spacing at r (2^(floor(log2 |r|) - 7) for bf16, - 10 for fp16, never below the
//    subnormal spacing), i.e. ours is r or a neighbour of r. One addition, at the
//    target's column only: 8 * 2^-24 * p_t * grad_scale. There the gradient is p_t - 1,
//    and when the row is nearly one-hot (p_t = 1 - 1e-7, as randn * 30 logits with the
//    target at the argmax give) fp32 holds p_t only to ~2^-24 absolute, so p_t - 1 has
//    a few fp32 ulps of 1 of absolute error however it is computed (ATen's fp32 path has
//    the same), which can be many bf16 ulps of the tiny result. A host emulation of the
//    kernel's fp32 arithmetic (same grouping and merge order) stayed within 0.15 of these
//    tolerances for fp32 and loss_sum and within 1 for bf16/fp16.
//  - padding columns [cols, ld) and ignored rows: +0 exactly (all bits zero); nothing
//    outside the (rows, ld) block is written (sentinels before and after it).
// The padding columns and the real columns of ignored rows hold NaN on input: the kernel
// must never read them into a result.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/gpu_util.h"
#include "kernels/softmax_xent.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt::kernels {
namespace test_softmax_xent {
namespace {

#ifndef ZT_WITH_CUDA
TEST(SoftmaxXent, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else

using zt::test_support::bits;
using zt::test_support::name;
using zt::test_support::to_dtype;
using zt::test_support::ulp_of;
using zt::test_support::within;

constexpr int64_t kGuard = 16;     // sentinel elements after the block
constexpr float kSentinel = -3.0f;  // exact in every dtype
constexpr double kLossRtol = 1e-5;
constexpr double kF32Rtol = 1e-5, kF32Atol = 1e-6;  // the absolute part is multiplied by grad_scale
constexpr double kTargetAllowance = 8.0 / (1 << 24);  // times p_t * grad_scale, bf16/fp16 only

::testing::AssertionResult all_zero_bits(const at::Tensor& t) {
  if (t.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor bad = (bits(t) != 0).nonzero();
  if (bad.size(0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad.size(0) << " of " << t.numel() << " elements are not +0";
}

// Where the targets point, by row: r % 5 picks the kind.
enum class Pick { kLastColumn, kIgnored, kArgmax, kFirstColumn, kRandom };
Pick pick_of(int64_t r) { return static_cast<Pick>(r % 5); }

struct Shape {
  const char* what;
  int64_t cols, ld;
  int64_t offset;  // elements between a fresh (512-byte aligned) allocation and the block
};
// Vectorized: the row starts are 16-byte aligned in every dtype. Scalar: they are not.
const Shape kShapes[] = {
    {"gpt2 vocab padded (vectorized, partial last group, padding)", 50257, 50304, 0},
    {"no padding (vectorized, whole groups)", 1000, 1000, 0},
    {"small padded (vectorized, partial group, padding groups)", 33, 40, 0},
    {"odd ld (scalar)", 33, 37, 0},
    {"rows unaligned, ld 1001 (scalar)", 1000, 1001, 0},
    {"base unaligned, offset 1 (scalar)", 1000, 1008, 1},
    {"gpt2 vocab unpadded (scalar, large rows)", 50257, 50257, 0},
};
const at::ScalarType kDtypes[] = {at::kBFloat16, at::kHalf, at::kFloat};
const int64_t kRows[] = {1, 7, 300};

class SoftmaxXent : public zt::test_support::KernelTest {
 protected:
  // A (rows, ld) block `offset` elements into a buffer of kSentinel with kGuard more
  // elements after it.
  struct Block {
    at::Tensor storage, view;  // view: (rows, ld)
    int64_t offset = 0;
    ::testing::AssertionResult guards_intact() const {
      const int64_t n = view.numel();
      const at::Tensor outside = at::cat({storage.narrow(0, 0, offset), storage.narrow(0, offset + n, kGuard)});
      if (at::equal(outside, at::full_like(outside, kSentinel))) return ::testing::AssertionSuccess();
      return ::testing::AssertionFailure() << "an element outside the block (offset " << offset << ", " << n
                                           << " elements) was written";
    }
  };
  Block make_block(int64_t rows, int64_t ld, int64_t offset, at::ScalarType dt) const {
    Block b;
    b.offset = offset;
    b.storage = at::full({offset + rows * ld + kGuard}, kSentinel, on(dt));
    b.view = b.storage.narrow(0, offset, rows * ld).view({rows, ld});
    return b;
  }

  // Logits randn * magnitude in the real columns, NaN in the padding; targets by
  // pick_of(r), ignored rows' real columns NaN too.
  struct Problem {
    Block block;
    at::Tensor targets;  // (rows) int64
    int64_t cols = 0;
  };
  Problem make_problem(at::ScalarType dt, int64_t rows, const Shape& shape, double magnitude, uint64_t seed) const {
    at::manual_seed(seed);
    Problem p;
    p.cols = shape.cols;
    p.block = make_block(rows, shape.ld, shape.offset, dt);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    p.block.view.fill_(nan);
    at::Tensor real = p.block.view.narrow(1, 0, shape.cols);
    real.copy_((at::randn({rows, shape.cols}, on(at::kFloat)) * magnitude).to(dt));
    const at::Tensor argmax = real.argmax(1).cpu();
    const at::Tensor random = at::randint(shape.cols, {rows}, at::TensorOptions(at::kLong));
    std::vector<int64_t> t(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      switch (pick_of(r)) {
        case Pick::kLastColumn: t[r] = shape.cols - 1; break;
        case Pick::kIgnored: t[r] = -1; break;
        case Pick::kArgmax: t[r] = argmax[r].item<int64_t>(); break;
        case Pick::kFirstColumn: t[r] = 0; break;
        case Pick::kRandom: t[r] = random[r].item<int64_t>(); break;
      }
      if (t[r] == -1) real[r].fill_(nan);
    }
    p.targets = at::tensor(t, at::TensorOptions(at::kLong)).to(dev_);
    return p;
  }

  // Runs the kernel on the block, adding to a loss_sum that starts at `loss_init`;
  // returns loss_sum.
  double run(Problem& p, float grad_scale, float loss_init = 0.f) const {
    const at::Tensor loss_sum = at::full({}, loss_init, on(at::kFloat));
    SoftmaxXentArgs a;
    a.logits = p.block.view.data_ptr();
    a.type = to_dtype(p.block.view.scalar_type());
    a.rows = p.block.view.size(0);
    a.cols = p.cols;
    a.ld = p.block.view.size(1);
    a.targets = p.targets.data_ptr<int64_t>();
    a.loss_sum = loss_sum.data_ptr<float>();
    a.grad_scale = grad_scale;
    softmax_xent(a, stream());
    return loss_sum.item<double>();
  }

  struct Reference {
    double loss_sum = 0;
    at::Tensor grad;    // (rows, cols) fp64, 0 in ignored rows
    at::Tensor p_t;     // (rows, 1) fp64: softmax at the target (0 in ignored rows)
    at::Tensor onehot;  // (rows, cols) fp64
    at::Tensor valid;   // (rows) bool
  };
  // From the logits before the kernel overwrites them.
  static Reference reference(const at::Tensor& logits, const at::Tensor& targets, int64_t cols, float grad_scale) {
    Reference ref;
    const at::Tensor x = logits.narrow(1, 0, cols).to(at::kDouble);  // exact
    ref.valid = targets.ne(-1);
    const at::Tensor t = at::where(ref.valid, targets, at::zeros({}, targets.options()));
    const at::Tensor v = ref.valid.unsqueeze(1);
    const at::Tensor zero = at::zeros({}, x.options());
    const at::Tensor lsm = at::where(v, at::log_softmax(x, 1), zero);  // ignored rows hold NaN: out
    const at::Tensor picked = lsm.gather(1, t.unsqueeze(1)).squeeze(1);
    ref.loss_sum = (-picked).sum().item<double>();
    const at::Tensor p = lsm.exp();
    ref.onehot = at::one_hot(t, cols).to(at::kDouble);
    ref.grad = at::where(v, (p - ref.onehot) * static_cast<double>(grad_scale), zero);
    ref.p_t = at::where(v, p.gather(1, t.unsqueeze(1)), zero);
    return ref;
  }

  void expect_matches_reference(at::ScalarType dt, int64_t rows, const Shape& shape, double magnitude,
                                float grad_scale, uint64_t seed, float loss_init = 0.f) const {
    Problem p = make_problem(dt, rows, shape, magnitude, seed);
    const Reference ref = reference(p.block.view, p.targets, shape.cols, grad_scale);
    const double loss_sum = run(p, grad_scale, loss_init) - loss_init;

    EXPECT_NEAR(loss_sum, ref.loss_sum, kLossRtol * std::abs(ref.loss_sum) + (loss_init != 0 ? 1e-6 * loss_init : 0))
        << "loss_sum";
    const at::Tensor got = p.block.view.narrow(1, 0, shape.cols).to(at::kDouble);
    const at::Tensor v = ref.valid.unsqueeze(1);
    if (dt == at::kFloat) {
      const at::Tensor tol = kF32Atol * grad_scale + kF32Rtol * ref.grad.abs();
      EXPECT_TRUE(within(got, ref.grad, tol, "gradients")) << "gradients";
    } else {
      const at::Tensor r = ref.grad.to(dt).to(at::kDouble);
      const at::Tensor tol = ulp_of(r, dt) + ref.onehot * (kTargetAllowance * grad_scale) * ref.p_t;
      EXPECT_TRUE(within(got, r, tol, "gradients")) << "gradients";
    }
    EXPECT_TRUE(all_zero_bits(p.block.view.narrow(1, shape.cols, shape.ld - shape.cols))) << "padding columns";
    const at::Tensor ignored = at::logical_not(ref.valid).nonzero().squeeze(1);
    EXPECT_TRUE(all_zero_bits(p.block.view.index_select(0, ignored))) << "ignored rows";
    EXPECT_TRUE(p.block.guards_intact());
    // Not vacuous: some gradient is non-zero.
    if (ref.valid.any().item<bool>()) {
      EXPECT_GT(got.abs().sum().item<double>(), 0.0) << "all gradients are zero";
    }
  }
};

TEST_F(SoftmaxXent, MatchesReferenceEveryDtypeShapeAndRowCount) {
  struct Mode {
    double magnitude;
    bool mean;  // grad_scale = 1 / rows, else 1
  };
  const Mode kModes[] = {{1.0, false}, {30.0, true}, {30.0, false}, {1.0, true}};
  uint64_t seed = 1;
  for (at::ScalarType dt : kDtypes) {
    for (const Shape& shape : kShapes) {
      for (int64_t rows : kRows) {
        for (const Mode& mode : kModes) {
          const float scale = mode.mean ? 1.0f / static_cast<float>(rows) : 1.0f;
          SCOPED_TRACE(name(dt) + " " + shape.what + ": rows=" + std::to_string(rows) + " cols=" +
                       std::to_string(shape.cols) + " ld=" + std::to_string(shape.ld) + " offset=" +
                       std::to_string(shape.offset) + " logits randn*" + std::to_string(mode.magnitude) +
                       " grad_scale=" + std::to_string(scale));
          expect_matches_reference(dt, rows, shape, mode.magnitude, scale, seed++);
        }
      }
    }
  }
}

// loss_sum is added to, not overwritten.
TEST_F(SoftmaxXent, AddsToLossSum) {
  for (at::ScalarType dt : kDtypes) {
    SCOPED_TRACE(name(dt));
    expect_matches_reference(dt, 7, kShapes[0], 1.0, 0.5f, 500, /*loss_init=*/100.0f);
  }
}

// Every row ignored: loss_sum untouched, every element of the block +0.
TEST_F(SoftmaxXent, AllRowsIgnored) {
  for (at::ScalarType dt : kDtypes) {
    SCOPED_TRACE(name(dt));
    Problem p = make_problem(dt, 6, kShapes[0], 1.0, 600);
    p.targets.fill_(-1);
    EXPECT_EQ(run(p, 1.0f, 2.5f), 2.5);
    EXPECT_TRUE(all_zero_bits(p.block.view));
    EXPECT_TRUE(p.block.guards_intact());
  }
}

// A target outside [0, cols) other than -1 is a bug: NaN loss (and NaN gradients in that
// row's real columns, padding still 0); the other rows are unaffected.
TEST_F(SoftmaxXent, OutOfRangeTargetGivesNanLoss) {
  const int64_t kN = 4, kBadRow = 2;  // rows: last column, ignored, bad, first column
  uint64_t seed = 700;
  for (at::ScalarType dt : kDtypes) {
    for (const Shape& shape : {kShapes[0], kShapes[4]}) {
      for (int64_t bad : {shape.cols, shape.ld, shape.ld + 1000, int64_t{-2}, std::numeric_limits<int64_t>::min()}) {
        SCOPED_TRACE(name(dt) + " " + shape.what + ": target " + std::to_string(bad));
        Problem p = make_problem(dt, kN, shape, 1.0, seed++);
        p.targets[kBadRow].fill_(bad);
        const at::Tensor good_rows = at::tensor({int64_t{0}, int64_t{3}}, at::TensorOptions(at::kLong)).to(dev_);
        const Reference ref = reference(p.block.view.index_select(0, good_rows), p.targets.index_select(0, good_rows),
                                        shape.cols, 1.0f);
        EXPECT_TRUE(std::isnan(run(p, 1.0f))) << "loss_sum";
        const at::Tensor bad_row = p.block.view[kBadRow];
        EXPECT_TRUE(at::isnan(bad_row.narrow(0, 0, shape.cols)).all().item<bool>()) << "the bad row's gradients";
        EXPECT_TRUE(all_zero_bits(bad_row.narrow(0, shape.cols, shape.ld - shape.cols))) << "the bad row's padding";
        EXPECT_TRUE(all_zero_bits(p.block.view[1])) << "the ignored row";
        const at::Tensor got = p.block.view.index_select(0, good_rows).narrow(1, 0, shape.cols).to(at::kDouble);
        if (dt == at::kFloat) {
          EXPECT_TRUE(within(got, ref.grad, kF32Atol + kF32Rtol * ref.grad.abs(), "gradients")) << "the other rows";
        } else {
          const at::Tensor r = ref.grad.to(dt).to(at::kDouble);
          EXPECT_TRUE(within(got, r, ulp_of(r, dt) + ref.onehot * kTargetAllowance * ref.p_t, "gradients")) << "the other rows";
        }
        EXPECT_TRUE(p.block.guards_intact());
      }
    }
  }
}

TEST_F(SoftmaxXent, ArgumentChecks) {
  SoftmaxXentArgs a;  // rows == 0: nothing to do, not even pointers to check
  EXPECT_NO_THROW(softmax_xent(a, stream()));
  a.rows = -1;
  EXPECT_THROW(softmax_xent(a, stream()), std::invalid_argument);

  at::Tensor logits = at::zeros({4, 8}, on(at::kBFloat16));
  at::Tensor targets = at::zeros({4}, on(at::kLong));
  at::Tensor loss_sum = at::zeros({}, on(at::kFloat));
  a.rows = 4;
  a.cols = 8;
  a.ld = 8;
  EXPECT_THROW(softmax_xent(a, stream()), std::invalid_argument) << "null pointers";
  a.logits = logits.data_ptr();
  a.targets = targets.data_ptr<int64_t>();
  a.loss_sum = loss_sum.data_ptr<float>();
  a.cols = 0;
  EXPECT_THROW(softmax_xent(a, stream()), std::invalid_argument) << "cols == 0";
  a.cols = 9;
  EXPECT_THROW(softmax_xent(a, stream()), std::invalid_argument) << "ld < cols";
  a.cols = 8;
  a.type = static_cast<DType>(7);
  EXPECT_THROW(softmax_xent(a, stream()), std::invalid_argument) << "unknown dtype";
  a.type = DType::kBF16;
  EXPECT_NO_THROW(softmax_xent(a, stream()));
  // Uniform rows of 8 classes: loss log(8) each, gradient 1/8 - onehot.
  EXPECT_NEAR(loss_sum.item<double>(), 4 * std::log(8.0), 1e-5 * 4 * std::log(8.0));
  EXPECT_EQ(logits[0][0].item<double>(), 1.0 / 8 - 1);
  EXPECT_EQ(logits[3][7].item<double>(), 1.0 / 8);
}

#endif  // ZT_WITH_CUDA

}  // namespace
}  // namespace test_softmax_xent
}  // namespace zt::kernels
