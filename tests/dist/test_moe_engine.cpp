// The engine over expert-data-parallel groups ([Expert Groups] in src/zero/zero_optimizer.h,
// docs/moe.md#the-engine) on real ranks (CPU, MPI, fp32; run at world 1, 2 and 4 by ctest).
//
// A small MoE network (Linear -> MoE of TwoLayer experts -> Linear, MSE + 0.01 aux loss) is
// trained 5 steps by the engine at ep 1 (world W, every expert on every rank, all dense)
// and at every ep P > 1 dividing W (expert-dp W/P; world 4: ep 2 and ep 4), from the same
// weights, on the same per-rank micro-batches, top-1 and top-2, ZeRO stages 0 to 3 (stage 3
// against ep 1 at stage 0, with and without declared gather units),
// gradient accumulation 1 and 2, with global-norm clipping active (clip below the norm).
// The optimizer is SGD with momentum: an update is proportional to the gradient, so an
// expert gradient averaged over the wrong group or scaled by ep (DeepSpeed #5618) moves
// the parameters by a different amount. Checked against ep 1:
//  * this rank's loss and the global gradient norm of every step (the norm counts every
//    expert once: the clipping coefficient and the overflow flag are ep 1's);
//  * every parameter after 5 steps: dense ones by name, this rank's experts against the
//    ep-1 expert of the same global index.
// Also: an inf in one rank's expert gradient skips the step on every rank (the overflow
// flag over ep), expert state bytes per rank (model_state_bytes), and the refusals.
// Tolerance 1e-5 absolute (fp32; the expert GEMMs see the slots of P ranks in one batch and
// the reductions sum in another order). A control run at ep 2 with the experts treated as
// dense parameters (EngineOptions.is_expert unset: the behaviour before expert-dp groups)
// must differ by more than 1e-3, so the comparison can fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

#include "models/moe.h"
#include "parallel/topology.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace test_moe_engine {
namespace {

constexpr int64_t kIn = 6, kHidden = 8, kOut = 3;
constexpr int kSteps = 5;
constexpr double kTol = 1e-5;

comm::GroupPtr world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

struct ExpertMlpImpl : torch::nn::Module {
  explicit ExpertMlpImpl(int64_t d)
      : fc1(register_module("fc1", torch::nn::Linear(d, 2 * d))),
        fc2(register_module("fc2", torch::nn::Linear(2 * d, d))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(ExpertMlp);

struct Case {
  int64_t k = 1;
  int stage = 0;
  int gas = 1;
  bool drop = true;
  std::string optimizer = "SGD";
  bool overlap = false;  // zero_optimization.overlap_comm (stage 1: reduce in backward hooks)
  bool offload = false;  // offload_optimizer.device cpu (the CPU Adam step)
  // Stage 3: three gather units (fc_in, moe, fc_out) run through Engine::run_unit, each
  // released after its forward; without, everything is in the root and persistent units.
  bool units = false;
  std::string tag() const {
    return "top-" + std::to_string(k) + " stage " + std::to_string(stage) + " gas " + std::to_string(gas) +
           (drop ? " drop" : " dropless") + " " + optimizer + (overlap ? " overlap_comm" : "") +
           (offload ? " offload cpu" : "") + (units ? " units" : "");
  }
};

// fc_in -> MoE -> fc_out; parameters fc_in.*, moe.gate.weight, moe.experts.<i>.fc{1,2}.*, fc_out.*.
struct NetImpl : torch::nn::Module {
  NetImpl(const Case& c, int64_t experts, comm::GroupPtr ep) {
    fc_in = register_module("fc_in", torch::nn::Linear(kIn, kHidden));
    MoEOptions o;
    o.hidden = kHidden;
    o.num_experts = experts;
    o.gate.k = c.k;
    o.gate.capacity_factor = 1.0;
    o.gate.min_capacity = 1;
    o.gate.drop_tokens = c.drop;
    o.gate.use_rts = false;
    o.gate.second_expert_sampling = false;
    o.ep_group = std::move(ep);
    moe = register_module("moe", MoE(o, [] { return torch::nn::AnyModule(ExpertMlp(kHidden)); }));
    fc_out = register_module("fc_out", torch::nn::Linear(kHidden, kOut));
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    // Stage-3 units (Case::units): the engine gathers each around its forward.
    auto unit = [&](int u, const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& t) {
      return engine ? engine->run_unit(u, fn, t) : fn(t);
    };
    torch::Tensor aux;
    auto h = unit(0, [&](const torch::Tensor& t) { return torch::tanh(fc_in(t)); }, x);
    auto m = unit(1, [&](const torch::Tensor& t) {
      auto o = moe->forward(t);
      aux = o.aux_loss;
      return o.output;
    }, h);
    auto out = unit(2, [&](const torch::Tensor& t) { return fc_out(t); }, m);
    return torch::mse_loss(out, y) + 0.01 * aux;
  }
  // The three units, in forward order (Case::units).
  std::vector<std::vector<torch::Tensor>> units() { return {fc_in->parameters(), moe->parameters(), fc_out->parameters()}; }
  torch::nn::Linear fc_in{nullptr}, fc_out{nullptr};
  MoE moe{nullptr};
  Engine* engine = nullptr;  // set with Case::units
};
TORCH_MODULE(Net);

bool is_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }

// "moe.experts.<local>.rest" -> "moe.experts.<first + local>.rest"; other names unchanged.
std::string global_name(const std::string& name, int64_t first) {
  const std::string key = "moe.experts.";
  if (name.rfind(key, 0) != 0) return name;
  const size_t dot = name.find('.', key.size());
  const int64_t local = std::stoll(name.substr(key.size(), dot - key.size()));
  return key + std::to_string(first + local) + name.substr(dot);
}

// The same initial weights on every rank and for every ep: a full one-process network
// (all experts) from a fixed seed, copied into `net` (its experts by global index).
void load_reference_weights(Net& net, const Case& c, int64_t experts) {
  torch::manual_seed(5);
  Net full(c, experts, nullptr);
  std::map<std::string, torch::Tensor> src;
  for (const auto& kv : full->named_parameters()) src[kv.key()] = kv.value();
  torch::NoGradGuard no_grad;
  for (auto& kv : net->named_parameters()) {
    const auto it = src.find(global_name(kv.key(), net->moe->first_expert()));
    ASSERT_NE(it, src.end()) << kv.key();
    kv.value().copy_(it->second);
  }
}

nlohmann::json config(const Case& c, double clip) {
  nlohmann::json opt = c.optimizer == "SGD"
                           ? nlohmann::json{{"type", "SGD"}, {"params", {{"lr", 0.2}, {"momentum", 0.9}}}}
                           : nlohmann::json{{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}};
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", c.gas},
          {"gradient_clipping", clip},
          {"steps_per_print", 1000},
          {"optimizer", opt},
          // Small buckets: several buckets per shard group, padding in each.
          {"zero_optimization",
           {{"stage", c.stage}, {"reduce_bucket_size", 300}, {"allgather_bucket_size", 400}, {"overlap_comm", c.overlap}}}};
  if (c.offload) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (c.stage == 3) {
    // Stage 3: biases under 10 elements persist, the rest is gathered per unit (root or
    // declared); a unit is released after its forward and prefetched one ahead.
    j["zero_optimization"]["stage3_param_persistence_threshold"] = 10;
    j["zero_optimization"]["stage3_max_reuse_distance"] = 0;
    j["zero_optimization"]["stage3_prefetch_bucket_size"] = 100;
  }
  return j;
}

struct TrainRun {
  std::vector<double> loss, norm;                // per step: this rank's loss, the global norm
  std::map<std::string, torch::Tensor> params;   // after the last step, by GLOBAL name
  ModelStateBytes bytes;
  int64_t gathers = 0;                           // the last step's ZeRO-3 unit gathers (both groups)
};

// Trains 5 steps at expert-parallel size `ep` (1: every expert everywhere). mark_experts
// false: the experts are managed as dense parameters (the control).
TrainRun train(const Case& c, int ep, int64_t experts, double clip, bool mark_experts = true) {
  auto w = world();
  const int W = w->size(), r = w->rank();
  parallel::Topology topo(w, parallel::ParallelDims::make(W, W, 1, 1, ep));
  Net net(c, experts, ep > 1 ? topo.ep() : nullptr);
  load_reference_weights(net, c, experts);
  EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.group = topo.dp();
  if (mark_experts) {
    o.is_expert = is_expert;
    o.ep = topo.ep();
    o.expert_dp = topo.expert_dp();
  }
  if (c.units) {
    o.units = net->units();
    o.unit_names = {"fc_in", "moe", "fc_out"};
  }
  auto engine = initialize(net.ptr(), Config::from_json(config(c, clip), W), o);
  if (c.units) net->engine = engine.get();
  TrainRun run;
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < c.gas; ++m) {
      // This rank's micro-batch: the same for every ep (a rank-dependent seed, so routing
      // differs between ranks).
      auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * s + 100 * m + r);
      auto x = torch::randn({2, 5, kIn}, gen), y = torch::randn({2, 5, kOut}, gen);
      auto loss = engine->forward([&] { return net->loss(x, y); });
      engine->backward(loss);
      engine->step();
    }
    const StepReport& rep = engine->last_report();
    run.loss.push_back(rep.loss);
    run.norm.push_back(rep.grad_norm);
  }
  auto master = engine->gather_master_params();
  size_t i = 0;
  for (const auto& kv : net->named_parameters()) {
    run.params[global_name(kv.key(), net->moe->first_expert())] = master.at(i++);
  }
  run.bytes = engine->model_state_bytes();
  run.gathers = engine->last_report().gathers;
  return run;
}

// Largest difference over every parameter this rank holds in `got` (experts: its own).
double max_param_diff(const TrainRun& got, const TrainRun& ref, const std::string& tag) {
  double d = 0;
  for (const auto& [name, t] : got.params) {
    const auto it = ref.params.find(name);
    EXPECT_NE(it, ref.params.end()) << tag << ": " << name << " not in the ep-1 run";
    if (it == ref.params.end()) continue;
    EXPECT_EQ(t.sizes(), it->second.sizes()) << tag << ": " << name;
    d = std::max(d, (t - it->second).abs().max().item<double>());
  }
  return d;
}

// The clip: half of the first step's norm at ep 1, so clipping acts in every case.
double clip_for(const Case& c, int64_t experts) {
  TrainRun probe = train(c, 1, experts, 0.0);
  return 0.5 * probe.norm.at(0);
}

// Every case at ep 1 (world W) against every ep > 1 dividing W; `ref_of` picks the ep-1
// run's case. Returns the largest parameter difference on this rank.
double check_against_ep_one(const std::vector<Case>& cases, const std::function<Case(const Case&)>& ref_of) {
  auto w = world();
  const int W = w->size();
  const int64_t E = 4;  // 4 experts: 2 per rank at ep 2, 1 at ep 4
  double worst = 0;
  for (const Case& c : cases) {
    const Case rc = ref_of(c);
    const double clip = clip_for(rc, E);
    TrainRun ref = train(rc, 1, E, clip);
    int clipped = 0;
    for (double n : ref.norm) clipped += n > clip;
    EXPECT_GT(clipped, 0) << c.tag() << ": clipping never acted (clip " << clip << ")";
    for (int ep = 2; ep <= W; ep *= 2) {
      if (W % ep != 0) continue;
      const std::string tag = c.tag() + " ep " + std::to_string(ep) + " world " + std::to_string(W);
      TrainRun got = train(c, ep, E, clip);
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_NEAR(got.loss[s], ref.loss[s], kTol) << tag << " loss, step " << s + 1;
        EXPECT_NEAR(got.norm[s], ref.norm[s], kTol * std::max(1.0, ref.norm[s])) << tag << " grad norm, step " << s + 1;
      }
      const double d = max_param_diff(got, ref, tag);
      EXPECT_LE(d, kTol) << tag << ": parameters after " << kSteps << " steps";
      worst = std::max(worst, d);
      EXPECT_GT(got.bytes.expert_master, 0) << tag;
      // Stage 3 gathers per micro-step: without units the root and persistent units of both
      // groups; with units 7: the dense persistent unit, fc_in and moe in forward and again
      // in backward, fc_out once and the experts' unit once (the last unit of each trace
      // is kept for its backward, which follows at once).
      if (c.stage == 3) EXPECT_GE(got.gathers, (c.units ? 7 : 3) * c.gas) << tag;
    }
  }
  return worst;
}

TEST(MoEEngine, ExpertParallelTrainsLikeEpOne) {
  auto w = world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1); MoEEngine.EpOneIsTheDensePath runs at world 1";
  std::vector<Case> cases = {
      {1, 0, 1, true}, {1, 1, 1, true}, {1, 2, 2, true}, {2, 0, 2, false}, {2, 1, 1, true}, {2, 2, 1, true},
      {2, 2, 1, true, "AdamW"}, {1, 1, 2, true, "SGD", true},
      {1, 1, 1, true, "AdamW", false, true}, {2, 2, 2, true, "AdamW", false, true},
  };
  const double worst = check_against_ep_one(cases, [](const Case& c) { return c; });
  if (w->rank() == 0) std::printf("[moe-engine] world %d: largest parameter difference vs ep 1: %.3g\n", W, worst);
}

TEST(MoEEngine, Stage3TrainsLikeEpOneStage0) {
  // ZeRO-3 with experts: dense parameters partitioned over dp, experts over expert-dp, both
  // gathered per unit ([Expert Groups]). Against ep 1 at stage 0 (plain data parallel, no
  // units); the offload row against ep 1 at stage 1 with offload (offload needs stage >= 1).
  auto w = world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  std::vector<Case> cases = {
      {1, 3, 1, true}, {2, 3, 2, false}, {1, 3, 2, true, "SGD", false, false, true},
      {2, 3, 1, true, "SGD", false, false, true}, {1, 3, 1, false, "AdamW", false, false, true},
      {2, 3, 2, true, "AdamW"}, {2, 3, 1, true, "AdamW", false, true, true},
  };
  const double worst = check_against_ep_one(cases, [](const Case& c) {
    Case r = c;
    r.stage = c.offload ? 1 : 0;
    r.units = false;
    return r;
  });
  if (w->rank() == 0) std::printf("[moe-engine] stage 3, world %d: largest parameter difference vs ep 1 stage 0: %.3g\n", W, worst);
}

TEST(MoEEngine, ExpertsAsDenseParametersDiffer) {
  // The control: the old behaviour (experts averaged over the whole dp group, rank 0's
  // experts broadcast to all) must fail the comparison above.
  auto w = world();
  if (w->size() < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  const Case c{1, 1, 1, true};
  const double clip = clip_for(c, 4);
  TrainRun ref = train(c, 1, 4, clip);
  TrainRun old = train(c, 2, 4, clip, /*mark_experts=*/false);
  double d = max_param_diff(old, ref, "control");
  auto t = torch::tensor({d}, torch::kDouble);
  w->all_reduce(t, comm::ReduceOp::kMax);
  EXPECT_GT(t.item<double>(), 1e-3) << "experts reduced over dp should differ from ep 1";
}

TEST(MoEEngine, EpOneIsTheDensePath) {
  // At ep 1 the predicate marks parameters that every rank holds alike: they stay in the
  // dense shard group (no expert group, no extra collective), bit-equal to no predicate.
  const Case c{2, 1, 1, true};
  TrainRun marked = train(c, 1, 4, 0.5);
  TrainRun plain = train(c, 1, 4, 0.5, /*mark_experts=*/false);
  EXPECT_EQ(marked.bytes.expert_master, 0);
  EXPECT_EQ(marked.bytes.total(), plain.bytes.total());
  EXPECT_EQ(max_param_diff(marked, plain, "ep 1"), 0.0);
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(marked.loss[s], plain.loss[s]);
}

TEST(MoEEngine, ExpertStateIsPartitionedOverExpertDp) {
  // Adam: master + exp_avg + exp_avg_sq of the experts. At stage 1 and 2 a rank holds
  // 1/(expert-dp) of its ep rank's experts' state: exactly stage 0's (the same padded
  // layout, unsharded) divided by expert-dp. Dense state is over the whole dp group.
  auto w = world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  const int64_t E = 4;
  for (int ep = 2; ep <= W; ep *= 2) {
    const int edp = W / ep;
    const int64_t local = E / ep * (kHidden * 2 * kHidden + 2 * kHidden + 2 * kHidden * kHidden + kHidden);
    Case c0{1, 0, 1, true, "AdamW"};
    const ModelStateBytes full = train(c0, ep, E, 1.0).bytes;
    EXPECT_GE(full.expert_master, 4 * local) << "ep " << ep;
    EXPECT_LT(full.expert_master, 4 * (local + W * 64 * 8)) << "ep " << ep << ": padding";
    EXPECT_EQ(full.expert_optimizer, 2 * full.expert_master);
    for (int stage : {1, 2}) {
      Case c{1, stage, 1, true, "AdamW"};
      const ModelStateBytes b = train(c, ep, E, 1.0).bytes;
      const std::string tag = "stage " + std::to_string(stage) + " ep " + std::to_string(ep);
      EXPECT_EQ(b.expert_master * edp, full.expert_master) << tag;
      EXPECT_EQ(b.expert_optimizer * edp, full.expert_optimizer) << tag;
      // Dense: 1/W of stage 0's dense state.
      EXPECT_EQ((b.master - b.expert_master) * W, full.master - full.expert_master) << tag;
    }
    // Stage 3: the unit layout pads each unit (root, persistent, declared) to a multiple of
    // 64 x the group's ranks, so the shard is 1/(expert-dp) of the experts' elements plus
    // at most 64 per unit; no standing copy of the parameters between gathers.
    for (bool units : {false, true}) {
      Case c{1, 3, 1, true, "AdamW", false, false, units};
      const ModelStateBytes b = train(c, ep, E, 1.0).bytes;
      const std::string tag = std::string("stage 3") + (units ? " units" : "") + " ep " + std::to_string(ep);
      const int64_t dense = kIn * kHidden + kHidden + E * kHidden + kHidden * kOut + kOut;
      EXPECT_GE(b.expert_master, 4 * local / edp) << tag;
      EXPECT_LE(b.expert_master, 4 * (local / edp + 3 * 64)) << tag << ": padding";
      EXPECT_EQ(b.expert_optimizer, 2 * b.expert_master) << tag;
      EXPECT_GE(b.master - b.expert_master, 4 * dense / W) << tag;
      EXPECT_LE(b.master - b.expert_master, 4 * (dense / W + 4 * 64)) << tag << ": padding";
      EXPECT_EQ(b.params, 0) << tag << ": stage 3 keeps no parameter copy between gathers";
    }
  }
}

TEST(MoEEngine, OverflowInOneExpertSkipsEveryRank) {
  // An inf in one expert's gradient on one rank only: the expert partial norm, summed over
  // ep, makes every rank (also those whose own experts are finite) skip the step.
  auto w = world();
  const int W = w->size(), r = w->rank();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  const Case c{1, 2, 1, true};
  parallel::Topology topo(w, parallel::ParallelDims::make(W, W, 1, 1, W));
  Net net(c, W, topo.ep());
  load_reference_weights(net, c, W);
  EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.group = topo.dp();
  o.is_expert = is_expert;
  o.ep = topo.ep();
  o.expert_dp = topo.expert_dp();
  auto engine = initialize(net.ptr(), Config::from_json(config(c, 1.0), W), o);
  std::vector<torch::Tensor> before;
  for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
  torch::Tensor expert_w = net->moe->experts[0]->parameters()[0];
  const bool poison = r == W - 1;  // the last ep rank only
  unsigned hook = 0;
  if (poison) hook = expert_w.register_hook([](const torch::Tensor& g) { return g * INFINITY; });
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + r);
  auto x = torch::randn({2, 5, kIn}, gen), y = torch::randn({2, 5, kOut}, gen);
  engine->backward(engine->forward([&] { return net->loss(x, y); }));
  ASSERT_TRUE(engine->step());
  if (poison) expert_w.remove_hook(hook);
  EXPECT_TRUE(engine->was_step_skipped()) << "rank " << r;
  auto after = net->parameters();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(after[i].detach(), before[i])) << "rank " << r << " param " << i;
  // The next step, without the inf, is applied everywhere.
  engine->backward(engine->forward([&] { return net->loss(x, y); }));
  ASSERT_TRUE(engine->step());
  EXPECT_FALSE(engine->was_step_skipped()) << "rank " << r;
}

TEST(MoEEngine, UnsupportedSetupsAreNamed) {
  auto w = world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  parallel::Topology topo(w, parallel::ParallelDims::make(W, W, 1, 1, W));
  auto expect_error = [&](const Case& c, EngineOptions o, const std::string& words, const std::string& what) {
    Net net(c, 2 * W, topo.ep());
    o.device = torch::Device(torch::kCPU);
    o.print = false;
    o.group = topo.dp();
    o.is_expert = is_expert;
    try {
      initialize(net.ptr(), Config::from_json(config(c, 1.0), W), o);
      ADD_FAILURE() << what << ": expected a ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << what << ": " << e.what();
    }
  };
  EngineOptions o;
  o.ep = topo.ep();
  o.expert_dp = topo.expert_dp();
  EngineOptions no_edp;
  no_edp.ep = topo.ep();
  expect_error({1, 1, 1, true}, no_edp, "EngineOptions.expert_dp is not set", "no expert_dp");
  EngineOptions wrong = o;
  wrong.expert_dp = w;  // W x W ranks != W
  expect_error({1, 1, 1, true}, wrong, "!= the data-parallel group", "mismatched groups");

  // Checkpoints would save one ep rank's experts under local names: refused.
  const Case c{1, 1, 1, true};
  Net net(c, 2 * W, topo.ep());
  EngineOptions ok = o;
  ok.device = torch::Device(torch::kCPU);
  ok.print = false;
  ok.group = topo.dp();
  ok.is_expert = is_expert;
  auto engine = initialize(net.ptr(), Config::from_json(config(c, 1.0), W), ok);
  EXPECT_THROW(engine->save_checkpoint("/nonexistent-moe-ckpt"), ConfigError);
}

}  // namespace
}  // namespace test_moe_engine
}  // namespace zt::models
