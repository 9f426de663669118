// Per-example attention on CUDA ([SFT Attention] in models/llama.h):
//
//   build/zt_gpu --gtest_filter='SftAttentionCuda*'
//
// Skipped without a CUDA build or a GPU. Runs on cuda:LOCAL_RANK (cuda:0 outside
// `zerotrain launch`).
//  - SftAttentionCuda.PackedExampleGivesItsLogitsAlone: a tiny Llama (GQA, one sliding-window
//    layer) on the GPU, two examples packed in a window, batch of 2 (both orders): with the
//    position ids each example's logits equal its logits alone on the GPU, in fp32 within
//    1e-4 of the largest logit (cuBLAS / SDPA kernels with other sizes), in bf16 within 2e-2;
//    plain causal attention moves the second example's logits by more than 10x that; the
//    fp32 GPU logits equal the CPU model's within 1e-4 relative. The loss backward runs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/llama.h"
#include "support/gpu_util.h"
#include "support/tiny_llama.h"

namespace zt_gpu_test_sft_attention {
namespace {

#ifndef ZT_WITH_CUDA
TEST(SftAttentionCuda, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else

torch::Tensor sftc_ids(std::initializer_list<int64_t> v) { return torch::tensor(std::vector<int64_t>(v), torch::kLong); }

// max |a - b| / max |b|.
double sftc_rel(const torch::Tensor& a, const torch::Tensor& b) {
  const auto af = a.to(torch::kCPU, torch::kDouble), bf = b.to(torch::kCPU, torch::kDouble);
  return (af - bf).abs().max().item<double>() / bf.abs().max().item<double>();
}

TEST(SftAttentionCuda, PackedExampleGivesItsLogitsAlone) {
  if (!at::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto dev = zt::test_support::rank_device();
  auto cfg = zt_test::tiny_qlora_llama_config();
  cfg.sliding_window = 4;
  cfg.layer_sliding = {true, false};
  torch::manual_seed(3);
  zt::models::LlamaForCausalLM cpu(cfg);
  const auto a = sftc_ids({5, 9, 13, 2, 33, 41, 1}), b = sftc_ids({7, 7, 20, 50, 3, 18, 60, 22, 1});
  const auto pa = torch::arange(7, torch::kLong), pb = torch::arange(9, torch::kLong);
  const auto x = torch::stack({torch::cat({a, b}), torch::cat({b, a})});
  const auto pos = torch::stack({torch::cat({pa, pb}), torch::cat({pb, pa})});
  torch::Tensor cpu_packed;
  {
    torch::NoGradGuard ng;
    cpu_packed = cpu->forward(x, pos);
  }
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(dt == torch::kFloat ? "fp32" : "bf16");
    torch::manual_seed(3);
    zt::models::LlamaForCausalLM m(cfg);
    m->to(dev, dt);
    const double tol = dt == torch::kFloat ? 1e-4 : 2e-2;
    torch::NoGradGuard ng;
    const auto xd = x.to(dev), pd = pos.to(dev);
    const auto alone_a = m->forward(a.unsqueeze(0).to(dev))[0], alone_b = m->forward(b.unsqueeze(0).to(dev))[0];
    const auto packed = m->forward(xd, pd);
    EXPECT_LE(sftc_rel(packed[0].narrow(0, 7, 9), alone_b), tol);
    EXPECT_LE(sftc_rel(packed[1].narrow(0, 9, 7), alone_a), tol);
    EXPECT_LE(sftc_rel(packed[0].narrow(0, 0, 7), alone_a), tol);
    const auto plain = m->forward(xd);
    EXPECT_GT(sftc_rel(plain[0].narrow(0, 7, 9), alone_b), 10 * tol);
    if (dt == torch::kFloat) EXPECT_LE(sftc_rel(packed, cpu_packed), 1e-4);
  }
  // Backward through the masked SDPA on the GPU.
  torch::manual_seed(3);
  zt::models::LlamaForCausalLM m(cfg);
  m->to(dev);
  const auto y = torch::randint(1, 64, {2, 16}, torch::kLong).to(dev);
  auto loss = m->loss(x.to(dev), y, pos.to(dev));
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  EXPECT_GT(m->lm_head_weight().grad().abs().sum().item<double>(), 0.0);
}

#endif

}  // namespace
}  // namespace zt_gpu_test_sft_attention
