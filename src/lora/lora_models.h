// Where LoRA may go in zerotrain's models, and how peft names those places.
//
//   GPT-2 (models/gpt2.h): every block's attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj.
//     peft sees GPT2LMHeadModel, so hf_path = "transformer." + path. HF stores these as
//     Conv1D (in, out) and peft's adapter_config says fan_in_fan_out: true; the adapter
//     matrices themselves are the same as for a Linear (A (r, in), B (out, r)), only the
//     merged delta is transposed on export (hf_gpt2 does that for every weight).
//   Llama family (models/llama.h): q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
//     down_proj of every layer; hf_path = path. lm_head is not adaptable (the loss
//     multiplies by its weight directly), nor are the embeddings.
#pragma once
#include <string>
#include <vector>

#include "lora/lora.h"
#include "models/gpt2.h"
#include "models/llama.h"

namespace zt::lora {

struct LoraTargetSpace {
  std::string family;          // "gpt2" | "llama"
  std::vector<LoraSite> sites;  // the adaptable linears, in registration order
  bool fan_in_fan_out = false;  // peft's flag for this family (GPT-2's Conv1D: true)
};

LoraTargetSpace lora_space(models::GPT2Impl& model);
LoraTargetSpace lora_space(models::LlamaForCausalLMImpl& model);

}  // namespace zt::lora
