// zero::ParamGatherer on its own (src/zero/param_gatherer.h): stage-3 units gathered over
// a group from shards the test provides, with no reducer, optimizer or engine. Parameter
// i holds 100 * i + k at element k on every rank (exact in fp32); each rank's shard source
// is its shard of that layout. Run at world 1, 2 and 4 by ctest.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <vector>

#include "zero/param_gatherer.h"
#include "zero/partition.h"
#include "zero/shard_layout.h"
#include "zerotrain/comm.h"

namespace zt::zero {
namespace test_param_gatherer {
namespace {

comm::GroupPtr world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

// Units "u0" = {0} (6 elements) and "u1" = {1} (10 elements); parameter 2 (3 elements)
// is under the persistence threshold (4). Buckets: u0, u1, persistent.
struct Fixture {
  ShardLayout L;
  UnitPlan plan;
  std::vector<torch::Tensor> params;  // layout order
  torch::Tensor shard;                // this rank's shard of every bucket
  std::unique_ptr<ParamGatherer> g;

  explicit Fixture(const comm::GroupPtr& group, int64_t prefetch_numel = 1000) {
    const std::vector<int64_t> numels{6, 10, 3};
    plan = plan_units(numels, {{"u0", {0}}, {"u1", {1}}}, 4, [](int) { return 0; },
                      [](int i) { return "p" + std::to_string(i); });
    L.flat = make_unit_layout(plan.numels, group->size(), 4);
    L.rank = group->rank();
    L.owns_all = false;
    auto full = torch::zeros({L.flat.total_numel});
    std::vector<std::vector<int64_t>> shapes;
    for (size_t i = 0; i < plan.order.size(); ++i) {
      const int user = plan.order[i];
      L.param_view(full, static_cast<int>(i)).copy_(expected(user));
      params.push_back(torch::zeros({numels[user]}));
      shapes.push_back({numels[user]});
    }
    std::vector<torch::Tensor> shards;
    for (int b = 0; b < L.num_buckets(); ++b) shards.push_back(L.shard_view(full, b));
    shard = torch::cat(shards);
    GathererOptions o;
    o.prefetch_numel = prefetch_numel;
    g = std::make_unique<ParamGatherer>(L, params, shapes, plan, group, o);
    g->shard_source = [this](int b) { return L.owned_view(shard, b); };
    for (int b = 0; b < L.num_buckets(); ++b) g->detach(b);
  }
  static torch::Tensor expected(int user) {
    return torch::arange(0, user == 0 ? 6 : user == 1 ? 10 : 3, torch::kFloat) + 100.0 * user;
  }
  // Layout index of user parameter `user`.
  const torch::Tensor& param(int user) const {
    for (size_t i = 0; i < plan.order.size(); ++i) {
      if (plan.order[i] == user) return params[i];
    }
    throw std::runtime_error("no such parameter");
  }
  bool gathered(int user) const { return torch::equal(param(user), expected(user)); }
  bool released(int user) const { return param(user).numel() == 0; }
};

TEST(ParamGatherer, GatherAllThenReleaseAll) {
  auto group = world();
  Fixture f(group);
  EXPECT_EQ(f.g->num_units(), 2);
  for (int u = 0; u < 3; ++u) EXPECT_TRUE(f.released(u)) << "detached at construction";
  f.g->gather_all();
  for (int u = 0; u < 3; ++u) EXPECT_TRUE(f.gathered(u)) << "parameter " << u;
  EXPECT_EQ(f.g->stats().gathers, 3);
  EXPECT_EQ(f.g->stats().live_numel, f.L.flat.total_numel);
  f.g->release_all(/*persistent_too=*/false);
  EXPECT_TRUE(f.released(0));
  EXPECT_TRUE(f.released(1));
  EXPECT_TRUE(f.gathered(2)) << "the persistent unit stays until the step";
  f.g->release_all(/*persistent_too=*/true);
  EXPECT_TRUE(f.released(2));
  EXPECT_EQ(f.g->stats().live_numel, 0);
}

// Forward without gradients: each unit is gathered by its pre-forward hook and released by
// its post-forward hook. The first forward records the trace; the second prefetches from
// it (both units fit the prefetch budget), so both of its unit gathers are prefetches.
TEST(ParamGatherer, ForwardGathersJustInTimeThenPrefetchesFromTheTrace) {
  auto group = world();
  Fixture f(group);
  torch::NoGradGuard no_grad;
  for (int pass = 0; pass < 2; ++pass) {
    f.g->reset_counters();
    f.g->begin_forward();
    EXPECT_TRUE(f.gathered(2)) << "persistent unit gathered at the start of forward";
    for (int unit = 0; unit < 2; ++unit) {
      f.g->unit_pre_forward(unit, false);
      EXPECT_TRUE(f.gathered(unit)) << "pass " << pass << " unit " << unit;
      f.g->unit_post_forward(unit, false);
      EXPECT_TRUE(f.released(unit)) << "no backward follows: released after its forward";
    }
    f.g->end_forward();
    EXPECT_EQ(f.g->stats().prefetched, pass == 0 ? 0 : 2) << "pass " << pass;
  }
  f.g->release_all(true);
}

// A prefetch budget smaller than any unit still prefetches the next unit (as DeepSpeed's
// loop, which adds a parameter while the elements in flight are below the bucket), and only
// that one; a budget of 0 prefetches nothing.
TEST(ParamGatherer, ASmallBudgetPrefetchesTheNextUnitOnlyAndZeroNone) {
  auto group = world();
  for (const int64_t budget : {int64_t{1}, int64_t{0}}) {
    Fixture f(group, /*prefetch_numel=*/budget);
    torch::NoGradGuard no_grad;
    for (int pass = 0; pass < 2; ++pass) {
      f.g->reset_counters();
      f.g->begin_forward();
      if (pass == 1) {  // the first unit in flight, not the second: one unit ahead
        EXPECT_EQ(f.g->stats().prefetched, budget > 0 ? 1 : 0) << "budget " << budget << " at the start of forward";
      }
      for (int unit = 0; unit < 2; ++unit) {
        f.g->unit_pre_forward(unit, false);
        f.g->unit_post_forward(unit, false);
      }
      f.g->end_forward();
      EXPECT_EQ(f.g->stats().prefetched, pass == 1 && budget > 0 ? 2 : 0) << "budget " << budget << " pass " << pass;
    }
    f.g->release_all(true);
  }
}

}  // namespace
}  // namespace test_param_gatherer
}  // namespace zt::zero
