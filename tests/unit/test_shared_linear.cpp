// [Shared-Input Linears] (models/shared_linear.h), the bias-less linears Llama runs as one
// autograd node: outputs equal to F::linear's (the same mm), gradients of x and of every
// weight equal to F::linear's within 1e-6 (fp32 inputs of magnitude ~1, sums of at most three
// products of length <= 12 in another order: a few ulps), for one to three weights, a 3-D
// input, an unused output and a frozen weight; and the accumulation path: a W.grad that
// already exists (a view of one flat buffer, as ZeRO stages 0-1 set it) is added to in place
// and AccumulateGrad's post hooks (the gradient reducer's ready hooks) still run.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "models/shared_linear.h"
#include "support/grad_probe.h"

namespace zt::models {
namespace test_shared_linear {
namespace {

namespace F = torch::nn::functional;

constexpr double kTol = 1e-6;

::testing::AssertionResult close(const torch::Tensor& a, const torch::Tensor& e, const std::string& what) {
  if (!a.defined() && !e.defined()) return ::testing::AssertionSuccess();
  if (a.defined() != e.defined()) {
    return ::testing::AssertionFailure() << what << ": defined " << a.defined() << " vs reference " << e.defined();
  }
  if (a.sizes() != e.sizes()) return ::testing::AssertionFailure() << what << ": " << a.sizes() << " vs " << e.sizes();
  const double err = (a - e).abs().max().item<double>();
  if (err <= kTol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max |diff| " << err << " > " << kTol;
}

struct Case {
  std::string name;
  std::vector<int64_t> outs;  // out_i of each weight
  std::vector<bool> used;     // whether the loss reads y_i
  std::vector<bool> trained;  // whether W_i requires grad
};

// x (2, 5, 12); loss = sum_i <y_i, r_i> over the used outputs. The same leaves' copies go
// through F::linear (the reference) and shared_input_linear.
void expect_matches_f_linear(const Case& c) {
  SCOPED_TRACE(c.name);
  torch::manual_seed(3);
  const int64_t in = 12;
  const auto x0 = torch::randn({2, 5, in});
  std::vector<torch::Tensor> w0, r;
  for (auto o : c.outs) {
    w0.push_back(torch::randn({o, in}) * 0.3);
    r.push_back(torch::randn({2, 5, o}));
  }
  auto run = [&](bool shared) {
    auto x = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> ws;
    for (size_t i = 0; i < w0.size(); ++i) ws.push_back(w0[i].clone().requires_grad_(c.trained[i]));
    std::vector<torch::Tensor> ys;
    if (shared) {
      ys = shared_input_linear(x, ws);
    } else {
      for (const auto& w : ws) ys.push_back(F::linear(x, w));
    }
    auto loss = torch::zeros({});
    for (size_t i = 0; i < ys.size(); ++i) {
      if (c.used[i]) loss = loss + (ys[i] * r[i]).sum();
    }
    loss.backward();
    std::vector<torch::Tensor> out = {x.grad()};
    for (const auto& w : ws) out.push_back(w.grad());
    for (const auto& y : ys) out.push_back(y.detach());
    return out;
  };
  const auto got = run(true), ref = run(false);
  const size_t n = c.outs.size();
  EXPECT_TRUE(close(got[0], ref[0], "dx"));
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(close(got[1 + i], ref[1 + i], "dW" + std::to_string(i)));
    if (!c.used[i] || !c.trained[i]) EXPECT_FALSE(got[1 + i].defined()) << "W" << i << " has a gradient";
    const auto& y = got[1 + n + i];
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 5, c.outs[i]}));
    EXPECT_TRUE(torch::equal(y, ref[1 + n + i])) << "y" << i << " differs from F::linear's";
  }
}

TEST(LlamaSharedLinear, MatchesFLinear) {
  const std::vector<Case> cases = {
      {"one weight", {7}, {true}, {true}},
      {"two weights", {7, 9}, {true, true}, {true, true}},
      {"three weights (q, k, v)", {8, 4, 4}, {true, true, true}, {true, true, true}},
      {"an unused output", {8, 4, 4}, {true, false, true}, {true, true, true}},
      {"a frozen weight", {8, 4, 4}, {true, true, true}, {true, false, true}},
      {"only a frozen weight used", {8, 4}, {true, false}, {false, true}},
  };
  for (const auto& c : cases) expect_matches_f_linear(c);
}

TEST(LlamaSharedLinear, NothingTrainedNeedsNoGraph) {
  const auto x = torch::randn({3, 4});
  const auto w = torch::randn({5, 4});
  const auto y = shared_input_linear(x, {w});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_FALSE(y[0].requires_grad());
  EXPECT_TRUE(torch::equal(y[0], F::linear(x, w)));
}

TEST(LlamaSharedLinear, AccumulatesIntoAnExistingGradInPlace) {
  torch::manual_seed(5);
  const int64_t in = 6;
  const std::vector<int64_t> outs = {4, 2, 2};
  const auto x0 = torch::randn({3, 2, in});
  // W.grad as views of one flat buffer holding v, as grad_reducer.cpp allocate() sets them.
  int64_t total = 0;
  for (auto o : outs) total += o * in;
  const auto v = torch::randn({total});
  auto flat = v.clone();
  std::vector<torch::Tensor> ws, wref;
  std::vector<const void*> ptrs;
  std::vector<std::unique_ptr<::test_support::GradAccumulatorProbe>> probes;
  int64_t off = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    auto w = (torch::randn({outs[i], in}) * 0.3).requires_grad_(true);
    w.mutable_grad() = flat.narrow(0, off, outs[i] * in).view({outs[i], in});
    off += outs[i] * in;
    ptrs.push_back(w.grad().data_ptr());
    probes.push_back(std::make_unique<::test_support::GradAccumulatorProbe>(w));
    ws.push_back(w);
    wref.push_back(w.detach().clone().requires_grad_(true));
  }
  const auto ys = shared_input_linear(x0, ws);
  const auto yr = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& w : wref) out.push_back(F::linear(x0, w));
    return out;
  }();
  auto loss = torch::zeros({}), loss_ref = torch::zeros({});
  for (size_t i = 0; i < ys.size(); ++i) {
    const auto r = torch::randn(ys[i].sizes());
    loss = loss + (ys[i] * r).sum();
    loss_ref = loss_ref + (yr[i] * r).sum();
  }
  loss.backward();
  loss_ref.backward();
  off = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    SCOPED_TRACE("W" + std::to_string(i));
    EXPECT_EQ(ws[i].grad().data_ptr(), ptrs[i]) << "W.grad was replaced, not added to";
    const auto vi = v.narrow(0, off, outs[i] * in).view({outs[i], in});
    off += outs[i] * in;
    EXPECT_TRUE(close(ws[i].grad(), vi + wref[i].grad(), "W.grad"));
    EXPECT_EQ(probes[i]->calls, 1) << "AccumulateGrad's post hook";
    EXPECT_EQ(probes[i]->handed, 0) << "a separate dW reached AccumulateGrad: the GEMM did not accumulate";
  }
  // The buffer itself holds the sums (the views were written through).
  EXPECT_TRUE(close(flat.narrow(0, 0, outs[0] * in).view({outs[0], in}), ws[0].grad(), "flat buffer"));
}

// A W.grad the GEMM cannot write (here a transposed, non-contiguous view) gets a fresh dW,
// which AccumulateGrad adds as it would F::linear's.
TEST(LlamaSharedLinear, NonContiguousGradTakesAFreshProduct) {
  torch::manual_seed(6);
  const auto x = torch::randn({5, 3});
  auto w = torch::randn({4, 3}).requires_grad_(true);
  const auto v = torch::randn({3, 4});
  w.mutable_grad() = v.clone().t();  // (4, 3), strides (1, 4)
  ::test_support::GradAccumulatorProbe probe(w);
  shared_input_linear(x, {w})[0].sum().backward();
  EXPECT_EQ(probe.handed, 1);
  const auto dw = at::mm(torch::ones({5, 4}).t(), x);
  EXPECT_TRUE(close(w.grad(), v.t() + dw, "W.grad"));
}

}  // namespace
}  // namespace test_shared_linear
}  // namespace zt::models
