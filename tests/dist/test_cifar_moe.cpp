// The CIFAR-10 MoE example's net (include/zerotrain/models/cifar_moe_net.h, [CIFAR MoE];
// docs/moe.md#the-cifar-10-moe-example) trained by the engine on real ranks (CPU, MPI, fp32)
// on a synthetic data set in the CIFAR-10 binary format: each rank writes the same files
// (random labels; each image = its class's mean image + noise, so the classes are learnable)
// and reads them through Cifar10Dataset, DistributedSampler and Loader, as the example does.
//  * LossFallsOnSyntheticCifar: the PR-MoE pyramid (--num-experts 2 4 --mlp-type residual
//    --top-k 1 --noisy-gate-policy RSample, aux coef 0.01) at ep 2 when the world is even,
//    Adam, 40 steps: the mean loss of the last 5 steps is under half of the first 5's.
//  * ExpertParallelEqualsEpOne: the same ranks, the same data and per-rank routing seeds at
//    ep 1 (every expert everywhere, all dense) and at every ep > 1 dividing the world and
//    every --num-experts entry: this rank's loss per step and every parameter after 6 steps
//    (experts by global index) within 1e-5 (fp32; the expert GEMMs see P ranks' rows in one
//    batch and reductions sum in another order). Top-1 with RSample + random token selection
//    and drops, top-2 with jitter + second-expert sampling, PR-MoE, ZeRO 0/1/2. Control: ep 2
//    with the experts left as dense parameters (no --moe-param-group: averaged over the
//    whole dp group with another rank's experts) is > 1e-4 away, so the check can fail.
//  * ExpertsThatDoNotDivideEpAreNamed: --num-experts 2 3 at ep 2 and an ep that does not
//    divide the world are ConfigErrors naming the flags, before any engine exists.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "support/dist_util.h"
#include "support/synthetic_cifar.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/data/cifar10.h"
#include "zerotrain/data/loader.h"
#include "zerotrain/data/sampler.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "zerotrain/models/cifar_moe_net.h"

namespace zt::models {
namespace test_cifar_moe {
namespace {

using data::Cifar10Dataset;

constexpr double kCifarMoETol = 1e-5;

comm::GroupPtr cifar_moe_world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(120));
  return g;
}

struct CifarMoECase {
  std::vector<int64_t> experts{2, 4};
  int64_t k = 1;
  std::string policy = "RSample";
  bool residual = true;
  int stage = 1;
  int64_t min_capacity = 0;
  std::string tag() const {
    std::string e;
    for (auto n : experts) e += std::to_string(n) + " ";
    return "experts " + e + "top-" + std::to_string(k) + " " + policy + (residual ? " residual" : " standard") +
           " stage " + std::to_string(stage) + " min_capacity " + std::to_string(min_capacity);
  }
};

struct CifarMoERun {
  std::vector<double> loss, norm;                 // this rank's loss, the global grad norm, per step
  double dropped = 0;                             // largest dropped fraction seen
  std::map<std::string, torch::Tensor> params;    // after the last step, by global name
};

// `steps` steps at expert-parallel size ep (1: all dense), micro-batch 16 per rank; Adam
// (the example's optimizer) when adam, else SGD with momentum (an update proportional to the
// gradient, so an expert gradient scaled or averaged over the wrong group shows; Adam's
// normalisation would hide a scale). mark_experts false: the experts stay dense (the control).
CifarMoERun train_cifar_moe(const std::string& dir, const CifarMoECase& c, int ep, int steps, double lr, bool adam,
                            bool mark_experts = true) {
  auto w = cifar_moe_world();
  const int W = w->size(), r = w->rank();
  CifarMoEOptions o;
  o.num_experts = c.experts;
  o.top_k = c.k;
  o.noisy_gate_policy = c.policy;
  o.use_residual = c.residual;
  o.min_capacity = c.min_capacity;
  EngineOptions eo;
  eo.device = torch::Device(torch::kCPU);
  eo.print = false;
  eo.group = w;
  if (ep > 1) {
    auto g = cifar_moe_groups(w, ep);
    o.ep_group = g.ep;
    if (mark_experts) {
      eo.ep = g.ep;
      eo.expert_dp = g.expert_dp;
    }
  }
  torch::manual_seed(11);
  CifarMoENet net(o);
  net->set_generator(at::make_generator<at::CPUGeneratorImpl>(1000003ULL * 5 + r));  // per rank, same at every ep
  if (mark_experts) {
    eo.is_expert = CifarMoENetImpl::is_expert;
    eo.expert_global_name = [p = net.ptr()](const std::string& n) { return p->global_param_name(n); };
  }
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", 16},
                        {"gradient_accumulation_steps", 1},
                        {"gradient_clipping", 1.0},
                        {"steps_per_print", 1000},
                        {"optimizer", adam ? nlohmann::json{{"type", "Adam"}, {"params", {{"lr", lr}, {"betas", {0.8, 0.999}}, {"eps", 1e-8}}}}
                                           : nlohmann::json{{"type", "SGD"}, {"params", {{"lr", lr}, {"momentum", 0.9}}}}},
                        {"zero_optimization", {{"stage", c.stage}, {"reduce_bucket_size", 20000}}}};
  auto engine = initialize(net.ptr(), Config::from_json(cfg, W), eo);
  auto ds = std::make_shared<Cifar10Dataset>(dir, true);
  data::DistributedSampler sampler(ds->size(), r, W, true, 0);
  data::Loader loader(ds, sampler, 16, engine->device());
  CifarMoERun run;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = loader.next();
    auto loss = engine->forward([&] { return net->loss(x, y); });
    engine->backward(loss);
    engine->step();
    run.loss.push_back(engine->last_report().loss);
    run.norm.push_back(engine->last_report().grad_norm);
    run.dropped = std::max(run.dropped, net->last_dropped_fraction());
  }
  auto master = engine->gather_master_params();
  size_t i = 0;
  for (const auto& kv : net->named_parameters()) run.params[net->global_param_name(kv.key())] = master.at(i++);
  return run;
}

double cifar_moe_param_diff(const CifarMoERun& got, const CifarMoERun& ref, const std::string& tag) {
  double d = 0;
  for (const auto& [name, t] : got.params) {
    const auto it = ref.params.find(name);
    EXPECT_NE(it, ref.params.end()) << tag << ": " << name << " not in the ep-1 run";
    if (it == ref.params.end()) continue;
    const double x = (t - it->second).abs().max().item<double>();
    if (x > kCifarMoETol && std::getenv("ZT_CIFAR_MOE_DEBUG"))  // which parameters a failure moved
      std::printf("%s: %s differs by %g\n", tag.c_str(), name.c_str(), x);
    d = std::max(d, x);
  }
  return d;
}

}  // namespace

TEST(CifarMoE, LossFallsOnSyntheticCifar) {
  auto w = cifar_moe_world();
  const int W = w->size();
  test_support::LocalTempDir dir("cifar_moe_loss");
  test_support::write_synthetic_cifar(dir.path, 64, 2718);
  const int ep = W % 2 == 0 ? 2 : 1;
  const CifarMoECase c;  // the pyramid 2 4, PR-MoE, top-1, RSample
  const CifarMoERun run = train_cifar_moe(dir.path, c, ep, 40, 3e-3, true);
  double first = 0, last = 0;
  for (int s = 0; s < 5; ++s) {
    first += run.loss[s] / 5;
    last += run.loss[run.loss.size() - 1 - s] / 5;
  }
  if (w->rank() == 0)
    std::printf("[cifar-moe] world %d ep %d: mean loss steps 1-5 %.4f, steps 36-40 %.4f\n", W, ep, first, last);
  EXPECT_GT(first, 1.8);  // about ln 10 at the start
  EXPECT_LT(last, 0.5 * first) << "world " << W << " ep " << ep;
}

TEST(CifarMoE, ExpertParallelEqualsEpOne) {
  auto w = cifar_moe_world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  test_support::LocalTempDir dir("cifar_moe_ep");
  test_support::write_synthetic_cifar(dir.path, 32, 2718);
  constexpr int kSteps = 6;
  constexpr double kLr = 0.05;
  const std::vector<CifarMoECase> cases = {
      {{2, 4}, 1, "RSample", true, 1, 0},   // the tutorial's pyramid: random token selection, drops
      {{2, 4}, 2, "Jitter", false, 2, 0},   // top-2 with second-expert sampling
      {{4}, 1, "None", false, 0, 0},
      {{4}, 2, "None", true, 2, 4},
  };
  double worst = 0, dropped = 0;
  for (const auto& c : cases) {
    const CifarMoERun ref = train_cifar_moe(dir.path, c, 1, kSteps, kLr, false);
    for (int ep = 2; ep <= W; ep *= 2) {
      bool divides = W % ep == 0;
      for (auto e : c.experts) divides = divides && e % ep == 0;
      if (!divides) continue;
      const std::string tag = c.tag() + " ep " + std::to_string(ep) + " world " + std::to_string(W);
      const CifarMoERun got = train_cifar_moe(dir.path, c, ep, kSteps, kLr, false);
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_NEAR(got.loss[s], ref.loss[s], kCifarMoETol) << tag << " loss, step " << s + 1;
        EXPECT_NEAR(got.norm[s], ref.norm[s], kCifarMoETol * std::max(1.0, ref.norm[s])) << tag << " norm, step " << s + 1;
      }
      const double d = cifar_moe_param_diff(got, ref, tag);
      EXPECT_LE(d, kCifarMoETol) << tag;
      EXPECT_EQ(got.params.size(), ref.params.size() - [&] {
        int64_t not_here = 0;  // the other ranks' experts
        for (auto e : c.experts) not_here += (e - e / ep) * 2;
        return not_here;
      }()) << tag;
      worst = std::max(worst, d);
      dropped = std::max(dropped, got.dropped);
    }
  }
  EXPECT_GT(dropped, 0.0) << "no case dropped tokens";
  // Control: ep 2 with the experts treated as dense parameters.
  const CifarMoERun ref = train_cifar_moe(dir.path, cases[0], 1, kSteps, kLr, false);
  const CifarMoERun bad = train_cifar_moe(dir.path, cases[0], 2, kSteps, kLr, false, false);
  const double control = cifar_moe_param_diff(bad, ref, "control");
  EXPECT_GT(control, 10 * kCifarMoETol);
  std::printf("[cifar-moe] world %d rank %d: largest parameter difference vs ep 1 %.3g (control %.3g), dropped up to %.3f\n",
              W, w->rank(), worst, control, dropped);
}

TEST(CifarMoE, ExpertsThatDoNotDivideEpAreNamed) {
  auto w = cifar_moe_world();
  const int W = w->size();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  auto g = cifar_moe_groups(w, 2 * (W / 2) == W ? 2 : 1);
  CifarMoEOptions o;
  o.num_experts = {2, 3};
  o.ep_group = g.ep;
  if (W % 2 == 0) {
    try {
      CifarMoENet net(o);
      ADD_FAILURE() << "3 experts over ep 2 were accepted";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--num-experts entry 1 (3 experts)"), std::string::npos) << m;
      EXPECT_NE(m.find("--ep 2"), std::string::npos) << m;
    }
  }
  try {
    cifar_moe_groups(w, W + 1);
    ADD_FAILURE() << "ep " << W + 1 << " over " << W << " ranks was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--ep " + std::to_string(W + 1)), std::string::npos) << e.what();
  }
}

}  // namespace test_cifar_moe
}  // namespace zt::models
