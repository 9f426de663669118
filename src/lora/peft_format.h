// LoRA adapters in the files peft shares: DIR/adapter_model.safetensors (lora_A / lora_B
// under peft's key names, lora.h peft_key) and DIR/adapter_config.json, which
// peft.PeftModel.from_pretrained(base, DIR) loads, and which zerotrain loads back.
//
// [PEFT Config Keys]
// Read: peft_type (must be "LORA"), task_type ("CAUSAL_LM" or absent/null), r, lora_alpha,
// lora_dropout, use_rslora, target_modules (a list of names or a regex string),
// fan_in_fan_out (must be the family's: true for GPT-2, false for Llama). Keys that would
// change the math if set and are not implemented -- bias other than "none", use_dora,
// lora_bias, modules_to_save, layers_to_transform, layers_pattern, rank_pattern,
// alpha_pattern, exclude_modules, target_parameters, trainable_token_indices,
// layer_replication, use_qalora, alora_invocation_tokens, megatron_config and the variants'
// configs (use_bdlora, arrow_config, kasa_config, monteclora_config, velora_config) -- are
// ConfigErrors naming the key when they hold anything but their default. Other keys
// (peft_version, inference_mode, init_lora_weights and the initialisers' configs such as
// loftq_config, revision, ...) do not change a loaded adapter and are ignored.
#pragma once
#include <map>
#include <string>

#include "lora/lora.h"
#include "lora/lora_models.h"

namespace zt::lora {

// Writes DIR/adapter_config.json for `o` and DIR/adapter_model.safetensors holding `tensors`
// (peft keys -> tensors, written in their own dtypes); creates DIR. For writers whose
// adapter values are not the modules' (the engine's fp32 master copies).
void write_peft_adapter(const std::string& dir, const std::map<std::string, torch::Tensor>& tensors,
                        const LoraOptions& o, const LoraTargetSpace& space, const std::string& base_model_name_or_path);

// Writes DIR/adapter_model.safetensors (tensors in `dtype`, metadata format=pt) and
// DIR/adapter_config.json; creates DIR. The adapters must be whole (under ZeRO-3, gather
// the parameters first).
void save_peft_adapter(const std::string& dir, const LoraModel& lm, const LoraTargetSpace& space,
                       const std::string& base_model_name_or_path, at::ScalarType dtype = at::kFloat);

// The options in DIR/adapter_config.json (or a path to the file itself). [PEFT Config Keys]
LoraOptions read_peft_config(const std::string& dir_or_file, const LoraTargetSpace& space);

// Applies the adapter in DIR to the model whose sites `space` lists (apply_lora with the
// config's options) and loads its weights. Every adapted layer's lora_A and lora_B must be
// in the file with the right shapes, and every lora tensor of the file must belong to an
// adapted layer; errors name the key, the file and both shapes.
LoraModel load_peft_adapter(torch::nn::Module& model, const LoraTargetSpace& space, const std::string& dir);

// Copies DIR/adapter_model.safetensors into the adapters of `lm` (same checks as above).
void load_peft_weights(const LoraModel& lm, const std::string& dir);

}  // namespace zt::lora
