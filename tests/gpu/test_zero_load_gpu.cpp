// A state loaded into a ZeroOptimizer that has already stepped on the GPU reaches the
// parameters (stages 0-2, bf16): after a fused-kernel step (which writes the compute-dtype
// parameters itself, so the post-step refresh casts nothing), import_state +
// finish_state_import must still cast the loaded fp32 master into the parameters, as it does
// in a fresh optimizer. Engine::load_checkpoint into a trained engine (e.g. after a failed
// asynchronous save, docs/reliability.md) depends on it. Before the fix the parameters kept
// the last step's values. Each rank on its own device, the world group:
//
//   zerotrain launch -n 1 -- build/zt_gpu --gtest_filter='ZeroLoadGpu*'
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "support/gpu_util.h"
#include "zero/zero_optimizer.h"
#include "zerotrain/comm.h"

namespace zt_test_zero_load_gpu {
namespace {

class ZeroLoadGpu : public ::testing::TestWithParam<int> {};

TEST_P(ZeroLoadGpu, ImportIntoASteppedOptimizerReachesTheParameters) {
  // Without a GPU the same checks run on the CPU (the ATen step, which never writes the
  // parameters: there they pass on the old code too; they check the test itself).
  const bool gpu = torch::cuda::is_available() && torch::cuda::device_count() > 0;
  const int stage = GetParam();
  const torch::Device dev = gpu ? zt::test_support::rank_device() : torch::Device(torch::kCPU);
  torch::manual_seed(11);
  auto topt = torch::TensorOptions().device(dev).dtype(torch::kBFloat16);
  auto w1 = torch::randn({8, 16}, topt).requires_grad_();
  auto w2 = torch::randn({16}, topt).requires_grad_();
  zt::zero::ZeroOptions o;
  o.stage = stage;
  o.dtype = torch::kBFloat16;
  o.device = dev;
  o.reduce_bucket_numel = 64;  // several buckets
  o.optimizer.type = "AdamW";
  o.optimizer.params.lr = 1e-2;
  zt::zero::ZeroOptimizer z({w1, w2}, zt::comm::world_group(), o);
  for (int64_t t = 1; t <= 2; ++t) {
    z.begin_backward(/*boundary=*/true, /*first_micro_step=*/true);
    auto loss = w1.to(torch::kFloat).square().sum() + w2.to(torch::kFloat).sum();
    loss.backward();
    z.end_backward();
    zt::zero::StepInputs in;
    in.lr = 1e-2;
    in.step = t;
    z.step(in);
    z.zero_grad();
  }
  // A loaded state: master 0.5 for w1 and 1.5 for w2 (exact in bf16), moments 0.
  z.import_state([](int p, int64_t begin, int64_t end, const std::string& kind) {
    return kind == "master" ? torch::full({end - begin}, 0.5 + p) : torch::zeros({end - begin});
  });
  z.finish_state_import();
  if (gpu) torch::cuda::synchronize();
  const auto a = w1.detach().to(torch::kCPU, torch::kFloat), b = w2.detach().to(torch::kCPU, torch::kFloat);
  EXPECT_TRUE(torch::equal(a, torch::full_like(a, 0.5))) << "stage " << stage << ": w1 is not the loaded master, max |diff| "
                                                         << (a - 0.5).abs().max().item<double>();
  EXPECT_TRUE(torch::equal(b, torch::full_like(b, 1.5))) << "stage " << stage << ": w2 is not the loaded master";
  const auto master = z.gather_master_params();
  EXPECT_TRUE(torch::equal(master[0].to(torch::kCPU), torch::full({8, 16}, 0.5)));
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroLoadGpu, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace
}  // namespace zt_test_zero_load_gpu
