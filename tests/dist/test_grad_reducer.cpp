// zero::GradReducer on its own (src/zero/grad_reducer.h): hooks, buckets and reductions
// over a group, with no optimizer, gatherer or engine. Every rank r makes the same
// parameters and a loss whose gradient is (r+1) on every element of the parameters it
// uses, so the averaged gradient is the mean of (g+1) over the group's ranks g: 1, 1.5 or
// 2.5 at group sizes 1, 2 and 4, exact in fp32 (sums of small integers, divisions by 2
// and 4). Results compare exactly. Run at world 1, 2 and 4 by ctest; the reducer is also
// run over a split sub-group of two ranks (color rank % 2) where the world is even.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/stale_grad.h"
#include "zero/grad_reducer.h"
#include "zero/partition.h"
#include "zero/shard_layout.h"
#include "zerotrain/comm.h"

namespace zt::zero {
namespace test_grad_reducer {
namespace {

constexpr int64_t kAlign = 4;
const std::vector<int64_t> kNumels{5, 7, 130, 3};  // layout order; bucket size 12: buckets {5,7}, {130}, {3}

comm::GroupPtr world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

struct Fixture {
  ShardLayout L;
  std::vector<torch::Tensor> params;
  std::unique_ptr<GradReducer> reducer;
  int issued = 0, finals = 0, done = 0;

  Fixture(const comm::GroupPtr& g, ReducerOptions o) {
    L.flat = make_flat_layout(kNumels, 12, g->size(), kAlign);
    L.rank = g->rank();
    L.owns_all = o.stage == 0;
    std::vector<int> user;
    for (size_t i = 0; i < kNumels.size(); ++i) {
      params.push_back(torch::zeros({kNumels[i]}).requires_grad_(true));
      user.push_back(static_cast<int>(i));
    }
    reducer = std::make_unique<GradReducer>(L, params, user, g, o);
    reducer->on_issued = [this](int, const comm::WorkPtr& w, bool final) {
      EXPECT_NE(w, nullptr);
      ++issued;
      finals += final ? 1 : 0;
    };
    reducer->on_done = [this](int) { ++done; };
    reducer->allocate();
    reducer->install_hooks(0, params.size());
  }
  // One micro-step's backward: gradient (rank+1) on the parameters in `used`.
  void backward(int rank, bool boundary, bool first, const std::vector<int>& used) {
    reducer->begin_backward(boundary, first);
    torch::Tensor loss = torch::zeros({});
    for (int i : used) loss = loss + params[i].sum() * static_cast<double>(rank + 1);
    loss.backward();
    reducer->launch_remaining();
    reducer->wait();
  }
  // The reduced gradient every rank must hold, as a flat buffer: `value` on the elements
  // of the parameters in `used`, 0 elsewhere (other parameters and padding).
  torch::Tensor expected_flat(double value, const std::vector<int>& used) const {
    auto t = torch::zeros({L.flat.total_numel});
    for (int i : used) L.param_view(t, i).fill_(value);
    return t;
  }
  void expect_owned(const torch::Tensor& flat, const char* what) {
    for (int b = 0; b < L.num_buckets(); ++b) {
      EXPECT_TRUE(torch::equal(reducer->grad(b), L.owned_in_flat(flat, b))) << what << ": bucket " << b;
    }
  }
};

double mean_of_ranks_plus_one(int n) { return (n + 1) / 2.0; }

const std::vector<int> kAll{0, 1, 2, 3};

class GradReducerStage : public ::testing::TestWithParam<int> {};

// One micro-step, every parameter used: each bucket is reduced once, in backward (stages
// 0-1 only with more than one rank), and this rank's part holds the mean.
TEST_P(GradReducerStage, ReducesTheMeanOverTheGroup) {
  auto g = world();
  ReducerOptions o;
  o.stage = GetParam();
  Fixture f(g, o);
  f.backward(g->rank(), /*boundary=*/true, /*first=*/true, kAll);
  f.reducer->reduce_now();  // nothing left to do with overlap_comm
  const auto want = f.expected_flat(mean_of_ranks_plus_one(g->size()), kAll);
  f.expect_owned(want, "owned part");
  const int nb = f.L.num_buckets();
  const bool reduces = o.stage >= 2 || g->size() > 1;
  EXPECT_EQ(f.reducer->buckets_launched(), reduces ? nb : 0);
  EXPECT_EQ(f.reducer->buckets_launched_in_backward(), reduces ? nb : 0);
  if (o.stage <= 1) {
    // .grad are views of the flat buffer; stage 0 all-reduced all of it.
    if (o.stage == 0) {
      for (size_t i = 0; i < f.params.size(); ++i) {
        EXPECT_TRUE(torch::equal(f.params[i].grad(), f.L.param_view(want, static_cast<int>(i))));
      }
    }
    EXPECT_EQ(f.issued, 0);
  } else {
    // Stages 2-3: the owner hears of every reduction; the window's only micro-step is final.
    EXPECT_EQ(f.issued, nb);
    EXPECT_EQ(f.finals, nb);
    EXPECT_EQ(f.done, nb);
    for (auto& p : f.params) EXPECT_FALSE(p.grad().defined()) << "stage 2 frees .grad once staged";
  }
  EXPECT_EQ(f.reducer->grad_bytes(),
            o.stage <= 1 ? f.L.flat.total_numel * 4 : f.L.flat.shard_numel * 4);
}

// Two micro-steps: stages 0-1 reduce only in the window's last backward (the sum of both
// micro-steps' local gradients), stages 2-3 in both (added after the wait).
TEST_P(GradReducerStage, AccumulatesOverMicroSteps) {
  auto g = world();
  ReducerOptions o;
  o.stage = GetParam();
  Fixture f(g, o);
  f.backward(g->rank(), /*boundary=*/false, /*first=*/true, kAll);
  f.backward(g->rank(), /*boundary=*/true, /*first=*/false, kAll);
  f.reducer->reduce_now();
  f.expect_owned(f.expected_flat(2 * mean_of_ranks_plus_one(g->size()), kAll), "two micro-steps");
  if (o.stage >= 2) {
    EXPECT_EQ(f.issued, 2 * f.L.num_buckets());
    EXPECT_EQ(f.finals, 0) << "no micro-step of a two-step window writes the shard alone";
  }
  // zero_grad: the next window starts from nothing.
  f.reducer->zero_grad();
  f.backward(g->rank(), true, true, kAll);
  f.expect_owned(f.expected_flat(mean_of_ranks_plus_one(g->size()), kAll), "after zero_grad");
}

// A parameter no loss uses: its bucket is still reduced (by launch_remaining, after
// backward) so that every rank issues the same collectives, and its gradient is zero.
TEST_P(GradReducerStage, ReducesBucketsOfUnusedParameters) {
  auto g = world();
  ReducerOptions o;
  o.stage = GetParam();
  Fixture f(g, o);
  const std::vector<int> used{0, 1, 2};  // parameter 3 (the last bucket) gets no gradient
  f.backward(g->rank(), true, true, used);
  f.reducer->reduce_now();
  f.expect_owned(f.expected_flat(mean_of_ranks_plus_one(g->size()), used), "unused parameter");
  if (o.stage >= 2 || g->size() > 1) {
    EXPECT_EQ(f.reducer->buckets_launched(), f.L.num_buckets());
    EXPECT_EQ(f.reducer->buckets_launched_in_backward(), f.L.num_buckets() - 1);
  }
}

// prescale_gradients: divide by the predivide factor, sum, multiply by factor / world --
// the same mean (exact here).
TEST_P(GradReducerStage, PrescaledMeanIsTheMean) {
  auto g = world();
  ReducerOptions o;
  o.stage = GetParam();
  o.prescale_gradients = true;
  o.gradient_predivide_factor = 2.0;
  Fixture f(g, o);
  f.backward(g->rank(), true, true, kAll);
  f.reducer->reduce_now();
  f.expect_owned(f.expected_flat(mean_of_ranks_plus_one(g->size()), kAll), "prescaled");
}

INSTANTIATE_TEST_SUITE_P(Stages, GradReducerStage, ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "stage" + std::to_string(i.param); });

// Stages 0-1 without overlap_comm: nothing is reduced in backward; reduce_now does it.
TEST(GradReducer, WithoutOverlapReducesAtTheStep) {
  auto g = world();
  for (int stage : {0, 1}) {
    ReducerOptions o;
    o.stage = stage;
    o.overlap_comm = false;
    Fixture f(g, o);
    f.backward(g->rank(), true, true, kAll);
    EXPECT_EQ(f.reducer->buckets_launched(), 0) << "stage " << stage;
    EXPECT_FALSE(f.reducer->reducing());
    f.reducer->reduce_now();
    f.expect_owned(f.expected_flat(mean_of_ranks_plus_one(g->size()), kAll), "reduce_now");
  }
}

// [Stale Gradients] zero_grad() marks the stage 0-1 gradients stale instead of zeroing
// them. Whatever they still hold (NaN here) must read as zero: for a parameter the next
// backward does not use (zeroed at the end of backward, before its bucket is reduced) and
// for those autograd adds into (zeroed by the reducer's hook before the add), over a
// window of two micro-steps. Once the reducer is gone, none of its marks is left.
TEST(GradReducer, StaleGradientsReadAsZero) {
  auto g = world();
  set_stale_grads_enabled(true);
  const size_t before = stale_grad_count();
  for (int stage : {0, 1}) {
    for (bool overlap : {true, false}) {
      const std::string what = "stage " + std::to_string(stage) + (overlap ? " overlap" : " at the step");
      ReducerOptions o;
      o.stage = stage;
      o.overlap_comm = overlap;
      {
        Fixture f(g, o);
        f.backward(g->rank(), true, true, kAll);
        f.reducer->reduce_now();
        f.reducer->zero_grad();
        EXPECT_EQ(stale_grad_count(), before + kNumels.size()) << what;
        for (auto& p : f.params) {
          ASSERT_TRUE(p.grad().defined()) << what;
          p.grad().fill_(std::numeric_limits<float>::quiet_NaN());  // last step's values, as far as anyone knows
        }
        const std::vector<int> used{0, 1, 2};  // parameter 3 gets nothing
        f.backward(g->rank(), false, true, used);
        f.backward(g->rank(), true, false, used);
        f.reducer->reduce_now();
        f.expect_owned(f.expected_flat(2 * mean_of_ranks_plus_one(g->size()), used), what.c_str());
        f.reducer->zero_grad();  // marked again: the destructor must drop them
      }
      EXPECT_EQ(stale_grad_count(), before) << what;
    }
  }
  // Marked, then filled with the marks off (ZT_STALE_GRADS=0 mid-run) before any backward: no
  // mark is left for a later micro-step's writer to take (it would overwrite the first's sum).
  {
    ReducerOptions o;
    Fixture f(g, o);
    f.backward(g->rank(), true, true, kAll);
    f.reducer->zero_grad();
    set_stale_grads_enabled(false);
    f.reducer->zero_grad();
    EXPECT_EQ(stale_grad_count(), before);
    f.backward(g->rank(), false, true, kAll);
    f.backward(g->rank(), true, false, kAll);
    f.reducer->reduce_now();
    f.expect_owned(f.expected_flat(2 * mean_of_ranks_plus_one(g->size()), kAll), "marks off after marks");
    set_stale_grads_enabled(true);
  }
}

// The reducer's group is any group: over a sub-group of two ranks (even ranks with even,
// odd with odd) the mean is over that sub-group's ranks only: ranks {0, 2} average 1 and 3
// (2), ranks {1, 3} average 2 and 4 (3); at world 2 each rank is alone (its own value).
TEST(GradReducer, ReducesOverASubGroupOnly) {
  auto w = world();
  if (w->size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  auto g = w->split(w->rank() % 2, w->rank());
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(g->size(), w->size() / 2);
  for (int stage : {0, 2}) {
    ReducerOptions o;
    o.stage = stage;
    Fixture f(g, o);
    f.backward(w->rank(), true, true, kAll);  // gradient: world rank + 1
    double sum = 0;
    for (int r = w->rank() % 2; r < w->size(); r += 2) sum += r + 1;
    f.expect_owned(f.expected_flat(sum / g->size(), kAll), "sub-group");
  }
}

}  // namespace
}  // namespace test_grad_reducer
}  // namespace zt::zero
