// GPT-2 with tensor (and sequence) parallelism against tp 1 from the same weights, on real
// ranks (CPU, MPI, fp32). ctest runs zt_dist at 1, 2 and 4 ranks; every case whose
// dp x tp is the world size runs there, the others are skipped by name (GTEST_SKIP says
// which world they need).
//
// The reference is the unsplit GPT2 (models/gpt2.h) from torch::manual_seed(kSeed),
// trained through the engine on a one-rank group with the whole global batch; the tp model
// is GPT2TP cut from that same full state (gpt2_tp_cut via load_full) and trained through
// the engine with EngineOptions.group = the dp group of a Topology(dp, tp), SGD with
// momentum (see ds_config for why not Adam). Compared:
//   * logits before training (eval forward, all-gathered over the vocabulary): 1e-5
//   * the loss of every step (the dp ranks' micro-batch losses averaged): kLossTol
//   * every parameter after kSteps steps, joined over tp (full_state): kParamTol
//   * with clipping, the gradient norm of every step (1e-5 relative)
// The differences are summation order only (partial GEMMs summed by the all-reduce, the
// cross entropy's max/sum over vocabulary slices): ~1e-7 relative per step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_tp.h"
#include "models/llama.h"
#include "models/llama_tp.h"
#include "parallel/topology.h"
#include "support/gpt2_tp_bytes.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "support/pipeline_test_util.h"

namespace zt::models {
namespace test_tensor_parallel {
namespace {

constexpr int64_t kSeed = 21, kMicro = 2, kSeq = 16;
constexpr int kSteps = 5;
constexpr double kLogitTol = 1e-5, kLossTol = 1e-5, kParamTol = 2e-6;

GPT2Config tiny(int64_t vocab = 256) {
  auto c = named_gpt2("gpt2-tiny");  // 2 layers, 4 heads, C 128
  c.n_positions = 32;
  c.vocab_size = vocab;
  return c;
}

LlamaConfig llama_tiny(int64_t vocab, int64_t kv_heads) {
  auto c = named_llama("llama-tiny");  // 2 layers, 4 query heads, d 128, SwiGLU 384, untied head
  c.max_position_embeddings = 32;
  c.vocab_size = vocab;
  c.num_key_value_heads = kv_heads;
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
  bool llama = false;    // Llama-tiny instead of GPT-2 tiny
  int64_t kv_heads = 2;  // Llama: key/value heads (grouped-query attention when < 4)
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
    // Clipping (the norm is summed over the model-parallel group, replicated parameters
    // weighted 1/tp): the clip at 0.05 is active every step (the norm is ~1).
    {"tp2_clipping", 1, 2, 1, false, 255, true},
    {"tp4_clipping_sequence_parallel", 1, 4, 2, true, 256, true},
    {"dp2_tp2_stage2_clipping", 2, 2, 2, false, 255, true},
    // Llama-tiny: GQA (4 query heads, 2 kv heads: one kv head per rank at tp 2), or MHA
    // at tp 4 (kv 2 does not divide by 4: a ConfigError, tested below).
    {"llama_tp2_gqa", 1, 2, 1, false, 256, false, true, 2},
    {"llama_tp2_gqa_sequence_parallel_vocab255", 1, 2, 2, true, 255, true, true, 2},
    {"llama_tp4_kv4_vocab255", 1, 4, 1, false, 255, false, true, 4},
    {"llama_dp2_tp2_gqa_stage2_clipping", 2, 2, 2, false, 256, true, true, 2},
};

nlohmann::json ds_config(int64_t micro, int stage, bool clipping) {
  return {
      {"train_micro_batch_size_per_gpu", micro},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", clipping ? 0.05 : 0.0},
      {"steps_per_print", 1000},
      // SGD, as the engine's stage tests: Adam turns gradients that are zero up to rounding
      // (the key bias's, exactly zero in exact arithmetic) into full lr-sized steps whose
      // sign is the rounding's, so tp 1 and tp 2 would differ by ~lr there.
      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}}},
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 20000}, {"allgather_bucket_size", 20000}}},
  };
}

// The global batch (identical on every rank and every step, so the loss must fall): inputs
// and next-token targets, the
// first three targets of the first sample of every micro-batch ignored (`ignore`: -1 for
// GPT-2, -100 for Llama): each dp rank counts as many targets, so the mean of the dp
// ranks' means is the global batch's mean.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t global, int64_t vocab, int64_t ignore) {
  return test_support::tp_global_batch(global, kMicro, kSeq, vocab, ignore);
}

struct TrainRun {
  std::vector<double> losses;                  // per step, over the global batch
  std::vector<double> norms;                   // gradient norm per step (before clipping)
  std::map<std::string, torch::Tensor> state;  // full parameters after kSteps
  torch::Tensor logits;                        // (global, T, V) before training
};

// A model as the test drives it (GPT2 / GPT2TP / LlamaForCausalLM / LlamaTP).
struct Net {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  std::function<std::map<std::string, torch::Tensor>()> full_state;
  std::function<double(const std::string&)> norm_weight;  // tp models only
};

std::map<std::string, torch::Tensor> full_weights(const Case& c) {
  torch::manual_seed(kSeed);
  if (c.llama) {
    LlamaForCausalLM m(llama_tiny(c.vocab, c.kv_heads));
    return gpt2_full_state(*m);  // any module: its named parameters, fp32 copies
  }
  GPT2 m(tiny(c.vocab));
  return gpt2_full_state(*m);
}

// tp 1: the unsplit model, loaded with the full weights.
Net unsplit(const Case& c) {
  const auto w = full_weights(c);
  auto load = [&](torch::nn::Module& m) {
    torch::NoGradGuard ng;
    for (auto& kv : m.named_parameters()) kv.value().copy_(w.at(kv.key()));
  };
  if (c.llama) {
    LlamaForCausalLM m(llama_tiny(c.vocab, c.kv_heads));
    load(*m);
    return {m.ptr(), [p = m.ptr()](const torch::Tensor& x) { return p->forward(x); },
            [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); },
            [p = m.ptr()] { return gpt2_full_state(*p); }, {}};
  }
  GPT2 m(tiny(c.vocab));
  load(*m);
  return {m.ptr(), [p = m.ptr()](const torch::Tensor& x) { return p->forward(x); },
          [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); },
          [p = m.ptr()] { return gpt2_full_state(*p); }, {}};
}

// The tp model cut from the same full weights.
Net split(const Case& c, const comm::GroupPtr& tp) {
  if (c.llama) {
    LlamaTP m(llama_tiny(c.vocab, c.kv_heads), tp, c.sequence_parallel);
    m->load_full(full_weights(c));
    return {m.ptr(), [p = m.ptr()](const torch::Tensor& x) { return p->forward(x); },
            [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); },
            [p = m.ptr()] { return p->full_state(); }, [p = m.ptr()](const std::string& n) { return p->norm_weight(n); }};
  }
  GPT2TP m(tiny(c.vocab), tp, c.sequence_parallel);
  m->load_full(full_weights(c));
  return {m.ptr(), [p = m.ptr()](const torch::Tensor& x) { return p->forward(x); },
          [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); },
          [p = m.ptr()] { return p->full_state(); }, [p = m.ptr()](const std::string& n) { return p->norm_weight(n); }};
}

// tp 1 on this rank alone (a one-rank group), the whole global batch per step.
TrainRun reference(const Case& c, const comm::GroupPtr& self) {
  const int64_t global = kMicro * c.dp, ignore = c.llama ? -100 : -1;
  Net m = unsplit(c);
  TrainRun r;
  {
    torch::NoGradGuard ng;
    r.logits = m.forward(batch(global, c.vocab, ignore).first);
  }
  EngineOptions o;
  o.group = self;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.module, Config::from_json(ds_config(global, c.stage, c.clipping), 1), o);
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(global, c.vocab, ignore);
    auto loss = engine->forward([&] { return m.loss(x, y); });
    engine->backward(loss);
    engine->step();
    r.losses.push_back(engine->last_report().loss);
    r.norms.push_back(engine->last_report().grad_norm);
  }
  r.state = m.full_state();
  return r;
}

TrainRun tensor_parallel(const Case& c, parallel::Topology& topo) {
  auto tp = topo.tp(), dp = topo.dp();
  const int64_t global = kMicro * c.dp, ignore = c.llama ? -100 : -1;
  Net m = split(c, tp);
  TrainRun r;
  {
    torch::NoGradGuard ng;
    r.logits = m.forward(batch(global, c.vocab, ignore).first);
  }
  EngineOptions o;
  o.group = dp;
  o.model_parallel = topo.model_parallel();
  o.norm_weight = m.norm_weight;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.module, Config::from_json(ds_config(kMicro, c.stage, c.clipping), c.dp), o);
  const int64_t row0 = topo.coords().dp * kMicro;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(global, c.vocab, ignore);
    x = x.narrow(0, row0, kMicro).contiguous();
    y = y.narrow(0, row0, kMicro).contiguous();
    auto loss = engine->forward([&] { return m.loss(x, y); });
    engine->backward(loss);
    engine->step();
    // The global batch's loss: the mean of the dp ranks' (equal-sized) micro-batch means.
    r.losses.push_back(test_support::dp_mean_loss(dp, engine->last_report().loss));
    r.norms.push_back(engine->last_report().grad_norm);
  }
  r.state = m.full_state();
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
  topo.model_parallel();
  auto self = world->split(world->rank(), 0);
  const TrainRun want = reference(c, self);
  const TrainRun got = tensor_parallel(c, topo);

  EXPECT_LE((got.logits - want.logits).abs().max().item<double>(), kLogitTol) << c.name << ": logits";
  ASSERT_EQ(got.losses.size(), want.losses.size());
  EXPECT_LT(want.losses.back(), want.losses.front()) << "the reference trains";
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], kLossTol) << c.name << ": loss of step " << s;
  if (c.clipping) {
    // The model-parallel norm counts every element of the model once: the tp norm is the
    // unsplit model's, and above the clip, so clipping acted.
    for (size_t s = 0; s < want.norms.size(); ++s) {
      EXPECT_NEAR(got.norms[s], want.norms[s], 1e-5 * want.norms[s]) << c.name << ": gradient norm of step " << s;
      EXPECT_GT(want.norms[s], 0.05) << "step " << s << " was not clipped";
    }
  }
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

TEST(TensorParallelLlama, KvHeadsThatDoNotDivideAreAConfigError) {
  auto world = comm::world_group();
  if (world->size() < 4) GTEST_SKIP() << "llama-tiny's 2 kv heads divide by tp 1 and 2: needs 4 ranks";
  try {
    LlamaTP m(llama_tiny(256, 2), world);
    ADD_FAILURE() << "no error for 2 kv heads at tp " << world->size();
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos) << e.what();
  }
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

// Activation bytes per rank: what a training forward (loss) of GPT2TP keeps for backward.
int64_t activation_bytes(const GPT2Config& cfg, const comm::GroupPtr& tp, bool sequence_parallel, int64_t batch,
                         int64_t seq) {
  return test_support::gpt2_tp_activation_bytes(cfg, tp, sequence_parallel, batch, seq, kSeed);
}

// Sequence parallelism on and off give the same loss and gradients (the equivalence table
// above has sequence-parallel cases against tp 1); here: the activation bytes per rank.
// Without it, each block keeps its LayerNorm inputs and outputs (4 of the (B, T, C)
// tensors, GPT-2 has no dropout) full on every rank and the tp-split rest (q/k/v, the
// attention output, MLP: 12 (B, T, C)-sized tensors) cut by tp: 4 + 12/tp per block; with
// it the 4 are cut too, and each column-parallel layer keeps only its rank's slice of the
// gathered input ([Sequence-Parallel Linear]): 16/tp. Per layer against Korthikanti et
// al.'s formula: tests/dist/test_tp_activation_bytes.cpp.
TEST(SequenceParallel, CutsActivationBytesPerRank) {
  auto world = comm::world_group();
  const int t = world->size();
  auto cfg = tiny();
  cfg.n_layer = 4;  // blocks dominate the embedding and LM head
  constexpr int64_t B = 2, T = 32;
  const int64_t off = activation_bytes(cfg, world, false, B, T);
  const int64_t on = activation_bytes(cfg, world, true, B, T);
  const double unit = 4.0 * B * T * static_cast<double>(cfg.n_embd);  // one (B, T, C) fp32 tensor
  if (world->rank() == 0) {
    std::printf("[tp] activation bytes per rank, gpt2-tiny %lld layers, B %lld, T %lld, tp %d: sequence parallel "
                "off %lld (%.2f x BTC*4 per layer), on %lld (%.2f per layer), ratio %.3f\n",
                static_cast<long long>(cfg.n_layer), static_cast<long long>(B), static_cast<long long>(T), t,
                static_cast<long long>(off), off / unit / cfg.n_layer, static_cast<long long>(on),
                on / unit / cfg.n_layer, static_cast<double>(on) / off);
  }
  if (t == 1) {
    EXPECT_NEAR(static_cast<double>(on), static_cast<double>(off), 0.02 * off) << "one rank: nothing to cut";
    return;
  }
  EXPECT_LT(on, off);
  // The blocks' saving is (4 - 4/tp) (B, T, C) tensors per layer; the embedding sum (the
  // first block's input) and ln_f's output (the LM head's input) are cut too: 2 - 2/tp.
  // The rest (attention and MLP inside the tp region, the cross entropy's softmax over
  // this rank's vocabulary) is the same on and off. Measured saving within 10% of that.
  const double expected_saving = ((4.0 - 4.0 / t) * cfg.n_layer + 2.0 * (1.0 - 1.0 / t)) * unit;
  EXPECT_NEAR(static_cast<double>(off - on), expected_saving, 0.10 * expected_saving);
}

}  // namespace
}  // namespace test_tensor_parallel
}  // namespace zt::models
