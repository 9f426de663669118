// The engine's asynchronous CUDA step (docs/engine.md, "The GPU step does not stop the
// CPU"): with bf16 and Adam/AdamW the overflow check and the clipping run on the device
// and the CPU learns the outcome at the next step. Checked here on real GPUs, each rank
// on cuda:LOCAL_RANK:
//   - an inf in one rank's gradients skips the step on every rank: the fp32 master
//     weights stay bit for bit, the report says skipped, the LR schedule does not advance;
//   - training then goes on (the next step changes the weights);
//   - take_reports() hands out each step's report once, in order;
//   - the deferred device step gives the weights of the CPU engine, whose every step is
//     decided on the host (fp32, 4 steps).
//
//   zerotrain launch -n 2 -- build/zt_gpu --gtest_filter='EngineAsync*'
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <limits>
#include <vector>

#include "support/gpu_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt_test_engine_async {

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(32, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

nlohmann::json config(int stage, const char* dtype) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 4},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 1e-3}, {"warmup_max_lr", 1e-2},
                                                      {"warmup_num_steps", 10}, {"warmup_type", "linear"}}}}},
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 500}, {"overlap_comm", true}}},
  };
  if (dtype != nullptr) j[dtype] = {{"enabled", true}};  // nullptr: fp32
  return j;
}

bool have_gpu() { return torch::cuda::is_available() && torch::cuda::device_count() > 0; }

torch::Device my_device() { return zt::test_support::rank_device(); }

// A fresh Net (torch seed `seed`) and its engine on `dev` for config `j`, quiet.
auto make_engine(Net& net, const nlohmann::json& j, torch::Device dev, int seed) {
  auto cfg = zt::Config::from_json(j, zt::comm::world_group()->size());
  torch::manual_seed(seed);
  net = Net();
  zt::EngineOptions o;
  o.device = dev;
  o.print = false;
  return zt::initialize(net.ptr(), cfg, o);
}

std::vector<torch::Tensor> cpu_copy(const std::vector<torch::Tensor>& v) {
  std::vector<torch::Tensor> out;
  for (const auto& t : v) out.push_back(t.to(torch::kCPU).clone());
  return out;
}

bool same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

class EngineAsync : public ::testing::TestWithParam<int> {};

TEST_P(EngineAsync, InfOnOneRankSkipsOnTheDeviceEverywhere) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int stage = GetParam();
  auto group = zt::comm::world_group();
  const int rank = group->rank();
  const torch::Device dev = my_device();
  Net net{nullptr};
  auto engine = make_engine(net, config(stage, "bf16"), dev, 3);
  auto batch = [&](int s) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(100 + s * 7 + rank);
    auto x = at::randn({4, 32}, g);
    auto y = at::randn({4, 8}, g);
    return std::make_pair(x.to(dev), y.to(dev));
  };
  auto run_step = [&](int s, bool poison) {
    auto [x, y] = batch(s);
    auto loss = engine->forward([&, x = x, y = y] {
      return torch::mse_loss(net->forward(x.to(engine->compute_dtype())).to(torch::kFloat), y);
    });
    if (poison) loss = loss * std::numeric_limits<float>::infinity();
    engine->backward(loss);
    EXPECT_TRUE(engine->step());
  };

  run_step(0, false);
  const auto before = cpu_copy(engine->gather_master_params());
  const double lr_before = engine->get_lr();
  run_step(1, /*poison=*/rank == 0);  // only rank 0's gradients are inf/NaN
  EXPECT_TRUE(engine->was_step_skipped()) << "rank " << rank << " stage " << stage;
  const auto after_skip = cpu_copy(engine->gather_master_params());
  EXPECT_TRUE(same_bits(before, after_skip)) << "a skipped step changed the master weights (rank " << rank << ")";
  EXPECT_EQ(engine->get_lr(), lr_before) << "the schedule advanced on a skipped step";
  run_step(2, false);
  EXPECT_FALSE(engine->was_step_skipped());
  const auto after = cpu_copy(engine->gather_master_params());
  EXPECT_FALSE(same_bits(after_skip, after)) << "training did not go on after the skipped step";
  for (const auto& t : after) EXPECT_TRUE(torch::isfinite(t).all().item<bool>());

  // Every step's report exactly once, in order, with the skip where it happened.
  const auto reports = engine->take_reports(true);
  ASSERT_EQ(reports.size(), 3u);
  for (size_t i = 0; i < reports.size(); ++i) EXPECT_EQ(reports[i].step, static_cast<int64_t>(i + 1));
  EXPECT_FALSE(reports[0].skipped);
  EXPECT_TRUE(reports[1].skipped);
  EXPECT_FALSE(reports[2].skipped);
  EXPECT_GT(reports[2].grad_norm, 0.0);
  EXPECT_GT(reports[2].forward.ms + reports[2].backward.ms + reports[2].step_phase.ms, 0.0);
  EXPECT_TRUE(engine->take_reports(true).empty());
}

// The deferred device step (bf16 on CUDA) and the same training where the CPU decides
// every step (the CPU engine) agree: fp32 compute, the same data, 4 steps.
TEST_P(EngineAsync, DeferredStepMatchesTheCpuEngine) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int stage = GetParam();
  auto group = zt::comm::world_group();
  const int rank = group->rank();
  auto train = [&](torch::Device dev) {
    Net net{nullptr};
    auto engine = make_engine(net, config(stage, nullptr), dev, 3);
    for (int s = 0; s < 4; ++s) {
      auto g = at::make_generator<at::CPUGeneratorImpl>(500 + s * 7 + rank);
      auto x = at::randn({4, 32}, g).to(dev), y = at::randn({4, 8}, g).to(dev);
      auto loss = engine->forward([&] { return torch::mse_loss(net->forward(x), y); });
      engine->backward(loss);
      engine->step();
    }
    return cpu_copy(engine->gather_master_params());
  };
  const auto gpu = train(my_device());
  const auto cpu = train(torch::Device(torch::kCPU));
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_TRUE(torch::allclose(gpu[i], cpu[i], 1e-4, 1e-5))
        << "parameter " << i << ": max |diff| " << (gpu[i] - cpu[i]).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineAsync, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// The delayed parameter update on GPUs: the worker thread uploads its sub-groups into a
// device buffer of its own during the next forward/backward, and the next step copies them
// into place. After 1 step the device parameters are still the initial ones; after 2 they
// equal a plain offloaded run's after 1; and once flushed they equal the fp32 master.
class DelayedUpdateGpu : public ::testing::TestWithParam<int> {};

TEST_P(DelayedUpdateGpu, LandsOneStepLateOnTheDevice) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int stage = GetParam();
  auto group = zt::comm::world_group();
  const int rank = group->rank();
  auto plain = config(stage, nullptr);
  plain["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  plain["zero_optimization"]["sub_group_size"] = 700;  // several sub-groups, so several uploads
  auto delayed = plain;
  delayed["zero_optimization"]["offload_optimizer"]["delayed_param_update"] = true;
  const torch::Device dev = my_device();
  auto device_params = [&](const nlohmann::json& j, int steps, bool flush) {
    Net net{nullptr};
    auto engine = make_engine(net, j, dev, 5);
    for (int s = 0; s < steps; ++s) {
      auto g = at::make_generator<at::CPUGeneratorImpl>(900 + s * 7 + rank);
      auto x = at::randn({4, 32}, g).to(dev), y = at::randn({4, 8}, g).to(dev);
      auto loss = engine->forward([&] { return torch::mse_loss(net->forward(x), y); });
      engine->backward(loss);
      engine->step();
    }
    std::vector<torch::Tensor> master;
    if (flush) master = cpu_copy(engine->gather_master_params());
    auto params = cpu_copy(net->parameters());
    return std::make_pair(params, master);
  };
  const auto init = device_params(plain, 0, false).first;
  const auto d1 = device_params(delayed, 1, false).first;
  const auto d2 = device_params(delayed, 2, false).first;
  const auto p1 = device_params(plain, 1, false).first;
  const auto [d4, d4_master] = device_params(delayed, 4, true);
  ASSERT_EQ(init.size(), d1.size());
  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_TRUE(torch::equal(d1[i], init[i])) << "parameter " << i << " changed before its delayed update landed";
    EXPECT_TRUE(torch::equal(d2[i], p1[i])) << "parameter " << i << ": second delayed step != first plain step, max |diff| "
                                            << (d2[i] - p1[i]).abs().max().item<double>();
    EXPECT_TRUE(torch::equal(d4[i], d4_master[i].view(d4[i].sizes())))
        << "parameter " << i << ": after the flush the device copy is not the fp32 master";
    EXPECT_FALSE(torch::equal(d4[i], p1[i])) << "parameter " << i << " stopped changing";
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, DelayedUpdateGpu, ::testing::Values(1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace

}  // namespace zt_test_engine_async
