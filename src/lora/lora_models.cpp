#include "lora/lora_models.h"

#include "zerotrain/error.h"

namespace zt::lora {

namespace {
// A deferred_init model holds 1x1 placeholders the engine fills for the parameters it
// manages, which a frozen base is not.
void check_whole(bool deferred, const char* family) {
  ZT_CHECK_T(!deferred, ConfigError, "lora: the ", family,
             " model is built with deferred_init (placeholder weights): LoRA freezes the base, which the engine "
             "then does not materialise; build the base whole (deferred_init = false) before applying LoRA");
}
}  // namespace

LoraTargetSpace lora_space(models::GPT2Impl& model) {
  check_whole(model.config().deferred_init, "GPT-2");
  LoraTargetSpace s;
  s.family = "gpt2";
  s.sites = linear_sites(model, "transformer.");
  s.fan_in_fan_out = true;
  return s;
}

LoraTargetSpace lora_space(models::LlamaForCausalLMImpl& model) {
  check_whole(model.config().deferred_init, "Llama");
  LoraTargetSpace s;
  s.family = "llama";
  s.sites = linear_sites(model, "", {"lm_head"});
  s.fan_in_fan_out = false;
  return s;
}

}  // namespace zt::lora
