// [Rank Consensus] (src/comm/consensus.h): ranks started with different configs or models
// are named, with the key, on every rank, before any collective of the engine can
// mismatch. Run at world 1, 2 and 4 by ctest; the disagreement cases need 2 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "comm/consensus.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt_test_consensus {

namespace {

using zt::test_support::Mlp;

zt::comm::GroupPtr world() {
  zt::comm::GroupPtr g = zt::comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

TEST(Consensus, FirstDifferenceNamesTheKeyAndBothValues) {
  using zt::comm::first_difference;
  EXPECT_EQ(first_difference({"a = 1", "b = 2"}, {"a = 1", "b = 2"}), "");
  EXPECT_EQ(first_difference({"a = 1", "b = 3"}, {"a = 1", "b = 2"}), "b: 3 here, 2 on rank 0");
  EXPECT_EQ(first_difference({"a = 1", "c = 3"}, {"a = 1"}), "c: 3 here, not set on rank 0");
  EXPECT_EQ(first_difference({"a = 1"}, {"a = 1", "b = 2"}), "b: not set here, 2 on rank 0");
  EXPECT_NE(zt::comm::records_digest({"a = 1"}), zt::comm::records_digest({"a = 2"}));
  // Record boundaries count: "ab" + "c" is not "a" + "bc".
  EXPECT_NE(zt::comm::records_digest({"ab", "c"}), zt::comm::records_digest({"a", "bc"}));
}

nlohmann::json config(double lr, int stage) {
  return {
      {"train_micro_batch_size_per_gpu", 2},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", lr}}}}},
      {"zero_optimization", {{"stage", stage}}},
  };
}

// Initializes an engine on every rank, the last rank with its own config or model;
// returns this rank's error message ("" = none).
std::string init_with_last_rank(const nlohmann::json& mine, int64_t hidden) {
  auto g = world();
  torch::manual_seed(7);
  Mlp m(8, hidden, 4);
  auto cfg = zt::Config::from_json(mine, g->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  try {
    auto engine = zt::initialize(m.ptr(), cfg, o);
  } catch (const zt::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Consensus, ARankWithAnotherLearningRateIsNamedOnEveryRank) {
  auto g = world();
  if (g->size() < 2) GTEST_SKIP() << "needs 2 ranks (a rank that disagrees with rank 0)";
  const bool last = g->rank() == g->size() - 1;
  const std::string err = init_with_last_rank(config(last ? 2e-3 : 1e-3, 1), 16);
  EXPECT_NE(err.find("rank " + std::to_string(g->size() - 1)), std::string::npos) << err;
  EXPECT_NE(err.find("optimizer.params.lr"), std::string::npos) << err;
  EXPECT_NE(err.find("same config"), std::string::npos) << err;
}

TEST(Consensus, ARankWithAnotherStageIsNamedNotATruncatedMessage) {
  auto g = world();
  if (g->size() < 2) GTEST_SKIP() << "needs 2 ranks (a rank that disagrees with rank 0)";
  const bool last = g->rank() == g->size() - 1;
  const std::string err = init_with_last_rank(config(1e-3, last ? 2 : 1), 16);
  EXPECT_NE(err.find("zero_optimization.stage: 2 here, 1 on rank 0"), std::string::npos) << err;
}

TEST(Consensus, ARankWithAnotherModelShapeIsNamed) {
  auto g = world();
  if (g->size() < 2) GTEST_SKIP() << "needs 2 ranks (a rank that disagrees with rank 0)";
  const bool last = g->rank() == g->size() - 1;
  const std::string err = init_with_last_rank(config(1e-3, 2), last ? 12 : 16);
  EXPECT_NE(err.find("the model"), std::string::npos) << err;
  EXPECT_NE(err.find("parameter fc1.weight"), std::string::npos) << err;
}

TEST(Consensus, AgreeingRanksInitialize) {
  EXPECT_EQ(init_with_last_rank(config(1e-3, 2), 16), "");
}

}  // namespace

}  // namespace zt_test_consensus
