// The step backends on their own (src/zero/step_backend.h), driven as ZeroOptimizer drives
// them, over a flat layout of two parameters (6 and 10 elements, two buckets, world 1 on
// every rank; the NVMe backend's set-up agrees over the world, so every rank runs the same
// test with its own swap file). Three AdamW steps with a clip factor:
//  * CpuAdamStep's master equals DeviceStep's (ATen's fused AdamW on the CPU) within rtol
//    1e-5, atol 1e-6 (the kernels order the fp32 arithmetic differently: a few ulps per
//    step), and its uploads put the master into the parameters;
//  * NvmeStep (sub-groups of 8 elements through 2 staging buffers) gives CpuAdamStep's
//    master, moments and parameters bit for bit (the same CPU Adam kernel over the same
//    ranges);
//  * the delayed update lands one step late: after update(t) the parameters hold step
//    t-1's result, and flush() puts step t's in place.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "support/dist_util.h"
#include "zero/step_cpu_adam.h"
#include "zero/step_device.h"
#include "zero/step_nvme.h"
#include "zero/zero_options.h"
#include "zerotrain/comm.h"

namespace zt_test_step_backends {
namespace {

using namespace zt::zero;

constexpr double kBackendLr = 1e-2;
constexpr double kBackendFactor = 0.5;  // a clipping coefficient x 1 / loss scale

ZeroOptions backend_options(const std::string& nvme_dir, bool delayed) {
  ZeroOptions o;
  o.stage = 1;
  o.optimizer.type = "AdamW";
  o.optimizer.params.lr = kBackendLr;
  o.optimizer.params.weight_decay = 0.1;
  o.offload_optimizer = true;
  o.sub_group_numel = 8;
  o.delayed_update = delayed;
  o.nvme = !nvme_dir.empty();
  o.nvme_path = nvme_dir;
  o.buffer_count = 2;
  return o;
}

torch::Tensor backend_grad(int64_t t, int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + t);
  return at::randn({n}, gen);
}

// One backend with its owner's state: the layout, the rule, the fp32 state (none for NVMe)
// and the parameters it writes, started from the same values for every kind.
struct BackendRig {
  ZeroOptions opt;
  ShardLayout L;
  OptimizerRule rule;
  OwnedState state;
  torch::Tensor flat;  // (total) fp32: the parameters
  torch::Tensor grad;  // (total) fp32: this step's gradient
  std::unique_ptr<StepBackend> backend;
  bool device = false;

  BackendRig(const std::string& kind, const std::string& nvme_dir = "", bool delayed = false)
      : opt(backend_options(kind == "nvme" ? nvme_dir : "", delayed)), rule(opt.optimizer, {}), device(kind == "device") {
    L.flat = make_flat_layout({6, 10}, 8, 1, 1);
    L.rank = 0;
    rule.build_group_runs(L, [](int) { return 0; });
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    flat = at::randn({L.flat.total_numel}, gen);
    grad = torch::zeros_like(flat);
    auto grad_of = [this](int b) { return L.owned_in_flat(grad, b); };
    auto dst_of = [this](int b) { return L.owned_in_flat(flat, b); };
    if (kind != "nvme") {
      state.master = flat.clone();
      state.exp_avg = torch::zeros_like(flat);
      state.exp_avg_sq = torch::zeros_like(flat);
    }
    if (kind == "device") {
      backend = std::make_unique<DeviceStep>(L, rule, state, DeviceStepOptions{}, grad_of,
                                             [](int) { return torch::Tensor(); });
      return;
    }
    StepContext ctx{opt, L, rule, state, zt::comm::world_group(), grad_of, dst_of, dst_of, torch::Tensor(),
                    nullptr, nullptr};
    if (kind == "nvme") {
      NvmeStep::check_path(opt, ctx.group, L.owned_numel());
      backend = std::make_unique<NvmeStep>(std::move(ctx));
    } else {
      backend = std::make_unique<CpuAdamStep>(std::move(ctx));
    }
  }

  // One step as ZeroOptimizer::apply_step runs it (the device step writes only the master:
  // its owner casts it into the parameters).
  void step(int64_t t) {
    grad.copy_(backend_grad(t, flat.numel()));
    StepInputs in;
    in.lr = kBackendLr;
    in.step = t;
    const bool wrote = backend->update(kBackendFactor, in);
    if (!wrote && device) flat.copy_(state.master);
    backend->end_step();
  }
  std::vector<torch::Tensor> owned_state() { return backend->state_buffers(false); }
};

void expect_backend_close(const torch::Tensor& got, const torch::Tensor& want, const char* what) {
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6)) << what << ": max diff " << (got - want).abs().max().item<double>();
}

TEST(StepBackends, CpuAdamEqualsTheDeviceStepAndNvmeEqualsCpuAdam) {
  zt::test_support::LocalTempDir dir("step_backends");
  BackendRig device("device"), cpu("cpu"), nvme("nvme", dir.path);
  EXPECT_STREQ(device.backend->name(), "device");
  EXPECT_STREQ(cpu.backend->name(), "cpu_adam");
  EXPECT_STREQ(nvme.backend->name(), "nvme");
  EXPECT_NE(nvme.backend->swap_file().find(dir.path), std::string::npos) << nvme.backend->swap_file();
  const auto before = device.flat.clone();
  for (int64_t t = 1; t <= 3; ++t) {
    device.step(t);
    cpu.step(t);
    nvme.step(t);
  }
  EXPECT_FALSE(torch::allclose(device.flat, before, 1e-5, 1e-6)) << "the steps moved the parameters";
  expect_backend_close(cpu.state.master, device.state.master, "master, CPU Adam vs device");
  expect_backend_close(cpu.state.exp_avg_sq, device.state.exp_avg_sq, "exp_avg_sq, CPU Adam vs device");
  EXPECT_TRUE(torch::equal(cpu.flat, cpu.state.master)) << "the CPU step uploads its master (fp32)";
  const auto c = cpu.owned_state(), n = nvme.owned_state();
  ASSERT_EQ(c.size(), 3u);
  ASSERT_EQ(n.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_TRUE(torch::equal(n[k], c[k])) << "state kind " << k << ", NVMe vs CPU Adam: max diff "
                                          << (n[k] - c[k]).abs().max().item<double>();
  }
  EXPECT_TRUE(torch::equal(nvme.flat, cpu.flat)) << "the NVMe step's uploads";
  EXPECT_GT(nvme.backend->swap_stats().bytes_read, 0);
}

TEST(StepBackends, DelayedUpdateLandsOneStepLate) {
  BackendRig now("cpu"), late("cpu", "", /*delayed=*/true);
  std::vector<torch::Tensor> after{now.flat.clone()};  // after[t]: the parameters after step t
  for (int64_t t = 1; t <= 3; ++t) {
    now.step(t);
    after.push_back(now.flat.clone());
  }
  for (int64_t t = 1; t <= 3; ++t) {
    late.step(t);  // puts step t-1 in place, then starts step t on the worker
    EXPECT_TRUE(torch::equal(late.flat, after[t - 1])) << "after update(" << t << "): step " << t - 1 << "'s parameters";
  }
  EXPECT_TRUE(late.backend->flush());
  EXPECT_TRUE(torch::equal(late.flat, after[3])) << "flush() puts the step in flight in place";
  EXPECT_FALSE(late.backend->flush()) << "nothing left in flight";
}

}  // namespace
}  // namespace zt_test_step_backends
