// QLoRA on the GPU ([NF4 On Device] in src/quant/nf4.h, [QLoRA Base] in src/lora/qlora.h):
//
//   build/zt_gpu --gtest_filter='Nf4Kernel*:QLoraCuda*'
//
// Skipped without a CUDA build, without the kernels (no nvcc at build time) or without a
// GPU. Runs on cuda:LOCAL_RANK (cuda:0 outside `zerotrain launch`).
//
//  - Nf4Kernel.EqualsTheCpuReferenceBitForBit: kernels::nf4_dequantize (through
//    dequantize_nf4_as and called directly into a guarded buffer) equals the CPU reference
//    dequantize_nf4(q).to(dt) bit for bit in fp32, bf16 and fp16 (the kernel rounds after
//    each product and sum as the reference does; any FMA contraction or indexing slip
//    shows): odd counts, partial last blocks of 64 and of 256 absmaxes, an all-zero
//    block, a Llama-3-8B MLP shape; nothing outside out[0, numel) is written.
//  - Nf4Kernel.BadArgumentsThrow.
//  - QLoraCuda.ForwardBackwardEqualsTheCpu: a tiny Llama with NF4 bases on all seven
//    projections, moved to the GPU (the NF4 tensors follow on the first forward): fp32
//    logits, loss and adapter gradients equal the CPU model's within 1e-4 relative to their
//    largest magnitude (cuBLAS vs CPU GEMM orders; TF32 is off in LibTorch by default);
//    in bf16 the loss within 5e-2 relative (bf16 weights and activations).
//  - QLoraCuda.GraphHoldsNoDequantizedWeight: after y = nf4_linear(x, W) in bf16 the CUDA
//    bytes still allocated beyond x are far below W's bf16 size; F::linear on the
//    dequantized W keeps W (the count sees it).
//  - QLoraCuda.FusedLoraEqualsUnfused ([Fused LoRA Linear] in src/lora/lora_linear.h): one
//    adapter of Llama-3-8B's q_proj shape (4096 -> 4096, r 16, scaling 2, 1024 tokens as
//    (2, 512, 4096)) on a plain bf16/fp32 base and on an NF4 base: the fused path's output
//    and x/A/B gradients equal the unfused path's within 1e-5 (fp32; TF32 off) and 3e-2
//    (bf16) of the largest magnitude; the fused NF4 graph keeps no dequantized weight
//    (bytes held after forward < W's bf16 size / 8). Prints forward+backward times of both
//    paths (bf16, 20 iterations) for the record; asserts nothing on them.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/nf4.h"
#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/qlora.h"
#include "models/llama.h"
#include "quant/nf4.h"
#include "support/gpu_util.h"

#ifdef ZT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include "support/tiny_llama.h"
#endif

namespace zt_gpu_test_qlora {
namespace {

#ifndef ZT_WITH_CUDA
TEST(Nf4Kernel, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)"; }
#else

namespace F = torch::nn::functional;
using zt::test_support::bits;
using zt::test_support::to_dtype;

constexpr int64_t kGuard = 16;

torch::Tensor weights(const std::vector<int64_t>& shape, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor x = at::randn(shape, g);
  if (x.dim() == 2) x = x * at::rand({shape[0], 1}, g).mul(3.0).add(0.01);
  if (x.numel() >= 2 * zt::quant::kNf4BlockSize) {
    x.view(-1).narrow(0, zt::quant::kNf4BlockSize, zt::quant::kNf4BlockSize).zero_();
  }
  return x;
}

::testing::AssertionResult bitwise_equal(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = bits(got.cpu()).reshape(-1), w = bits(want.cpu()).reshape(-1);
  if (g.numel() != w.numel()) return ::testing::AssertionFailure() << g.numel() << " vs " << w.numel() << " elements";
  const at::Tensor bad = (g != w).nonzero();
  if (bad.size(0) == 0) return ::testing::AssertionSuccess();
  const int64_t j = bad[0][0].item<int64_t>();
  return ::testing::AssertionFailure() << bad.size(0) << " of " << g.numel() << " elements differ; first at [" << j
                                       << "]: " << got.cpu().reshape(-1)[j].item<double>() << " vs "
                                       << want.cpu().reshape(-1)[j].item<double>();
}

using Nf4Kernel = zt::test_support::KernelTest;

TEST_F(Nf4Kernel, EqualsTheCpuReferenceBitForBit) {
  const std::vector<std::vector<int64_t>> shapes = {{1},         {7},           {64},          {100},
                                                    {37, 131},   {64 * 300 + 37}, {96, 200}, {14336, 4096}};
  uint64_t seed = 100;
  for (const auto& shape : shapes) {
    const torch::Tensor x = weights(shape, ++seed);
    const zt::quant::Nf4Tensor q = zt::quant::quantize_nf4(x);
    const torch::Tensor ref = zt::quant::dequantize_nf4(q);
    const zt::quant::Nf4Tensor qd = zt::quant::nf4_to(q, dev_);
    ASSERT_TRUE(zt::quant::nf4_on(qd, dev_));
    for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(::testing::Message() << "shape " << x.sizes() << " " << dt);
      const torch::Tensor got = zt::quant::dequantize_nf4_as(qd, dt);
      ASSERT_TRUE(got.is_cuda());
      ASSERT_EQ(got.sizes(), x.sizes());
      ASSERT_EQ(got.scalar_type(), dt);
      EXPECT_TRUE(bitwise_equal(got, ref.to(dt)));
      // Direct launch into a buffer with NaN guards on both sides.
      const torch::Tensor buf = at::full({q.numel + 2 * kGuard}, std::numeric_limits<float>::quiet_NaN(), on(dt));
      zt::kernels::Nf4DequantArgs a;
      a.packed = qd.packed.data_ptr<uint8_t>();
      a.qabsmax = qd.qabsmax.data_ptr<uint8_t>();
      a.absmax2 = qd.absmax2.data_ptr<float>();
      a.offset = qd.offset;
      a.numel = qd.numel;
      a.nf4_code = zt::quant::nf4_code().data();
      a.code2 = zt::quant::dynamic_map_code().data();
      a.out = buf.narrow(0, kGuard, q.numel).data_ptr();
      a.type = to_dtype(dt);
      zt::kernels::nf4_dequantize(a, stream());
      EXPECT_TRUE(bitwise_equal(buf.narrow(0, kGuard, q.numel), ref.to(dt)));
      EXPECT_TRUE(buf.narrow(0, 0, kGuard).isnan().all().item<bool>()) << "wrote before out";
      EXPECT_TRUE(buf.narrow(0, kGuard + q.numel, kGuard).isnan().all().item<bool>()) << "wrote past out";
    }
  }
}

TEST_F(Nf4Kernel, BadArgumentsThrow) {
  zt::kernels::Nf4DequantArgs a;
  a.numel = -1;
  EXPECT_THROW(zt::kernels::nf4_dequantize(a, stream()), std::invalid_argument);
  a.numel = 10;  // null pointers
  EXPECT_THROW(zt::kernels::nf4_dequantize(a, stream()), std::invalid_argument);
  a.numel = 0;  // nothing to do, nothing read
  EXPECT_NO_THROW(zt::kernels::nf4_dequantize(a, stream()));
}

zt::models::LlamaForCausalLM tiny_llama() { return zt_test::tiny_qlora_llama(); }

// A tiny Llama with random non-zero adapters on all seven projections and NF4 bases.
struct QModel {
  zt::models::LlamaForCausalLM m{nullptr};
  zt::lora::LoraModel lm;
};
QModel qlora_llama() {
  QModel r;
  r.m = tiny_llama();
  zt::lora::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  r.lm = zt::lora::apply_lora(*r.m, zt::lora::lora_space(*r.m).sites, o);
  torch::NoGradGuard ng;
  auto g = at::make_generator<at::CPUGeneratorImpl>(17);
  for (const auto& a : r.lm.adapters) {
    a.adapter->lora_A.copy_(at::randn(a.adapter->lora_A.sizes(), g) * 0.3);
    a.adapter->lora_B.copy_(at::randn(a.adapter->lora_B.sizes(), g) * 0.3);
  }
  zt::lora::quantize_lora_bases(r.lm);
  return r;
}

double rel_diff(const torch::Tensor& got, const torch::Tensor& want) {
  const torch::Tensor g = got.detach().cpu().to(at::kDouble), w = want.detach().cpu().to(at::kDouble);
  return (g - w).abs().max().item<double>() / std::max(1e-30, w.abs().max().item<double>());
}

using QLoraCuda = zt::test_support::KernelTest;

TEST_F(QLoraCuda, ForwardBackwardEqualsTheCpu) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  const torch::Tensor ids = at::randint(0, 64, {2, 12}, g);

  QModel cpu = qlora_llama();
  cpu.m->eval();
  const torch::Tensor cpu_logits = cpu.m->forward(ids).detach();
  const torch::Tensor cpu_loss = cpu.m->loss(ids, ids);
  cpu_loss.backward();

  QModel gpu = qlora_llama();
  gpu.m->eval();
  gpu.m->to(dev_);
  const torch::Tensor ids_d = ids.to(dev_);
  const torch::Tensor gpu_logits = gpu.m->forward(ids_d);
  for (const auto& a : gpu.lm.adapters) {
    auto q = std::dynamic_pointer_cast<zt::lora::QLoraAdapterImpl>(a.adapter.ptr());
    ASSERT_TRUE(q) << a.site.path;
    EXPECT_TRUE(zt::quant::nf4_on(q->nf4(), dev_)) << a.site.path << ": the NF4 tensors follow the activations";
  }
  EXPECT_LE(rel_diff(gpu_logits, cpu_logits), 1e-4);
  const torch::Tensor gpu_loss = gpu.m->loss(ids_d, ids_d);
  EXPECT_LE(rel_diff(gpu_loss, cpu_loss), 1e-5);
  gpu_loss.backward();
  for (size_t i = 0; i < cpu.lm.adapters.size(); ++i) {
    const auto& c = cpu.lm.adapters[i];
    const auto& d = gpu.lm.adapters[i];
    SCOPED_TRACE(c.site.path);
    ASSERT_TRUE(d.adapter->lora_A.grad().defined());
    EXPECT_LE(rel_diff(d.adapter->lora_A.grad(), c.adapter->lora_A.grad()), 1e-4);
    EXPECT_LE(rel_diff(d.adapter->lora_B.grad(), c.adapter->lora_B.grad()), 1e-4);
  }

  // bf16 on the GPU: the base dequantized straight to bf16 (no fp32 weight).
  QModel bf = qlora_llama();
  bf.m->eval();
  bf.m->to(dev_, at::kBFloat16);
  const torch::Tensor bf_loss = bf.m->loss(ids_d, ids_d);
  EXPECT_LE(rel_diff(bf_loss, cpu_loss), 5e-2);
  bf_loss.backward();
  for (const auto& a : bf.lm.adapters) {
    ASSERT_TRUE(a.adapter->lora_B.grad().defined()) << a.site.path;
    EXPECT_TRUE(a.adapter->lora_B.grad().isfinite().all().item<bool>()) << a.site.path;
  }
}

int64_t cuda_allocated(const at::Device& d) {
  const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
  return st.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
}

TEST_F(QLoraCuda, GraphHoldsNoDequantizedWeight) {
  constexpr int64_t kOut = 4096, kIn = 4096;
  constexpr int64_t kWBytes = kOut * kIn * 2;  // bf16: 32 MiB
  auto g = at::make_generator<at::CPUGeneratorImpl>(13);
  const auto q = zt::quant::nf4_to(zt::quant::quantize_nf4(at::randn({kOut, kIn}, g) * 0.02), dev_);
  const torch::Tensor x0 = at::randn({8, kIn}, g).to(dev_, at::kBFloat16);
  int64_t held_new = 0, held_old = 0;
  torch::Tensor grad_new, grad_old;
  {
    const torch::Tensor x = x0.clone().requires_grad_(true);
    const int64_t before = cuda_allocated(dev_);
    torch::Tensor y = zt::lora::nf4_linear(x, q);
    held_new = cuda_allocated(dev_) - before;
    y.sum().backward();
    grad_new = x.grad();
  }
  {
    const torch::Tensor x = x0.clone().requires_grad_(true);
    const int64_t before = cuda_allocated(dev_);
    torch::Tensor y = F::linear(x, zt::quant::dequantize_nf4_as(q, at::kBFloat16));
    held_old = cuda_allocated(dev_) - before;
    y.sum().backward();
    grad_old = x.grad();
  }
  EXPECT_LT(held_new, kWBytes / 8) << "nf4_linear's graph keeps " << held_new << " bytes";
  EXPECT_GE(held_old, kWBytes) << "F::linear on the dequantized W should keep it, kept " << held_old;
  EXPECT_LE(rel_diff(grad_new, grad_old), 1e-2);  // the same bf16 W; bf16 GEMMs (one rounding)
}

TEST_F(QLoraCuda, FusedLoraEqualsUnfused) {
  constexpr int64_t kIn = 4096, kOut = 4096, kR = 16;
  auto g = at::make_generator<at::CPUGeneratorImpl>(31);
  const torch::Tensor w = at::randn({kOut, kIn}, g) * 0.02;
  const torch::Tensor a0 = at::randn({kR, kIn}, g) * 0.02, b0 = at::randn({kOut, kR}, g) * 0.02;
  const torch::Tensor x0 = at::randn({2, 512, kIn}, g), gy0 = at::randn({2, 512, kOut}, g);
  for (bool nf4 : {false, true}) {
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string(nf4 ? "nf4 " : "plain ") + c10::toString(dt));
      torch::nn::Linear lin(torch::nn::LinearOptions(kIn, kOut).bias(false));
      zt::lora::LoraAdapter ad(kIn, kOut, kR, 2.0, 0.0, torch::TensorOptions());
      {
        torch::NoGradGuard ng;
        lin->weight.copy_(w);
        ad->lora_A.copy_(a0);
        ad->lora_B.copy_(b0);
      }
      if (nf4) {
        auto q = std::make_shared<zt::lora::QLoraAdapterImpl>(*ad, w, torch::Tensor());
        ad = zt::lora::LoraAdapter(std::static_pointer_cast<zt::lora::LoraAdapterImpl>(q));
        lin->weight.set_data(torch::empty({0}));
      }
      lin->to(dev_, dt);
      ad->to(dev_, dt);
      lin->weight.set_requires_grad(false);
      const auto& l = lin;
      auto base = [&l](const torch::Tensor& t) { return F::linear(t, l->weight); };
      const torch::Tensor x = x0.to(dev_, dt), gy = gy0.to(dev_, dt);
      auto run = [&](bool fused) {
        ad->set_fused(fused);
        ad->lora_A.mutable_grad() = torch::Tensor();
        ad->lora_B.mutable_grad() = torch::Tensor();
        const torch::Tensor xi = x.clone().requires_grad_(true);
        torch::Tensor y = ad->adapt(xi, *lin, base);
        y.backward(gy);
        return std::vector<torch::Tensor>{y.detach(), xi.grad(), ad->lora_A.grad(), ad->lora_B.grad()};
      };
      const auto fu = run(true), un = run(false);
      const double tol = dt == at::kFloat ? 1e-5 : 3e-2;
      const char* what[] = {"y", "grad x", "grad A", "grad B"};
      for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(fu[i].defined()) << what[i];
        EXPECT_LE(rel_diff(fu[i], un[i]), tol) << what[i];
      }
      if (dt != at::kBFloat16) continue;
      if (nf4) {
        ad->set_fused(true);
        const torch::Tensor xi = x.clone().requires_grad_(true);
        const int64_t before = cuda_allocated(dev_);
        torch::Tensor y = ad->adapt(xi, *lin, base);
        const int64_t held = cuda_allocated(dev_) - before - y.numel() * 2;
        EXPECT_LT(held, kOut * kIn * 2 / 8) << "the fused NF4 graph keeps " << held << " bytes beyond y";
      }
      for (bool fused : {false, true}) {
        for (int i = 0; i < 3; ++i) run(fused);
        torch::cuda::synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 20; ++i) run(fused);
        torch::cuda::synchronize();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 20;
        std::printf("[fused lora] %s bf16 (2,512,4096) r16 %-7s fwd+bwd %.3f ms\n", nf4 ? "nf4  " : "plain",
                    fused ? "fused" : "unfused", ms);
      }
    }
  }
}

#endif  // ZT_WITH_CUDA

}  // namespace
}  // namespace zt_gpu_test_qlora
