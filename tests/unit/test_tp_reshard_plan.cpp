// [TP Reshard] without ranks: the index map against tp::cut (the cut the models use), and
// how plan_param_read picks the exact shard, a re-shardable set, or an error.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/tp_reshard.h"
#include "tp/shard.h"
#include "zerotrain/error.h"

namespace {

using zt::ckpt::ShardCoord;
using zt::ckpt::TpSplit;

// tp_index_map(split) is tp::cut of the full parameter's flat indices, padding -1: every
// (shape, dim, blocks, padding, tp) the models use (q/k/v stacked, a padded vocabulary,
// row-parallel columns).
TEST(TpReshardPlan, IndexMapIsTheCutOfTheIndices) {
  struct Case {
    std::vector<int64_t> shape;
    int64_t dim, blocks, padded;
  };
  const Case cases[] = {{{384, 128}, 0, 3, 0}, {{255, 128}, 0, 1, 256}, {{128, 512}, 1, 1, 0}, {{96}, 0, 3, 0},
                        {{257, 16}, 0, 1, 264}};
  for (const auto& c : cases) {
    for (int size : {1, 2, 4}) {
      const TpSplit s{c.blocks, c.padded, c.shape};
      const zt::tp::SplitSpec spec{c.dim, c.blocks, c.padded};
      int64_t numel = 1;
      for (auto d : c.shape) numel *= d;
      // Indices + 1 so the cut's zero padding reads as -1 below.
      const auto full = torch::arange(1, numel + 1, torch::kLong).view(c.shape);
      for (int r = 0; r < size; ++r) {
        const auto want = zt::tp::cut(full, spec, r, size).reshape({-1}) - 1;
        const auto got = zt::ckpt::tp_index_map(s, c.dim, r, size);
        ASSERT_TRUE(torch::equal(got, want)) << "shape " << c.shape << " dim " << c.dim << " rank " << r << " of " << size;
      }
    }
  }
  EXPECT_THROW(zt::ckpt::tp_index_map(TpSplit{3, 0, {100, 4}}, 0, 0, 2), zt::CheckpointError);
}

nlohmann::json tp_plan_entry(const std::string& name, const ShardCoord& c, std::vector<int64_t> shape, const TpSplit* s) {
  nlohmann::json p = {{"name", name}, {"shard", zt::ckpt::to_json(c)}, {"shape", shape}, {"dtype", "F32"},
                      {"fragments", nlohmann::json::array()}};
  if (s != nullptr) p["tp_split"] = {{"blocks", s->blocks}, {"padded", s->padded}, {"full_shape", s->full_shape}};
  return p;
}

TEST(TpReshardPlan, ExactShardCompleteSetOrTheError) {
  const TpSplit vocab{1, 256, {255, 8}};
  const ShardCoord r0{.tp_rank = 0, .tp_size = 2, .tp_dim = 0}, r1{.tp_rank = 1, .tp_size = 2, .tp_dim = 0};
  nlohmann::json params = nlohmann::json::array({tp_plan_entry("wte", r0, {128, 8}, &vocab), tp_plan_entry("wte", r1, {128, 8}, &vocab),
                                                 tp_plan_entry("ln", ShardCoord{}, {8}, nullptr)});
  // The same tp: rank 1's own shard, read as it is.
  auto p = zt::ckpt::plan_param_read(params, "wte", r1, &vocab, {}, "ckpt");
  EXPECT_TRUE(p.direct());
  EXPECT_EQ(p.entry, 1u);
  EXPECT_EQ(p.id, "wte[tp1of2d0]");
  // tp 1: both shards, the whole parameter (255 rows: the padding row is not data).
  p = zt::ckpt::plan_param_read(params, "wte", ShardCoord{}, nullptr, {255, 8}, "ckpt");
  ASSERT_FALSE(p.direct());
  EXPECT_EQ(p.sources.size(), 2u);
  EXPECT_EQ(p.full_numel, 255 * 8);
  EXPECT_FALSE(p.wanted.defined());
  EXPECT_EQ((p.sources[1].second < 0).sum().item<int64_t>(), 8) << "tp rank 1's last row is padding";
  // tp 4 (padded to 256 again): this rank's rows of the full parameter.
  const ShardCoord q3{.tp_rank = 3, .tp_size = 4, .tp_dim = 0};
  p = zt::ckpt::plan_param_read(params, "wte", q3, &vocab, {}, "ckpt");
  ASSERT_FALSE(p.direct());
  EXPECT_EQ(p.wanted.numel(), 64 * 8);
  EXPECT_EQ(p.wanted[0].item<int64_t>(), 192 * 8);
  // Another full shape: named with both shapes.
  try {
    zt::ckpt::plan_param_read(params, "wte", ShardCoord{}, nullptr, {257, 8}, "ckpt");
    ADD_FAILURE() << "a full shape mismatch must throw";
  } catch (const zt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("[255, 8]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[257, 8]"), std::string::npos) << e.what();
  }
  // An incomplete set (rank 1 only) keeps find_param_entry's error.
  nlohmann::json half = nlohmann::json::array({params[1], params[2]});
  try {
    zt::ckpt::plan_param_read(half, "wte", ShardCoord{}, nullptr, {255, 8}, "ckpt");
    ADD_FAILURE() << "an incomplete set of shards must throw";
  } catch (const zt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tp rank 1 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not supported yet"), std::string::npos) << e.what();
  }
  // A whole parameter into a tp shard; the replicated one read as it is.
  p = zt::ckpt::plan_param_read(params, "ln", ShardCoord{}, nullptr, {8}, "ckpt");
  EXPECT_TRUE(p.direct());
  EXPECT_EQ(p.entry, 2u);
  const TpSplit ln_split{1, 0, {8}};
  p = zt::ckpt::plan_param_read(params, "ln", ShardCoord{.tp_rank = 1, .tp_size = 2, .tp_dim = 0}, &ln_split, {}, "ckpt");
  ASSERT_FALSE(p.direct());
  EXPECT_EQ(p.sources.size(), 1u);
  EXPECT_TRUE(torch::equal(p.wanted, torch::arange(4, 8, torch::kLong)));
}

}  // namespace
