// The pure parts of ZeRO (docs/zero-parts.md): a rank's views of a layout (ShardLayout)
// and the stage-3 unit plan (plan_units). No communication; exact.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "zero/param_gatherer.h"
#include "zero/shard_layout.h"
#include "zerotrain/error.h"

namespace zt::zero {
namespace test_zero_parts {
namespace {

// {5, 7} | {130} | {3} at bucket size 12, world 4, align 4: buckets of 16, 144 and 16
// elements, shards of 4, 36 and 4 (44 per rank).
ShardLayout layout(int rank, bool owns_all) {
  ShardLayout L;
  L.flat = make_flat_layout({5, 7, 130, 3}, 12, 4, 4);
  L.rank = rank;
  L.owns_all = owns_all;
  return L;
}

TEST(ShardLayout, ShardedRankOwnsItsShardOfEveryBucket) {
  const ShardLayout L = layout(2, false);
  ASSERT_EQ(L.num_buckets(), 3);
  EXPECT_EQ(L.owned_numel(), 44);
  EXPECT_EQ(L.owned_begin(1), 4);
  EXPECT_EQ(L.owned_bucket_numel(1), 36);
  EXPECT_EQ(L.owned_flat_range(1).begin, 16 + 2 * 36);
  EXPECT_EQ(L.owned_flat_range(1).end, 16 + 3 * 36);
  EXPECT_EQ(L.max_owned_numel(), 36);
  auto flat = torch::arange(176, torch::kLong);
  auto owned = torch::arange(44, torch::kLong);
  EXPECT_TRUE(torch::equal(L.shard_view(flat, 1), torch::arange(88, 124, torch::kLong)));
  EXPECT_TRUE(torch::equal(L.owned_in_flat(flat, 1), L.shard_view(flat, 1)));
  EXPECT_TRUE(torch::equal(L.bucket_view(flat, 2), torch::arange(160, 176, torch::kLong)));
  EXPECT_TRUE(torch::equal(L.owned_view(owned, 2), torch::arange(40, 44, torch::kLong)));
  EXPECT_TRUE(torch::equal(L.param_view(flat, 2), torch::arange(16, 146, torch::kLong)));
  EXPECT_EQ(L.owned_view(owned, 1).data_ptr(), owned.narrow(0, 4, 36).data_ptr()) << "a view, not a copy";
  // Owned elements [2, 42) cut at the buckets' owned parts.
  std::vector<std::vector<int64_t>> pieces;
  L.owned_pieces(2, 40, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
    pieces.push_back({b, at, in_bucket, len});
  });
  const std::vector<std::vector<int64_t>> want{{0, 0, 2, 2}, {1, 2, 0, 36}, {2, 38, 0, 2}};
  EXPECT_EQ(pieces, want);
}

TEST(ShardLayout, StageZeroRankOwnsEverything) {
  const ShardLayout L = layout(3, true);
  EXPECT_EQ(L.owned_numel(), 176);
  EXPECT_EQ(L.owned_begin(1), 16);
  EXPECT_EQ(L.owned_bucket_numel(1), 144);
  EXPECT_EQ(L.max_owned_numel(), 144);
  auto flat = torch::arange(176, torch::kLong);
  EXPECT_TRUE(torch::equal(L.owned_in_flat(flat, 1), L.bucket_view(flat, 1)));
  EXPECT_TRUE(torch::equal(L.owned_view(flat, 1), L.bucket_view(flat, 1)));
  EXPECT_EQ(L.owned_flat_range(2).begin, 160);
  EXPECT_EQ(L.owned_flat_range(2).end, 176);
}

std::string name_of(int i) { return "p" + std::to_string(i); }

// Parameters 0..5 of 100, 4, 200, 300, 50, 7 elements; units "b0" = {2, 1}, "b1" = {3};
// threshold 10: 1 and 5 persist, 0 and 4 are root. Group of parameter 4 is 0, the rest 1:
// the root unit lists 4 before 0.
TEST(PlanUnits, RootDeclaredUnitsThenPersistentWithGroupsContiguous) {
  const std::vector<int64_t> numels{100, 4, 200, 300, 50, 7};
  const UnitPlan p = plan_units(numels, {{"b0", {2, 1}}, {"b1", {3}}}, 10, [](int i) { return i == 4 ? 0 : 1; }, name_of);
  EXPECT_EQ(p.order, (std::vector<int>{4, 0, 2, 3, 1, 5}));
  EXPECT_EQ(p.names, (std::vector<std::string>{"root", "b0", "b1", "persistent"}));
  EXPECT_EQ(p.kinds, (std::vector<UnitKind>{UnitKind::kRoot, UnitKind::kBlock, UnitKind::kBlock, UnitKind::kPersistent}));
  EXPECT_EQ(p.unit_bucket, (std::vector<int>{1, 2}));
  EXPECT_EQ(p.numels, (std::vector<std::vector<int64_t>>{{50, 100}, {200}, {300}, {4, 7}}));
}

TEST(PlanUnits, UnitOfPersistentParametersOnlyHasNoBucket) {
  const UnitPlan p = plan_units({100, 4}, {{"tiny", {1}}}, 10, [](int) { return 0; }, name_of);
  EXPECT_EQ(p.unit_bucket, (std::vector<int>{-1}));
  EXPECT_EQ(p.names, (std::vector<std::string>{"root", "persistent"}));
}

TEST(PlanUnits, BadUnitsAreConfigErrors) {
  auto g = [](int) { return 0; };
  try {
    plan_units({100, 200}, {{"a", {0}}, {"b", {0}}}, 10, g, name_of);
    FAIL() << "a parameter in two units";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("p0 is in two units ('a' and 'b')"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_units({100}, {{"a", {3}}}, 10, g, name_of), ConfigError);
}

}  // namespace
}  // namespace test_zero_parts
}  // namespace zt::zero
