// [Mixtral] on the engine with its experts split over ep (docs/moe.md#the-engine, the
// Mixtral-shaped Llama of models/llama.h) on real ranks (CPU, MPI, fp32; 2 and 4 ranks).
//
// A tiny Mixtral (2 layers, width 32, 4 experts, top-2, GQA; aux loss in the loss) is trained
// 5 steps at ep 1 (world W, every expert on every rank: plain data parallel at ZeRO-0) and at
// ep 2 (world 2) / ep 2 and ep 4 (world 4; expert-dp 2 / 1), ZeRO stages 1, 2 and 3 (stage 3:
// each decoder layer a gather unit through Engine::run_unit, its dense part over dp and its
// experts over expert-dp), from the same weights (each rank keeps its experts by global
// index) on the same per-rank micro-batches, with global-norm clipping acting. Checked
// against ep 1, as MoEEngine.* does for its small network: this rank's loss and the global
// gradient norm of every step, and every parameter after 5 steps (dense by name, this rank's
// experts against the ep-1 expert of the same global index), within 1e-5 (fp32: the experts'
// GEMMs see the rows of the ep group in one batch and their gradients sum in another order).
// SGD with momentum (an update proportional to the gradient: an expert gradient scaled by ep,
// DeepSpeed #5618, moves it) and AdamW rows; accumulation 1 and 2; one row with activation
// checkpointing ([Checkpointed Aux]).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "models/llama.h"
#include "models/llama_engine.h"
#include "parallel/topology.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace test_mixtral_engine {
namespace {

constexpr int kMixtralSteps = 5;
constexpr double kMixtralTol = 1e-5;

comm::GroupPtr mixtral_engine_world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

LlamaConfig mixtral_engine_config(int64_t experts = 4) {
  LlamaConfig c = named_llama("mixtral-tiny");
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.max_position_embeddings = 16;
  c.num_local_experts = experts;
  return c;
}

struct MixtralCase {
  int stage = 1;
  int gas = 1;
  std::string optimizer = "SGD";
  bool checkpointing = false;
  std::string tag() const {
    return "stage " + std::to_string(stage) + " gas " + std::to_string(gas) + " " + optimizer +
           (checkpointing ? " checkpointing" : "");
  }
};

nlohmann::json mixtral_engine_json(const MixtralCase& c, double clip) {
  nlohmann::json opt = c.optimizer == "SGD"
                           ? nlohmann::json{{"type", "SGD"}, {"params", {{"lr", 0.3}, {"momentum", 0.9}}}}
                           : nlohmann::json{{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}};
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2},
                      {"gradient_accumulation_steps", c.gas},
                      {"gradient_clipping", clip},
                      {"steps_per_print", 1000},
                      {"optimizer", opt},
                      {"zero_optimization", {{"stage", c.stage}, {"reduce_bucket_size", 2000}, {"allgather_bucket_size", 3000}}}};
  if (c.stage == 3) {
    j["zero_optimization"]["stage3_param_persistence_threshold"] = 40;
    j["zero_optimization"]["stage3_max_reuse_distance"] = 0;
    j["zero_optimization"]["stage3_prefetch_bucket_size"] = 1000;
  }
  return j;
}

struct MixtralRun {
  std::vector<double> loss, norm;
  std::map<std::string, torch::Tensor> params;  // by global (ep-1) name
};

MixtralRun train_mixtral(const MixtralCase& c, int ep, double clip) {
  auto w = mixtral_engine_world();
  const int W = w->size(), r = w->rank();
  parallel::Topology topo(w, parallel::ParallelDims::make(W, W, 1, 1, ep));
  const LlamaConfig cfg = mixtral_engine_config();
  torch::manual_seed(5);
  LlamaForCausalLM whole(cfg);
  LlamaForCausalLM m(cfg, ep > 1 ? topo.ep() : nullptr);
  {
    torch::NoGradGuard no_grad;
    const auto src = whole->named_parameters();
    for (auto& kv : m->named_parameters()) kv.value().copy_(src[m->global_param_name(kv.key())]);
  }
  if (c.checkpointing) m->set_activation_checkpointing(true);
  EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.group = topo.dp();
  llama_engine_options(m, o, nullptr);
  if (ep > 1) {
    o.is_expert = llama_is_expert_param;
    o.ep = topo.ep();
    o.expert_dp = topo.expert_dp();
    o.expert_global_name = [p = m.ptr()](const std::string& n) { return p->global_param_name(n); };
  }
  auto engine = initialize(m.ptr(), Config::from_json(mixtral_engine_json(c, clip), W), o);
  attach_llama_engine(*m, *engine);
  MixtralRun run;
  for (int s = 0; s < kMixtralSteps; ++s) {
    for (int mi = 0; mi < c.gas; ++mi) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * s + 100 * mi + r);
      auto x = torch::randint(0, cfg.vocab_size, {2, 8}, gen, torch::kLong);
      auto y = torch::randint(0, cfg.vocab_size, {2, 8}, gen, torch::kLong);
      auto loss = engine->forward([&] { return m->loss(x, y); });
      engine->backward(loss);
      engine->step();
    }
    run.loss.push_back(engine->last_report().loss);
    run.norm.push_back(engine->last_report().grad_norm);
  }
  auto master = engine->gather_master_params();
  size_t i = 0;
  for (const auto& kv : m->named_parameters()) run.params[m->global_param_name(kv.key())] = master.at(i++);
  m->set_layer_runner({});
  return run;
}

}  // namespace

TEST(MixtralEngine, ExpertParallelTrainsLikeEpOne) {
  auto w = mixtral_engine_world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  const std::vector<MixtralCase> cases = {
      {1, 1, "SGD"}, {2, 2, "SGD"}, {3, 1, "SGD"}, {2, 1, "AdamW"}, {3, 2, "AdamW"}, {3, 1, "SGD", true},
  };
  double worst = 0;
  for (const auto& c : cases) {
    MixtralCase rc = c;
    rc.stage = 0;  // ep 1: plain data parallel
    rc.checkpointing = false;
    const double clip = 0.5 * train_mixtral(rc, 1, 0.0).norm.at(0);
    const MixtralRun ref = train_mixtral(rc, 1, clip);
    int clipped = 0;
    for (double n : ref.norm) clipped += n > clip;
    EXPECT_GT(clipped, 0) << c.tag() << ": clipping never acted";
    for (int ep = 2; ep <= W; ep *= 2) {
      if (W % ep) continue;
      const std::string tag = c.tag() + " ep " + std::to_string(ep) + " world " + std::to_string(W);
      const MixtralRun got = train_mixtral(c, ep, clip);
      for (int s = 0; s < kMixtralSteps; ++s) {
        EXPECT_NEAR(got.loss[s], ref.loss[s], kMixtralTol) << tag << " loss, step " << s + 1;
        EXPECT_NEAR(got.norm[s], ref.norm[s], kMixtralTol * std::max(1.0, ref.norm[s])) << tag << " grad norm, step " << s + 1;
      }
      double d = 0;
      for (const auto& [name, t] : got.params) {
        const auto it = ref.params.find(name);
        ASSERT_NE(it, ref.params.end()) << tag << ": " << name;
        d = std::max(d, (t - it->second).abs().max().item<double>());
      }
      EXPECT_LE(d, kMixtralTol) << tag << ": parameters after " << kMixtralSteps << " steps";
      worst = std::max(worst, d);
    }
    // The runs train: the loss moves.
    EXPECT_NE(ref.loss.front(), ref.loss.back()) << c.tag();
  }
  if (w->rank() == 0) std::printf("[mixtral-engine] world %d: largest parameter difference vs ep 1: %.3g\n", W, worst);
}

TEST(MixtralEngine, ExpertsThatDoNotDivideAreNamed) {
  auto w = mixtral_engine_world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  parallel::Topology topo(w, parallel::ParallelDims::make(W, W, 1, 1, 2));
  try {
    LlamaForCausalLM m(mixtral_engine_config(3), topo.ep());
    ADD_FAILURE() << "3 experts over ep 2: expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts 3 does not divide by the expert-parallel size 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace test_mixtral_engine
}  // namespace zt::models
