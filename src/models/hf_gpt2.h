// Hugging Face GPT-2 checkpoints <-> zerotrain's GPT2 (see gpt2.h for the layout).
//
// HF names: "transformer.h.0.attn.c_attn.weight" (GPT2LMHeadModel) or "h.0.attn..."
// (GPT2Model); both are accepted. HF's Conv1D weights (attn.c_attn, attn.c_proj,
// mlp.c_fc, mlp.c_proj) are (in, out) and are transposed to Linear's (out, in). The
// attn.bias / attn.masked_bias causal-mask buffers and the tied lm_head.weight are skipped.
#pragma once
#include <map>
#include <string>

#include "gpt2.h"  // sibling-relative: bench/ has only include/ on its path

namespace zt::models {

// Loads weights into an existing model (any device/dtype: values are converted). Accepts
// a model.safetensors file, a directory holding one, or a directory with a sharded
// model.safetensors.index.json. Every model parameter must be present with the HF shape;
// errors name the tensor, the file and both shapes. Unknown tensors are errors too (a
// checkpoint with more layers than the model).
void load_hf_gpt2(GPT2Impl& model, const std::string& dir_or_file);

// Builds the model from DIR/config.json and loads DIR's weights (fp32, CPU).
GPT2 load_hf_gpt2_pretrained(const std::string& dir);

// Writes DIR/model.safetensors (HF layout: "transformer." prefix, Conv1D (in, out)
// weights, tensors in `dtype`, metadata format=pt) and DIR/config.json, which
// transformers' GPT2LMHeadModel.from_pretrained(DIR) loads. Creates DIR if needed.
void save_hf_gpt2(const GPT2Impl& model, const std::string& dir, at::ScalarType dtype = at::kFloat);

// The tensors save_hf_gpt2 writes (HF names and layouts, CPU, `dtype`), for writers that
// choose their own file name (zerotrain convert).
std::map<std::string, torch::Tensor> hf_gpt2_tensors(const GPT2Impl& model, at::ScalarType dtype = at::kFloat);

}  // namespace zt::models
