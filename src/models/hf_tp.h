// Hugging Face weights straight into the tensor-parallel models (GPT2TP, LlamaTP): each tp
// rank reads only its own slices from the safetensors files.
//
// [HF TP Load]
//  * Names and shapes are checked first, from the headers only (ConfigError naming the
//    tensor, its file and both shapes; missing parameters listed; an unknown tensor is an
//    error), as load_hf_gpt2 / check_hf_llama do for the unsplit models.
//  * A split parameter ([TP Slices] in tp/shard.h) is read block by block: for each of its
//    `blocks` (GPT-2's c_attn: q, k, v), the rank's rows (dim 0: one contiguous read) or
//    columns (dim 1: one read per row) of the stored tensor; GPT-2's Conv1D weights are
//    stored (in, out), so their dim is the other one and the slice is transposed after
//    reading. Rows past the real vocabulary (the vocab-parallel padding) are zeros, as
//    tp::cut pads them. A replicated parameter is read whole.
//  * Peak host memory per rank: one slice (1/tp of a matrix) or one replicated tensor at
//    a time, besides the model's own slices; never the whole model nor a whole matrix.
//  * The slices equal tp::cut of the full tensor bit for bit (dtype converted by copy_),
//    so the model equals load_full of the unsplit model loaded from the same files.
#pragma once
#include <string>

#include "models/gpt2_tp.h"
#include "models/hf_checkpoint.h"
#include "models/llama_tp.h"
#include "tp/shard.h"

namespace zt::models {

// Rank `rank`'s slice (of `tp`) of tensor `stored` under `spec`, reading only its bytes.
// `full_shape`: the parameter's unsplit shape; `transposed`: the stored tensor is its
// transpose (2-D: GPT-2's Conv1D). ConfigError when the dimension does not divide by tp.
torch::Tensor read_tp_slice(const HfCheckpointReader& ckpt, const std::string& stored, const tp::SplitSpec& spec,
                            const std::vector<int64_t>& full_shape, int rank, int tp, bool transposed);

// GPT-2 (names with or without "transformer."; attn.bias / attn.masked_bias and the tied
// lm_head.weight skipped, as load_hf_gpt2) into this rank's slices of `model`.
void load_hf_gpt2_tp(GPT2TPImpl& model, const HfCheckpointReader& ckpt);
// The Llama family (HF names as they are; check_hf_llama's checks) into this rank's slices.
void load_hf_llama_tp(LlamaTPImpl& model, const HfCheckpointReader& ckpt);

}  // namespace zt::models
