// LoRA adapters (peft's tuners/lora conventions): a frozen base Linear plus trainable
// lora_A [r, in] (kaiming-uniform, a = sqrt(5)) and lora_B [out, r] (zeros), output
// base(x) + scaling * lora_B(lora_A(dropout(x))), scaling = alpha / r (rsLoRA: alpha/sqrt(r)).
//
// [LoRA Targets]
// target_modules are PEFT-style: a module path matches a name when the path equals it or
// ends with "." + name; target_regex (if set) must fully match the path instead. Only
// torch::nn::Linear modules are wrapped; a name or regex that matches no Linear is a
// ConfigError naming it and some module paths.
//
// [LoRA Dispatch]
// apply_lora swaps each target in its parent's registered children (Module::replace_module).
// A libtorch parent that holds its Linear in a member holder keeps calling the old module,
// so models call their linears through lora_forward(parent, name, x), which dispatches to
// whichever module is registered under `name` now. (GPT-2 does not do that yet; see
// docs/lora.md.)
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace zt::models {

struct LoraConfig {
  int64_t r = 8;
  double alpha = 8.0;
  double dropout = 0.0;
  bool use_rslora = false;
  std::vector<std::string> target_modules;  // suffix names ("c_attn", "mlp.c_fc")
  std::string target_regex;                 // full-match regex over module paths; overrides
  double scaling() const;
};

class LoraLinearImpl : public torch::nn::Module {
 public:
  LoraLinearImpl(torch::nn::Linear base, int64_t r, double scaling, double dropout);
  torch::Tensor forward(const torch::Tensor& x);
  // W + scaling * B A (the base's dtype), without changing the module.
  torch::Tensor merged_weight() const;
  torch::nn::Linear base{nullptr};
  torch::nn::Linear lora_A{nullptr};
  torch::nn::Linear lora_B{nullptr};
  torch::nn::Dropout dropout{nullptr};
  double scaling = 1.0;
};
TORCH_MODULE(LoraLinear);

// Module paths (as named_modules() spells them) of the Linear modules cfg targets.
std::vector<std::string> find_lora_targets(torch::nn::Module& model, const LoraConfig& cfg);

// Freezes every parameter of `model`, wraps each target in a LoraLinear (adapters
// trainable). Returns path -> LoraLinear.
std::map<std::string, LoraLinear> apply_lora(torch::nn::Module& model, const LoraConfig& cfg);

// Calls parent's child `name` (a Linear or a LoraLinear). [LoRA Dispatch]
torch::Tensor lora_forward(torch::nn::Module& parent, const std::string& name, const torch::Tensor& x);

// Replaces each LoraLinear by a plain Linear with the merged weight (W + scaling B A).
void merge_lora(torch::nn::Module& model, const std::map<std::string, LoraLinear>& adapters);

// PEFT names: base_model.model.<path>.lora_A.weight / .lora_B.weight.
std::map<std::string, torch::Tensor> lora_state_dict(const std::map<std::string, LoraLinear>& adapters);
// Writes dir/adapter_model.safetensors and dir/adapter_config.json (PEFT's keys).
void save_lora_adapter(const std::string& dir, const std::map<std::string, LoraLinear>& adapters,
                       const LoraConfig& cfg);
// Copies the adapter weights of dir/adapter_model.safetensors into `adapters`; a missing
// key or a shape mismatch is a CheckpointError naming it.
void load_lora_adapter(const std::string& dir, const std::map<std::string, LoraLinear>& adapters);

}  // namespace zt::models
