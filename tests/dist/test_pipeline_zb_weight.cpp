// zb-h1's weight pass from deferred closures ([Deferred Weight Gradients] in
// src/models/deferred_grad.h): at pp 2 the last stage's W must run the weight-gradient
// closures its B pass collected -- no autograd pass through the stage -- and train exactly
// as the 1f1b schedule does; a stage with a parameter of plain ATen ops (Llama's RMSNorm
// on CPU is the reference formulation) must fall back to the autograd pass and still train
// as 1f1b does.
//
// Tolerances are tests/dist/test_pipeline.cpp's (the same fp32 math, gradients summed in
// another order, amplified through 5 Adam steps at lr 1e-3): losses within 1e-5 relative,
// parameters within 2e-5 absolute + 1e-4 relative. A W that drops or doubles a parameter's
// gradient misses by orders of magnitude; without the closures the counters stay 0.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/llama.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "support/pipeline_test_util.h"
#include "zerotrain/comm.h"

namespace zt::pipe {
namespace test_pipeline_zb_weight {
namespace {

constexpr int kSteps = 5, kGas = 4;
constexpr int64_t kMicro = 2, kSeq = 16;

// max_pending_w >= 0: pipeline.zb_max_pending_w ([ZB-H1 Pending Cap]).
nlohmann::json ds_json(const std::string& schedule, int zero_stage, double clip, int max_pending_w = -1) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", kGas},
      {"gradient_clipping", clip},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", zero_stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 7000}}},
      {"pipeline", {{"stages", 2}, {"schedule", schedule}}},
  };
  if (max_pending_w >= 0) j["pipeline"]["zb_max_pending_w"] = max_pending_w;
  return j;
}

MicroBatch micro_batch(int step, int i) {
  auto [idx, targets] = test_support::seeded_tokens(static_cast<uint64_t>(1000 * step + 10 * i + 3), kMicro, kSeq, 256);
  return {idx, targets};
}

struct ZbRun {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> params;  // this stage's, after kSteps
  int64_t deferred = 0, fallback = 0, closures = 0;
  int stage = 0;
  int64_t closures_per_pass = 0;  // one per parameter, one per LayerNorm (weight and bias)
  std::string last_stage_line;    // the schedule's compute order on the last stage
  bool released = false;          // releases_input_backward_graph() after training
};

// kSteps batches of `schedule` at pp 2 over the first 2 world ranks; `make` builds the
// PipeEngine from the whole model (same seed on every rank).
template <typename MakePipe>
ZbRun train(const MakePipe& make) {
  auto group = test_support::consecutive_ranks(2);
  parallel::Topology topo(group, parallel::ParallelDims::make(2, 1, 1, 2));
  auto pipe = make(topo);
  ZbRun r;
  for (int s = 0; s < kSteps; ++s) {
    int i = 0;
    r.losses.push_back(pipe->train_batch([&] { return micro_batch(s, i++); }));
  }
  for (const auto& kv : pipe->module()->named_parameters()) r.params[kv.key()] = kv.value().detach().clone();
  r.deferred = pipe->deferred_weight_passes();
  r.fallback = pipe->fallback_weight_passes();
  r.closures = pipe->deferred_closures_run();
  r.stage = pipe->stage();
  r.last_stage_line = pipe->schedule().line(1);
  r.released = pipe->releases_input_backward_graph();
  for (const auto& kv : pipe->module()->named_parameters())
    r.closures_per_pass += kv.key().find("ln_") == std::string::npos ? 2 : 1;
  r.closures_per_pass /= 2;
  return r;
}

void expect_same_training(const ZbRun& zb, const ZbRun& ref, const std::string& name) {
  ASSERT_EQ(zb.losses.size(), ref.losses.size());
  for (size_t s = 0; s < zb.losses.size(); ++s)
    EXPECT_NEAR(zb.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << name << " step " << s;
  ASSERT_EQ(zb.params.size(), ref.params.size()) << name;
  for (const auto& [k, v] : ref.params) {
    const auto& w = zb.params.at(k);
    EXPECT_TRUE(torch::allclose(w, v, 1e-4, 2e-5))
        << name << " stage " << zb.stage << " " << k << " max diff " << (w - v).abs().max().item<double>();
  }
}

// Every pair of consecutive world ranks runs its own copy (2 at 4 ranks).
bool enough_ranks() { return test_support::pipe_test_world()->size() % 2 == 0; }

models::GPT2Config gpt2_tiny() {
  models::GPT2Config c;
  c.n_layer = 6;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 256;
  c.n_positions = 64;
  return c;
}

struct ZbCase {
  const char* name;
  int zero_stage;
  double clip;
  int max_pending_w = -1;  // pipeline.zb_max_pending_w; 0: the last stage runs each W right after its B
};

class ZbWeightPass : public ::testing::TestWithParam<ZbCase> {};

// GPT-2: every parameter of the last stage (LinearFn, LayerNormFn; the head's weight is the
// tied copy, whose gradient B computes) has a closure, so every W of the last stage runs
// from them. ZeRO 0 accumulates in place into the flat gradient buffer inside the closures;
// ZeRO 2 hands fresh gradients to the reducer's hooks. With zb_max_pending_w 0 the last
// stage runs "B0 sg0 W0 F1 ..." (checked below): the schedule moves W, never the math.
TEST_P(ZbWeightPass, Gpt2RunsFromTheClosuresAndTrainsAs1f1b) {
  const ZbCase& c = GetParam();
  if (!enough_ranks()) GTEST_SKIP() << "needs an even number of ranks";
  auto make = [&](const std::string& schedule) {
    return [&c, schedule](parallel::Topology& topo) {
      torch::manual_seed(11);
      models::GPT2 full(gpt2_tiny());
      PipeOptions po;
      po.device = torch::Device(torch::kCPU);
      const int cap = schedule == "zb-h1" ? c.max_pending_w : -1;
      return std::make_unique<PipeEngine>(full, pipeline_config(ds_json(schedule, c.zero_stage, c.clip, cap), 2), topo,
                                          po);
    };
  };
  const ZbRun zb = train(make("zb-h1"));
  EXPECT_EQ(zb.last_stage_line, c.max_pending_w == 0 ? "F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3"
                                                     : "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3")
      << c.name;
  const ZbRun ref = train(make("1f1b"));
  expect_same_training(zb, ref, c.name);
  EXPECT_EQ(ref.deferred + ref.fallback + ref.closures, 0) << "1f1b has no weight pass";
  EXPECT_EQ(zb.fallback, 0) << c.name;
  if (zb.stage == 0) {
    // Token ids have no gradient: the first stage's W is its whole backward.
    EXPECT_EQ(zb.deferred, 0) << c.name;
    EXPECT_EQ(zb.closures, 0) << c.name;
    EXPECT_FALSE(zb.released) << c.name;
  } else {
    // [B Graph Release]: after the first B every B of the last stage ran without the retained
    // graph, and trained as 1f1b did (above).
    EXPECT_TRUE(zb.released) << c.name;
    EXPECT_EQ(zb.deferred, kSteps * kGas) << c.name;
    // Per micro-batch: one closure per linear weight and bias, one per LayerNorm.
    EXPECT_GT(zb.closures_per_pass, 0);
    EXPECT_EQ(zb.closures, kSteps * kGas * zb.closures_per_pass) << c.name;
  }
}

std::string zb_name(const ::testing::TestParamInfo<ZbCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Pipeline, ZbWeightPass,
                         ::testing::Values(ZbCase{"z0", 0, 0.0}, ZbCase{"z1_clip", 1, 0.05},
                                           ZbCase{"z2_clip", 2, 0.05}, ZbCase{"z2_clip_w0", 2, 0.05, 0}),
                         zb_name);

// Llama on CPU: RMSNorm is the reference formulation (plain ATen ops), so the last stage's
// norms get no closure and every W falls back to the autograd pass -- and still trains as
// 1f1b does. (On CUDA RmsNormFn defers its gradient too.)
TEST(PipelineZbWeightFallback, LlamaOnCpuFallsBackAndTrainsAs1f1b) {
  if (!enough_ranks()) GTEST_SKIP() << "needs an even number of ranks";
  models::LlamaConfig cfg;
  cfg.vocab_size = 256;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 128;
  cfg.num_hidden_layers = 4;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 16;
  cfg.max_position_embeddings = 64;
  cfg.tie_word_embeddings = false;
  auto make = [&](const std::string& schedule) {
    return [&cfg, schedule](parallel::Topology& topo) {
      torch::manual_seed(11);
      models::LlamaForCausalLM full(cfg);
      PipeOptions po;
      po.device = torch::Device(torch::kCPU);
      return std::make_unique<PipeEngine>(full, pipeline_config(ds_json(schedule, 1, 1.0), 2), topo, po);
    };
  };
  const ZbRun zb = train(make("zb-h1"));
  const ZbRun ref = train(make("1f1b"));
  expect_same_training(zb, ref, "llama");
  EXPECT_EQ(zb.deferred, 0);
  EXPECT_EQ(zb.closures, 0);
  EXPECT_EQ(zb.fallback, zb.stage == 0 ? 0 : kSteps * kGas);
  EXPECT_FALSE(zb.released) << "the fallback W needs B's graph";
}

}  // namespace
}  // namespace test_pipeline_zb_weight
}  // namespace zt::pipe
