// The small Llama the QLoRA tests build (tests/unit/test_qlora.cpp on the CPU,
// tests/gpu/test_qlora_cuda.cpp on CUDA): llama-tiny narrowed to width 64 (head_dim 16),
// MLP 128, vocab 64, 32 positions, drawn with seed 3, so both suites start from the same
// weights.
#pragma once
#include "models/llama.h"

namespace zt_test {

// The shape alone (tests/unit/test_layerwise_init.cpp varies it).
inline zt::models::LlamaConfig tiny_qlora_llama_config() {
  auto c = zt::models::named_llama("llama-tiny");
  c.hidden_size = 64;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.vocab_size = 64;
  c.max_position_embeddings = 32;
  return c;
}

inline zt::models::LlamaForCausalLM tiny_qlora_llama() {
  torch::manual_seed(3);
  return zt::models::LlamaForCausalLM(tiny_qlora_llama_config());
}

}  // namespace zt_test
