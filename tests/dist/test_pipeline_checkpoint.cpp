// Pipeline checkpoints on CPU ranks ([Pipeline Checkpoints] in src/ckpt/engine_checkpoint.cpp,
// PipeEngine::save_checkpoint / load_checkpoint): GPT-2 (6 blocks, C 64, fp32) trained 3
// steps at one layout, saved, and continued 2 steps (the reference); the checkpoint then
// loads at the same layout (bit-exact losses and parameters), at another pp (1: the ordinary
// non-pipelined engine; 4), another dp and another ZeRO stage (losses within 1e-5 relative of
// the reference). A non-pipelined checkpoint loads into pp 2 and 4 the same way.
//
// Every layout trains the same global batch per step: kBatch micro-batches, replica d of dp
// taking micro-batches d*gas .. d*gas+gas-1 (gas = kBatch / dp), and the loss compared is
// the mean over the replicas. Layouts of the same pp*dp run on groups of consecutive world
// ranks (several copies at 4 ranks); those needing more ranks than the run has are skipped.
//
// Tolerance: another pp or dp sums the same fp32 gradients in another order (the tied
// embedding's two parts, the stages' norms, the dp reduction): rounding amplified through 2
// Adam steps, as in tests/dist/test_pipeline.cpp (1e-5 relative there after 5 steps). A load
// that misses a stage's parameters, the optimizer state or the schedule position moves the
// loss far more; a stale tied copy (the loaded wte not sent to the last stage) moved it by
// 5.6e-5 relative at step 4 (checked by hand), and the tied-copy check catches it exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/engine_checkpoint.h"
#include "models/gpt2.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "support/pipeline_test_util.h"

namespace zt::pipe {
namespace test_pipeline_checkpoint {
namespace {

constexpr int64_t kMicro = 2, kSeq = 16;
constexpr int kBatch = 4;  // micro-batches per step over all dp replicas (dp x gas)
constexpr int kSaveAt = 3, kSteps = 5;

models::GPT2Config pipe_ckpt_tiny(int64_t n_layer = 6) {
  models::GPT2Config c;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 256;
  c.n_positions = 64;
  return c;
}

struct Layout {
  const char* name;
  int pp, dp, zero;
  const char* schedule = "1f1b";
  int virtual_stages = 1;
  int ranks() const { return pp * dp; }
  int gas() const { return kBatch / dp; }
};

nlohmann::json pipe_ckpt_json(const Layout& l) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", l.gas()},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
      // The LR changes every step: a wrong schedule position after the load shows.
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 1e-3}, {"warmup_num_steps", 8}}}}},
      {"zero_optimization", {{"stage", l.zero}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 7000}}},
  };
  if (l.pp > 1) {
    j["pipeline"] = {{"stages", l.pp}, {"schedule", l.schedule}};
    if (l.virtual_stages > 1) j["pipeline"]["virtual_stages"] = l.virtual_stages;
  }
  return j;
}

// Micro-batch j (of kBatch) of step s: random bytes, next-token targets.
MicroBatch pipe_ckpt_micro(int step, int j) {
  auto [idx, targets] = test_support::seeded_tokens(static_cast<uint64_t>(7000 + 100 * step + j), kMicro, kSeq, 256);
  return {idx, targets};
}

comm::GroupPtr pipe_ckpt_world() { return test_support::pipe_test_world(); }

bool fits(const Layout& l, int world) { return world >= l.ranks() && world % l.ranks() == 0; }

// GPT-2 trained at one layout on a group of pp x dp ranks: the pipeline engine (pp > 1) or
// the ordinary engine (pp 1), from the same seed.
struct Trainer {
  Layout l;
  comm::GroupPtr group;
  std::unique_ptr<parallel::Topology> topo;
  models::GPT2 model{nullptr};  // pp 1
  std::unique_ptr<Engine> engine;
  std::unique_ptr<PipeEngine> pipe;
  int dp_rank = 0;

  Trainer(const Layout& lay, int64_t n_layer = 6) : l(lay) {
    auto w = pipe_ckpt_world();
    group = w->split(w->rank() / l.ranks(), w->rank() % l.ranks());
    topo = std::make_unique<parallel::Topology>(group, parallel::ParallelDims::make(l.ranks(), l.dp, 1, l.pp));
    dp_rank = topo->coords().dp;
    torch::manual_seed(11);
    models::GPT2 full(pipe_ckpt_tiny(n_layer));
    if (l.pp > 1) {
      PipeOptions po;
      po.device = torch::Device(torch::kCPU);
      pipe = std::make_unique<PipeEngine>(full, pipeline_config(pipe_ckpt_json(l), l.ranks(), l.name), *topo, po);
    } else {
      model = full;
      EngineOptions o;
      o.group = topo->dp();
      o.device = torch::Device(torch::kCPU);
      o.print = false;
      engine = initialize(model.ptr(), Config::from_json(pipe_ckpt_json(l), l.dp), o);
    }
  }
  Engine& eng() { return pipe ? pipe->engine() : *engine; }

  // Step s (0-based); returns the loss over the whole batch (the mean over the replicas).
  double step(int s) {
    const int gas = l.gas();
    double loss = 0;
    if (pipe) {
      int i = 0;
      loss = pipe->train_batch([&] { return pipe_ckpt_micro(s, dp_rank * gas + i++); });
    } else {
      for (int i = 0; i < gas; ++i) {
        auto mb = pipe_ckpt_micro(s, dp_rank * gas + i);
        auto out = engine->forward([&] { return model->loss(mb.idx, mb.targets); });
        loss += out.item<double>() / gas;
        engine->backward(out);
      }
      EXPECT_TRUE(engine->step());
    }
    if (l.dp > 1) {
      auto t = torch::tensor({loss}, torch::kDouble);
      topo->dp()->all_reduce(t, comm::ReduceOp::kSum);
      loss = t.item<double>() / l.dp;
    }
    return loss;
  }
  void save(const std::string& dir, bool async) {
    if (pipe) {
      pipe->save_checkpoint(dir, "", {{"test", l.name}}, async);
    } else {
      engine->save_checkpoint(dir, "", {{"test", l.name}}, async);
    }
  }
  nlohmann::json load(const std::string& dir) { return pipe ? pipe->load_checkpoint(dir) : engine->load_checkpoint(dir); }
  void wait() { pipe ? pipe->wait_checkpoint() : engine->wait_checkpoint(); }
  // This rank's parameters by their (whole-model) names.
  std::map<std::string, torch::Tensor> params() {
    std::map<std::string, torch::Tensor> out;
    auto named = pipe ? pipe->module()->named_parameters() : model->named_parameters();
    for (const auto& kv : named) out[kv.key()] = kv.value().detach().clone();
    return out;
  }
  // The last stage's tied copy equals the first stage's wte, bit for bit (pp > 1).
  void expect_tied_copy_equal(const std::string& what) {
    if (!pipe || l.pp == 1) return;
    auto w = pipe->stage() == 0 ? pipe->module()->embedding_weight().detach().clone() : torch::empty({256, 64});
    topo->pp()->broadcast(w, 0);
    if (pipe->module()->holds_tied_copy()) {
      EXPECT_TRUE(torch::equal(pipe->module()->tied_copy().detach(), w)) << what << ": tied copy differs from wte";
    }
  }
};

struct SaveCase {
  const char* name;
  Layout save;
  bool async;
};

class PipelineCheckpoint : public ::testing::TestWithParam<SaveCase> {};

// Saved at step 3 at `save`, loaded at every layout this run's ranks allow.
TEST_P(PipelineCheckpoint, LoadsAtEveryLayout) {
  const SaveCase& c = GetParam();
  auto world = pipe_ckpt_world();
  const int W = world->size();
  if (!fits(c.save, W)) {
    GTEST_SKIP() << c.name << " saves on " << c.save.ranks() << " ranks (pp " << c.save.pp << " x dp " << c.save.dp
                 << "); this run has " << W;
  }
  zt::test_support::SharedTempDir root(world, "pipe_ckpt");
  // Every copy of the save layout saves into its own directory; the loads read copy 0's.
  const std::string mine = root.path + "/copy" + std::to_string(world->rank() / c.save.ranks());
  const std::string dir = root.path + "/copy0";

  std::vector<double> ref;
  std::map<std::string, torch::Tensor> ref_params;
  {
    Trainer t(c.save);
    for (int s = 0; s < kSaveAt; ++s) t.step(s);
    t.save(mine, c.async);
    for (int s = kSaveAt; s < kSteps; ++s) ref.push_back(t.step(s));
    t.wait();  // an asynchronous save is published by now
    ref_params = t.params();
    t.expect_tied_copy_equal(std::string(c.name) + " (saving run)");
  }
  world->barrier();

  // The checkpoint is a non-pipelined GPT-2's: every parameter once, whole, under its name,
  // in the model's order; no tied copy, no pipeline coordinates.
  if (world->rank() == 0) {
    const auto m = ckpt::read_manifest(dir, "");
    EXPECT_EQ(m.at("world_size").get<int>(), c.save.ranks());
    EXPECT_EQ(m.at("counters").at("global_steps").get<int64_t>(), kSaveAt);
    torch::manual_seed(11);
    models::GPT2 whole(pipe_ckpt_tiny());
    std::vector<std::string> want, got;
    for (const auto& kv : whole->named_parameters()) want.push_back(kv.key());
    for (const auto& p : m.at("params")) {
      got.push_back(p.at("name").get<std::string>());
      EXPECT_EQ(p.at("shard").at("pp_stage").get<int>(), 0) << got.back();
    }
    // One contiguous range of layers per stage: the stages' lists join in the model's order;
    // interleaved chunks are listed stage by stage (loads go by name, the order is cosmetic).
    if (c.save.virtual_stages == 1) EXPECT_EQ(got, want);
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want);
    EXPECT_TRUE(m.at("extra").empty()) << m.at("extra").dump();
    EXPECT_EQ(m.at("client_state").at("test").get<std::string>(), c.save.name);
    if (c.save.pp > 1) EXPECT_EQ(m.at("client_state").at("pipeline").at("stages").get<int>(), c.save.pp);
  }

  const Layout loads[] = {
      c.save,
      {"pp1_dp1_z1", 1, 1, 1},
      {"pp1_dp2_z2", 1, 2, 2},
      {"pp2_dp1_z2", 2, 1, 2},
      {"pp2_dp1_interleaved_z0", 2, 1, 0, "interleaved", 2},
      {"pp2_dp2_z1", 2, 2, 1},
      {"pp4_dp1_z1", 4, 1, 1},
  };
  for (size_t k = 0; k < std::size(loads); ++k) {
    const Layout& l = loads[k];
    const bool same = k == 0;
    if (!fits(l, W) || (k > 0 && std::string(l.name) == c.save.name)) continue;
    SCOPED_TRACE(std::string(c.name) + " loaded at " + l.name);
    Trainer t(l);
    const auto client = t.load(dir);
    EXPECT_EQ(client.at("test").get<std::string>(), c.save.name);
    EXPECT_EQ(t.eng().global_steps(), kSaveAt);
    t.expect_tied_copy_equal(l.name);
    double worst = 0;  // largest relative difference to the reference, printed
    for (int s = kSaveAt; s < kSteps; ++s) {
      const double loss = t.step(s), want = ref[static_cast<size_t>(s - kSaveAt)];
      worst = std::max(worst, std::abs(loss - want) / std::abs(want));
      if (same) {
        EXPECT_EQ(loss, want) << "step " << s + 1 << ": the same layout resumes bit-exactly";
      } else {
        EXPECT_NEAR(loss, want, 1e-5 * std::abs(want)) << "step " << s + 1;
      }
    }
    if (world->rank() == 0) std::printf("[pipe ckpt] %s -> %s: steps 4-5 max relative loss difference %.3g\n", c.name, l.name, worst);
    if (same) {
      for (const auto& [name, p] : t.params()) {
        auto it = ref_params.find(name);
        ASSERT_NE(it, ref_params.end()) << name;
        EXPECT_TRUE(torch::equal(p, it->second)) << name << " differs after the bit-exact resume by "
                                                 << (p - it->second).abs().max().item<double>();
      }
    }
    world->barrier();
  }
}

std::string pipe_ckpt_case_name(const ::testing::TestParamInfo<SaveCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineCheckpoint,
    ::testing::Values(
        // A non-pipelined checkpoint (1 rank) into pp 2 and 4.
        SaveCase{"pp1_dp1_z1", {"pp1_dp1_z1", 1, 1, 1}, false},
        // pp 2 x dp 1 (2 ranks), ZeRO 1; and interleaved (2 chunks per stage) at ZeRO 0.
        SaveCase{"pp2_dp1_z1", {"pp2_dp1_z1", 2, 1, 1}, false},
        SaveCase{"pp2_dp1_interleaved_z0_async", {"pp2_dp1_interleaved_z0", 2, 1, 0, "interleaved", 2}, true},
        // pp 2 x dp 2 (4 ranks), ZeRO 2, asynchronous (published at a later step, over every stage).
        SaveCase{"pp2_dp2_z2_async", {"pp2_dp2_z2", 2, 2, 2}, true}),
    pipe_ckpt_case_name);

// A checkpoint of another model shape: a CheckpointError on every rank naming the parameter
// no stage trains, before any state changes.
TEST(PipelineCheckpointErrors, AnotherModelShapeIsNamed) {
  auto world = pipe_ckpt_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  zt::test_support::SharedTempDir root(world, "pipe_ckpt_err");
  const Layout l{"pp2_dp1_z1", 2, 1, 1};
  const std::string dir = root.path + "/copy" + std::to_string(world->rank() / 2);
  {
    Trainer t(l);
    t.step(0);
    t.save(dir, false);
  }
  Trainer small(l, /*n_layer=*/4);
  std::string err;
  try {
    small.load(dir);
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("holds parameter 'h.4."), std::string::npos) << err;
  EXPECT_NE(err.find("but no rank of this run trains it (pipeline stages read their layers by the whole model's names"),
            std::string::npos)
      << err;
  // The group still works: no rank left waiting in a collective.
  auto t = torch::ones({1});
  small.group->all_reduce(t);
  EXPECT_EQ(t.item<float>(), 2.0f);
}

// A failed asynchronous save (rank 1's write fails as a full disk would,
// ZT_CKPT_TEST_FAIL) is thrown by the train_batch whose step publishes it, as CheckpointError
// on every rank, after the whole batch ran: the step is counted, the tied copy took the
// stepped wte, and the next batch trains on every stage (no rank left behind in the schedule).
TEST(PipelineCheckpointErrors, FailedAsyncSaveIsThrownAfterTheBatch) {
  auto world = pipe_ckpt_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  zt::test_support::SharedTempDir root(world, "pipe_ckpt_fail");
  Trainer t({"pp2_dp1_z1", 2, 1, 1});
  const std::string dir = root.path + "/copy" + std::to_string(world->rank() / 2);
  t.step(0);
  ::setenv("ZT_CKPT_TEST_FAIL", "global_step1:1", 1);
  t.save(dir, /*async=*/true);
  std::string err;
  int s = 1;
  for (; s < 20 && err.empty(); ++s) {
    try {
      int i = 0;
      t.pipe->train_batch([&] { return pipe_ckpt_micro(s, i++); });
    } catch (const CheckpointError& e) {
      err = e.what();
    }
  }
  ::unsetenv("ZT_CKPT_TEST_FAIL");
  EXPECT_NE(err.find("injected by ZT_CKPT_TEST_FAIL"), std::string::npos) << err;
  EXPECT_EQ(t.eng().global_steps(), s) << "the batch that threw was stepped";
  EXPECT_FALSE(t.eng().checkpoint_pending());
  t.expect_tied_copy_equal("after the failed save");
  const double loss = t.step(s);
  EXPECT_TRUE(std::isfinite(loss));
  auto l = torch::tensor({loss}, torch::kDouble);
  t.group->all_reduce(l, comm::ReduceOp::kMax);
  EXPECT_EQ(l.item<double>(), loss) << "both stages report the batch's loss";
}

// [Failed Previous Save] on load through the pipeline: a load while a failed asynchronous save
// is in flight loads, finishes the tied-weight exchange and the step count, then throws the
// failure on every rank saying the load succeeded. Before, the engine's throw skipped the
// exchange: the last stage kept the tied copy of a later step.
TEST(PipelineCheckpointErrors, LoadAfterAFailedAsyncSaveLoadsThenThrows) {
  auto world = pipe_ckpt_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  zt::test_support::SharedTempDir root(world, "pipe_ckpt_load_fail");
  Trainer t({"pp2_dp1_z1", 2, 1, 1});
  const std::string copy = std::to_string(world->rank() / 2);
  const std::string good = root.path + "/good" + copy, bad = root.path + "/bad" + copy;
  for (int s = 0; s < 3; ++s) t.step(s);
  t.save(good, /*async=*/false);
  const auto saved = t.params();
  const double loss3 = t.step(3);
  ::setenv("ZT_CKPT_TEST_FAIL", "global_step4:1", 1);
  t.save(bad, /*async=*/true);
  std::string err;
  try {
    t.load(good);
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  ::unsetenv("ZT_CKPT_TEST_FAIL");
  EXPECT_NE(err.find("injected by ZT_CKPT_TEST_FAIL"), std::string::npos) << err;
  EXPECT_NE(err.find("succeeded (the engine is at global step 3)"), std::string::npos) << err;
  EXPECT_EQ(t.eng().global_steps(), 3);
  EXPECT_FALSE(t.eng().checkpoint_pending());
  t.expect_tied_copy_equal("after the load");
  for (const auto& [name, v] : t.params()) {
    EXPECT_TRUE(torch::equal(v, saved.at(name))) << name << " is not the loaded value";
  }
  EXPECT_EQ(t.step(3), loss3) << "the step after the load repeats step 3 bit for bit";
}

}  // namespace
}  // namespace test_pipeline_checkpoint
}  // namespace zt::pipe
