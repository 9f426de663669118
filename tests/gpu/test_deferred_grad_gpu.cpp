// [Deferred Weight Gradients] (models/deferred_grad.h) on CUDA, fp32 and bf16: the fused
// paths -- LayerNormFn's and RmsNormFn's parameter-gradient kernel, the LM head's fused
// softmax-cross-entropy with its fp32 head sum, the addmm accumulation into W.grad -- give
// the same weight gradients from the closures of an input-gradient pass as from one full
// backward (tests/support/deferred_grad_check.h), and RmsNormFn defers (on CPU it is ATen's
// reference and does not).
//
//   build/zt_gpu --gtest_filter='DeferredWeightGradsGpu*'
//
// Tolerances: the closures run the same kernels on the same saved tensors as the full
// backward, so fp32 agrees to 1e-6 |ref| + 1e-6 max|ref|; bf16 to 2^-7 (one bf16 ulp, for
// an accumulation rounded in another order). Skipped without a CUDA build or a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/llama_fused.h"
#include "support/deferred_grad_check.h"
#include "support/gpu_util.h"

namespace zt::models {
namespace test_deferred_grad_gpu {
namespace {

#ifndef ZT_WITH_CUDA
TEST(DeferredWeightGradsGpu, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else
TEST(DeferredWeightGradsGpu, OpsMatchOneFullBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto dev = test_support::rank_device();
  ASSERT_TRUE(llama_fused_enabled()) << "RmsNormFn is off (ZT_LLAMA_FUSED=0?)";
  test_support::check_deferred_ops(dev, torch::kFloat, 1e-6, 1e-6, /*rms_fused=*/true);
  test_support::check_deferred_ops(dev, torch::kBFloat16, 1.0 / 128, 1.0 / 128, /*rms_fused=*/true);
}
#endif

}  // namespace
}  // namespace test_deferred_grad_gpu
}  // namespace zt::models
