// [Stale Gradients] (src/common/stale_grad.h) on CUDA, where the writers that overwrite a
// stale gradient are the device paths: the weight GEMMs as beta-0 cuBLAS calls
// (shared_input_linear, residual_linear, GPT-2's LinearFn), the LM head's add_scaled kernel
// in its store mode, and the embedding kernel (which zeroes a stale untied table first).
// Trained with NaN written into every stale gradient after each step, the tiny Llamas and
// GPT-2 follow training with zero_grad's fill (ZT_STALE_GRADS=0): fp32 within 1e-5 (a beta-0
// GEMM may take another cuBLAS kernel), bf16 within 1/64 of the largest weight.
//
//   zerotrain launch -n 2 -- build/zt_gpu --gtest_filter='StaleGradsGpu*'
#include <gtest/gtest.h>

#include "support/gpu_util.h"
#include "support/stale_grads_case.h"

namespace zt_test_stale_grads_gpu {

namespace {

struct Case {
  const char* model;
  int stage;
  const char* dtype;  // nullptr: fp32
};

class StaleGradsGpu : public ::testing::TestWithParam<Case> {};

#ifndef ZT_WITH_CUDA
TEST(StaleGradsGpu, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else
TEST_P(StaleGradsGpu, PoisonedStaleGradientsTrainAsZeroed) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto c = GetParam();
  const auto dev = zt::test_support::rank_device();
  const auto ref = zt_test::stale_grads_run(c.model, c.stage, false, false, dev, c.dtype);
  const auto got = zt_test::stale_grads_run(c.model, c.stage, true, true, dev, c.dtype);
  ASSERT_EQ(ref.params.size(), got.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    ASSERT_TRUE(torch::isfinite(got.params[i]).all().item<bool>()) << "parameter " << i << " read a stale gradient";
    const double scale = c.dtype == nullptr ? 1e-5 : std::max(1.0, ref.params[i].abs().max().item<double>()) / 64;
    EXPECT_LE((ref.params[i] - got.params[i]).abs().max().item<double>(), scale) << "parameter " << i;
  }
  EXPECT_GT(got.trainable, 0);
  EXPECT_EQ(got.poisoned, 3 * got.trainable);
  EXPECT_LT(got.losses.back(), got.losses.front());
}

INSTANTIATE_TEST_SUITE_P(Models, StaleGradsGpu,
                         ::testing::Values(Case{"llama-tied", 0, nullptr}, Case{"llama-untied", 1, nullptr},
                                           Case{"gpt2", 0, nullptr}, Case{"llama-tied", 0, "bf16"},
                                           Case{"llama-untied", 1, "bf16"}, Case{"gpt2", 1, "bf16"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = std::string(i.param.model) + "_z" + std::to_string(i.param.stage) + "_" +
                                           (i.param.dtype ? i.param.dtype : "fp32");
                           for (auto& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });
#endif

}  // namespace

}  // namespace zt_test_stale_grads_gpu
