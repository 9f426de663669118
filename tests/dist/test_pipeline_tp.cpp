// Tensor x pipeline parallelism on CPU ranks ([Pipeline x Tensor Parallel] in
// src/pipe/gpt2_pipe.h): GPT-2 (4 blocks, C 64, 4 heads, fp32) cut over tp 2 and into pp 2
// stages, over 1 or 2 data-parallel replicas, must train as the non-parallel engine does on
// the same data: the loss of each of 5 steps within 1e-5 relative, every parameter after 5
// steps (joined over tp) within 2e-5 absolute + 1e-4 relative, the last stage's tied copy
// bit-identical to the first stage's wte slice, eval_batch's loss the reference model's.
// The tolerances are tests/dist/test_pipeline.cpp's, for the same reasons (the same fp32
// math in another order -- here also the tp partial sums -- amplified through 5 Adam
// steps); a dropped tp collective, stage gradient, tied gradient or a norm not summed over
// tp x pp misses them by orders of magnitude.
//
// A case runs on groups of tp x pp x dp consecutive world ranks (2 copies at 8 ranks for a
// 4-rank case) and skips, naming why, where the run has too few ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_shapes.h"
#include "models/gpt2_tp.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "tp/shard.h"
#include "zerotrain/comm.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "support/pipeline_test_util.h"

namespace zt::pipe {
namespace test_pipeline_tp {
namespace {

constexpr int kTpxppSteps = 5;
constexpr int64_t kTpxppMicro = 2, kTpxppSeq = 16;

models::GPT2Config tpxpp_tiny(int64_t vocab) {
  models::GPT2Config c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = vocab;
  c.n_positions = 64;
  return c;
}

struct TpxppCase {
  const char* name;
  int tp, pp, dp;
  const char* schedule;
  int virtual_stages;
  int zero_stage;
  int gas;
  double clip;
  bool sequence_parallel = false;
  int64_t vocab = 256;    // 255: the vocab-parallel wte and the tied copy are padded
  int ckpt_interval = 0;  // pipeline.activation_checkpoint_interval
};

// gtest prints a failing case by its name (not its bytes).
void PrintTo(const TpxppCase& c, std::ostream* os) { *os << c.name; }

nlohmann::json tpxpp_json(const TpxppCase& c, bool parallel) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kTpxppMicro},
      {"gradient_accumulation_steps", c.gas},
      {"gradient_clipping", c.clip},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", c.zero_stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 7000}}},
  };
  if (parallel) {
    j["pipeline"] = {{"stages", c.pp}, {"schedule", c.schedule}};
    if (c.virtual_stages > 1) j["pipeline"]["virtual_stages"] = c.virtual_stages;
    if (c.ckpt_interval > 0) j["pipeline"]["activation_checkpoint_interval"] = c.ckpt_interval;
    j["tensor_parallel"] = {{"autotp_size", c.tp}, {"sequence_parallel", c.sequence_parallel}};
  }
  return j;
}

// Micro-batch `i` of step `step` on data-parallel rank `dp`: random tokens, next-token targets.
MicroBatch tpxpp_micro_batch(int step, int i, int dp, int64_t vocab) {
  auto [idx, targets] =
      test_support::seeded_tokens(static_cast<uint64_t>(1000 * step + 10 * i + dp + 1), kTpxppMicro, kTpxppSeq, vocab);
  return {idx, targets};
}

comm::GroupPtr tpxpp_world() { return test_support::pipe_test_world(); }

struct TpxppReference {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> params;
  double eval = 0;
  double moved = 0;
};

// The non-parallel engine (plain GPT2, no tp, no pipeline) over the same data-parallel
// ranks and data.
TpxppReference tpxpp_reference(const TpxppCase& c, const comm::GroupPtr& dp, int dp_rank) {
  torch::manual_seed(11);
  models::GPT2 model(tpxpp_tiny(c.vocab));
  auto cfg = Config::from_json(tpxpp_json(c, false), dp->size());
  EngineOptions o;
  o.group = dp;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  std::vector<torch::Tensor> init;
  for (const auto& p : model->parameters()) init.push_back(p.detach().clone());
  auto engine = initialize(model.ptr(), cfg, o);
  TpxppReference r;
  for (int s = 0; s < kTpxppSteps; ++s) {
    double sum = 0;
    for (int i = 0; i < c.gas; ++i) {
      auto mb = tpxpp_micro_batch(s, i, dp_rank, c.vocab);
      auto loss = engine->forward([&] { return model->loss(mb.idx, mb.targets); });
      sum += loss.item<double>();
      engine->backward(loss);
    }
    EXPECT_TRUE(engine->step());
    r.losses.push_back(sum / c.gas);
  }
  for (const auto& kv : model->named_parameters()) r.params[kv.key()] = kv.value().detach().clone();
  const auto now = model->parameters();
  for (size_t i = 0; i < init.size(); ++i) r.moved = std::max(r.moved, (now[i].detach() - init[i]).abs().max().item<double>());
  torch::NoGradGuard ng;
  for (int i = 0; i < c.gas; ++i) {
    auto mb = tpxpp_micro_batch(kTpxppSteps, i, dp_rank, c.vocab);
    r.eval += model->loss(mb.idx, mb.targets).item<double>() / c.gas;
  }
  return r;
}

class TensorPipelineEquivalence : public ::testing::TestWithParam<TpxppCase> {};

TEST_P(TensorPipelineEquivalence, MatchesTheNonParallelEngine) {
  const TpxppCase& c = GetParam();
  const int need = c.tp * c.pp * c.dp, have = tpxpp_world()->size();
  if (have < need || have % need != 0) {
    GTEST_SKIP() << c.name << " needs a multiple of " << need << " ranks (tp " << c.tp << " x pp " << c.pp << " x dp "
                 << c.dp << "); this run has " << have;
  }
  auto w = tpxpp_world();
  auto group = w->split(w->rank() / need, w->rank() % need);
  parallel::Topology topo(group, parallel::ParallelDims::make(need, c.dp, c.tp, c.pp));
  auto tp_group = topo.tp();  // first: the engine builds dp, model-parallel and pp after it
  const int dp_rank = topo.coords().dp;
  const models::GPT2Config mc = tpxpp_tiny(c.vocab);

  auto pc = pipeline_config(tpxpp_json(c, true), need, c.name);
  torch::manual_seed(11);
  models::GPT2 full(mc);
  models::GPT2TP cut(mc, tp_group, c.sequence_parallel);
  cut->load_full(models::gpt2_full_state(*full));
  PipeOptions po;
  po.device = torch::Device(torch::kCPU);
  PipeEngine pipe(cut, pc, topo, po);
  EXPECT_EQ(pipe.module()->tp_size(), c.tp);

  std::vector<double> losses;
  for (int s = 0; s < kTpxppSteps; ++s) {
    int i = 0;
    losses.push_back(pipe.train_batch([&] { return tpxpp_micro_batch(s, i++, dp_rank, c.vocab); }));
  }
  // Each message between stages is 1/tp of the (B, T, C) hidden state: this rank's part
  // (DeepSpeed's pipe_partitioned / grad_partitioned), or its sequence slice under sequence
  // parallelism. Without virtual stages the first stage sends one activation and the last
  // one gradient per micro-batch.
  if (c.virtual_stages == 1) {
    const int64_t per_message = kTpxppMicro * kTpxppSeq * mc.n_embd * 4 / c.tp;
    EXPECT_EQ(pipe.p2p_bytes_sent(), int64_t{kTpxppSteps} * c.gas * per_message) << c.name;
  }
  const TpxppReference ref = tpxpp_reference(c, topo.dp(), dp_rank);
  const double loss_rtol = 1e-5, rtol = 1e-4, atol = 2e-5;
  for (int s = 0; s < kTpxppSteps; ++s) {
    EXPECT_NEAR(losses[static_cast<size_t>(s)], ref.losses[static_cast<size_t>(s)],
                loss_rtol * std::abs(ref.losses[static_cast<size_t>(s)]))
        << c.name << " step " << s;
  }
  EXPECT_GT(ref.moved, 1e-3) << c.name;  // training moved the weights

  // Every parameter of this stage, joined over tp, against the reference's.
  int compared = 0;
  double worst = 0;
  for (const auto& kv : pipe.module()->named_parameters()) {
    const auto spec = models::gpt2_tp_split_spec(mc, c.tp, kv.key());
    const int64_t full_size = spec.split() ? models::gpt2_param_shape(mc, kv.key())[static_cast<size_t>(spec.dim)] : 0;
    const auto joined = tp::gather_full(kv.value().detach(), spec, full_size, tp_group);
    auto it = ref.params.find(kv.key());
    ASSERT_NE(it, ref.params.end()) << kv.key();
    ASSERT_EQ(joined.sizes(), it->second.sizes()) << kv.key();
    const double diff = (joined - it->second).abs().max().item<double>();
    worst = std::max(worst, diff);
    EXPECT_TRUE(torch::allclose(joined, it->second, rtol, atol))
        << c.name << " stage " << pipe.stage() << " tp " << topo.coords().tp << " " << kv.key() << " max diff " << diff;
    ++compared;
  }
  EXPECT_GT(compared, 0);

  // The tied embedding: the last stage's copy is the first stage's wte slice of the same
  // tp rank, bit for bit.
  const auto wspec = models::gpt2_tp_split_spec(mc, c.tp, "wte.weight");
  auto wte = pipe.stage() == 0 ? pipe.module()->embedding_weight().detach().clone()
                               : torch::empty({wspec.padded / c.tp, mc.n_embd}, torch::kFloat);
  topo.pp()->broadcast(wte, 0);
  if (pipe.module()->holds_tied_copy()) EXPECT_TRUE(torch::equal(pipe.module()->tied_copy().detach(), wte)) << c.name;

  int i = 0;
  const double eval = pipe.eval_batch([&] { return tpxpp_micro_batch(kTpxppSteps, i++, dp_rank, c.vocab); });
  EXPECT_NEAR(eval, ref.eval, loss_rtol * ref.eval) << c.name;
  EXPECT_EQ(pipe.engine().global_steps(), kTpxppSteps);
  if (w->rank() == 0) {
    std::printf("[tp x pp] %s: loss step 5 %.6f vs %.6f, largest parameter difference %.2g\n", c.name,
                losses.back(), ref.losses.back(), worst);
  }
}

std::string tpxpp_case_name(const ::testing::TestParamInfo<TpxppCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorPipelineEquivalence,
    ::testing::Values(
        // tp 2 x pp 2 x dp 1 (4 ranks).
        TpxppCase{"tp2_pp2_1f1b_z1", 2, 2, 1, "1f1b", 1, 1, 4, 1.0},
        TpxppCase{"tp2_pp2_gpipe_z0_ckpt2", 2, 2, 1, "gpipe", 1, 0, 4, 0.0, false, 256, 2},
        TpxppCase{"tp2_pp2_1f1b_z2_clip_sequence_parallel_vocab255", 2, 2, 1, "1f1b", 1, 2, 4, 0.05, true, 255},
        TpxppCase{"tp2_pp2_zbh1_z2_sequence_parallel", 2, 2, 1, "zb-h1", 1, 2, 4, 1.0, true},
        TpxppCase{"tp2_pp2_interleaved_z1", 2, 2, 1, "interleaved", 2, 1, 4, 1.0},
        // tp 2 x pp 2 x dp 2 (8 ranks).
        TpxppCase{"tp2_pp2_dp2_1f1b_z2_clip", 2, 2, 2, "1f1b", 1, 2, 4, 0.05},
        TpxppCase{"tp2_pp2_dp2_gpipe_z1_sequence_parallel", 2, 2, 2, "gpipe", 1, 1, 4, 1.0, true}),
    tpxpp_case_name);

template <typename F>
std::string tpxpp_config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

// A layout the model or the config does not match: named errors on every rank before any
// collective (the group still works afterwards).
TEST(TensorPipelineErrors, ModelAndConfigMustMatchTheTopology) {
  const int have = tpxpp_world()->size();
  if (have < 4 || have % 4 != 0) GTEST_SKIP() << "tp 2 x pp 2 needs a multiple of 4 ranks; this run has " << have;
  auto w = tpxpp_world();
  auto group = w->split(w->rank() / 4, w->rank() % 4);
  parallel::Topology topo(group, parallel::ParallelDims::make(4, 1, 2, 2));
  const models::GPT2Config mc = tpxpp_tiny(256);
  TpxppCase c{"errors", 2, 2, 1, "1f1b", 1, 1, 4, 0.0};
  torch::manual_seed(1);
  models::GPT2 plain(mc);
  // A plain GPT2 on a tp 2 topology.
  std::string e = tpxpp_config_error([&] { PipeEngine pipe(plain, pipeline_config(tpxpp_json(c, true), 4), topo); });
  EXPECT_NE(e.find("the topology has tp 2 but the model is cut over 1 tensor-parallel ranks"), std::string::npos) << e;
  // A config without tensor_parallel.autotp_size (resolved for dp 2 x pp 2).
  auto j = tpxpp_json(c, true);
  j.erase("tensor_parallel");
  models::GPT2TP cut(mc, topo.tp(), false);
  e = tpxpp_config_error([&] { PipeEngine pipe(cut, pipeline_config(j, 4), topo); });
  EXPECT_NE(e.find("tensor_parallel.autotp_size = 0 but the topology has tp 2"), std::string::npos) << e;
  // An activation_checkpointing key the stages would ignore.
  j = tpxpp_json(c, true);
  j["activation_checkpointing"] = {{"partition_activations", true}};
  e = tpxpp_config_error([&] { PipeEngine pipe(cut, pipeline_config(j, 4), topo); });
  EXPECT_NE(e.find("activation_checkpointing.partition_activations with pipeline.stages > 1 is not supported"),
            std::string::npos)
      << e;
  auto t = torch::ones({1});
  group->all_reduce(t);
  EXPECT_EQ(t.item<float>(), 4.0f);
}

}  // namespace
}  // namespace test_pipeline_tp
}  // namespace zt::pipe
