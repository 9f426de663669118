// The chunked LM-head loss (src/models/lm_head_loss.cpp) on CUDA: the head's gradient, which
// the GEMM accumulates chunk after chunk into one fp32 buffer (addmm with an fp32 output for
// bf16/fp16 inputs), against an fp64 reference from the same inputs, and at least as close
// to it as the former formulation (each chunk's product rounded to x's dtype, then added in
// fp32). Several chunks, a last short chunk, a padded vocabulary, ignored targets.
//
//   build/zt_gpu --gtest_filter='LmHeadLossGpu*'
//
// Tolerances: fp32: |dw - ref| <= 1e-5 * max|ref|; bf16: <= 2e-2 * max|ref| (the logit
// gradient is rounded to bf16 before the GEMM, as before), and the max error <= 1.05 x the
// former formulation's + 1e-7 * max|ref|. dx (its path is unchanged): 1e-5 in fp32, 5e-2
// in bf16. Then many chunks against one (the first chunk's beta-0 GEMM into an uninitialised
// buffer) and the 2-byte logits of the chunk-rows rule.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <vector>

#include "kernels/aten.h"
#include "kernels/llama_ops.h"
#include "models/lm_head_loss.h"
#include "models/llama.h"
#include "support/gpu_util.h"

namespace zt::models {
namespace test_lm_head_loss_gpu {
namespace {

#ifdef ZT_WITH_CUDA
struct Ref {
  at::Tensor dx, dw;  // fp64
};

// d(mean loss)/dx and /dw in fp64 from x (N, C), w (V, C), targets (-1 = ignored).
Ref reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& t) {
  const auto xd = x.cpu().to(at::kDouble), wd = w.cpu().to(at::kDouble);
  const auto tc = t.cpu();
  const auto valid = tc.ne(-1);
  const auto logits = at::mm(xd, wd.t());
  auto g = at::softmax(logits, 1);
  const auto tt = at::where(valid, tc, at::zeros({}, tc.options()));
  g.scatter_add_(1, tt.unsqueeze(1), at::full({x.size(0), 1}, -1.0, g.options()));
  g.mul_(valid.unsqueeze(1).to(at::kDouble));
  g.div_(valid.sum().to(at::kDouble).clamp_min(1.0));
  return {at::mm(g, wd), at::mm(g.t(), xd)};
}

double max_err(const at::Tensor& a, const at::Tensor& ref) {
  return (a.cpu().to(at::kDouble) - ref).abs().max().item<double>();
}

class LmHeadLossGpu : public test_support::KernelTest {};

TEST_F(LmHeadLossGpu, HeadGradientAccumulatesInFp32AcrossChunks) {
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    for (int64_t chunk : {int64_t{37}, int64_t{64}, int64_t{1000}}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " chunk " + std::to_string(chunk));
      at::manual_seed(7);
      const int64_t N = 300, C = 96, V = 1001;
      auto x = (at::randn({N, C}) * 2).to(on(dt)).requires_grad_(true);
      auto w = (at::randn({V, C}) * 0.5).to(on(dt)).requires_grad_(true);
      auto t = at::randint(0, V, {N}, at::TensorOptions(at::kLong));
      t.narrow(0, 10, 5).fill_(-1);
      t = t.to(dev_);
      auto loss = lm_head_cross_entropy(x, w, t, 64, chunk);
      loss.backward();
      const Ref r = reference(x.detach(), w.detach(), t);
      const double scale_w = r.dw.abs().max().item<double>(), scale_x = r.dx.abs().max().item<double>();
      const double ew = max_err(w.grad(), r.dw), ex = max_err(x.grad(), r.dx);
      if (dt == at::kFloat) {
        EXPECT_LE(ew, 1e-5 * scale_w);
        EXPECT_LE(ex, 1e-5 * scale_x);
        continue;
      }
      EXPECT_LE(ew, 2e-2 * scale_w);
      // dx's path is unchanged (one GEMM per chunk from the same bf16 logit gradient); its
      // error is the bf16 gradient's cancellation over the vocabulary: 0.025 x max|ref| on an
      // H100 for these inputs, so 5e-2 here.
      EXPECT_LE(ex, 5e-2 * scale_x);
      // The former formulation: each chunk's (V, C) product in bf16, added in fp32, then
      // scaled by 1 / (valid rows) and rounded once, from the same bf16 logit gradients.
      at::NoGradGuard ng;
      auto dw_old = at::zeros({V, C}, on(at::kFloat));
      const auto valid = t.ne(-1);
      const double count = std::max<int64_t>(1, valid.sum().item<int64_t>());
      for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t n = std::min(chunk, N - r0);
        const auto xc = x.detach().narrow(0, r0, n);
        auto p = at::softmax(at::mm(xc, w.detach().t()).to(at::kFloat), 1);
        const auto tc = t.narrow(0, r0, n), vc = valid.narrow(0, r0, n);
        p.scatter_add_(1, at::where(vc, tc, at::zeros({}, tc.options())).unsqueeze(1),
                       at::full({n, 1}, -1.0f, p.options()));
        p.mul_(vc.unsqueeze(1));
        dw_old.add_(at::mm(p.to(dt).t(), xc));
      }
      const double ew_old = max_err((dw_old / count).to(dt), r.dw);
      EXPECT_LE(ew, 1.05 * ew_old + 1e-7 * scale_w) << "new " << ew << " former " << ew_old;
    }
  }
}
// Many chunks against one, same inputs: the head gradient's first chunk is written with beta
// 0 into an uninitialised buffer (blocks of NaN were freed into the caching allocator just
// before, so a read of it would show), later chunks accumulate with beta 1. Tolerances
// (M = max |one-chunk|): fp32: loss 1e-5 relative, dw and dx 1e-5 M (sum orders); bf16: loss
// 1e-3 relative, dw and dx 2^-7 |ref| + 2^-8 M (a GEMM of another M may round a bf16 logit
// the other way, and the fp32 sums may round the other way into bf16: an ulp or two).
TEST_F(LmHeadLossGpu, ManyChunksMatchOneChunk) {
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dt));
    at::manual_seed(9);
    const int64_t N = 300, C = 96, V = 1001, Vp = 1024;
    const auto x0 = (at::randn({N, C}) * 2).to(on(dt));
    const auto w0 = (at::randn({V, C}) * 0.5).to(on(dt));
    auto t = at::randint(0, V, {N}, at::TensorOptions(at::kLong));
    t.narrow(0, 3, 4).fill_(-1);
    t = t.to(dev_);
    auto run = [&](int64_t chunk) {
      {
        std::vector<at::Tensor> junk;  // freed at once: what at::empty hands out next
        for (int i = 0; i < 8; ++i) {
          junk.push_back(at::full({Vp, C}, std::numeric_limits<float>::quiet_NaN(), on(at::kFloat)));
        }
      }
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      auto loss = lm_head_cross_entropy(x, w, t, 64, chunk);
      loss.backward();
      return std::vector<at::Tensor>{loss.detach(), x.grad(), w.grad()};
    };
    const auto one = run(N), many = run(64);  // 1 chunk; 5 chunks, the last one 44 rows
    for (const auto& g : many) EXPECT_TRUE(at::isfinite(g).all().item<bool>()) << "a NaN/inf got in";
    const bool f32 = dt == at::kFloat;
    EXPECT_NEAR(many[0].item<double>(), one[0].item<double>(), (f32 ? 1e-5 : 1e-3) * std::abs(one[0].item<double>()));
    auto expect_close = [](const at::Tensor& a, const at::Tensor& e, double rel, double of_max, const char* what) {
      const auto ad = a.cpu().to(at::kDouble), ed = e.cpu().to(at::kDouble);
      const double m = ed.abs().max().item<double>();
      const auto excess = (ad - ed).abs() - (ed.abs() * rel + of_max * m);
      EXPECT_LE(excess.max().item<double>(), 0.0) << what << ": max |diff| " << (ad - ed).abs().max().item<double>()
                                                  << ", max |ref| " << m;
    };
    expect_close(many[1], one[1], f32 ? 0.0 : 1.0 / 128, f32 ? 1e-5 : 1.0 / 256, "dx");
    expect_close(many[2], one[2], f32 ? 0.0 : 1.0 / 128, f32 ? 1e-5 : 1.0 / 256, "dw");
  }
}

// The chunk-rows rule's input (models/llama.h llama_loss_chunk_rows): on the fused path the
// logits are in x's dtype, so bf16/fp16 count 2 bytes each and Llama-3.2-1B's chunk doubles.
// An existing W.grad (the engine's gradient buffer at ZeRO 0-1): the scaled fp32 sum is added
// into it by kernels::add_scaled in one pass. The kernel against ATen's addcmul_ on the same
// operands (odd sizes take the scalar path), then end to end: W.grad - G0 against a fresh
// backward's gradient, within one ulp of |G0| + M (each side rounds once).
TEST_F(LmHeadLossGpu, AddsIntoAnExistingGradInOnePass) {
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t n : {int64_t{4096}, int64_t{1001}}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " n " + std::to_string(n));
      at::manual_seed(3);
      auto dst = at::randn({n}).to(on(dt));
      const auto src = at::randn({n}, on(at::kFloat)) * 3;
      const auto scale = at::full({}, 0.37f, on(at::kFloat));
      auto want = dst.clone();
      want.addcmul_(src, scale);
      kernels::AddScaledArgs a;
      a.dst = dst.data_ptr();
      a.src = src.data_ptr<float>();
      a.scale = scale.data_ptr<float>();
      a.type = kernels::dtype_of(dt);
      a.n = n;
      kernels::add_scaled(a, kernels::current_stream(dev_));
      const double m = want.abs().max().item<double>();
      // One rounding of the same fp32 value; an FMA may round the product differently: 1 ulp.
      const double ulp = dt == at::kFloat ? 1.2e-7 : dt == at::kBFloat16 ? 7.9e-3 : 9.8e-4;
      EXPECT_LE((dst.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>(), ulp * m);
    }
  }
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dt));
    at::manual_seed(9);
    const int64_t N = 200, C = 64, V = 777;
    const auto x = (at::randn({N, C}) * 2).to(on(dt));
    const auto w0 = (at::randn({V, C}) * 0.5).to(on(dt));
    const auto t = at::randint(0, V, {N}, at::TensorOptions(at::kLong)).to(dev_);
    auto fresh = w0.clone().requires_grad_(true);
    lm_head_cross_entropy(x, fresh, t, 64, 50).backward();
    auto acc = w0.clone().requires_grad_(true);
    const auto g0 = at::randn({V, C}).to(on(dt)) * 1e-3;
    acc.mutable_grad() = g0.clone();
    const void* before = acc.grad().data_ptr();
    lm_head_cross_entropy(x, acc, t, 64, 50).backward();
    EXPECT_EQ(acc.grad().data_ptr(), before) << "the gradient was not added in place";
    const auto d = (acc.grad().to(at::kDouble) - g0.to(at::kDouble) - fresh.grad().to(at::kDouble)).abs();
    const double m = fresh.grad().abs().max().item<double>();
    // Each side rounds g0 + s (or s) once: half an ulp of |g0| + M each, twice.
    const double ulp = dt == at::kFloat ? 1.2e-7 : 7.9e-3;
    const auto bound = (g0.to(at::kDouble).abs() + m) * ulp + 1e-12;
    EXPECT_TRUE((d <= bound).all().item<bool>()) << "max diff " << d.max().item<double>() << " (M " << m << ")";
  }
}

TEST_F(LmHeadLossGpu, LogitBytesFollowTheFusedPath) {
  EXPECT_EQ(lm_head_logit_bytes(at::zeros({2, 3}, on(at::kBFloat16))), 2);
  EXPECT_EQ(lm_head_logit_bytes(at::zeros({2, 3}, on(at::kHalf))), 2);
  EXPECT_EQ(lm_head_logit_bytes(at::zeros({2, 3}, on(at::kFloat))), 4);
  EXPECT_EQ(lm_head_logit_bytes(at::zeros({2, 3}, at::kBFloat16)), 4);  // the CPU: unfused
  const auto c = named_llama("llama3.2-1b");
  EXPECT_EQ(llama_loss_chunk_rows(c, lm_head_logit_bytes(at::zeros({2, 3}, on(at::kBFloat16)))), 2092);
}
#else
TEST(LmHeadLossGpu, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#endif

}  // namespace
}  // namespace test_lm_head_loss_gpu
}  // namespace zt::models
