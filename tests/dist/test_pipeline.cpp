// Pipeline parallelism on CPU ranks (src/pipe/pipe_engine.h): GPT-2 (6 blocks, C 64,
// fp32) cut into 2 or 4 stages, over 1 or 2 data-parallel ranks, with every schedule, must
// train as the non-pipelined engine does on the same data: the loss of every step and
// every parameter after 5 steps within the tolerances below, the tied embedding identical
// on the first and last stage, and bad layouts as named errors before any step.
//
// Each case runs on groups of pp x dp ranks split from the world (2 copies at 4 ranks for
// a 2-rank case); a case needing more ranks than the run has skips, naming why.
//
// Tolerances: the pipelined and the reference engine do the same fp32 math in a different
// order in two places -- the tied embedding's gradient is the sum of the head's and the
// embedding's parts added in another order, and gradients of stages are reduced and
// normed in other groupings -- so values agree to float rounding amplified through 5 Adam
// steps: losses within 1e-5 relative, parameters within 2e-5 absolute + 1e-4 relative
// (Adam's update divides by sqrt(v): a gradient entry near zero turns rounding into an
// lr-sized step, lr 1e-3 here). A pipeline that drops a micro-batch, a stage's gradient,
// the tied gradient or the clipping over stages misses them by orders of magnitude.
#include <gtest/gtest.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "zerotrain/comm.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "support/pipeline_test_util.h"

namespace zt::pipe {
namespace test_pipeline {
namespace {

constexpr int kSteps = 5;
constexpr int64_t kMicro = 2, kSeq = 16;

models::GPT2Config tiny(int64_t n_layer = 6) {
  models::GPT2Config c;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 256;
  c.n_positions = 64;
  return c;
}

struct Case {
  const char* name;
  int pp, dp;
  const char* schedule;
  int virtual_stages;
  int zero_stage;
  int gas;
  double clip;
  int ckpt_interval = 0;  // pipeline.activation_checkpoint_interval
  bool bf16 = false;      // bf16 compute (fp32 master weights); looser tolerances, see below
  int zb_max_pending_w = -1;  // pipeline.zb_max_pending_w (zb-h1; -1: not set)
};

nlohmann::json ds_json(const Case& c, bool pipeline) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", c.gas},
      {"gradient_clipping", c.clip},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", c.zero_stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 7000}}},
  };
  if (c.bf16) j["bf16"] = {{"enabled", true}};
  if (pipeline) {
    j["pipeline"] = {{"stages", c.pp}, {"schedule", c.schedule}};
    if (c.virtual_stages > 1) j["pipeline"]["virtual_stages"] = c.virtual_stages;
    if (c.ckpt_interval > 0) j["pipeline"]["activation_checkpoint_interval"] = c.ckpt_interval;
    if (c.zb_max_pending_w >= 0) j["pipeline"]["zb_max_pending_w"] = c.zb_max_pending_w;
  }
  return j;
}

// Micro-batch `i` of step `step` on data-parallel rank `dp`: random bytes, next-token targets.
MicroBatch micro_batch(int step, int i, int dp) {
  auto [idx, targets] = test_support::seeded_tokens(static_cast<uint64_t>(1000 * step + 10 * i + dp + 1), kMicro, kSeq, 256);
  return {idx, targets};
}

comm::GroupPtr world() { return test_support::pipe_test_world(); }

// The ranks of one copy of a case: groups of `n` consecutive world ranks.
comm::GroupPtr case_group(int n) { return test_support::consecutive_ranks(n); }

struct Reference {
  std::vector<double> losses;  // per step, mean over this dp rank's micro-batches
  std::map<std::string, torch::Tensor> params;
  double eval = 0;  // mean loss on step kSteps's micro-batches after training, no grad
  double moved = 0; // largest change of any parameter over the 5 steps
};

// The non-pipelined engine over the same data-parallel ranks and data.
Reference run_reference(const Case& c, const comm::GroupPtr& dp, int dp_rank) {
  torch::manual_seed(11);
  models::GPT2 model(tiny());
  auto cfg = Config::from_json(ds_json(c, false), dp->size());
  EngineOptions o;
  o.group = dp;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  std::vector<torch::Tensor> init;
  for (const auto& p : model->parameters()) init.push_back(p.detach().clone());
  auto engine = initialize(model.ptr(), cfg, o);
  Reference r;
  for (int s = 0; s < kSteps; ++s) {
    double sum = 0;
    for (int i = 0; i < c.gas; ++i) {
      auto mb = micro_batch(s, i, dp_rank);
      auto loss = engine->forward([&] { return model->loss(mb.idx, mb.targets); });
      sum += loss.item<double>();
      engine->backward(loss);
    }
    EXPECT_TRUE(engine->step());
    r.losses.push_back(sum / c.gas);
  }
  for (const auto& kv : model->named_parameters()) r.params[kv.key()] = kv.value().detach().clone();
  const auto now = model->parameters();
  for (size_t i = 0; i < init.size(); ++i)
    r.moved = std::max(r.moved, (now[i].detach().to(torch::kFloat) - init[i].to(torch::kFloat)).abs().max().item<double>());
  torch::NoGradGuard ng;
  for (int i = 0; i < c.gas; ++i) {
    auto mb = micro_batch(kSteps, i, dp_rank);
    r.eval += model->loss(mb.idx, mb.targets).item<double>() / c.gas;
  }
  return r;
}

class PipelineEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineEquivalence, MatchesTheNonPipelinedEngine) {
  const Case& c = GetParam();
  const int need = c.pp * c.dp, have = world()->size();
  if (have < need || have % need != 0) {
    GTEST_SKIP() << c.name << " needs a multiple of " << need << " ranks (pp " << c.pp << " x dp " << c.dp
                 << "); this run has " << have;
  }
  auto group = case_group(need);
  parallel::Topology topo(group, parallel::ParallelDims::make(need, c.dp, 1, c.pp));
  const int dp_rank = topo.coords().dp;

  auto pc = pipeline_config(ds_json(c, true), need, c.name);
  torch::manual_seed(11);
  models::GPT2 full(tiny());
  PipeOptions po;
  po.device = torch::Device(torch::kCPU);
  PipeEngine pipe(full, pc, topo, po);
  EXPECT_EQ(pipe.schedule().spec.micro_batches, c.gas);
  EXPECT_EQ(pipe.schedule().spec.max_pending_w, c.zb_max_pending_w) << c.name;  // the key reaches the schedule

  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    int i = 0;
    losses.push_back(pipe.train_batch([&] { return micro_batch(s, i++, dp_rank); }));
  }
  const Reference ref = run_reference(c, topo.dp(), dp_rank);
  // bf16: the tied gradient's two halves are added in bf16 in another order, and bf16
  // keeps 8 bits: losses agree to bf16 rounding (2^-8) amplified through 5 steps. The
  // attention key bias has a gradient that is zero up to rounding (softmax ignores a shift
  // per query); in bf16 that rounding is far above Adam's eps, so it moves by +-lr per step
  // in a direction set by rounding: up to 5 x lr = 5e-3 apart, hence atol 1e-2 for bf16.
  const double loss_rtol = c.bf16 ? 2e-3 : 1e-5, rtol = c.bf16 ? 2e-2 : 1e-4, atol = c.bf16 ? 1e-2 : 2e-5;
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(losses[static_cast<size_t>(s)], ref.losses[static_cast<size_t>(s)],
                loss_rtol * std::abs(ref.losses[static_cast<size_t>(s)]))
        << c.name << " step " << s;
  }
  // Training moved the weights (the comparison below is not between initial values): by
  // about lr per step at least somewhere.
  EXPECT_GT(ref.moved, 1e-3) << c.name;

  int compared = 0;
  for (const auto& kv : pipe.module()->named_parameters()) {
    auto it = ref.params.find(kv.key());
    ASSERT_NE(it, ref.params.end()) << kv.key();
    EXPECT_TRUE(torch::allclose(kv.value().detach().to(torch::kFloat), it->second.to(torch::kFloat), rtol, atol))
        << c.name << " stage " << pipe.stage() << " " << kv.key() << " max diff "
        << (kv.value().detach() - it->second).abs().max().item<double>();
    ++compared;
  }
  EXPECT_GT(compared, 0);

  // The tied embedding: the last stage's copy equals the first stage's wte, bit for bit,
  // and the reference's within the tolerance.
  if (c.pp > 1) {
    auto w = pipe.stage() == 0 ? pipe.module()->embedding_weight().detach().clone()
                               : torch::empty({256, 64}, c.bf16 ? torch::kBFloat16 : torch::kFloat);
    topo.pp()->broadcast(w, 0);
    if (pipe.module()->holds_tied_copy()) {
      EXPECT_TRUE(torch::equal(pipe.module()->tied_copy().detach(), w)) << c.name;
      EXPECT_TRUE(torch::allclose(w.to(torch::kFloat), ref.params.at("wte.weight").to(torch::kFloat), rtol, atol))
          << c.name;
    }
  }
  // eval_batch: forward only, the same loss as the model's on the current weights.
  int i = 0;
  const double eval = pipe.eval_batch([&] { return micro_batch(kSteps, i++, dp_rank); });
  EXPECT_NEAR(eval, ref.eval, loss_rtol * ref.eval) << c.name;
  EXPECT_EQ(pipe.engine().global_steps(), kSteps);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineEquivalence,
    ::testing::Values(
        // pp 2 x dp 1 (2 ranks): every schedule, ZeRO 0 and 2, clipping on in some.
        Case{"pp2_gpipe_z0", 2, 1, "gpipe", 1, 0, 4, 0.0}, Case{"pp2_1f1b_z0", 2, 1, "1f1b", 1, 0, 4, 1.0},
        Case{"pp2_1f1b_m1_z0", 2, 1, "1f1b", 1, 0, 1, 0.0},
        Case{"pp2_1f1b_ckpt2_z2", 2, 1, "1f1b", 1, 2, 4, 1.0, 2},
        Case{"pp2_interleaved_z1", 2, 1, "interleaved", 2, 1, 4, 1.0},
        Case{"pp2_zbh1_z0", 2, 1, "zb-h1", 1, 0, 4, 0.0},
        Case{"pp2_1f1b_bf16_z1", 2, 1, "1f1b", 1, 1, 4, 1.0, 0, true}, Case{"pp2_zbh1_z2_clip", 2, 1, "zb-h1", 1, 2, 4, 0.05},
        // pp 2 x dp 2 (4 ranks): ZeRO 0, 1 and 2 over dp.
        Case{"pp2_dp2_gpipe_z1", 2, 2, "gpipe", 1, 1, 4, 1.0}, Case{"pp2_dp2_1f1b_z0", 2, 2, "1f1b", 1, 0, 4, 1.0},
        Case{"pp2_dp2_1f1b_z2_clip", 2, 2, "1f1b", 1, 2, 4, 0.05},
        Case{"pp2_dp2_interleaved_z2", 2, 2, "interleaved", 2, 2, 4, 0.0},
        Case{"pp2_dp2_zbh1_z1", 2, 2, "zb-h1", 1, 1, 4, 1.0},
        // pp 4 x dp 1 (4 ranks).
        Case{"pp4_gpipe_z0", 4, 1, "gpipe", 1, 0, 4, 0.0}, Case{"pp4_1f1b_z1_clip", 4, 1, "1f1b", 1, 1, 6, 0.05},
        Case{"pp4_interleaved_z2", 4, 1, "interleaved", 2, 2, 4, 1.0},
        Case{"pp4_zbh1_z2", 4, 1, "zb-h1", 1, 2, 4, 1.0},
        // [ZB-H1 Pending Cap] 1: stages 2 and 3 keep one W pending, not 2 and 3.
        Case{"pp4_zbh1_w1_z1", 4, 1, "zb-h1", 1, 1, 4, 1.0, 0, false, 1}),
    case_name);

// The measured bubble's report and JSON metrics: one line per batch with every stage's
// times, busy time within wall time, the formula of the schedule.
TEST(PipelineReport, TimingAndMetrics) {
  const int have = world()->size();
  if (have < 2) GTEST_SKIP() << "a pipeline needs at least 2 ranks; this run has " << have;
  auto group = case_group(2);
  parallel::Topology topo(group, parallel::ParallelDims::make(2, 1, 1, 2));
  Case c{"report", 2, 1, "1f1b", 1, 0, 4, 0.0};
  torch::manual_seed(1);
  models::GPT2 full(tiny(2));
  PipeOptions po;
  po.device = torch::Device(torch::kCPU);
  // Only the pipeline's first rank writes and reads it: a name of its own process, so
  // that concurrent test runs on one machine never share the file.
  const std::string path = "/tmp/zt_pipe_metrics_" + std::to_string(::getpid()) + ".jsonl";
  if (topo.parent()->rank() == 0) std::remove(path.c_str());
  po.metrics_path = topo.parent()->rank() == 0 ? path : "";
  PipeEngine pipe(full, pipeline_config(ds_json(c, true), 2), topo, po);
  for (int s = 0; s < 2; ++s) {
    int i = 0;
    pipe.train_batch([&] { return micro_batch(s, i++, 0); });
  }
  const auto& r = pipe.last_report();
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(r.schedule, "1f1b");
  EXPECT_DOUBLE_EQ(r.bubble_formula, 1.0 / 4);
  ASSERT_EQ(r.timing.size(), 2u);
  for (const auto& t : r.timing) {
    EXPECT_GT(t.forward_ms, 0);
    EXPECT_GT(t.backward_ms, 0);
    EXPECT_NEAR(t.busy_ms, t.forward_ms + t.backward_ms + t.weight_ms, 1e-6);
    EXPECT_LE(t.busy_ms, t.wall_ms + 1e-6);
    EXPECT_GT(t.busy_fraction(), 0);
  }
  EXPECT_GE(r.bubble, 0);
  if (topo.parent()->rank() == 0) {
    std::ifstream f(path);
    std::string line;
    int lines = 0;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line);
      EXPECT_EQ(j.at("stage_timing").size(), 2u);
      EXPECT_TRUE(j.contains("bubble") && j.contains("bubble_formula"));
      ++lines;
    }
    EXPECT_EQ(lines, 2);
    std::remove(path.c_str());
  }
}

template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

// Fewer pipeline layers than stages (or chunks): a ConfigError on every rank, before any
// collective or step.
TEST(PipelineErrors, LayersFewerThanStages) {
  const int have = world()->size();
  if (have < 2) GTEST_SKIP() << "a pipeline needs at least 2 ranks; this run has " << have;
  const int pp = have >= 4 ? 4 : 2;
  auto group = case_group(pp);
  parallel::Topology topo(group, parallel::ParallelDims::make(pp, 1, 1, pp));
  // 1 block = 3 pipeline layers; pp 2 with 2 virtual stages = 4 chunks, pp 4 = 4 stages.
  Case c{"few_layers", pp, 1, pp == 2 ? "interleaved" : "1f1b", pp == 2 ? 2 : 1, 0, 4, 0.0};
  auto pc = pipeline_config(ds_json(c, true), pp);
  torch::manual_seed(1);
  models::GPT2 full(tiny(1));
  const std::string e = config_error([&] { PipeEngine pipe(full, pc, topo); });
  EXPECT_NE(e.find("more than the model's 3 pipeline layers"), std::string::npos) << e;
  // The group still works: no rank went into a collective the others skipped.
  auto t = torch::ones({1});
  group->all_reduce(t);
  EXPECT_EQ(t.item<float>(), static_cast<float>(pp));
}

TEST(PipelineErrors, BadLayoutsAndConfigs) {
  const int have = world()->size();
  if (have < 2) GTEST_SKIP() << "a pipeline needs at least 2 ranks; this run has " << have;
  auto group = case_group(2);
  parallel::Topology topo(group, parallel::ParallelDims::make(2, 1, 1, 2));
  torch::manual_seed(1);
  models::GPT2 full(tiny(2));
  // ZeRO-3 with a pipeline.
  Case z3{"z3", 2, 1, "1f1b", 1, 3, 4, 0.0};
  auto e = config_error([&] { PipeEngine pipe(full, pipeline_config(ds_json(z3, true), 2), topo); });
  EXPECT_NE(e.find("zero_optimization.stage = 3 with pipeline.stages > 1"), std::string::npos) << e;
  // zb-h1 with fewer micro-batches than stages.
  Case zb{"zb", 2, 1, "zb-h1", 1, 0, 1, 0.0};
  e = config_error([&] { PipeEngine pipe(full, pipeline_config(ds_json(zb, true), 2), topo); });
  EXPECT_NE(e.find("zb-h1 needs at least as many micro-batches"), std::string::npos) << e;
  // The topology's pp must be pipeline.stages.
  Case p4{"p4", 4, 1, "1f1b", 1, 0, 4, 0.0};
  e = config_error([&] { PipeEngine pipe(full, pipeline_config(ds_json(p4, true), 2), topo); });
  EXPECT_NE(e.find("pipeline.stages"), std::string::npos) << e;
}

}  // namespace
}  // namespace test_pipeline
}  // namespace zt::pipe
