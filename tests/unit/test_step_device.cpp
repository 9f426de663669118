// zero::DeviceStep on its own (src/zero/step_device.h): the optimizer step of a flat
// shard against torch::optim on the same parameters and gradients (CPU: ATen's fused
// Adam/AdamW and the SGD loop). Tolerance: the fused kernels order the Adam arithmetic
// differently from torch::optim::Adam(W), a few fp32 ulps per step; over 3 steps of
// values of order 1, rtol 1e-5 and atol 1e-6 hold with a wide margin. SGD is the same
// operations in the same order.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "zero/optimizer_state.h"
#include "zero/step_device.h"

namespace zt::zero {
namespace test_step_device {
namespace {

constexpr double kLr = 1e-2;

// Two parameters of 6 and 10 elements in one bucket, world 1: 16 owned elements.
ShardLayout layout() {
  ShardLayout L;
  L.flat = make_flat_layout({6, 10}, 1000, 1, 1);
  return L;
}

struct StepRun {
  ShardLayout L = layout();
  OptimizerRule rule;
  OwnedState state;
  std::unique_ptr<DeviceStep> step;
  StepRun(const OptimizerConfig& cfg, std::vector<ParamGroupSpec> groups, const torch::Tensor& init)
      : rule(cfg, std::move(groups)) {
    rule.build_group_runs(L, [](int i) { return i; });  // parameter i in group i (when there are two)
    state.master = init.clone();
    if (!rule.sgd()) {
      state.exp_avg = torch::zeros({16});
      state.exp_avg_sq = torch::zeros({16});
    }
    if (rule.momentum_buffer()) state.momentum = torch::zeros({16});
    step = std::make_unique<DeviceStep>(L, rule, state, DeviceStepOptions{});
  }
  void update(const torch::Tensor& grad, int64_t t, double factor = 1.0) {
    StepInputs in;
    in.lr = kLr;
    in.step = t;
    const bool wrote = step->step(factor, in, [&](int) { return grad; }, [](int) { return torch::Tensor(); });
    EXPECT_FALSE(wrote);
  }
};

OptimizerConfig config(const char* type, double wd) {
  OptimizerConfig c;
  c.type = type;
  c.params.lr = kLr;
  c.params.weight_decay = wd;
  if (std::string(type) == "Adam") c.params.adam_w_mode = false;
  if (std::string(type) == "SGD") c.params.momentum = 0.9;
  return c;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double rtol, double atol, const char* what) {
  EXPECT_TRUE(torch::allclose(got, want, rtol, atol)) << what << ": max diff " << (got - want).abs().max().item<double>();
}

TEST(DeviceStep, AdamWMatchesTorchOptimWithClipFactor) {
  torch::manual_seed(1);
  auto init = torch::randn({16});
  StepRun run(config("AdamW", 0.1), {}, init);
  auto ref = init.clone().requires_grad_(true);
  torch::optim::AdamW opt({ref}, torch::optim::AdamWOptions(kLr).weight_decay(0.1));
  for (int t = 1; t <= 3; ++t) {
    auto g = torch::randn({16});
    ref.mutable_grad() = g * 0.5;
    opt.step();
    run.update(g, t, /*factor=*/0.5);  // the step multiplies the gradients by the clip factor
  }
  expect_close(run.state.master, ref.detach(), 1e-5, 1e-6, "AdamW");
}

TEST(DeviceStep, AdamWithL2MatchesTorchOptim) {
  torch::manual_seed(2);
  auto init = torch::randn({16});
  StepRun run(config("Adam", 0.01), {}, init);
  auto ref = init.clone().requires_grad_(true);
  torch::optim::Adam opt({ref}, torch::optim::AdamOptions(kLr).weight_decay(0.01));
  for (int t = 1; t <= 3; ++t) {
    auto g = torch::randn({16});
    ref.mutable_grad() = g.clone();
    opt.step();
    run.update(g, t);
  }
  expect_close(run.state.master, ref.detach(), 1e-5, 1e-6, "Adam");
}

TEST(DeviceStep, SgdWithMomentumMatchesTorchOptim) {
  torch::manual_seed(3);
  auto init = torch::randn({16});
  StepRun run(config("SGD", 0.01), {}, init);
  auto ref = init.clone().requires_grad_(true);
  torch::optim::SGD opt({ref}, torch::optim::SGDOptions(kLr).momentum(0.9).weight_decay(0.01));
  for (int t = 1; t <= 3; ++t) {
    auto g = torch::randn({16});
    ref.mutable_grad() = g.clone();
    opt.step();
    run.update(g, t);
  }
  expect_close(run.state.master, ref.detach(), 1e-6, 1e-7, "SGD");
  auto& st = static_cast<torch::optim::SGDParamState&>(*opt.state().at(ref.unsafeGetTensorImpl()));
  expect_close(run.state.momentum, st.momentum_buffer(), 1e-6, 1e-7, "SGD momentum");
}

// Two parameter groups ([Group Runs]): parameter 0 (6 elements) with weight decay 0.1 and
// the full lr, parameter 1 (10) with no weight decay and half the lr, against
// torch::optim::AdamW with the same two groups.
TEST(DeviceStep, ParameterGroupsMatchTorchOptimGroups) {
  torch::manual_seed(4);
  auto init = torch::randn({16});
  StepRun run(config("AdamW", 0.0), {{"decay", 1.0, 0.1}, {"no_decay", 0.5, 0.0}}, init);
  auto r0 = init.narrow(0, 0, 6).clone().requires_grad_(true);
  auto r1 = init.narrow(0, 6, 10).clone().requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{r0},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(kLr).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{r1},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(kLr * 0.5).weight_decay(0.0)));
  torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(kLr));
  for (int t = 1; t <= 3; ++t) {
    auto g = torch::randn({16});
    r0.mutable_grad() = g.narrow(0, 0, 6).clone();
    r1.mutable_grad() = g.narrow(0, 6, 10).clone();
    opt.step();
    run.update(g, t);
  }
  expect_close(run.state.master.narrow(0, 0, 6), r0.detach(), 1e-5, 1e-6, "group 0");
  expect_close(run.state.master.narrow(0, 6, 10), r1.detach(), 1e-5, 1e-6, "group 1");
}

TEST(OptimizerRule, StateKinds) {
  EXPECT_EQ(OptimizerRule(config("AdamW", 0), {}).state_kinds(),
            (std::vector<std::string>{"master", "exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(OptimizerRule(config("SGD", 0), {}).state_kinds(), (std::vector<std::string>{"master", "momentum"}));
  OptimizerConfig plain = config("SGD", 0);
  plain.params.momentum = 0;
  EXPECT_EQ(OptimizerRule(plain, {}).state_kinds(), (std::vector<std::string>{"master"}));
}

}  // namespace
}  // namespace test_step_device
}  // namespace zt::zero
