// Partial gradient norms combined over shard groups and the model-parallel group
// (src/zero/grad_norm.h, ZeroOptions::model_parallel). Run at world 1, 2 and 4 by ctest.
// The model-parallel case stands in for tensor parallelism: every rank holds parameters
// of its own (data-parallel group: the rank alone), and the clipping norm and the
// overflow decision must be the global ones, equal on every rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "zero/grad_norm.h"
#include "zero/zero_optimizer.h"
#include "zerotrain/comm.h"

namespace zt::zero {
namespace test_grad_norm {
namespace {

comm::GroupPtr world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

torch::Tensor one(double v) { return torch::full({1}, v, torch::kDouble); }

TEST(GradNorm, OnePartialWithoutModelParallelIsItself) {
  auto p = one(2.5);
  auto sq = combine_norm_sq({p}, nullptr);
  EXPECT_TRUE(sq.is_same(p)) << "no operation at all on the default path";
}

TEST(GradNorm, AddsShardGroupsThenModelParallelRanks) {
  auto g = world();
  const int r = g->rank();
  // Two shard groups on this rank (say dense and experts): 1 + (r+1)^2.
  auto sq = combine_norm_sq({one(1.0), one((r + 1.0) * (r + 1.0))}, g);
  double want = 0;
  for (int k = 0; k < g->size(); ++k) want += 1.0 + (k + 1.0) * (k + 1.0);
  EXPECT_EQ(sq.item<double>(), want);
  // An inf on one model-parallel rank is an overflow on all of them.
  auto f = combine_norm_sq({one(r == g->size() - 1 ? std::numeric_limits<double>::infinity() : 1.0)}, g);
  EXPECT_FALSE(std::isfinite(f.item<double>()));
}

// ZeroOptimizer over a data-parallel group of one rank with the world as its
// model-parallel group: rank r's parameter (8 elements) gets gradient r+1 everywhere. The
// global norm is sqrt(8 * sum_k (k+1)^2); with clip 1 every rank scales its update by
// 1 / (norm + 1e-6). SGD, lr 0.5, no momentum: p = -0.5 * (r+1) * coef.
TEST(GradNorm, ModelParallelGroupGivesTheGlobalClipNorm) {
  auto w = world();
  const int r = w->rank();
  for (int stage : {0, 2}) {
    auto dp = w->split(r, 0);  // each rank alone
    ASSERT_EQ(dp->size(), 1);
    auto p = torch::zeros({8}).requires_grad_(true);
    ZeroOptions o;
    o.stage = stage;
    o.optimizer.type = "SGD";
    o.model_parallel = w;
    ZeroOptimizer z({p}, dp, o);
    z.begin_backward(true, true);
    (p * static_cast<double>(r + 1)).sum().backward();
    z.end_backward();
    StepInputs in;
    in.lr = 0.5;
    in.clip = 1.0;
    const StepOutcome out = z.step(in);
    double sum = 0;
    for (int k = 0; k < w->size(); ++k) sum += 8.0 * (k + 1) * (k + 1);
    const double norm = std::sqrt(sum);
    ASSERT_FALSE(out.overflow);
    // Per-bucket fp32 norms: relative error of a few fp32 ulps.
    EXPECT_NEAR(out.grad_norm, norm, 1e-6 * norm) << "stage " << stage;
    const double coef = 1.0 / (norm + 1e-6);
    auto want = torch::full({8}, -0.5 * (r + 1) * coef);
    EXPECT_TRUE(torch::allclose(p.detach(), want, 1e-6, 0)) << "stage " << stage << ": " << p;
  }
}

}  // namespace
}  // namespace test_grad_norm
}  // namespace zt::zero
