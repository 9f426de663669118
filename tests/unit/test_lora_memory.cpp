// Memory of a LoRA / QLoRA step on Llama (issue 21), counted on the CPU: a counting CPU
// allocator (support/cpu_byte_counter.h) gives the bytes the autograd graph holds at the
// end of forward and the most bytes alive during backward, and each is checked against
// what the step must hold by formula (docs/lora.md "Memory"). The LM head is frozen under
// LoRA: its loss must keep no (V, C) tensor (the former code built the head's fp32
// gradient dw in forward anyway: V x C x 4 bytes held to the end of backward, then an fp32
// and a bf16 copy of it, 2.1 + 2.1 + 1.0 GB for Llama-3-8B's head).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>

#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/qlora.h"
#include "models/llama.h"
#include "models/lm_head_loss.h"
#include "support/cpu_byte_counter.h"

namespace zt_test_lora_memory {

using zt::test_support::CpuByteCounter;

namespace {

CpuByteCounter& lora_mem_counter() {
  static CpuByteCounter c;  // outlives every tensor it counts
  return c;
}

// What one forward + backward holds, in bytes above the live bytes before the forward.
struct LoraMemStep {
  int64_t held_after_forward = 0;  // the graph (plus the scalar loss)
  int64_t forward_peak = 0;
  int64_t backward_peak = 0;
};

template <typename Fwd>
LoraMemStep lora_mem_measure(Fwd&& forward) {
  auto& c = lora_mem_counter();
  CpuByteCounter::Scope scope(c);
  const int64_t base = c.live();
  c.reset_peak();
  LoraMemStep m;
  {
    torch::Tensor loss = forward();
    m.held_after_forward = c.live() - base;
    m.forward_peak = c.peak() - base;
    c.reset_peak();
    loss.backward();
    m.backward_peak = c.peak() - base;
  }
  return m;
}

void lora_mem_print(const char* what, const LoraMemStep& m) {
  std::printf("[ memory  ] %s: held after forward %lld B, forward peak %lld B, backward peak %lld B\n", what,
              static_cast<long long>(m.held_after_forward), static_cast<long long>(m.forward_peak),
              static_cast<long long>(m.backward_peak));
}

}  // namespace

// The head alone: x (N, C) trainable, w (V, C) frozen or not. Frozen, the graph keeps dx
// (N x C, x's dtype) and two scalars, and backward allocates dx scaled (an fp32 copy, its
// product by the scale and the result: N x C x (8 + e)); never a (V, C) tensor. Trainable, dw comes back as before
// and the loss and dx are bit for bit those of the frozen head.
TEST(LmHeadLossMemory, FrozenHeadKeepsNoVocabSizedTensor) {
  constexpr int64_t N = 256, C = 64, V = 8000;
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
    const int64_t e = dt == torch::kFloat32 ? 4 : 2;
    auto g = at::make_generator<at::CPUGeneratorImpl>(31);
    const torch::Tensor x0 = at::randn({N, C}, g).to(dt);
    const torch::Tensor w0 = (at::randn({V, C}, g) * 0.05).to(dt);
    auto tgt = at::randint(0, V, {N}, g);
    tgt.narrow(0, 0, 5).fill_(-1);  // some ignored rows
    torch::Tensor loss_frozen, loss_train;
    const auto x_frozen = x0.clone().requires_grad_(true), x_train = x0.clone().requires_grad_(true);
    const auto frozen = lora_mem_measure([&] {
      loss_frozen = zt::models::lm_head_cross_entropy(x_frozen, w0, tgt, 64, 100);
      return loss_frozen;
    });
    lora_mem_print(dt == torch::kFloat32 ? "LM head fp32, frozen w" : "LM head bf16, frozen w", frozen);
    const auto w = w0.clone().requires_grad_(true);
    const auto train = lora_mem_measure([&] {
      loss_train = zt::models::lm_head_cross_entropy(x_train, w, tgt, 64, 100);
      return loss_train;
    });
    lora_mem_print(dt == torch::kFloat32 ? "LM head fp32, trained w" : "LM head bf16, trained w", train);
    const int64_t dx_bytes = N * C * e, vocab_fp32 = V * C * 4;
    EXPECT_LE(frozen.held_after_forward, dx_bytes + 4096) << "a frozen head's loss keeps more than dx";
    EXPECT_LE(frozen.backward_peak - frozen.held_after_forward, N * C * (8 + e) + 4096);
    EXPECT_LT(frozen.held_after_forward, vocab_fp32 / 4);
    // The trained head keeps dw (V x C fp32): the count sees it (the check above can fail).
    EXPECT_GE(train.held_after_forward, vocab_fp32);
    EXPECT_TRUE(torch::equal(loss_frozen, loss_train));
    EXPECT_TRUE(torch::equal(x_frozen.grad(), x_train.grad()));
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad().scalar_type(), dt);
  }
}

namespace {

// Llama-3-8B's proportions scaled down: V / d = 31, I / d = 3.5, 4 query heads per kv head;
// N = T tokens, L layers.
zt::models::LlamaConfig lora_mem_llama_config() {
  auto c = zt::models::named_llama("llama-tiny");
  c.hidden_size = 256;
  c.intermediate_size = 896;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 7936;
  c.num_hidden_layers = 2;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = false;
  return c;
}

}  // namespace

// A bf16 LoRA (r 16 on all seven projections; and QLoRA) step on a 2-layer Llama of
// Llama-3-8B's proportions, activation checkpointing on. By formula (docs/lora.md "Memory"),
// with N tokens, width d, MLP width I, L layers, e = 2 bytes:
//   held after forward <= L N d e (each block's input)  +  N d (4 + 3e) (final RMSNorm's saved
//                         input, its fp32 copy and the normalised output, the head's dx)  + 8 KiB
//   backward peak      <= held + the recompute of one block (its activations, at most
//                         N (12 d + 5 I) 4 bytes) + one dequantized base weight (QLoRA: I d (4 + e))
//                         + the adapters' gradients
//   forward peak       <= the held bound + one block run without grad + the loss's chunk of
//                         logits on the CPU (fp32, its log-softmax, the gradient in e: N V (8 + e);
//                         here one chunk holds all N rows)
// The former head kept V d 4 bytes more from forward on (its frozen weight's gradient) and
// made V d (4 + e) more in backward.
TEST(LoraMemory, LlamaStepHoldsNoVocabSizedTensorAndFrozenBaseGetsNoGradient) {
  const auto c = lora_mem_llama_config();
  constexpr int64_t T = 128;
  const int64_t N = T, d = c.hidden_size, I = c.intermediate_size, L = c.num_hidden_layers, V = c.vocab_size;
  constexpr int64_t e = 2;
  auto g = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto idx = at::randint(0, V, {1, T}, g);
  const auto tgt = at::randint(0, V, {1, T}, g);
  torch::Tensor losses[2];
  for (bool qlora : {false, true}) {
    torch::manual_seed(11);
    zt::models::LlamaForCausalLM m(c);
    auto space = zt::lora::lora_space(*m);
    zt::lora::LoraOptions o;
    o.r = 16;
    o.alpha = 32;
    o.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    auto lm = zt::lora::apply_lora(*m, space.sites, o);
    {
      torch::NoGradGuard ng;
      auto gb = at::make_generator<at::CPUGeneratorImpl>(17);
      for (const auto& a : lm.adapters) a.adapter->lora_B.copy_(at::randn(a.adapter->lora_B.sizes(), gb) * 0.1);
    }
    if (qlora) zt::lora::quantize_lora_bases(lm);
    m->to(torch::kBFloat16);
    m->set_activation_checkpointing(true, std::nullopt, false);
    const auto step = lora_mem_measure([&] {
      losses[qlora ? 1 : 0] = m->loss(idx, tgt);
      return losses[qlora ? 1 : 0];
    });
    lora_mem_print(qlora ? "QLoRA Llama bf16 step" : "LoRA Llama bf16 step", step);
    int64_t adapter_bytes = 0;
    for (const auto& p : m->parameters()) {
      if (p.requires_grad()) {
        ASSERT_TRUE(p.grad().defined());
        adapter_bytes += p.numel() * p.element_size();
      } else {
        EXPECT_FALSE(p.grad().defined()) << "a frozen parameter got a gradient";
      }
    }
    const int64_t held_bound = L * N * d * e + N * d * (4 + 3 * e) + 8192;
    const int64_t block = N * (12 * d + 5 * I) * 4;
    const int64_t dequant = qlora ? I * d * (4 + e) : 0;
    EXPECT_LE(step.held_after_forward, held_bound);
    EXPECT_LE(step.forward_peak, held_bound + block + N * V * (8 + e));
    EXPECT_LE(step.backward_peak, step.held_after_forward + block + dequant + adapter_bytes);
    EXPECT_LT(step.held_after_forward, V * d * 4);  // the former head alone kept this much
  }
  EXPECT_TRUE(std::isfinite(losses[0].item<double>()) && std::isfinite(losses[1].item<double>()));
}

}  // namespace zt_test_lora_memory
