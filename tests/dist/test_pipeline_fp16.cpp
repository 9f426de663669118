// fp16 (dynamic loss scale) with the pipeline engine on CPU ranks (src/pipe/pipe_engine.h):
// GPT-2 (6 blocks pp 2, 4 blocks tp 2 x pp 2; C 64) in fp16 compute with fp32 master
// weights, over pp 2 x dp 1, pp 2 x dp 2 and tp 2 x pp 2 (2 and 4 ranks). An inf is
// injected into the gradient of ONE parameter of stage 0 on one rank (dp rank dp-1, tp
// rank 0) at chosen steps, and a large initial loss scale makes the first steps overflow
// on their own. Checked:
//  (1) every rank of the case skips the same steps, and exactly the steps the
//      non-pipelined fp16 engine skips on the same data with the same injection (the
//      injected steps among them); a skipped step leaves every parameter of every stage
//      unchanged, an applied one changes them;
//  (2) the loss scale after each step is identical on every rank and equals the
//      reference's;
//  (3) the losses of every step and every parameter after the run match the reference
//      within the tolerances below; the last stage's tied copy is bit-identical to wte.
// The overflow flag agrees because each stage's partial sum of squares (inf/NaN included)
// is all-reduced over the model-parallel group (tp x pp ranks of a replica) and over dp by
// the gradient reduction ([Pipeline Execution]); the loss gradient entering the head is
// the loss scale / m, and the activation and tied gradients carry that scale, so every
// stage unscales by the one scale its engine holds.
//
// Tolerances (fp16, 11-bit significand): the pipeline does the same fp16 math as the
// reference except that the tied embedding's two gradient halves are added in another
// order and gradients are reduced and normed in other groupings; fp16 rounding (2^-11)
// amplified through the applied Adam steps gives losses within 1e-3 relative. Parameters:
// entries whose gradient is zero up to rounding (the attention key bias: softmax ignores a
// shift per query) move by +-lr per applied step in a direction set by rounding, as in the
// bf16 case of test_pipeline.cpp: atol 5e-3 (lr 1e-3, at most 4 applied steps) + 1e-2 rel.
// Measured: losses within 1.2e-5 relative, parameters within 2.4e-3 after 8 steps. A stage
// that steps where the others skip is caught by (1) and (2) at once: without the norm's
// all-reduce over the model-parallel group (zero/grad_norm.cpp) every case fails on every
// rank, the last stage stepping on the injected steps 4 and 5 (checked by hand).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <limits>
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
namespace test_pipeline_fp16 {
namespace {

constexpr int kFp16Steps = 8;
constexpr int64_t kFp16Micro = 2, kFp16Seq = 16;
// The parameter whose gradient gets the inf: on stage 0 at pp 2 in every case. Not a
// linear weight: LinearFn (models/gpt2.cpp) adds its weight gradient straight into W.grad
// once it exists, so a tensor hook there sees no gradient.
constexpr const char* kFp16InjectParam = "wpe.weight";

models::GPT2Config fp16_tiny(int64_t n_layer) {
  models::GPT2Config c;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 256;
  c.n_positions = 64;
  return c;
}

struct Fp16Case {
  const char* name;
  int tp, pp, dp;
  const char* schedule;
  int zero_stage;
  int gas;
  double clip;
  int scale_power;           // fp16.initial_scale_power
  std::vector<int> inject;   // steps whose stage-0 gradient gets an inf (on one rank)
};

void PrintTo(const Fp16Case& c, std::ostream* os) { *os << c.name; }

nlohmann::json fp16_json(const Fp16Case& c, bool parallel) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kFp16Micro},
      {"gradient_accumulation_steps", c.gas},
      {"gradient_clipping", c.clip},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", c.zero_stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 7000}}},
      {"fp16",
       {{"enabled", true},
        {"loss_scale", 0},
        {"initial_scale_power", c.scale_power},
        {"hysteresis", 2},
        {"loss_scale_window", 3},
        {"min_loss_scale", 1}}},
  };
  if (parallel) {
    j["pipeline"] = {{"stages", c.pp}, {"schedule", c.schedule}};
    if (c.tp > 1) j["tensor_parallel"] = {{"autotp_size", c.tp}};
  }
  return j;
}

MicroBatch fp16_micro_batch(int step, int i, int dp) {
  auto [idx, targets] =
      test_support::seeded_tokens(static_cast<uint64_t>(1000 * step + 10 * i + dp + 1), kFp16Micro, kFp16Seq, 256);
  return {idx, targets};
}

comm::GroupPtr fp16_world() { return test_support::pipe_test_world(); }

bool fp16_injects(const Fp16Case& c, int step) {
  for (int s : c.inject) {
    if (s == step) return true;
  }
  return false;
}

// Adds an inf to `p`'s gradient while *on is true (a tensor hook: before accumulation).
void fp16_inject_hook(torch::Tensor p, const bool* on) {
  p.register_hook([on](torch::Tensor g) {
    return *on && g.defined() ? g + std::numeric_limits<float>::infinity() : g;
  });
}

struct Fp16Run {
  std::vector<double> losses, scales;
  std::vector<int> skipped;
  std::map<std::string, torch::Tensor> params;  // reference: every parameter after the run
  double moved = 0;
};

// The non-pipelined fp16 engine over the same data-parallel ranks and data, with the inf
// injected into the same parameter on the same dp rank and steps.
Fp16Run fp16_reference(const Fp16Case& c, const comm::GroupPtr& dp, int dp_rank) {
  torch::manual_seed(11);
  models::GPT2 model(fp16_tiny(c.tp > 1 ? 4 : 6));
  auto cfg = Config::from_json(fp16_json(c, false), dp->size());
  EngineOptions o;
  o.group = dp;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  std::vector<torch::Tensor> init;
  for (const auto& p : model->parameters()) init.push_back(p.detach().to(torch::kFloat).clone());
  auto engine = initialize(model.ptr(), cfg, o);
  bool inject = false;
  fp16_inject_hook(model->named_parameters()[kFp16InjectParam], &inject);
  Fp16Run r;
  for (int s = 0; s < kFp16Steps; ++s) {
    inject = fp16_injects(c, s) && dp_rank == dp->size() - 1;
    double sum = 0;
    for (int i = 0; i < c.gas; ++i) {
      auto mb = fp16_micro_batch(s, i, dp_rank);
      auto loss = engine->forward([&] { return model->loss(mb.idx, mb.targets); });
      sum += loss.item<double>();
      engine->backward(loss);
    }
    EXPECT_TRUE(engine->step());
    r.losses.push_back(sum / c.gas);
    r.skipped.push_back(engine->was_step_skipped() ? 1 : 0);
    r.scales.push_back(engine->loss_scale());
  }
  for (const auto& kv : model->named_parameters()) r.params[kv.key()] = kv.value().detach().to(torch::kFloat).clone();
  const auto now = model->parameters();
  for (size_t i = 0; i < init.size(); ++i)
    r.moved = std::max(r.moved, (now[i].detach().to(torch::kFloat) - init[i]).abs().max().item<double>());
  return r;
}

// This stage's parameters (of its tp slice) as one fp32 vector, to see whether a step moved them.
torch::Tensor fp16_stage_flat(PipeEngine& pipe) {
  std::vector<torch::Tensor> v;
  for (const auto& p : pipe.module()->parameters()) v.push_back(p.detach().to(torch::kFloat).reshape({-1}));
  return torch::cat(v);
}

class PipelineFp16 : public ::testing::TestWithParam<Fp16Case> {};

TEST_P(PipelineFp16, StagesSkipAndScaleAlikeAndMatchTheNonPipelinedEngine) {
  const Fp16Case& c = GetParam();
  const int need = c.tp * c.pp * c.dp, have = fp16_world()->size();
  if (have < need || have % need != 0) {
    GTEST_SKIP() << c.name << " needs a multiple of " << need << " ranks (tp " << c.tp << " x pp " << c.pp << " x dp "
                 << c.dp << "); this run has " << have;
  }
  auto w = fp16_world();
  auto group = w->split(w->rank() / need, w->rank() % need);
  parallel::Topology topo(group, parallel::ParallelDims::make(need, c.dp, c.tp, c.pp));
  comm::GroupPtr tp_group = c.tp > 1 ? topo.tp() : nullptr;  // first: the engine builds the others after it
  const auto co = topo.coords();
  const models::GPT2Config mc = fp16_tiny(c.tp > 1 ? 4 : 6);

  auto pc = pipeline_config(fp16_json(c, true), need, c.name);
  torch::manual_seed(11);
  models::GPT2 full(mc);
  PipeOptions po;
  po.device = torch::Device(torch::kCPU);
  std::unique_ptr<PipeEngine> pipe;
  models::GPT2TP cut{nullptr};
  if (c.tp > 1) {
    cut = models::GPT2TP(mc, tp_group, false);
    cut->load_full(models::gpt2_full_state(*full));
    pipe = std::make_unique<PipeEngine>(cut, pc, topo, po);
  } else {
    pipe = std::make_unique<PipeEngine>(full, pc, topo, po);
  }
  ASSERT_EQ(pipe->engine().compute_dtype(), torch::kHalf);
  bool inject = false;
  bool holds_target = false;
  for (const auto& kv : pipe->module()->named_parameters()) {
    if (kv.key() == kFp16InjectParam) {
      fp16_inject_hook(kv.value(), &inject);
      holds_target = true;
    }
  }
  EXPECT_EQ(holds_target, co.pp == 0) << c.name << ": " << kFp16InjectParam << " must live on stage 0";
  // One rank alone sees the inf: the last dp replica's tp rank 0 of stage 0.
  const bool injector = holds_target && co.dp == c.dp - 1 && co.tp == 0;

  Fp16Run got;
  for (int s = 0; s < kFp16Steps; ++s) {
    inject = injector && fp16_injects(c, s);
    const auto before = fp16_stage_flat(*pipe);
    int i = 0;
    got.losses.push_back(pipe->train_batch([&] { return fp16_micro_batch(s, i++, co.dp); }));
    const bool skipped = pipe->engine().was_step_skipped();
    got.skipped.push_back(skipped ? 1 : 0);
    got.scales.push_back(pipe->engine().loss_scale());
    const auto after = fp16_stage_flat(*pipe);
    if (skipped) {
      EXPECT_TRUE(torch::equal(before, after)) << c.name << " step " << s << ": a skipped step changed stage "
                                               << co.pp << "'s parameters";
    } else {
      EXPECT_TRUE(torch::isfinite(after).all().item<bool>()) << c.name << " step " << s;
      EXPECT_FALSE(torch::equal(before, after)) << c.name << " step " << s << ": an applied step left stage "
                                                << co.pp << "'s parameters unchanged";
    }
  }

  // (1), (2): every rank of the case has the same skips and loss scales.
  const int n = kFp16Steps;
  auto mine = torch::empty({2 * n}, torch::kDouble);
  for (int s = 0; s < n; ++s) {
    mine[s] = got.skipped[static_cast<size_t>(s)];
    mine[n + s] = got.scales[static_cast<size_t>(s)];
  }
  auto all = torch::empty({need * 2 * n}, torch::kDouble);
  group->all_gather(all, mine);
  for (int r = 0; r < need; ++r) {
    EXPECT_TRUE(torch::equal(all.narrow(0, r * 2 * n, 2 * n), mine))
        << c.name << ": rank " << r << " skipped / scaled otherwise than rank " << group->rank() << ": "
        << all.narrow(0, r * 2 * n, 2 * n) << " vs " << mine;
  }

  const Fp16Run ref = fp16_reference(c, topo.dp(), co.dp);
  // The injected steps skip in the reference, the large initial scale made the first step
  // overflow, and some steps were applied: the run exercises both paths.
  for (int s : c.inject) EXPECT_EQ(ref.skipped[static_cast<size_t>(s)], 1) << c.name << " injected step " << s;
  EXPECT_EQ(ref.skipped[0], 1) << c.name << ": initial_scale_power " << c.scale_power << " did not overflow";
  int applied = 0;
  for (int k : ref.skipped) applied += 1 - k;
  EXPECT_GE(applied, 2) << c.name;
  EXPECT_EQ(got.skipped, ref.skipped) << c.name;
  EXPECT_EQ(got.scales, ref.scales) << c.name;

  // (3) losses and parameters.
  const double loss_rtol = 1e-3, rtol = 1e-2, atol = 5e-3;
  for (int s = 0; s < n; ++s) {
    EXPECT_NEAR(got.losses[static_cast<size_t>(s)], ref.losses[static_cast<size_t>(s)],
                loss_rtol * std::abs(ref.losses[static_cast<size_t>(s)]))
        << c.name << " step " << s;
  }
  EXPECT_GT(ref.moved, 1e-3) << c.name;
  int compared = 0;
  double worst = 0;
  for (const auto& kv : pipe->module()->named_parameters()) {
    torch::Tensor v = kv.value().detach().to(torch::kFloat);
    if (c.tp > 1) {
      const auto spec = models::gpt2_tp_split_spec(mc, c.tp, kv.key());
      const int64_t full_size =
          spec.split() ? models::gpt2_param_shape(mc, kv.key())[static_cast<size_t>(spec.dim)] : 0;
      v = tp::gather_full(v, spec, full_size, tp_group);
    }
    auto it = ref.params.find(kv.key());
    ASSERT_NE(it, ref.params.end()) << kv.key();
    ASSERT_EQ(v.sizes(), it->second.sizes()) << kv.key();
    const double diff = (v - it->second).abs().max().item<double>();
    worst = std::max(worst, diff);
    EXPECT_TRUE(torch::allclose(v, it->second, rtol, atol))
        << c.name << " stage " << co.pp << " tp " << co.tp << " " << kv.key() << " max diff " << diff;
    ++compared;
  }
  EXPECT_GT(compared, 0);
  // The tied copy: the first stage's wte (slice), bit for bit.
  auto wte = co.pp == 0 ? pipe->module()->embedding_weight().detach().clone()
                        : torch::empty_like(pipe->module()->tied_copy().detach());
  topo.pp()->broadcast(wte, 0);
  if (pipe->module()->holds_tied_copy()) EXPECT_TRUE(torch::equal(pipe->module()->tied_copy().detach(), wte)) << c.name;
  if (w->rank() == 0) {
    std::string sk;
    for (int k : got.skipped) sk += k ? "S" : ".";
    std::printf("[pipe fp16] %s: skips %s, final scale %g, loss step %d %.6f vs %.6f, largest parameter difference %.2g\n",
                c.name, sk.c_str(), got.scales.back(), n, got.losses.back(), ref.losses.back(), worst);
  }
}

std::string fp16_case_name(const ::testing::TestParamInfo<Fp16Case>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineFp16,
    ::testing::Values(
        // pp 2 x dp 1 (2 ranks).
        Fp16Case{"pp2_1f1b_z1", 1, 2, 1, "1f1b", 1, 4, 1.0, 19, {4, 5}},
        Fp16Case{"pp2_zbh1_z2_clip", 1, 2, 1, "zb-h1", 2, 4, 0.05, 19, {4, 5}},
        // pp 2 x dp 2 (4 ranks).
        Fp16Case{"pp2_dp2_1f1b_z2", 1, 2, 2, "1f1b", 2, 4, 1.0, 19, {4, 5}},
        Fp16Case{"pp2_dp2_gpipe_z0", 1, 2, 2, "gpipe", 0, 4, 1.0, 19, {4, 5}},
        // tp 2 x pp 2 (4 ranks).
        Fp16Case{"tp2_pp2_1f1b_z1", 2, 2, 1, "1f1b", 1, 4, 1.0, 19, {4, 5}}),
    fp16_case_name);

}  // namespace
}  // namespace test_pipeline_fp16
}  // namespace zt::pipe
