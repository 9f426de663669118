// The engine API the model-parallel features build on (run at world 1, 2 and 4 by ctest):
//  * Engine::backward(outputs, grads, inputs, loss) -- a pipeline stage without the loss,
//    and a split backward (input gradients first, weight gradients later) -- trains
//    exactly as backward(loss) does;
//  * EngineOptions / ZeroOptions norm weights: a parameter replicated on k model-parallel
//    ranks counts once in the clipping norm, at every ZeRO stage, also when its gradient
//    is cut across data-parallel shards ([Norm Weights] in src/zero/zero_optimizer.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt_test_stage_backward {

namespace {

using zt::test_support::global_batch;
using zt::test_support::Mlp;

zt::comm::GroupPtr world() {
  zt::comm::GroupPtr g = zt::comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

nlohmann::json config(int stage, int gas, const std::string& dtype) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", gas},
      {"gradient_clipping", 0.5},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 200}, {"allgather_bucket_size", 300}}},
  };
  if (dtype == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  return j;
}

enum class Mode { loss, outputs, split };

// Trains a fresh Mlp (seed 7) for 4 steps; returns the fp32 master parameters and the
// reported losses. Mode::outputs runs backward(outputs, grads) with dL/d(output) x
// backward_scale() computed outside the engine; Mode::split first takes the gradient of the
// stage input with torch::autograd::grad (the input-gradient pass of a
// zero-bubble schedule), then the weight pass as backward(outputs, grads, parameters).
std::pair<std::vector<torch::Tensor>, std::vector<double>> train(Mode mode, int stage, int gas, const std::string& dtype) {
  auto g = world();
  torch::manual_seed(7);
  Mlp m;
  auto cfg = zt::Config::from_json(config(stage, gas, dtype), g->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.ptr(), cfg, o);
  const auto compute = engine->compute_dtype();
  std::vector<double> losses;
  for (int s = 0; s < 4; ++s) {
    for (int k = 0; k < gas; ++k) {
      auto [x, y] = global_batch(s * gas + k, 2 * g->size());
      auto xb = x.narrow(0, 2 * g->rank(), 2).to(compute), yb = y.narrow(0, 2 * g->rank(), 2);
      if (mode == Mode::loss) {
        auto loss = engine->forward([&] { return torch::mse_loss(m->forward(xb).to(torch::kFloat), yb); });
        engine->backward(loss);
        continue;
      }
      // As a stage receives it: an activation that requires grad.
      auto xin = xb.detach().requires_grad_(mode == Mode::split);
      torch::Tensor out, loss;
      engine->forward([&] {
        out = m->forward(xin);
        loss = torch::mse_loss(out.to(torch::kFloat), yb);
        return loss;
      });
      // What the next pipeline stage would send back: dL/d(out), scaled.
      auto d_out = torch::autograd::grad({loss * engine->backward_scale()}, {out}, {}, /*retain_graph=*/true)[0];
      if (mode == Mode::outputs) {
        engine->backward({out}, {d_out}, {}, loss);
      } else {
        // The input-gradient pass (the "B" of ZB-H1: what this stage sends to the previous
        // one) accumulates into no parameter; the weight pass ("W") comes later.
        auto d_in = torch::autograd::grad({out}, {xin}, {d_out}, /*retain_graph=*/true)[0];
        EXPECT_EQ(d_in.sizes(), xin.sizes());
        engine->backward({out}, {d_out}, m->parameters(), loss);
      }
    }
    EXPECT_TRUE(engine->step());
    for (const auto& r : engine->take_reports()) losses.push_back(r.loss);
  }
  return {engine->gather_master_params(), losses};
}

TEST(StageBackward, OutputsAndSplitBackwardTrainAsBackwardOfTheLoss) {
  for (int stage : {0, 1, 2, 3}) {
    for (const std::string dtype : {"fp32", "fp16"}) {
      const int gas = stage == 1 ? 2 : 1;
      auto [ref, ref_loss] = train(Mode::loss, stage, gas, dtype);
      for (Mode mode : {Mode::outputs, Mode::split}) {
        auto [got, got_loss] = train(mode, stage, gas, dtype);
        ASSERT_EQ(got.size(), ref.size());
        // Same gradients up to the summation order autograd takes (the loss's
        // gradient computed first, then chained): a few fp32 ulps after 4 Adam steps.
        for (size_t i = 0; i < ref.size(); ++i) {
          EXPECT_TRUE(torch::allclose(got[i], ref[i], 1e-5, 1e-6))
              << "stage " << stage << " " << dtype << " mode " << static_cast<int>(mode) << " param " << i
              << " max diff " << (got[i] - ref[i]).abs().max().item<double>();
        }
        ASSERT_EQ(got_loss.size(), ref_loss.size());
        for (size_t i = 0; i < ref_loss.size(); ++i) EXPECT_NEAR(got_loss[i], ref_loss[i], 1e-6 * std::abs(ref_loss[i]));
      }
    }
  }
}

TEST(StageBackward, MismatchedOutputsAndGradientsAreNamedErrors) {
  torch::manual_seed(7);
  Mlp m;
  auto cfg = zt::Config::from_json(config(0, 1, "fp32"), world()->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.ptr(), cfg, o);
  auto out = m->forward(torch::randn({2, 8}));
  EXPECT_THROW(engine->backward({out}, {}, {}, {}), zt::TrainingError);
  EXPECT_THROW(engine->backward({out}, {torch::ones({3, 4})}, {}, {}), zt::TrainingError);
}

// Parameters a (10), b (7), c (5) with gradients 1, 2 and 3 on every rank (identical
// across the data-parallel group, so their mean is the same) and norm weights 1, 0.25 and
// 0: norm^2 = 10 + 0.25 * 7 * 4 = 17 at every stage. Buckets of 8 elements (stages 0-2)
// and one unit of 22 elements (stage 3) cut b and c across the shards at world > 1.
TEST(StageBackward, NormWeightsScaleEachParametersShareAtEveryStage) {
  auto g = world();
  struct Three : torch::nn::Module {
    Three() {
      a = register_parameter("a", torch::zeros({10}));
      b = register_parameter("b", torch::zeros({7}));
      c = register_parameter("c", torch::zeros({5}));
    }
    torch::Tensor a, b, c;
  };
  for (int stage : {0, 1, 2, 3}) {
    auto model = std::make_shared<Three>();
    nlohmann::json j = config(stage, 1, "fp32");
    j["gradient_clipping"] = 0.0;
    j["zero_optimization"]["reduce_bucket_size"] = 8;
    j["zero_optimization"]["allgather_bucket_size"] = 8;
    j["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    auto cfg = zt::Config::from_json(j, g->size());
    zt::EngineOptions o;
    o.device = torch::Device(torch::kCPU);
    o.print = false;
    o.norm_weight = [](const std::string& name) { return name == "a" ? 1.0 : name == "b" ? 0.25 : 0.0; };
    auto engine = zt::initialize(model, cfg, o);
    auto loss = engine->forward([&] { return model->a.sum() + (model->b * 2.0).sum() + (model->c * 3.0).sum(); });
    engine->backward(loss);
    engine->step();
    auto reports = engine->take_reports(true);
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_NEAR(reports[0].grad_norm, std::sqrt(17.0), 1e-6) << "stage " << stage << " world " << g->size();
  }
}

// The model-parallel view: every rank holds its own `a` (gradient r+1, 4 elements) and a
// replica of `b` (gradient 2, 6 elements; weight 1/world). Data-parallel group: the rank
// alone; model-parallel group: the world. Through the engine: norm^2 =
// 4 * sum_k (k+1)^2 + 6 * 4, the same on every rank, and without the weight b would count
// world times.
TEST(StageBackward, EngineNormWeightCountsAReplicatedParameterOnce) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  for (bool weighted : {true, false}) {
    auto dp = w->split(r, 0);
    struct Two : torch::nn::Module {
      Two() {
        a = register_parameter("a", torch::zeros({4}));
        b = register_parameter("b", torch::zeros({6}));
      }
      torch::Tensor a, b;
    };
    auto model = std::make_shared<Two>();
    nlohmann::json j = config(2, 1, "fp32");
    j["gradient_clipping"] = 0.0;
    auto cfg = zt::Config::from_json(j, 1);
    zt::EngineOptions o;
    o.device = torch::Device(torch::kCPU);
    o.print = false;
    o.group = dp;
    o.model_parallel = w;
    if (weighted) o.norm_weight = [n](const std::string& name) { return name == "b" ? 1.0 / n : 1.0; };
    auto engine = zt::initialize(model, cfg, o);
    auto loss = engine->forward([&] { return (model->a * (r + 1.0)).sum() + (model->b * 2.0).sum(); });
    engine->backward(loss);
    engine->step();
    auto reports = engine->take_reports(true);
    ASSERT_EQ(reports.size(), 1u);
    double want = 24.0 * (weighted ? 1 : n);
    for (int k = 0; k < n; ++k) want += 4.0 * (k + 1) * (k + 1);
    EXPECT_NEAR(reports[0].grad_norm, std::sqrt(want), 1e-6 * std::sqrt(want)) << "weighted " << weighted;
  }
}

TEST(StageBackward, NegativeNormWeightIsAConfigError) {
  struct One : torch::nn::Module {
    One() { a = register_parameter("a", torch::zeros({4})); }
    torch::Tensor a;
  };
  auto model = std::make_shared<One>();
  auto cfg = zt::Config::from_json(config(0, 1, "fp32"), world()->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.norm_weight = [](const std::string&) { return -1.0; };
  EXPECT_THROW(zt::initialize(model, cfg, o), zt::ConfigError);
}

}  // namespace

}  // namespace zt_test_stage_backward
