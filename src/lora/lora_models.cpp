#include "lora/lora_models.h"

namespace zt::lora {

LoraTargetSpace lora_space(models::GPT2Impl& model) {
  LoraTargetSpace s;
  s.family = "gpt2";
  s.sites = linear_sites(model, "transformer.");
  s.fan_in_fan_out = true;
  return s;
}

LoraTargetSpace lora_space(models::LlamaForCausalLMImpl& model) {
  LoraTargetSpace s;
  s.family = "llama";
  s.sites = linear_sites(model, "", {"lm_head"});
  s.fan_in_fan_out = false;
  return s;
}

}  // namespace zt::lora
