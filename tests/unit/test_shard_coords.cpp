// Shard coordinates of checkpoint keys ([Shard Keys] in src/ckpt/shard_coords.h): the
// key suffix, the manifest entry (with version 1's missing entry as the default), checks,
// and the lookup of (name, coordinates) among a manifest's params.
#include <gtest/gtest.h>

#include <string>

#include "ckpt/shard_coords.h"
#include "zerotrain/error.h"

namespace zt::ckpt {
namespace test_shard_coords {
namespace {

template <typename Fn>
std::string ckpt_error(Fn fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ShardCoords, DefaultAddsNothingToTheKey) {
  EXPECT_TRUE(ShardCoord{}.is_default());
  EXPECT_EQ(shard_suffix(ShardCoord{}), "");
  EXPECT_EQ(param_id("h.0.attn.c_attn.weight", ShardCoord{}), "h.0.attn.c_attn.weight");
}

TEST(ShardCoords, SuffixNamesOnlyWhatDiffers) {
  EXPECT_EQ(param_id("w", ShardCoord{.tp_rank = 1, .tp_size = 2, .tp_dim = 0}), "w[tp1of2d0]");
  EXPECT_EQ(param_id("w", ShardCoord{.pp_stage = 3}), "w[pp3]");
  EXPECT_EQ(param_id("w", ShardCoord{.expert = 0}), "w[ex0]");
  EXPECT_EQ(param_id("w", ShardCoord{.tp_rank = 7, .tp_size = 8, .tp_dim = 1, .pp_stage = 2, .expert = 5}),
            "w[tp7of8d1,pp2,ex5]");
  // Two tensor-parallel shards of one parameter have different ids.
  EXPECT_NE(param_id("w", ShardCoord{.tp_rank = 0, .tp_size = 2, .tp_dim = 0}),
            param_id("w", ShardCoord{.tp_rank = 1, .tp_size = 2, .tp_dim = 0}));
  EXPECT_NE(param_id("w", ShardCoord{.tp_rank = 0, .tp_size = 2, .tp_dim = 0}),
            param_id("w", ShardCoord{.tp_rank = 0, .tp_size = 2, .tp_dim = 1}));
}

TEST(ShardCoords, JsonRoundTripAndVersionOneEntries) {
  const ShardCoord c{.tp_rank = 2, .tp_size = 4, .tp_dim = 1, .pp_stage = 1, .expert = 6};
  nlohmann::json entry = {{"name", "w"}, {"shard", to_json(c)}};
  EXPECT_EQ(coord_of_entry(entry, "w"), c);
  // Version 1 wrote no "shard": the default layout.
  EXPECT_EQ(coord_of_entry(nlohmann::json{{"name", "w"}}, "w"), ShardCoord{});
  entry["shard"].erase("tp_dim");
  std::string m = ckpt_error([&] { coord_of_entry(entry, "parameter 'w'"); });
  EXPECT_TRUE(has(m, "parameter 'w'") && has(m, "malformed")) << m;
}

TEST(ShardCoords, InconsistentCoordinatesAreNamed) {
  std::string m = ckpt_error([] { validate(ShardCoord{.tp_rank = 2, .tp_size = 2, .tp_dim = 0}, "parameter 'w'"); });
  EXPECT_TRUE(has(m, "parameter 'w'") && has(m, "rank 2 of 2")) << m;
  m = ckpt_error([] { validate(ShardCoord{.tp_rank = 0, .tp_size = 2}, "parameter 'w'"); });
  EXPECT_TRUE(has(m, "split dimension -1")) << m;
  m = ckpt_error([] { validate(ShardCoord{.tp_dim = 0}, "parameter 'w'"); });
  EXPECT_TRUE(has(m, "size 1 with split dimension 0")) << m;
  m = ckpt_error([] { validate(ShardCoord{.pp_stage = -1}, "p"); });
  EXPECT_TRUE(has(m, "pipeline stage -1")) << m;
  m = ckpt_error([] { validate(ShardCoord{.expert = -2}, "p"); });
  EXPECT_TRUE(has(m, "expert index -2")) << m;
  validate(ShardCoord{}, "p");  // the default is fine
}

TEST(ShardCoords, FindsExactlyTheRequestedShard) {
  const ShardCoord tp0{.tp_rank = 0, .tp_size = 2, .tp_dim = 0}, tp1{.tp_rank = 1, .tp_size = 2, .tp_dim = 0};
  nlohmann::json params = nlohmann::json::array();
  params.push_back({{"name", "a"}});  // version 1 style: default
  params.push_back({{"name", "w"}, {"shard", to_json(tp0)}});
  params.push_back({{"name", "w"}, {"shard", to_json(tp1)}});
  EXPECT_EQ(find_param_entry(params, "a", ShardCoord{}, "ck"), 0u);
  EXPECT_EQ(find_param_entry(params, "w", tp0, "ck"), 1u);
  EXPECT_EQ(find_param_entry(params, "w", tp1, "ck"), 2u);

  std::string m = ckpt_error([&] { find_param_entry(params, "w", ShardCoord{}, "ck"); });
  EXPECT_TRUE(has(m, "'w'")) << m;
  EXPECT_TRUE(has(m, "tp rank 0 of 2 (dim 0), pipeline stage 0, dense; tp rank 1 of 2 (dim 0)")) << m;
  EXPECT_TRUE(has(m, "needs it as [not tensor-parallel, pipeline stage 0, dense]")) << m;
  m = ckpt_error([&] { find_param_entry(params, "a", ShardCoord{.expert = 1}, "ck"); });
  EXPECT_TRUE(has(m, "'a'") && has(m, "expert 1")) << m;
  m = ckpt_error([&] { find_param_entry(params, "b", ShardCoord{}, "ck"); });
  EXPECT_TRUE(has(m, "has no parameter 'b'")) << m;
}

}  // namespace
}  // namespace test_shard_coords
}  // namespace zt::ckpt
