// GPT-2 with tensor (and sequence) parallelism against tp 1 from the same weights, on real
// ranks (CPU, MPI, fp32). ctest runs zt_dist at 1, 2 and 4 ranks; every case whose
// dp x tp is the world size runs there, the others are skipped by name (GTEST_SKIP says
// which world they need).
//
// The reference is the unsplit GPT2 (models/gpt2.h) from torch::manual_seed(kSeed),
// trained through the engine on a one-rank group with the whole global batch; the tp model
// is GPT2TP cut from that same full state (gpt2_tp_cut via load_full) and trained through
// the engine with EngineOptions.group = the dp group of a Topology(dp, tp). Compared:
//   * logits before training (eval forward, all-gathered over the vocabulary): 1e-5
//   * the loss of every step (the dp ranks' micro-batch losses averaged): kLossTol
//   * every parameter after kSteps AdamW steps, joined over tp (full_state): kParamTol
// The differences are summation order only (partial GEMMs summed by the all-reduce, the
// cross entropy's max/sum over vocabulary slices): ~1e-7 relative in forward; AdamW
// normalises each step's update, so a parameter moves by at most ~lr per step and the
// order differences show up as ~1e-6 after 5 steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_tp.h"
#include "parallel/topology.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace {

constexpr int64_t kSeed = 21, kMicro = 2, kSeq = 16;
constexpr int kSteps = 5;
constexpr double kLogitTol = 1e-5, kLossTol = 1e-5, kParamTol = 2e-5;

GPT2Config tiny(int64_t vocab = 256) {
  auto c = named_gpt2("gpt2-tiny");  // 2 layers, 4 heads, C 128
  c.n_positions = 32;
  c.vocab_size = vocab;
  return c;
}

// One named configuration of the table below.
struct Case {
  const char* name;
  int dp, tp;
  int stage;
  bool sequence_parallel;
  int64_t vocab;
  bool clipping;
};

const Case kCases[] = {
    {"tp2", 1, 2, 1, false, 256, false},
    {"tp2_stage0", 1, 2, 0, false, 256, false},
    {"tp2_sequence_parallel", 1, 2, 1, true, 256, false},
    {"tp2_vocab255", 1, 2, 1, false, 255, false},
    {"tp4", 1, 4, 1, false, 256, false},
    {"tp4_sequence_parallel", 1, 4, 2, true, 256, false},
    {"tp4_vocab255", 1, 4, 1, false, 255, false},
    {"dp2_tp2_stage1", 2, 2, 1, false, 256, false},
    {"dp2_tp2_stage2", 2, 2, 2, false, 256, false},
    {"dp2_tp2_stage2_sequence_parallel_vocab255", 2, 2, 2, true, 255, false},
};

nlohmann::json ds_config(int64_t micro, int stage, bool clipping) {
  return {
      {"train_micro_batch_size_per_gpu", micro},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", clipping ? 0.05 : 0.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 20000}, {"allgather_bucket_size", 20000}}},
  };
}

// Step s's global batch (identical on every rank): inputs and next-token targets, the
// first three targets of sample 0 ignored (-1).
std::pair<torch::Tensor, torch::Tensor> batch(int s, int64_t global, int64_t vocab) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(1000 + s);
  auto idx = at::randint(0, vocab, {global, kSeq + 1}, g);
  auto x = idx.narrow(1, 0, kSeq).contiguous();
  auto y = idx.narrow(1, 1, kSeq).contiguous();
  y.index_put_({0, torch::indexing::Slice(0, 3)}, -1);
  return {x, y};
}

struct TrainRun {
  std::vector<double> losses;                  // per step, over the global batch
  std::map<std::string, torch::Tensor> state;  // full parameters after kSteps
  torch::Tensor logits;                        // (global, T, V) before training
};

std::map<std::string, torch::Tensor> full_weights(int64_t vocab) {
  torch::manual_seed(kSeed);
  GPT2 m(tiny(vocab));
  return gpt2_full_state(*m);
}

// tp 1: the unsplit GPT2 on this rank alone, the whole global batch per step.
TrainRun reference(const Case& c, const comm::GroupPtr& self) {
  const int64_t global = kMicro * c.dp;
  GPT2 m(tiny(c.vocab));
  {
    torch::NoGradGuard ng;
    const auto w = full_weights(c.vocab);
    for (auto& kv : m->named_parameters()) kv.value().copy_(w.at(kv.key()));
  }
  TrainRun r;
  {
    torch::NoGradGuard ng;
    r.logits = m->forward(batch(0, global, c.vocab).first);
  }
  EngineOptions o;
  o.group = self;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.ptr(), Config::from_json(ds_config(global, c.stage, c.clipping), 1), o);
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s, global, c.vocab);
    auto loss = engine->forward([&] { return m->loss(x, y); });
    engine->backward(loss);
    engine->step();
    r.losses.push_back(engine->last_report().loss);
  }
  r.state = gpt2_full_state(*m);
  return r;
}

TrainRun tensor_parallel(const Case& c, parallel::Topology& topo) {
  auto tp = topo.tp(), dp = topo.dp();
  const int64_t global = kMicro * c.dp;
  GPT2TP m(tiny(c.vocab), tp, c.sequence_parallel);
  m->load_full(full_weights(c.vocab));
  TrainRun r;
  {
    torch::NoGradGuard ng;
    r.logits = m->forward(batch(0, global, c.vocab).first);
  }
  EngineOptions o;
  o.group = dp;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.ptr(), Config::from_json(ds_config(kMicro, c.stage, c.clipping), c.dp), o);
  const int64_t row0 = topo.coords().dp * kMicro;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s, global, c.vocab);
    x = x.narrow(0, row0, kMicro).contiguous();
    y = y.narrow(0, row0, kMicro).contiguous();
    auto loss = engine->forward([&] { return m->loss(x, y); });
    engine->backward(loss);
    engine->step();
    // The global batch's loss: the mean of the dp ranks' (equal-sized) micro-batch means.
    auto l = torch::tensor({engine->last_report().loss}, torch::kDouble);
    dp->all_reduce(l, comm::ReduceOp::kAvg);
    r.losses.push_back(l.item<double>());
  }
  r.state = m->full_state();
  return r;
}

class TensorParallelGPT2 : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelGPT2, MatchesTp1FromTheSameWeights) {
  const Case& c = GetParam();
  auto world = comm::world_group();
  if (world->size() != c.dp * c.tp) {
    GTEST_SKIP() << c.name << " needs " << c.dp * c.tp << " ranks (dp " << c.dp << " x tp " << c.tp << "), the world has "
                 << world->size();
  }
  parallel::Topology topo(world, parallel::ParallelDims::make(world->size(), c.dp, c.tp, 1));
  topo.tp();  // build the groups in the same order on every rank (see [Topology Groups])
  topo.dp();
  auto self = world->split(world->rank(), 0);
  const TrainRun want = reference(c, self);
  const TrainRun got = tensor_parallel(c, topo);

  EXPECT_LE((got.logits - want.logits).abs().max().item<double>(), kLogitTol) << c.name << ": logits";
  ASSERT_EQ(got.losses.size(), want.losses.size());
  EXPECT_LT(want.losses.back(), want.losses.front()) << "the reference trains";
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], kLossTol) << c.name << ": loss of step " << s;
  ASSERT_EQ(got.state.size(), want.state.size());
  double worst = 0;
  for (const auto& [name, w] : want.state) {
    const auto& g = got.state.at(name);
    ASSERT_EQ(g.sizes(), w.sizes()) << name;
    const double d = (g - w).abs().max().item<double>();
    worst = std::max(worst, d);
    EXPECT_LE(d, kParamTol) << c.name << ": parameter " << name << " after " << kSteps << " steps";
  }
  if (world->rank() == 0) {
    std::printf("[tp] %s: max |param diff| after %d steps %.3g, last loss %.6f vs %.6f\n", c.name, kSteps, worst,
                got.losses.back(), want.losses.back());
  }
}

INSTANTIATE_TEST_SUITE_P(Table, TensorParallelGPT2, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// The weights GPT2TP draws itself do not depend on tp: joined, they are the tp 1 model's.
TEST(TensorParallelGPT2Init, SameSeedSameWeightsAtEveryTp) {
  auto world = comm::world_group();
  torch::manual_seed(kSeed);
  GPT2TP one(tiny(255), nullptr);
  torch::manual_seed(kSeed);
  GPT2TP split(tiny(255), world);
  const auto a = one->full_state(), b = split->full_state();
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  // The spec the engine may read: split parameters name their dim and the group "tp".
  EXPECT_EQ(split->tensor_parallel_spec("h.0.attn.c_attn.weight").dim, 0);
  EXPECT_EQ(split->tensor_parallel_spec("h.0.attn.c_proj.weight").dim, 1);
  EXPECT_EQ(split->tensor_parallel_spec("h.1.mlp.c_proj.weight").group, "tp");
  EXPECT_FALSE(split->tensor_parallel_spec("h.0.ln_1.weight").split());
  EXPECT_FALSE(split->tensor_parallel_spec("h.0.mlp.c_proj.bias").split());
  EXPECT_DOUBLE_EQ(split->norm_weight("ln_f.bias"), 1.0 / world->size());
  EXPECT_DOUBLE_EQ(split->norm_weight("wte.weight"), 1.0);
}

TEST(TensorParallelGPT2Init, HeadsThatDoNotDivideAreAConfigError) {
  auto world = comm::world_group();
  if (world->size() == 1) GTEST_SKIP() << "every head count divides by tp 1: needs 2 or more ranks";
  auto c = tiny();
  c.n_head = 1;  // 1 head cannot be split over 2 or 4 ranks
  try {
    GPT2TP m(c, world);
    ADD_FAILURE() << "no error for n_head 1 at tp " << world->size();
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_head"), std::string::npos) << e.what();
  }
  GPT2TP sp(tiny(), world, /*sequence_parallel=*/true);
  EXPECT_THROW(sp->forward(torch::zeros({1, 2 * world->size() + 1}, torch::kLong)), zt::ConfigError);
}

}  // namespace
}  // namespace zt::models
