// Checkpoints of expert-parallel runs ([Expert Checkpoints] in src/ckpt/engine_checkpoint.cpp,
// docs/moe.md) on real ranks (CPU, MPI, fp32; run at world 1, 2 and 4 by ctest; a row that
// needs more ranks than the run has is left out).
//
// The MoE GPT-2 tiny (gpt2-tiny-moe: block 1 an MoE of 4 experts, top-2, dropless) trains 6
// steps of one global batch of 8 sequences each (each of W ranks takes 8/W of them), AdamW
// with a warm-up schedule and clipping. Each row trains 3 steps at ep 2 (world 2, expert-dp 1;
// world 4, expert-dp 2, saved asynchronously), saves, loads into a fresh engine (other
// initial weights) at ep 1 (world 1 and 2), ep 2 (world 2 at ZeRO-3; world 4, expert-dp 2)
// or ep 4 (world 4), and trains 3 more steps.
// The reference is the same at ep 1: 6 uninterrupted steps when the world size stays, else 3
// steps at the saving world size, an ep-1 checkpoint (the dense path, bit-exact by
// CheckpointUniversal) and 3 steps at the loading one (the aux loss is per rank's tokens, so
// the world size is part of the math). Checked against it:
//  * the global loss (mean over the ranks) of all 6 steps;
//  * every parameter after the 6 steps (dense ones by name, this rank's experts by global
//    index: a wrong master weight, Adam moment, step count or LR position shows here);
//  * the checkpoint lists exactly the ep-1 model's parameter names, in its order.
// Tolerance 1e-5 absolute (fp32; as tests/dist/test_moe_engine.cpp: the expert GEMMs see the
// slots of several ranks in one batch and reductions sum in another order). Gradient
// accumulation stays 1: a load at another gradient_accumulation_steps starts its windows
// misaligned (the restored micro-step count; docs/moe.md).
// Control (MoECheckpoint.ExpertsReadByAnotherIndexDiffer): loading each expert under another
// expert's global index (a permutation: every check of the load passes) must differ by more
// than 1e-3, so the comparison can fail; loading by local index (two ep ranks both asking for
// experts 0 and 1) is a CheckpointError naming an expert no rank reads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/engine_checkpoint.h"
#include "models/gpt2.h"
#include "parallel/topology.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace test_moe_checkpoint {
namespace {

constexpr int kSteps = 6, kSaveAt = 3;
constexpr int64_t kGlobalBatch = 8, kSeq = 32;  // sequences per step, split over the ranks
constexpr double kTol = 1e-5;

comm::GroupPtr world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(120));
  return g;
}

nlohmann::json config(int ranks, int stage) {
  return {{"train_micro_batch_size_per_gpu", kGlobalBatch / ranks},
          {"gradient_accumulation_steps", 1},
          {"gradient_clipping", 1.0},
          {"steps_per_print", 1000},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
          {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.0}, {"warmup_num_steps", 5}}}}},
          // Small buckets: several per shard group, padding in each.
          {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 40000}, {"allgather_bucket_size", 40000}}}};
}

// Maps a name of the model to the name a checkpoint stores (EngineOptions::expert_global_name).
using Naming = std::function<std::string(const GPT2Impl&, const std::string&)>;
std::string by_global_index(const GPT2Impl& m, const std::string& n) { return m.global_param_name(n); }

// One run's model and engine at expert-parallel size `ep` over the group g (dp = g); naming
// null: EngineOptions.expert_global_name unset.
struct Trainer {
  std::unique_ptr<parallel::Topology> topo;
  GPT2 model{nullptr};
  std::unique_ptr<Engine> engine;
};

// The model is built whole from `seed` (as build_ep_train_model does), then each rank keeps
// the dense part and its own experts by global index.
Trainer make_trainer(const comm::GroupPtr& g, int ep, int stage, uint64_t seed, const Naming& naming = by_global_index) {
  Trainer t;
  const int W = g->size();
  t.topo = std::make_unique<parallel::Topology>(g, parallel::ParallelDims::make(W, W, 1, 1, ep));
  const GPT2Config cfg = named_gpt2("gpt2-tiny-moe");
  torch::manual_seed(seed);
  GPT2 full(cfg);
  t.model = ep > 1 ? GPT2(cfg, t.topo->ep()) : full;
  if (ep > 1) {
    std::map<std::string, torch::Tensor> src;
    for (const auto& kv : full->named_parameters()) src[kv.key()] = kv.value();
    torch::NoGradGuard no_grad;
    for (auto& kv : t.model->named_parameters()) kv.value().copy_(src.at(t.model->global_param_name(kv.key())));
  }
  EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.group = t.topo->dp();
  o.is_expert = gpt2_is_expert_param;
  if (ep > 1) {
    o.ep = t.topo->ep();
    o.expert_dp = t.topo->expert_dp();
  }
  const GPT2Impl* m = t.model.get();
  if (naming) o.expert_global_name = [m, naming](const std::string& n) { return naming(*m, n); };
  t.engine = initialize(t.model.ptr(), Config::from_json(config(W, stage), W), o);
  return t;
}

// Steps [from, to): step s is the 8 sequences of seed 1000 + s; rank r of W takes rows
// r*8/W ... (r+1)*8/W - 1. Returns the global loss of each step (mean over the ranks).
std::vector<double> train(Trainer& t, const comm::GroupPtr& g, int from, int to) {
  const int W = g->size();
  const int64_t rows = kGlobalBatch / W;
  std::vector<double> out;
  for (int s = from; s < to; ++s) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + s);
    auto tok = torch::randint(0, 256, {kGlobalBatch, kSeq + 1}, gen).narrow(0, g->rank() * rows, rows);
    auto x = tok.narrow(1, 0, kSeq).contiguous(), y = tok.narrow(1, 1, kSeq).contiguous();
    auto loss = t.engine->forward([&] { return t.model->loss(x, y); });
    t.engine->backward(loss);
    t.engine->step();
    auto l = torch::tensor({t.engine->last_report().loss}, torch::kDouble);
    g->all_reduce(l);
    out.push_back(l.item<double>() / W);
  }
  return out;
}

// This rank's fp32 master weights by global name (experts: its own).
std::map<std::string, torch::Tensor> params_of(Trainer& t) {
  auto master = t.engine->gather_master_params();
  std::map<std::string, torch::Tensor> out;
  size_t i = 0;
  for (const auto& kv : t.model->named_parameters()) out[t.model->global_param_name(kv.key())] = master.at(i++);
  return out;
}

double max_param_diff(const std::map<std::string, torch::Tensor>& got,
                      const std::map<std::string, torch::Tensor>& ref, const std::string& tag) {
  double d = 0;
  for (const auto& [name, v] : got) {
    const auto it = ref.find(name);
    EXPECT_NE(it, ref.end()) << tag << ": " << name << " not in the reference";
    if (it == ref.end()) continue;
    d = std::max(d, (v - it->second).abs().max().item<double>());
  }
  return d;
}

// The ranks [0, n) of w as a group (null on the others). Collective over w.
comm::GroupPtr first_ranks(const comm::GroupPtr& w, int n) { return w->split(w->rank() < n ? 0 : -1, w->rank()); }

struct Layout {
  int world, ep, stage;
  std::string tag() const {
    return "ep " + std::to_string(ep) + " world " + std::to_string(world) + " (expert-dp " +
           std::to_string(world / ep) + ", stage " + std::to_string(stage) + ")";
  }
};

// Trains 3 steps at `save` and saves into dir (asynchronously when `async`: the snapshot
// copies both shard groups' state); returns the global losses (on its ranks).
std::vector<double> train_and_save(const comm::GroupPtr& w, const Layout& save, const std::string& dir,
                                   bool async = false) {
  auto g = first_ranks(w, save.world);
  std::vector<double> losses;
  if (g) {
    Trainer t = make_trainer(g, save.ep, save.stage, 11);
    losses = train(t, g, 0, kSaveAt);
    t.engine->save_checkpoint(dir, "moe", nlohmann::json::object(), async);
    t.engine->wait_checkpoint();
  }
  w->barrier();
  return losses;
}

struct Reference {
  std::vector<double> loss;        // 6 global losses (on rank 0 and the ranks of both runs)
  std::vector<std::string> names;  // the ep-1 model's parameter names, in order
  std::map<std::string, torch::Tensor> params;  // after 6 steps (on the ranks [0, load world))
};

// The ep-1 run for a save at `save_world` ranks loaded at `load_world` ranks (module comment).
Reference reference(const comm::GroupPtr& w, int save_world, int load_world) {
  Reference r;
  auto g = first_ranks(w, save_world);
  if (save_world == load_world) {
    if (g) {
      Trainer t = make_trainer(g, 1, 1, 11);
      r.loss = train(t, g, 0, kSteps);
      r.params = params_of(t);
      for (const auto& kv : t.model->named_parameters()) r.names.push_back(kv.key());
    }
    w->barrier();
    return r;
  }
  test_support::SharedTempDir dir(w, "moe_ckpt_ref");
  if (g) {
    Trainer t = make_trainer(g, 1, 1, 11);
    r.loss = train(t, g, 0, kSaveAt);
    t.engine->save_checkpoint(dir.path, "ref");
    for (const auto& kv : t.model->named_parameters()) r.names.push_back(kv.key());
  }
  w->barrier();
  auto l = first_ranks(w, load_world);
  if (l) {
    Trainer t = make_trainer(l, 1, 1, 99);
    t.engine->load_checkpoint(dir.path);
    const auto more = train(t, l, kSaveAt, kSteps);
    r.loss.resize(kSaveAt);
    r.loss.insert(r.loss.end(), more.begin(), more.end());
    r.params = params_of(t);
  }
  w->barrier();
  return r;
}

TEST(MoECheckpoint, SavedAtEp2LoadsAtEp1Ep2AndEp4) {
  auto w = world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (a save at ep 2)";
  double worst = 0;
  // ZeRO-3 with experts ([Expert Groups]) keeps "rank r writes shard r": a load at stage 3.
  std::vector<Layout> saves = {{2, 2, 1}}, loads = {{1, 1, 1}, {2, 1, 2}, {2, 2, 3}};
  if (W >= 4) {
    saves.push_back({4, 2, 2});
    loads.push_back({4, 2, 1});
    loads.push_back({4, 4, 2});
  }
  for (const Layout& save : saves) {
    test_support::SharedTempDir dir(w, "moe_ckpt");
    const std::vector<double> first = train_and_save(w, save, dir.path, /*async=*/save.world == 4);
    const Reference same = reference(w, save.world, save.world);
    if (w->rank() < save.world) {
      for (int s = 0; s < kSaveAt; ++s) EXPECT_NEAR(first[s], same.loss[s], kTol) << save.tag() << " step " << s + 1;
    }
    // The manifest lists the ep-1 model's names (experts by global index), in its order.
    if (w->rank() == 0) {
      const Reference& ref = same;
      const auto m = ckpt::read_manifest(dir.path, "moe");
      std::vector<std::string> names;
      for (const auto& p : m.at("params")) {
        names.push_back(p.at("name").get<std::string>());
        EXPECT_EQ(ckpt::coord_of_entry(p, names.back()), ckpt::ShardCoord{}) << names.back();
      }
      EXPECT_EQ(names, ref.names) << save.tag();
    }
    for (const Layout& load : loads) {
      const std::string tag = "saved at " + save.tag() + ", loaded at " + load.tag();
      const Reference ref = load.world == save.world ? same : reference(w, save.world, load.world);
      auto g = first_ranks(w, load.world);
      if (g) {
        Trainer t = make_trainer(g, load.ep, load.stage, 99);  // other weights: the load must set them
        t.engine->load_checkpoint(dir.path);
        EXPECT_EQ(t.engine->global_steps(), kSaveAt) << tag;
        const std::vector<double> more = train(t, g, kSaveAt, kSteps);
        for (int s = kSaveAt; s < kSteps; ++s) {
        EXPECT_NEAR(more[s - kSaveAt], ref.loss[s], kTol) << tag << " step " << s + 1;
      }
        const double d = max_param_diff(params_of(t), ref.params, tag);
        EXPECT_LE(d, kTol) << tag << ": parameters after " << kSteps << " steps";
        worst = std::max(worst, d);
      }
      w->barrier();
    }
  }
  auto t = torch::tensor({worst}, torch::kDouble);
  w->all_reduce(t, comm::ReduceOp::kMax);
  if (w->rank() == 0) {
    std::printf("[moe-checkpoint] world %d: largest parameter difference vs the ep-1 run: %.3g\n", W,
                t.item<double>());
  }
}

TEST(MoECheckpoint, ExpertsReadByAnotherIndexDiffer) {
  auto w = world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (a save at ep 2)";
  const Reference ref = reference(w, 2, 2);
  test_support::SharedTempDir dir(w, "moe_ckpt_control");
  train_and_save(w, {2, 2, 1}, dir.path);
  // Every expert read under the global index of the expert E/2 away: a permutation, so the
  // load succeeds, but the gate now routes to other weights.
  const Naming shifted = [](const GPT2Impl& m, const std::string& n) {
    const std::string g = m.global_param_name(n);
    const std::string key = ".moe.experts.";
    const size_t at = g.find(key);
    if (at == std::string::npos) return g;
    const size_t from = at + key.size(), dot = g.find('.', from);
    const int64_t e = std::stoll(g.substr(from, dot - from)), E = m.config().moe_num_experts;
    return g.substr(0, from) + std::to_string((e + E / 2) % E) + g.substr(dot);
  };
  auto two = first_ranks(w, 2);
  if (two) {
    Trainer t = make_trainer(two, 2, 1, 99, shifted);
    t.engine->load_checkpoint(dir.path);
    const std::vector<double> more = train(t, two, kSaveAt, kSteps);
    const double d = max_param_diff(params_of(t), ref.params, "control");
    EXPECT_GT(d, 1e-3) << "experts loaded under another index should differ from the uninterrupted run";
    EXPECT_GT(std::abs(more[0] - ref.loss[kSaveAt]), 1e-4) << "loss of the first step after the load";
    if (two->rank() == 0) std::printf("[moe-checkpoint] control (experts read under another index): parameter difference %.3g, loss "
                "difference %.3g at step %d\n", d, std::abs(more[0] - ref.loss[kSaveAt]), kSaveAt + 1);
  }
  w->barrier();
  // By local index: both ep-2 ranks ask for experts 0 and 1; no rank reads 2 and 3.
  if (two) {
    Trainer t = make_trainer(two, 2, 1, 99, [](const GPT2Impl&, const std::string& n) { return n; });
    try {
      t.engine->load_checkpoint(dir.path);
      ADD_FAILURE() << "loading experts by local index should fail";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("h.1.moe.experts.2."), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("no rank of this run trains it"), std::string::npos) << e.what();
    }
  }
  w->barrier();
}

TEST(MoECheckpoint, SavingNeedsTheGlobalName) {
  // Without EngineOptions.expert_global_name a save at ep > 1 is a ConfigError naming it.
  auto w = world();
  if (w->size() < 2) GTEST_SKIP() << "needs 2 ranks (ep 2)";
  auto two = first_ranks(w, 2);
  if (two) {
    Trainer t = make_trainer(two, 2, 1, 11, nullptr);
    auto& e = t.engine;
    try {
      e->save_checkpoint("/nonexistent-moe-ckpt");
      ADD_FAILURE() << "save without expert_global_name should fail";
    } catch (const ConfigError& ex) {
      EXPECT_NE(std::string(ex.what()).find("EngineOptions.expert_global_name"), std::string::npos) << ex.what();
    }
  }
  w->barrier();
}

}  // namespace
}  // namespace test_moe_checkpoint
}  // namespace zt::models
