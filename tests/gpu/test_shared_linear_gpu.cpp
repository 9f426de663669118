// [Shared-Input Linears] (models/shared_linear.h) on CUDA, fp32 and bf16: outputs and the
// gradients of x and of every weight against F::linear on the same device in the same
// dtype (one to three weights, a 3-D input, an unused output, a frozen weight), and the
// accumulation into W.grad views of one flat buffer (ZeRO stages 0-1's layout), written in
// place by the GEMM with AccumulateGrad's post hook still running.
//
//   build/zt_gpu --gtest_filter='LlamaSharedLinearGpu*'
//
// Skipped without a CUDA build or without a GPU. Tolerances, per element, with M = max
// |reference|, as tests/gpu/test_llama_kernels.cpp's gradients: fp32 1e-5 |ref| + 1e-5 M
// (the x gradient's sum and the W.grad accumulation in another order); bf16 2^-6 |ref| +
// 2^-6 M (about 2 bf16 ulps: here dx += dy_i W_i and W.grad += dW are rounded once per
// GEMM, F::linear's path rounds each product and then each sum). Outputs are the same mm
// as F::linear's, so they must be equal.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "models/shared_linear.h"
#include "support/gpu_util.h"
#include "support/grad_probe.h"

namespace zt::models {
namespace test_shared_linear_gpu {
namespace {

#ifndef ZT_WITH_CUDA
TEST(LlamaSharedLinearGpu, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else

namespace F = torch::nn::functional;
using zt::test_support::within;

struct Tol {
  double rel, of_max;
};
Tol grad_tol(at::ScalarType t) { return t == at::kFloat ? Tol{1e-5, 1e-5} : Tol{1.0 / 64, 1.0 / 64}; }

::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected, Tol tol,
                                 const std::string& what) {
  if (!actual.defined() && !expected.defined()) return ::testing::AssertionSuccess();
  if (!actual.defined() || !expected.defined()) {
    return ::testing::AssertionFailure() << what << ": a gradient is missing (shared " << actual.defined()
                                         << ", reference " << expected.defined() << ")";
  }
  if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure() << what << ": " << actual.sizes() << " " << actual.scalar_type() << " vs "
                                         << expected.sizes() << " " << expected.scalar_type();
  }
  const auto a = actual.detach().to(at::kCPU, at::kDouble);
  const auto e = expected.detach().to(at::kCPU, at::kDouble);
  const double m = e.numel() ? e.abs().max().item<double>() : 0.0;
  return within(a, e, e.abs() * tol.rel + tol.of_max * m, what.c_str());
}

class LlamaSharedLinearGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    dev_ = zt::test_support::rank_device();
  }
  at::Tensor randn(at::IntArrayRef shape, at::ScalarType t, double scale = 1.0) const {
    return (at::randn(shape, at::TensorOptions(at::kFloat).device(dev_)) * scale).to(t);
  }
  at::Device dev_{at::kCPU};
};

struct Case {
  std::string name;
  std::vector<int64_t> outs;
  std::vector<bool> used, trained;
};

const at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16};

TEST_F(LlamaSharedLinearGpu, MatchesFLinear) {
  // x (2, 96, 256): Llama-like q (256), k and v (64) of one input, MLP-like gate/up (704).
  const std::vector<Case> cases = {
      {"o_proj (one weight)", {256}, {true}, {true}},
      {"gate/up", {704, 704}, {true, true}, {true, true}},
      {"q/k/v", {256, 64, 64}, {true, true, true}, {true, true, true}},
      {"q/k/v, k unused", {256, 64, 64}, {true, false, true}, {true, true, true}},
      {"q/k/v, k frozen", {256, 64, 64}, {true, true, true}, {true, false, true}},
  };
  for (auto dt : kDtypes) {
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " " + c.name);
      at::manual_seed(11);
      const int64_t in = 256;
      const auto x0 = randn({2, 96, in}, dt);
      std::vector<at::Tensor> w0, r;
      for (auto o : c.outs) {
        w0.push_back(randn({o, in}, dt, 0.05));
        r.push_back(randn({2, 96, o}, dt));
      }
      auto run = [&](bool shared) {
        auto x = x0.clone().requires_grad_(true);
        std::vector<at::Tensor> ws;
        for (size_t i = 0; i < w0.size(); ++i) ws.push_back(w0[i].clone().requires_grad_(c.trained[i]));
        std::vector<at::Tensor> ys;
        if (shared) {
          ys = shared_input_linear(x, ws);
        } else {
          for (const auto& w : ws) ys.push_back(F::linear(x, w));
        }
        auto loss = at::zeros({}, at::TensorOptions(at::kFloat).device(dev_));
        for (size_t i = 0; i < ys.size(); ++i) {
          if (c.used[i]) loss = loss + (ys[i] * r[i]).sum().to(at::kFloat);
        }
        loss.backward();
        std::vector<at::Tensor> out = {x.grad()};
        for (const auto& w : ws) out.push_back(w.grad());
        for (const auto& y : ys) out.push_back(y.detach());
        return out;
      };
      const auto got = run(true), ref = run(false);
      const size_t n = c.outs.size();
      EXPECT_TRUE(close(got[0], ref[0], grad_tol(dt), "dx"));
      for (size_t i = 0; i < n; ++i) {
        EXPECT_TRUE(close(got[1 + i], ref[1 + i], grad_tol(dt), "dW" + std::to_string(i)));
        EXPECT_TRUE(at::equal(got[1 + n + i], ref[1 + n + i])) << "y" << i << " differs from F::linear's";
      }
    }
  }
}

TEST_F(LlamaSharedLinearGpu, AccumulatesIntoTheFlatBufferInPlace) {
  for (auto dt : kDtypes) {
    SCOPED_TRACE(c10::toString(dt));
    at::manual_seed(12);
    const int64_t in = 256;
    const std::vector<int64_t> outs = {256, 64, 64};
    const auto x0 = randn({2, 96, in}, dt);
    int64_t total = 0;
    for (auto o : outs) total += o * in;
    const auto v = randn({total}, dt, 0.1);
    auto flat = v.clone();  // the engine's flat gradient buffer
    std::vector<at::Tensor> ws, wref;
    std::vector<const void*> ptrs;
    std::vector<std::unique_ptr<::test_support::GradAccumulatorProbe>> probes;
    int64_t off = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      auto w = randn({outs[i], in}, dt, 0.05).requires_grad_(true);
      w.mutable_grad() = flat.narrow(0, off, outs[i] * in).view({outs[i], in});
      off += outs[i] * in;
      ptrs.push_back(w.grad().data_ptr());
      probes.push_back(std::make_unique<::test_support::GradAccumulatorProbe>(w));
      ws.push_back(w);
      wref.push_back(w.detach().clone().requires_grad_(true));
    }
    const auto ys = shared_input_linear(x0, ws);
    auto loss = at::zeros({}, at::TensorOptions(at::kFloat).device(dev_)), loss_ref = loss.clone();
    for (size_t i = 0; i < ys.size(); ++i) {
      const auto r = randn(ys[i].sizes(), dt);
      loss = loss + (ys[i] * r).sum().to(at::kFloat);
      loss_ref = loss_ref + (F::linear(x0, wref[i]) * r).sum().to(at::kFloat);
    }
    loss.backward();
    loss_ref.backward();
    off = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
      SCOPED_TRACE("W" + std::to_string(i));
      EXPECT_EQ(ws[i].grad().data_ptr(), ptrs[i]) << "W.grad was replaced, not added to";
      const auto vi = v.narrow(0, off, outs[i] * in).view({outs[i], in});
      off += outs[i] * in;
      EXPECT_TRUE(close(ws[i].grad(), vi + wref[i].grad(), grad_tol(dt), "W.grad"));
      EXPECT_EQ(probes[i]->calls, 1) << "AccumulateGrad's post hook";
      EXPECT_EQ(probes[i]->handed, 0) << "a separate dW reached AccumulateGrad: the GEMM did not accumulate";
    }
  }
}

#endif

}  // namespace
}  // namespace test_shared_linear_gpu
}  // namespace zt::models
