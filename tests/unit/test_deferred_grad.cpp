// [Deferred Weight Gradients] (models/deferred_grad.h) on CPU, fp32: for GPT-2's linear and
// LayerNorm, Llama's shared-input linears and the LM-head loss, the weight gradients of an
// input-gradient pass under a collector followed by a weight pass over the collector's roots
// equal one full backward's (within 1e-6 |ref| + 1e-6 max|ref|: the same products, the
// LayerNorm's through ATen's backward with another output mask), with .grad undefined and
// preset (the in-place accumulation paths), and the input gradient too; B leaves every .grad
// untouched. Llama's RMSNorm is ATen's reference on CPU: no closure (the pipeline's fallback).
// The collector itself: nothing is deferred while none is active, and a closure serving two
// parameters runs once.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/deferred_grad.h"
#include "models/gpt2.h"
#include "support/deferred_grad_check.h"

namespace zt::models {
namespace test_deferred_grad {
namespace {

TEST(DeferredWeightGrads, OpsMatchOneFullBackwardOnCpu) {
  test_support::check_deferred_ops(torch::Device(torch::kCPU), torch::kFloat, 1e-6, 1e-6, /*rms_fused=*/false);
}

TEST(DeferredWeightGrads, NothingIsDeferredWithoutAnActiveCollector) {
  torch::nn::Linear lin(4, 3);
  auto x = torch::randn({5, 4}, torch::requires_grad());
  auto gx = torch::autograd::grad({linear(lin, x)}, {x}, {torch::ones({5, 3})})[0];
  EXPECT_TRUE(gx.defined());
  EXPECT_FALSE(lin->weight.grad().defined());
  EXPECT_EQ(active_weight_grad_collector(), nullptr);
}

TEST(DeferredWeightGrads, AClosureForTwoParametersRunsOnce) {
  auto a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({3}, torch::requires_grad());
  WeightGradCollector c;
  int runs = 0;
  {
    CollectWeightGrads collect(&c);
    EXPECT_EQ(active_weight_grad_collector(), &c);
    EXPECT_TRUE(defer_weight_grads({a, b}, [&] {
      ++runs;
      return std::vector<torch::Tensor>{torch::full({2}, 2.0), torch::full({3}, 3.0)};
    }));
  }
  EXPECT_EQ(active_weight_grad_collector(), nullptr);
  EXPECT_FALSE(defer_weight_grads({a}, [] { return std::vector<torch::Tensor>{torch::ones({2})}; }));
  auto roots = c.roots({a, b});
  ASSERT_EQ(roots.size(), 2u);
  torch::autograd::backward(roots, {torch::ones({}), torch::ones({})});
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(c.closures_run(), 1);
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({2}, 2.0)));
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({3}, 3.0)));
  EXPECT_TRUE(c.empty());
}

}  // namespace
}  // namespace test_deferred_grad
}  // namespace zt::models
