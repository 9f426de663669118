// ZeRO-3 with tensor parallelism (issue 19), on real ranks (CPU, MPI, fp32): each tp rank's
// parameters (its tp slices) are partitioned over the dp ranks by ZeRO-3 and gathered per
// unit (GPT2TP's blocks, LlamaTP's decoder layers; the embedding, final norm and LM head are
// the root unit), the gradients reduce-scattered over dp, the clipping norm summed over
// dp x tp with the tp-replicated parameters (LayerNorms / RMSNorms, wpe, row-parallel
// biases) counted once (their norm weight 1/tp).
//
// At 4 ranks (dp 2 x tp 2) every case trains 5 steps three times from the same full weights:
//   * the unsplit model (GPT2 / LlamaForCausalLM) on a one-rank group, the whole global batch;
//   * the tp model at ZeRO-2 over dp (the layout the tp table of test_tensor_parallel.cpp
//     already checks);
//   * the tp model at ZeRO-3 over dp, units small enough to be gathered and released
//     (stage3_param_persistence_threshold 200: norms and small biases persistent, every
//     matrix gathered per unit; stage3_max_reuse_distance 0: every unit released after its
//     forward and gathered again for its backward).
// ZeRO-3 against ZeRO-2 (same layout, the same reduce-scatter pairs; the gradient norm
// summed in another order): loss of every step within 1e-6 relative, the gradient norm
// within 1e-6 relative, every parameter within kStage3ParamTol. Against the unsplit
// reference: test_tensor_parallel.cpp's tolerances (loss 1e-5, parameters 2e-6, gradient
// norm 1e-5 relative).
//
// Checkpoints (TpZero3Checkpoint.*): a ZeRO-3 tp run saves at step 3 and is resumed from
// that checkpoint at ZeRO-3 (same layout), at ZeRO-2 (same layout) and by the unsplit model on
// one rank, against the uninterrupted ZeRO-3 run.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_tp.h"
#include "models/llama.h"
#include "models/llama_tp.h"
#include "parallel/topology.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "support/pipeline_test_util.h"

namespace zt::models {
namespace test_tp_zero3 {
namespace {

constexpr int64_t kZ3Seed = 21, kZ3Micro = 2, kZ3Seq = 16;
constexpr int kZ3Steps = 5;
// Against the unsplit reference: test_tensor_parallel.cpp's (summation order of the tp
// partial sums, ~1e-7 relative per step).
constexpr double kRefLossTol = 1e-5, kRefParamTol = 2e-6, kRefNormRel = 1e-5;
// ZeRO-3 against ZeRO-2 at the same (dp, tp): the same reduce-scatter over dp of the same
// gradients; the buckets (ZeRO-3's units) differ, so the gradient norm is summed in another
// order, which moves the clipped step by rounding only.
constexpr double kStage3LossRel = 1e-6, kStage3NormRel = 1e-6, kStage3ParamTol = 1e-6;

struct Z3Case {
  const char* name;
  bool llama;
  bool sequence_parallel;
  int64_t vocab;
  bool clipping;
  bool checkpointing = false;  // activation checkpointing (recompute gathers the unit again)
};

const Z3Case kZ3Cases[] = {
    {"gpt2", false, false, 256, false},
    {"gpt2_sequence_parallel_vocab255_clipping", false, true, 255, true},
    {"gpt2_sequence_parallel_checkpointing", false, true, 256, false, true},
    {"llama_gqa_clipping", true, false, 256, true},
    {"llama_gqa_sequence_parallel_vocab255", true, true, 255, false},
    {"llama_gqa_clipping_checkpointing", true, false, 256, true, true},
};

GPT2Config z3_gpt2_tiny(int64_t vocab) {
  auto c = named_gpt2("gpt2-tiny");  // 2 layers, 4 heads, C 128
  c.n_positions = 32;
  c.vocab_size = vocab;
  return c;
}

LlamaConfig z3_llama_tiny(int64_t vocab) {
  auto c = named_llama("llama-tiny");  // 2 layers, 4 query heads, d 128, untied head
  c.max_position_embeddings = 32;
  c.vocab_size = vocab;
  c.num_key_value_heads = 2;  // GQA: one kv head per rank at tp 2
  return c;
}

nlohmann::json z3_ds_config(int64_t micro, int stage, bool clipping) {
  nlohmann::json zo = {{"stage", stage}, {"reduce_bucket_size", 20000}, {"allgather_bucket_size", 20000}};
  if (stage == 3) {
    zo["stage3_param_persistence_threshold"] = 200;
    zo["stage3_max_reuse_distance"] = 0;
    zo["stage3_prefetch_bucket_size"] = 20000;
  }
  return {
      {"train_micro_batch_size_per_gpu", micro},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", clipping ? 0.05 : 0.0},
      {"steps_per_print", 1000},
      // SGD with momentum, as test_tensor_parallel.cpp (Adam would turn gradients that are
      // zero up to rounding into lr-sized steps of the rounding's sign).
      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}}},
      {"zero_optimization", zo},
  };
}

// The global batch, the same every step; the first three targets of each micro-batch's first
// sample ignored (the dp ranks count the same number of targets).
std::pair<torch::Tensor, torch::Tensor> z3_batch(int64_t global, int64_t vocab, int64_t ignore) {
  return test_support::tp_global_batch(global, kZ3Micro, kZ3Seq, vocab, ignore);
}

struct Z3Net {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  std::function<std::map<std::string, torch::Tensor>()> full_state;
  std::function<double(const std::string&)> norm_weight;  // tp models only
};

std::map<std::string, torch::Tensor> z3_full_weights(const Z3Case& c) {
  torch::manual_seed(kZ3Seed);
  if (c.llama) {
    LlamaForCausalLM m(z3_llama_tiny(c.vocab));
    return gpt2_full_state(*m);  // any module: its named parameters, fp32 copies
  }
  GPT2 m(z3_gpt2_tiny(c.vocab));
  return gpt2_full_state(*m);
}

Z3Net z3_unsplit(const Z3Case& c) {
  const auto w = z3_full_weights(c);
  auto load = [&](torch::nn::Module& m) {
    torch::NoGradGuard ng;
    for (auto& kv : m.named_parameters()) kv.value().copy_(w.at(kv.key()));
  };
  if (c.llama) {
    LlamaForCausalLM m(z3_llama_tiny(c.vocab));
    load(*m);
    return {m.ptr(), [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); },
            [p = m.ptr()] { return gpt2_full_state(*p); }, {}};
  }
  GPT2 m(z3_gpt2_tiny(c.vocab));
  load(*m);
  return {m.ptr(), [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); },
          [p = m.ptr()] { return gpt2_full_state(*p); }, {}};
}

Z3Net z3_split(const Z3Case& c, const comm::GroupPtr& tp) {
  if (c.llama) {
    LlamaTP m(z3_llama_tiny(c.vocab), tp, c.sequence_parallel);
    m->load_full(z3_full_weights(c));
    if (c.checkpointing) m->set_activation_checkpointing(true);
    return {m.ptr(), [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); },
            [p = m.ptr()] { return p->full_state(); }, [p = m.ptr()](const std::string& n) { return p->norm_weight(n); }};
  }
  GPT2TP m(z3_gpt2_tiny(c.vocab), tp, c.sequence_parallel);
  m->load_full(z3_full_weights(c));
  if (c.checkpointing) m->set_activation_checkpointing(true);
  return {m.ptr(), [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); },
          [p = m.ptr()] { return p->full_state(); }, [p = m.ptr()](const std::string& n) { return p->norm_weight(n); }};
}

struct Z3Run {
  std::vector<double> losses;                  // per step, over the global batch
  std::vector<double> norms;                   // gradient norm per step (before clipping)
  std::map<std::string, torch::Tensor> state;  // full parameters after the last step
  int64_t gathers = 0;                         // ZeRO-3 unit gathers of the last step
};

// The full parameters of a model trained by `engine` (gathered first at ZeRO-3).
std::map<std::string, torch::Tensor> z3_state(Engine& engine, const Z3Net& m, int stage) {
  if (stage == 3) engine.gather_params();
  auto s = m.full_state();
  if (stage == 3) engine.release_params();
  return s;
}

// The unsplit model on this rank alone, the whole global batch of `dp` replicas per step;
// steps [first, last), resumed from the checkpoint `load` when given.
Z3Run z3_reference(const Z3Case& c, const comm::GroupPtr& self, int dp, int first = 0, int last = kZ3Steps,
                   const std::string& load = "") {
  const int64_t global = kZ3Micro * dp, ignore = c.llama ? -100 : -1;
  Z3Net m = z3_unsplit(c);
  EngineOptions o;
  o.group = self;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.module, Config::from_json(z3_ds_config(global, 2, c.clipping), 1), o);
  if (!load.empty()) engine->load_checkpoint(load);
  Z3Run r;
  for (int s = first; s < last; ++s) {
    auto [x, y] = z3_batch(global, c.vocab, ignore);
    auto loss = engine->forward([&] { return m.loss(x, y); });
    engine->backward(loss);
    engine->step();
    r.losses.push_back(engine->last_report().loss);
    r.norms.push_back(engine->last_report().grad_norm);
  }
  r.state = m.full_state();
  return r;
}

// The tp model over `topo` at `stage`, steps [first, last) of the run; `load` / `save`: a
// checkpoint directory to resume from before the first step / to write after the last.
Z3Run z3_tensor_parallel(const Z3Case& c, parallel::Topology& topo, int stage, int first = 0, int last = kZ3Steps,
                         const std::string& load = "", const std::string& save = "") {
  auto tp = topo.tp(), dp = topo.dp();
  const int ndp = dp->size();
  const int64_t global = kZ3Micro * ndp, ignore = c.llama ? -100 : -1;
  Z3Net m = z3_split(c, tp);
  EngineOptions o;
  o.group = dp;
  o.model_parallel = topo.model_parallel();
  o.norm_weight = m.norm_weight;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.module, Config::from_json(z3_ds_config(kZ3Micro, stage, c.clipping), ndp), o);
  if (!load.empty()) engine->load_checkpoint(load);
  const int64_t row0 = topo.coords().dp * kZ3Micro;
  Z3Run r;
  for (int s = first; s < last; ++s) {
    auto [x, y] = z3_batch(global, c.vocab, ignore);
    x = x.narrow(0, row0, kZ3Micro).contiguous();
    y = y.narrow(0, row0, kZ3Micro).contiguous();
    auto loss = engine->forward([&] { return m.loss(x, y); });
    engine->backward(loss);
    engine->step();
    r.losses.push_back(test_support::dp_mean_loss(dp, engine->last_report().loss));  // the global batch's loss
    r.norms.push_back(engine->last_report().grad_norm);
    r.gathers = engine->last_report().gathers;
  }
  if (!save.empty()) {
    engine->save_checkpoint(save);
    engine->wait_checkpoint();
  }
  r.state = z3_state(*engine, m, stage);
  return r;
}

double z3_max_param_diff(const Z3Run& a, const Z3Run& b, const char* what, double tol) {
  EXPECT_EQ(a.state.size(), b.state.size()) << what;
  double worst = 0;
  for (const auto& [name, w] : b.state) {
    auto it = a.state.find(name);
    if (it == a.state.end()) {
      ADD_FAILURE() << what << ": no parameter " << name;
      continue;
    }
    EXPECT_EQ(it->second.sizes(), w.sizes()) << what << ": " << name;
    if (it->second.sizes() != w.sizes()) continue;
    const double d = (it->second - w).abs().max().item<double>();
    worst = std::max(worst, d);
    EXPECT_LE(d, tol) << what << ": parameter " << name;
  }
  return worst;
}

std::unique_ptr<parallel::Topology> z3_topology(const comm::GroupPtr& world) {
  auto topo = std::make_unique<parallel::Topology>(world, parallel::ParallelDims::make(world->size(), 2, 2, 1));
  topo->tp();  // the groups in the same order on every rank ([Topology Groups])
  topo->dp();
  topo->model_parallel();
  return topo;
}

class TpZero3 : public ::testing::TestWithParam<Z3Case> {};

TEST_P(TpZero3, Stage3EqualsStage2AndTheUnsplitModel) {
  const Z3Case& c = GetParam();
  auto world = comm::world_group();
  if (world->size() != 4) GTEST_SKIP() << c.name << " needs 4 ranks (dp 2 x tp 2), the world has " << world->size();
  auto topo = z3_topology(world);
  auto self = world->split(world->rank(), 0);
  const Z3Run want = z3_reference(c, self, 2);
  const Z3Run z2 = z3_tensor_parallel(c, *topo, 2);
  const Z3Run z3 = z3_tensor_parallel(c, *topo, 3);

  // ZeRO-3 really gathered per unit: the root, the 2 blocks in forward, the 2 again for
  // their backward (max_reuse_distance 0 releases each after its forward); the recompute
  // of a checkpointed block gathers too.
  EXPECT_GE(z3.gathers, 5) << c.name;
  ASSERT_EQ(z3.losses.size(), want.losses.size());
  EXPECT_LT(want.losses.back(), want.losses.front()) << "the reference trains";
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(z3.losses[s], z2.losses[s], kStage3LossRel * std::abs(z2.losses[s])) << c.name << ": loss of step " << s;
    EXPECT_NEAR(z3.losses[s], want.losses[s], kRefLossTol) << c.name << ": loss of step " << s << " (unsplit)";
    EXPECT_NEAR(z3.norms[s], z2.norms[s], kStage3NormRel * z2.norms[s]) << c.name << ": gradient norm of step " << s;
    // The norm over dp x tp counts every element of the model once: the unsplit model's.
    EXPECT_NEAR(z3.norms[s], want.norms[s], kRefNormRel * want.norms[s])
        << c.name << ": gradient norm of step " << s << " (unsplit)";
    if (c.clipping) EXPECT_GT(want.norms[s], 0.05) << "step " << s << " was not clipped";
  }
  const double d2 = z3_max_param_diff(z3, z2, "ZeRO-3 vs ZeRO-2", kStage3ParamTol);
  const double d1 = z3_max_param_diff(z3, want, "ZeRO-3 vs unsplit", kRefParamTol);
  if (world->rank() == 0) {
    std::printf("[tp zero3] %s: %lld gathers a step; max |param diff| after %d steps: vs ZeRO-2 %.3g, vs unsplit "
                "%.3g; last loss %.6f (ZeRO-2 %.6f, unsplit %.6f); max loss rel diff vs ZeRO-2 %.3g\n",
                c.name, static_cast<long long>(z3.gathers), kZ3Steps, d2, d1, z3.losses.back(), z2.losses.back(),
                want.losses.back(), [&] {
                  double m = 0;
                  for (size_t s = 0; s < z3.losses.size(); ++s)
                    m = std::max(m, std::abs(z3.losses[s] - z2.losses[s]) / std::abs(z2.losses[s]));
                  return m;
                }());
  }
}

// [TP Reshard] at ZeRO-3: the tp shards' ZeRO-3 fragments are saved as ZeRO-1/2's are (a
// parameter's master and momentum by element range of its tp slice), so a ZeRO-3 tp
// checkpoint resumes at ZeRO-3, at ZeRO-2 and in the unsplit model. 3 steps at ZeRO-3
// (dp 2 x tp 2), save; 3 more from the checkpoint at each layout against 6 uninterrupted
// ZeRO-3 steps: the same layout bitwise, ZeRO-2 within the ZeRO-3 vs ZeRO-2 tolerances, the
// unsplit model on one rank within the unsplit tolerances.
class TpZero3Checkpoint : public ::testing::TestWithParam<Z3Case> {};

TEST_P(TpZero3Checkpoint, ResumesAtStage3Stage2AndUnsplit) {
  const Z3Case& c = GetParam();
  auto world = comm::world_group();
  if (world->size() != 4) GTEST_SKIP() << c.name << " needs 4 ranks (dp 2 x tp 2), the world has " << world->size();
  auto topo = z3_topology(world);
  auto self = world->split(world->rank(), 0);
  test_support::SharedTempDir dir(world, "tp_zero3");
  const Z3Run straight = z3_tensor_parallel(c, *topo, 3, 0, 6);
  z3_tensor_parallel(c, *topo, 3, 0, 3, "", dir.path);
  const Z3Run at3 = z3_tensor_parallel(c, *topo, 3, 3, 6, dir.path);
  const Z3Run at2 = z3_tensor_parallel(c, *topo, 2, 3, 6, dir.path);
  const Z3Run one = z3_reference(c, self, 2, 3, 6, dir.path);
  ASSERT_EQ(straight.losses.size(), 6u);
  struct Resumed {
    const char* name;
    const Z3Run& run;
    double loss_rel, param_tol;
  };
  const Resumed resumed[] = {{"ZeRO-3, dp 2 x tp 2", at3, 0.0, 0.0},
                             {"ZeRO-2, dp 2 x tp 2", at2, kStage3LossRel, kStage3ParamTol},
                             {"unsplit, one rank", one, kRefLossTol, kRefParamTol}};
  for (const auto& r : resumed) {
    ASSERT_EQ(r.run.losses.size(), 3u) << r.name;
    double worst_loss = 0;
    for (size_t s = 0; s < 3; ++s) {
      const double want = straight.losses[s + 3];
      worst_loss = std::max(worst_loss, std::abs(r.run.losses[s] - want) / std::abs(want));
      EXPECT_NEAR(r.run.losses[s], want, r.loss_rel * std::abs(want)) << c.name << ", " << r.name << ": step " << s + 4;
    }
    const double d = z3_max_param_diff(r.run, straight, r.name, r.param_tol);
    if (world->rank() == 0) {
      std::printf("[tp zero3 ckpt] %s resumed at %s: steps 4-6 max loss rel diff %.3g, parameters after step 6 max "
                  "diff %.3g (last loss %.6f vs %.6f)\n",
                  c.name, r.name, worst_loss, d, r.run.losses.back(), straight.losses.back());
    }
  }
}

const Z3Case kZ3CkptCases[] = {
    {"gpt2_sequence_parallel_vocab255_clipping", false, true, 255, true},
    {"llama_gqa_clipping", true, false, 256, true},
};
INSTANTIATE_TEST_SUITE_P(Models, TpZero3Checkpoint, ::testing::ValuesIn(kZ3CkptCases),
                         [](const auto& info) { return std::string(info.param.name); });

INSTANTIATE_TEST_SUITE_P(Table, TpZero3, ::testing::ValuesIn(kZ3Cases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace test_tp_zero3
}  // namespace zt::models
