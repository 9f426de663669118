// LoRA (Hu et al. 2021) as Hugging Face peft's tuners/lora defines it: a frozen base linear
// y = x W^T (+ b) plus a trainable low-rank update,
//   y = base(x) + (dropout(x) A^T) B^T * scaling        A (r, in), B (out, r)
// scaling = lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA (Kalajdzievski 2023).
// A starts kaiming-uniform with a = sqrt(5) (bound 1/sqrt(in), torch's nn.Linear default,
// drawn from the global generator), B starts at zero, so the adapted model starts equal to
// the base.
//
// The adapter hangs on the base Linear as its child "lora" ([Linear Adapters] in
// models/linear_adapter.h), so the base keeps its Hugging Face names and the model's own
// forward reaches the adapter. Parameters: "<linear path>.lora.lora_A" (r, in) and
// "<linear path>.lora.lora_B" (out, r).
//
// [LoRA Targets]
// peft's target_modules: a list of names, each selecting the linears whose module path
// equals it or ends with "." + it ("q_proj", "self_attn.q_proj"); or one string, a regex
// that must match the whole path (Python's re.fullmatch; std::regex ECMAScript here, the
// same for the usual patterns such as ".*\.(q_proj|v_proj)"). Paths are the ones peft sees
// in the Hugging Face model (LoraSite::hf_path: "model.layers.0.self_attn.q_proj",
// "transformer.h.0.attn.c_attn"), so an adapter_config.json from peft selects the same
// layers here. A list entry or a regex that selects nothing is a ConfigError listing the
// adaptable linears' names.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/linear_adapter.h"

namespace zt::lora {

struct LoraOptions {
  int64_t r = 8;               // rank, > 0
  double alpha = 8.0;          // lora_alpha, > 0
  double dropout = 0.0;        // lora_dropout on the adapter's input in train mode, [0, 1)
  bool use_rslora = false;     // scaling alpha / sqrt(r) instead of alpha / r
  // [LoRA Targets]: names (suffix match) ...
  std::vector<std::string> target_modules;
  // ... or, when non-empty, one regex matched against the whole path (then
  // target_modules must be empty).
  std::string target_regex;

  double scaling() const;
  // ConfigError naming the field for a bad value (r, alpha, dropout, no targets, both kinds
  // of target, an invalid regex).
  void validate() const;
};

// The low-rank update on one base linear (in -> out). [Linear Adapters]
class LoraAdapterImpl : public torch::nn::Module, public models::LinearAdapter {
 public:
  // A and B in `options` (the base weight's device and dtype); A drawn in fp32 on the CPU
  // from the global generator, then converted, so the draw does not depend on the device.
  LoraAdapterImpl(int64_t in, int64_t out, int64_t r, double scaling, double dropout,
                  const torch::TensorOptions& options);
  // base(x) + (dropout(x) A^T) B^T * scaling, in x's dtype; dropout only in train mode.
  // Through lora_linear (the base from layer's weight and bias, [Fused LoRA Linear] in
  // lora/lora_linear.h) when fusable(): else base(x) plus the update computed apart.
  torch::Tensor adapt(const torch::Tensor& x, const torch::nn::LinearImpl& layer,
                      const models::BaseLinearFn& base) override;
  // True when the update may be fused with a frozen base of weight/bias for input x: the
  // fused path is on, no dropout acts (dropout 0 or eval mode), weight and bias do not
  // require grad, and x, A, B (and weight, when defined) share one dtype.
  bool fusable(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) const;
  // Off: always the unfused path (the reference the tests compare the fused one with).
  void set_fused(bool on) { fused_ = on; }
  bool fused() const { return fused_; }
  // B A * scaling (out, in) in fp32: what merging adds to the base weight.
  torch::Tensor delta_weight() const;

  int64_t r() const { return lora_A.size(0); }
  double scaling() const { return scaling_; }
  double dropout() const { return dropout_; }

  torch::Tensor lora_A;  // (r, in), trainable
  torch::Tensor lora_B;  // (out, r), trainable

 private:
  double scaling_;
  double dropout_;
  bool fused_ = true;
};
TORCH_MODULE(LoraAdapter);

// A linear of the model that LoRA may adapt.
struct LoraSite {
  std::string path;     // in the zerotrain model (named_modules): "h.0.attn.c_attn"
  std::string hf_path;  // as peft sees it in the HF model: "transformer.h.0.attn.c_attn"
  torch::nn::Linear linear{nullptr};
};

// Every Linear of `model` (named_modules order) whose path is not in `excluded`, with
// hf_path = hf_prefix + path. Linears inside an adapter are never sites.
std::vector<LoraSite> linear_sites(torch::nn::Module& model, const std::string& hf_prefix = "",
                                   const std::vector<std::string>& excluded = {});

// The sites `o` selects ([LoRA Targets]), in site order; ConfigError when a target selects
// nothing.
std::vector<LoraSite> select_targets(const std::vector<LoraSite>& sites, const LoraOptions& o);

// A model with adapters attached.
struct LoraModel {
  LoraOptions options;
  // One per adapted linear, in site order.
  struct Adapted {
    LoraSite site;
    LoraAdapter adapter{nullptr};
  };
  std::vector<Adapted> adapters;

  int64_t trainable_params() const;  // sum of A and B numels
  std::vector<torch::Tensor> parameters() const;  // A, B of each adapter, in order
};

// What apply_lora accepts as a selected linear's weight: only the whole weight (the
// default), or also a 0-element placeholder whose base is held elsewhere (its NF4 form, made
// while the base was built: [Layerwise QLoRA Base] in lora/qlora.h).
enum class LoraBase { kWhole, kWholeOrHeldElsewhere };

// Freezes every parameter of `model` (requires_grad false), then attaches a LoraAdapter
// (trainable) to each site `o` selects. Call before zt::initialize. A site that already
// carries an adapter is a ConfigError.
LoraModel apply_lora(torch::nn::Module& model, const std::vector<LoraSite>& sites, const LoraOptions& o,
                     LoraBase base = LoraBase::kWhole);

// Adds each adapter's delta_weight to its base weight (in fp32, stored back in the weight's
// dtype) and detaches the adapters: the model computes what the adapted model computed,
// without adapters. Full (not partitioned) parameters only.
void merge_lora(LoraModel& lm);

// The adapters as peft saves them: "base_model.model." + hf_path + ".lora_A.weight" (r, in)
// and ".lora_B.weight" (out, r), detached, on the CPU, contiguous, in `dtype`.
std::map<std::string, torch::Tensor> peft_state_dict(const LoraModel& lm, at::ScalarType dtype = at::kFloat);
std::string peft_key(const std::string& hf_path, const char* which);  // which: "lora_A" | "lora_B"

}  // namespace zt::lora
