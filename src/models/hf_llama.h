// Hugging Face Llama-family checkpoints <-> zerotrain's LlamaForCausalLM, streaming.
//
// Names are HF's as they are (llama.h registers them so), weights (out, in) as HF's
// nn.Linear. Skipped on load: the rotary buffers (*.rotary_emb.inv_freq, stored by old
// transformers) and lm_head.weight of a tied model (some checkpoints store the copy).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "hf_checkpoint.h"  // sibling-relative
#include "llama.h"

namespace zt::models {

// Whether a stored tensor is one the loader skips for this config (see above).
bool hf_llama_skipped(const LlamaConfig& cfg, const std::string& name);

// Checks that `ckpt` holds exactly the model's parameters with their full shapes (reads
// headers only): errors name the tensor, its file and both shapes; missing parameters are
// listed; an extra tensor is an error (a checkpoint of a bigger model).
void check_hf_llama(const LlamaConfig& cfg, const HfCheckpointReader& ckpt);

// Loads weights into a built model, one tensor at a time (any device/dtype: converted).
// A deferred_init model's placeholders are left alone: only parameters with their full
// shape are loaded (the engine fills the placeholders through llama_engine_options).
void load_hf_llama(LlamaForCausalLMImpl& model, const HfCheckpointReader& ckpt);
void load_hf_llama(LlamaForCausalLMImpl& model, const std::string& dir_or_file);

// Builds the model from DIR/config.json and loads DIR's weights (fp32, CPU).
LlamaForCausalLM load_hf_llama_pretrained(const std::string& dir);

// Writes DIR/config.json (torch_dtype = dtype) and the weights in `dtype`, sharded past
// max_shard_bytes (see save_hf_checkpoint), which transformers'
// AutoModelForCausalLM.from_pretrained(DIR) loads. The model must hold full parameters
// (under ZeRO-3, call Engine::gather_params first). Returns the weight files written.
std::vector<std::string> save_hf_llama(const LlamaForCausalLMImpl& model, const std::string& dir,
                                       at::ScalarType dtype = at::kFloat, int64_t max_shard_bytes = kHfMaxShardBytes);
// The same from any source of full tensors by HF name (zerotrain convert: a ZeRO
// checkpoint's consolidated parameters, one at a time).
std::vector<std::string> save_hf_llama(const LlamaConfig& cfg,
                                       const std::function<torch::Tensor(const std::string&)>& produce,
                                       const std::string& dir, at::ScalarType dtype = at::kFloat,
                                       int64_t max_shard_bytes = kHfMaxShardBytes);

}  // namespace zt::models
