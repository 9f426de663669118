// QLoRA on the CPU (src/lora/qlora.h): NF4 base weights dequantized in the forward give
// the LoRA model on dequant(quant(W)); the fp32 weights are gone; only the adapters train;
// dequantizing back and merging gives the same logits.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/qlora.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "quant/nf4.h"
#include "zerotrain/error.h"

namespace zt_test_qlora {

namespace {

zt::models::LlamaForCausalLM tiny_llama() {
  auto c = zt::models::named_llama("llama-tiny");
  c.hidden_size = 64;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.vocab_size = 64;
  c.max_position_embeddings = 32;
  torch::manual_seed(3);
  return zt::models::LlamaForCausalLM(c);
}

zt::lora::LoraOptions opts() {
  zt::lora::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return o;
}

void randomize(const zt::lora::LoraModel& lm) {
  torch::NoGradGuard ng;
  auto g = at::make_generator<at::CPUGeneratorImpl>(17);
  for (const auto& a : lm.adapters) {
    a.adapter->lora_A.copy_(at::randn(a.adapter->lora_A.sizes(), g) * 0.3);
    a.adapter->lora_B.copy_(at::randn(a.adapter->lora_B.sizes(), g) * 0.3);
  }
}

torch::Tensor ids() {
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  return at::randint(0, 64, {2, 12}, g);
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

TEST(QLora, Nf4BaseEqualsLoraOnTheRoundTrippedWeights) {
  // Reference: LoRA on W' = dequant(quant(W)).
  auto ref = tiny_llama();
  ref->eval();
  auto ref_lm = zt::lora::apply_lora(*ref, zt::lora::lora_space(*ref).sites, opts());
  randomize(ref_lm);
  const auto full = ref->forward(ids()).detach().clone();
  zt::lora::round_trip_nf4_bases(ref_lm);
  const auto want = ref->forward(ids()).detach().clone();
  EXPECT_GT(max_diff(want, full), 1e-4) << "NF4 must change the weights at all";

  auto m = tiny_llama();
  m->eval();
  auto lm = zt::lora::apply_lora(*m, zt::lora::lora_space(*m).sites, opts());
  randomize(lm);
  const int64_t bytes = zt::lora::quantize_lora_bases(lm);
  int64_t adapted = 0;
  for (const auto& a : lm.adapters) {
    EXPECT_EQ(a.site.linear->weight.numel(), 0) << a.site.path << ": the fp32 weight is freed";
    adapted += a.site.linear->options.in_features() * a.site.linear->options.out_features();
  }
  // 4 bits a weight, one 8-bit absmax per 64, an fp32 absmax per 256 blocks: ~0.516 bytes each.
  EXPECT_LE(bytes, adapted / 2 + adapted / 64 + 4 * (adapted / (64 * 256) + 2 * 14) + 4 * 14);
  EXPECT_GE(bytes, adapted / 2);
  // The same math as LoRA on W' (the base as F::linear on dequant(W) in fp32).
  EXPECT_LE(max_diff(m->forward(ids()), want), 1e-5);
  EXPECT_THROW(zt::lora::quantize_lora_bases(lm), zt::ConfigError);  // twice
}

TEST(QLora, OnlyAdaptersTrainAndDequantizedMergeKeepsTheLogits) {
  auto m = tiny_llama();
  auto lm = zt::lora::apply_lora(*m, zt::lora::lora_space(*m).sites, opts());
  randomize(lm);
  zt::lora::quantize_lora_bases(lm);
  m->train();
  m->loss(ids(), ids()).backward();
  for (const auto& kv : m->named_parameters()) {
    const bool lora = kv.key().find(".lora.lora_") != std::string::npos;
    EXPECT_EQ(kv.value().requires_grad(), lora) << kv.key();
    if (lora) {
      ASSERT_TRUE(kv.value().grad().defined()) << kv.key();
      EXPECT_GT(kv.value().grad().abs().max().item<double>(), 0.0) << kv.key();
    } else {
      EXPECT_FALSE(kv.value().grad().defined()) << kv.key();
    }
  }
  m->eval();
  const auto q = m->forward(ids()).detach().clone();
  zt::lora::dequantize_lora_bases(lm);
  for (const auto& a : lm.adapters) EXPECT_GT(a.site.linear->weight.numel(), 0);
  EXPECT_LE(max_diff(m->forward(ids()), q), 1e-5);
  zt::lora::merge_lora(lm);
  EXPECT_LE(max_diff(m->forward(ids()), q), 1e-5);
}

}  // namespace zt_test_qlora
