// [Llama Fused Ops] (models/llama_fused.h, kernels/llama_ops.h) on CUDA against the
// reference ATen formulations the CPU runs (llama_rms_norm_reference, llama_rope_reference,
// llama_swiglu_reference), both on the same device in the same dtype: forward and
// gradients, odd sizes (the scalar paths) and aligned ones (16-byte vectors), then a whole
// small Llama (tests/support/tiny_llama.h) with the fused path on and off.
//
//   build/zt_gpu --gtest_filter='LlamaKernels*'
//
// Skipped without a CUDA build, without the kernels (no nvcc at build time) or without a
// GPU. Tolerances, per element, with M = max |reference| over the tensor:
//  - fp32 forwards: |fused - ref| <= 2e-6 |ref| + 1e-6 M (a few fp32 ulps: other sum
//    orders, FMA contraction, rsqrtf);
//  - fp32 gradients: 1e-5 |ref| + 1e-5 M (row/column sums in other orders; RMSNorm's
//    input gradient cancels between its two terms);
//  - bf16: 2^-6 |ref| + 2^-6 M, i.e. within about 2 bf16 ulps of the element plus 2 ulps
//    of the largest value: the reference rounds to bf16 after each op (RoPE: after both
//    products and the sum; RMSNorm's backward: dy * w), the fused ops once (see
//    llama_fused.h), so elements near cancellation differ by up to about 1.5 ulps of the
//    operands (<= 2^-7 M) rather than of the result.
//  - the whole model: fp32 loss within 1e-5 relative, every parameter gradient within
//    1e-4 |ref| + 1e-4 M; bf16 loss within 1e-2 relative, gradients 2^-3 |ref| + 2^-4 M
//    (two layers of bf16 rounding differences compounded through attention and the MLP).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "models/llama.h"
#include "models/llama_fused.h"
#include "models/shared_linear.h"
#include "support/gpu_util.h"
#include "support/tiny_llama.h"

namespace zt::models {
namespace test_llama_kernels {
namespace {

#ifndef ZT_WITH_CUDA
TEST(LlamaKernels, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else

using zt::test_support::within;

struct Tol {
  double rel, of_max;
};

Tol forward_tol(at::ScalarType t) { return t == at::kFloat ? Tol{2e-6, 1e-6} : Tol{1.0 / 64, 1.0 / 64}; }
Tol grad_tol(at::ScalarType t) { return t == at::kFloat ? Tol{1e-5, 1e-5} : Tol{1.0 / 64, 1.0 / 64}; }

::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected, Tol tol, const std::string& what) {
  if (!actual.defined() && !expected.defined()) return ::testing::AssertionSuccess();
  if (!actual.defined() || !expected.defined()) {
    return ::testing::AssertionFailure() << what << ": a gradient is missing (fused " << actual.defined()
                                         << ", reference " << expected.defined() << ")";
  }
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << what << ": shape " << actual.sizes() << " vs " << expected.sizes();
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure() << what << ": dtype " << actual.scalar_type() << " vs "
                                         << expected.scalar_type();
  }
  const auto a = actual.detach().to(at::kCPU, at::kDouble);
  const auto e = expected.detach().to(at::kCPU, at::kDouble);
  const double m = e.numel() ? e.abs().max().item<double>() : 0.0;
  const auto t = e.abs() * tol.rel + tol.of_max * m;
  return within(a, e, t, what.c_str());
}

class LlamaKernels : public zt::test_support::KernelTest {
 protected:
  void SetUp() override {
    KernelTest::SetUp();
    if (IsSkipped()) return;
    set_llama_fused(true);
  }
  void TearDown() override { set_llama_fused(true); }

  at::Tensor randn(at::IntArrayRef shape, at::ScalarType t, double scale = 1.0) const {
    return (at::randn(shape, at::TensorOptions(at::kFloat).device(dev_)) * scale).to(t);
  }
};

const at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16};

// ---- RMSNorm --------------------------------------------------------------------------

TEST_F(LlamaKernels, RmsNormMatchesReference) {
  // One warp per row (256, 4096 bf16, 24, 2048 fp32), one block per row (67 and 3: scalar;
  // 8192: wider than a warp's registers hold), 9 rows (a partial last block of warps).
  const std::vector<std::vector<int64_t>> shapes = {{2, 3, 67}, {5, 3},    {2, 5, 256}, {3, 4096},
                                                    {7, 24},    {9, 2048}, {2, 8192}};
  for (const auto dt : kDtypes) {
    for (const auto& shape : shapes) {
      for (const bool weight_grad : {true, false}) {
        const std::string what = std::string(c10::toString(dt)) + " " + c10::str(c10::IntArrayRef(shape)) +
                                 (weight_grad ? "" : " frozen weight");
        SCOPED_TRACE(what);
        at::manual_seed(11);
        const int64_t C = shape.back();
        const auto x0 = randn(shape, dt, 3.0);
        const auto w0 = (randn({C}, at::kFloat, 0.2) + 1.0).to(dt);
        const auto dy = randn(shape, dt);
        auto run = [&](bool fused) {
          auto x = x0.clone().requires_grad_(true);
          auto w = w0.clone().requires_grad_(weight_grad);
          auto y = fused ? llama_rms_norm(x, w, 1e-5) : llama_rms_norm_reference(x, w, 1e-5);
          y.backward(dy);
          return std::vector<at::Tensor>{y.detach(), x.grad(), w.grad()};
        };
        const auto f = run(true), r = run(false);
        EXPECT_TRUE(close(f[0], r[0], forward_tol(dt), "y"));
        EXPECT_TRUE(close(f[1], r[1], grad_tol(dt), "dx"));
        if (weight_grad) {
          EXPECT_TRUE(close(f[2], r[2], grad_tol(dt), "dw"));
        } else {
          EXPECT_FALSE(f[2].defined());
        }
      }
    }
  }
}

// fp32: the fused forward is HF's formula to a few fp32 ulps; bf16: y = w * bf16(x * r)
// exactly when r is the same, so at most an ulp apart where x * r sits on a rounding edge.
TEST_F(LlamaKernels, RmsNormBf16RoundsLikeHf) {
  at::manual_seed(5);
  const auto x = randn({64, 2048}, at::kBFloat16, 2.0);
  const auto w = (randn({2048}, at::kFloat, 0.1) + 1.0).to(at::kBFloat16);
  const auto f = llama_rms_norm(x, w, 1e-5), r = llama_rms_norm_reference(x, w, 1e-5);
  const auto differ = f.ne(r).sum().item<int64_t>();
  // Equal bit for bit except where r's last fp32 bit moved x * r across a bf16 rounding
  // boundary: a small fraction of the elements.
  EXPECT_LE(differ, f.numel() / 50) << differ << " of " << f.numel() << " differ";
}

// [Residual Norm]: (norm(x), x) then (x + d, norm(x + d)), d a function of the first norm,
// against the same chain written as separate ops over the plain fused norm: equal bit for
// bit (the sum and the input gradients are rounded where the separate add and autograd's
// accumulation round them), values and every gradient, on each kernel path.
TEST_F(LlamaKernels, ResidualNormsEqualSeparateOps) {
  const std::vector<std::vector<int64_t>> shapes = {{2, 3, 67}, {2, 5, 256}, {3, 4096}, {9, 2048}, {2, 8192}};
  for (const auto dt : kDtypes) {
    for (const auto& shape : shapes) {
      for (const bool weight_grad : {true, false}) {
        SCOPED_TRACE(std::string(c10::toString(dt)) + " " + c10::str(c10::IntArrayRef(shape)) +
                     (weight_grad ? "" : " frozen weights"));
        at::manual_seed(19);
        const int64_t C = shape.back();
        const auto x0 = randn(shape, dt, 2.0);
        const auto w10 = (randn({C}, at::kFloat, 0.2) + 1.0).to(dt);
        const auto w20 = (randn({C}, at::kFloat, 0.2) + 1.0).to(dt);
        const auto dh = randn(shape, dt), dy2 = randn(shape, dt);
        auto run = [&](bool together) {
          auto x = x0.clone().requires_grad_(true);
          auto w1 = w10.clone().requires_grad_(weight_grad), w2 = w20.clone().requires_grad_(weight_grad);
          at::Tensor h, y2;
          if (together) {
            auto [y1, xs] = llama_rms_norm_keep(x, w1, 1e-5);
            std::tie(h, y2) = llama_add_rms_norm(xs, y1 * 0.75 + 0.5, w2, 1e-5);
          } else {
            const auto y1 = llama_rms_norm(x, w1, 1e-5);
            h = x + (y1 * 0.75 + 0.5);
            y2 = llama_rms_norm(h, w2, 1e-5);
          }
          ((h * dh).sum() + (y2 * dy2).sum()).backward();
          return std::vector<at::Tensor>{h.detach(), y2.detach(), x.grad(), w1.grad(), w2.grad()};
        };
        const auto f = run(true), r = run(false);
        const char* names[] = {"h", "y2", "dx", "dw1", "dw2"};
        for (size_t i = 0; i < f.size(); ++i) {
          if (!weight_grad && i >= 3) {
            EXPECT_FALSE(f[i].defined()) << names[i];
            continue;
          }
          ASSERT_TRUE(f[i].defined() && r[i].defined()) << names[i];
          EXPECT_TRUE(f[i].equal(r[i])) << names[i] << ": max |diff| "
                                        << (f[i].to(at::kDouble) - r[i].to(at::kDouble)).abs().max().item<double>();
        }
      }
    }
  }
}

// [Embedding Grad]: the weight gradient added into an existing .grad row by row equals
// ATen's dense backward added by autograd. Bit for bit while no id repeats more than 10
// times (ATen sums a token's rows in partial segments of 10, in position order, as the
// kernel does within one segment); within the gradient tolerance with heavy repeats; with
// no .grad yet, ATen's dense gradient itself.
TEST_F(LlamaKernels, EmbeddingGradAddsIntoGrad) {
  struct Case {
    int64_t V, C, B, T, id_range, pad;
    bool has_grad, exact;
  };
  const std::vector<Case> cases = {{500, 64, 3, 40, 500, -1, true, true},  {500, 64, 3, 40, 500, 7, true, true},
                                   {300, 20, 2, 33, 300, 3, true, true},   {300, 64, 4, 64, 3, 1, true, false},
                                   {500, 64, 3, 40, 500, -1, false, true}, {128, 2048, 2, 512, 128, -1, true, false}};
  for (const auto dt : kDtypes) {
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " V" + std::to_string(c.V) + " C" + std::to_string(c.C) + " ids<" +
                   std::to_string(c.id_range) + " pad " + std::to_string(c.pad) + (c.has_grad ? "" : " no .grad"));
      at::manual_seed(23);
      const auto w0 = randn({c.V, c.C}, dt);
      const auto grad0 = randn({c.V, c.C}, dt);
      auto idx = at::randint(c.id_range, {c.B, c.T}, at::TensorOptions(at::kLong).device(dev_));
      if (c.exact && c.has_grad) {
        // at most 10 repeats of any id: ids from a permutation, each used at most twice
        idx = at::randperm(c.V, at::TensorOptions(at::kLong).device(dev_)).repeat({2}).slice(0, 0, c.B * c.T).view({c.B, c.T});
      }
      if (c.pad >= 0) idx.view(-1).slice(0, 0, 5).fill_(c.pad);
      const auto dy = randn({c.B, c.T, c.C}, dt);
      auto run = [&](bool fused) {
        auto w = w0.clone().requires_grad_(true);
        if (c.has_grad) w.mutable_grad() = grad0.clone();
        auto y = fused ? llama_embedding(w, idx, c.pad) : torch::embedding(w, idx, c.pad);
        y.backward(dy);
        return std::vector<at::Tensor>{y.detach(), w.grad()};
      };
      const auto f = run(true), r = run(false);
      EXPECT_TRUE(f[0].equal(r[0])) << "lookup";
      ASSERT_TRUE(f[1].defined());
      if (c.exact) {
        EXPECT_TRUE(f[1].equal(r[1])) << "grad: max |diff| "
                                      << (f[1].to(at::kDouble) - r[1].to(at::kDouble)).abs().max().item<double>();
      } else {
        EXPECT_TRUE(close(f[1], r[1], grad_tol(dt), "grad"));
      }
      if (c.pad >= 0 && c.has_grad) EXPECT_TRUE(f[1][c.pad].equal(grad0[c.pad])) << "the pad row moved";
    }
  }
}

// residual_linear (down_proj with its residual in the GEMM) against r + x W^T as two ops:
// the forward rounds once instead of twice (within an ulp of the element in bf16), the
// gradients of x and W within the gradient tolerance, the residual's gradient is dy itself.
TEST_F(LlamaKernels, ResidualLinearMatchesAdd) {
  for (const auto dt : kDtypes) {
    for (const bool preset : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + (preset ? " W.grad preset" : ""));
      at::manual_seed(29);
      const auto x0 = randn({2, 37, 64}, dt), w0 = randn({48, 64}, dt, 0.2), r0 = randn({2, 37, 48}, dt, 3.0);
      const auto g0 = randn({48, 64}, dt), dy = randn({2, 37, 48}, dt);
      auto run = [&](bool fused) {
        auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
        auto r = r0.clone().requires_grad_(true);
        if (preset) w.mutable_grad() = g0.clone();
        auto y = fused ? residual_linear(x, w, r) : r + torch::nn::functional::linear(x, w);
        y.backward(dy);
        return std::vector<at::Tensor>{y.detach(), x.grad(), w.grad(), r.grad()};
      };
      const auto f = run(true), ref = run(false);
      EXPECT_TRUE(close(f[0], ref[0], forward_tol(dt), "y"));
      EXPECT_TRUE(close(f[1], ref[1], grad_tol(dt), "dx"));
      EXPECT_TRUE(close(f[2], ref[2], grad_tol(dt), "dW"));
      EXPECT_TRUE(f[3].equal(dy)) << "the residual's gradient is dy";
    }
  }
}

// ---- RoPE -----------------------------------------------------------------------------

TEST_F(LlamaKernels, RopeMatchesReference) {
  struct Case {
    int64_t B, T, H, hd;
    bool per_example;  // cos/sin (B, 1, T, hd) (packed sequences) rather than (T, hd)
    bool transposed;   // x as the model makes it: (B, T, H, hd) viewed (B, H, T, hd)
  };
  const std::vector<Case> cases = {{2, 7, 3, 16, false, true}, {2, 9, 4, 64, false, true}, {1, 5, 2, 6, false, true},
                                   {3, 4, 2, 128, true, true}, {2, 6, 3, 10, true, false}, {1, 1, 1, 2, false, false},
                                   // Llama-3.2-1B's q at micro-batch 4 (more rows than one grid: the
                                   // grid-stride loop), and a larger head-outer layout
                                   {4, 2048, 32, 64, false, true}, {2, 1500, 8, 64, true, false},
                                   // batch x heads past the grid's 65 535 rows of y (the kernel's stride loop)
                                   {3, 3, 22000, 16, true, true}};
  for (const auto dt : kDtypes) {
    for (const auto& c : cases) {
      const std::string what = std::string(c10::toString(dt)) + " B" + std::to_string(c.B) + " T" +
                               std::to_string(c.T) + " H" + std::to_string(c.H) + " hd" + std::to_string(c.hd) +
                               (c.per_example ? " per-example cos" : "") + (c.transposed ? " transposed" : "");
      SCOPED_TRACE(what);
      at::manual_seed(7);
      const auto base = randn({c.B, c.T, c.H, c.hd}, dt, 2.0);
      const auto angles = c.per_example ? at::rand({c.B, 1, c.T, c.hd}, at::TensorOptions(at::kFloat).device(dev_))
                                        : at::rand({c.T, c.hd}, at::TensorOptions(at::kFloat).device(dev_));
      const auto cos = (angles * 6.0).cos().to(dt), sin = (angles * 6.0).sin().to(dt);
      const auto dy = randn({c.B, c.H, c.T, c.hd}, dt);
      auto run = [&](bool fused) {
        auto leaf = (c.transposed ? base.clone() : base.transpose(1, 2).contiguous()).requires_grad_(true);
        auto x = c.transposed ? leaf.transpose(1, 2) : leaf;  // (B, H, T, hd)
        auto y = fused ? llama_rope(x, cos, sin) : llama_rope_reference(x, cos, sin);
        y.backward(dy);
        auto g = c.transposed ? leaf.grad().transpose(1, 2) : leaf.grad();
        return std::vector<at::Tensor>{y.detach(), g};
      };
      const auto f = run(true), r = run(false);
      EXPECT_TRUE(close(f[0], r[0], forward_tol(dt), "y"));
      EXPECT_TRUE(close(f[1], r[1], forward_tol(dt), "dx"));
    }
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------

TEST_F(LlamaKernels, SwigluMatchesReference) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 7, 13}, {1}, {2, 8, 256}, {4, 1000}};
  for (const auto dt : kDtypes) {
    for (const auto& shape : shapes) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " " + c10::str(c10::IntArrayRef(shape)));
      at::manual_seed(3);
      const auto g0 = randn(shape, dt, 4.0), u0 = randn(shape, dt), dy = randn(shape, dt);
      auto run = [&](bool fused) {
        auto g = g0.clone().requires_grad_(true), u = u0.clone().requires_grad_(true);
        auto y = fused ? llama_swiglu(g, u) : llama_swiglu_reference(g, u);
        y.backward(dy);
        return std::vector<at::Tensor>{y.detach(), g.grad(), u.grad()};
      };
      const auto f = run(true), r = run(false);
      EXPECT_TRUE(close(f[0], r[0], forward_tol(dt), "y"));
      EXPECT_TRUE(close(f[1], r[1], forward_tol(dt), "d gate"));
      EXPECT_TRUE(close(f[2], r[2], forward_tol(dt), "d up"));
    }
  }
}

// ---- the whole model ------------------------------------------------------------------

struct StepResult {
  double loss = 0;
  std::vector<std::pair<std::string, at::Tensor>> grads;
};

StepResult step(LlamaForCausalLM& m, const at::Tensor& idx, const at::Tensor& targets, const at::Tensor& pos,
                bool fused) {
  set_llama_fused(fused);
  m->zero_grad();
  auto loss = m->loss(idx, targets, pos);
  loss.backward();
  StepResult r;
  r.loss = loss.item<double>();
  for (const auto& p : m->named_parameters()) {
    const auto g = p.value().grad();
    r.grads.emplace_back(p.key(), g.defined() ? g.detach().clone() : g);
  }
  return r;
}

void expect_model_close(at::ScalarType dt, bool packed, bool checkpointed, at::Device dev) {
  auto m = zt_test::tiny_qlora_llama();
  m->to(dev, dt);
  if (checkpointed) m->set_activation_checkpointing(true, std::nullopt, false);
  at::manual_seed(9);
  const int64_t B = 2, T = 32;
  const auto idx = at::randint(0, 64, {B, T}, at::TensorOptions(at::kLong).device(dev));
  const auto targets = at::randint(0, 64, {B, T}, at::TensorOptions(at::kLong).device(dev));
  at::Tensor pos;
  if (packed) {  // two examples per row: positions 0..11, then 0..19
    pos = at::cat({at::arange(12), at::arange(20)}).repeat({B, 1}).to(dev);
  }
  const auto f = step(m, idx, targets, pos, true);
  const auto r = step(m, idx, targets, pos, false);
  set_llama_fused(true);
  const bool fp32 = dt == at::kFloat;
  EXPECT_NEAR(f.loss, r.loss, (fp32 ? 1e-5 : 1e-2) * std::abs(r.loss));
  const Tol tol = fp32 ? Tol{1e-4, 1e-4} : Tol{1.0 / 8, 1.0 / 16};
  ASSERT_EQ(f.grads.size(), r.grads.size());
  for (size_t i = 0; i < f.grads.size(); ++i) {
    EXPECT_TRUE(close(f.grads[i].second, r.grads[i].second, tol, f.grads[i].first));
  }
}

TEST_F(LlamaKernels, TinyLlamaFp32MatchesUnfused) { expect_model_close(at::kFloat, false, false, dev_); }
TEST_F(LlamaKernels, TinyLlamaBf16MatchesUnfused) { expect_model_close(at::kBFloat16, false, false, dev_); }
TEST_F(LlamaKernels, TinyLlamaPackedPositionsMatchUnfused) { expect_model_close(at::kFloat, true, false, dev_); }
TEST_F(LlamaKernels, TinyLlamaCheckpointedMatchesUnfused) { expect_model_close(at::kBFloat16, false, true, dev_); }

// The switch: off, the CUDA path is the reference formulation bit for bit.
TEST_F(LlamaKernels, SwitchOffIsTheReference) {
  at::manual_seed(1);
  const auto x = randn({4, 6, 64}, at::kBFloat16), w = randn({64}, at::kBFloat16);
  set_llama_fused(false);
  EXPECT_FALSE(llama_fused_enabled());
  EXPECT_TRUE(llama_rms_norm(x, w, 1e-6).equal(llama_rms_norm_reference(x, w, 1e-6)));
  EXPECT_TRUE(llama_swiglu(x, x * 2).equal(llama_swiglu_reference(x, x * 2)));
  set_llama_fused(true);
  EXPECT_TRUE(llama_fused_enabled());
}

#endif  // ZT_WITH_CUDA

}  // namespace
}  // namespace test_llama_kernels
}  // namespace zt::models
