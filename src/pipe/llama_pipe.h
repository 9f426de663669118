// The Llama family (Llama 2/3, Mistral, Qwen2; models/llama.h) as a sequence of pipeline
// layers, as gpt2_pipe.h cuts GPT-2.
//
// [Llama Pipeline]
//  Layer 0 is the embedding (model.embed_tokens), layers 1..L the decoder layers
//  (model.layers.i: RMSNorm, GQA attention with RoPE, SwiGLU MLP), layer L + 1 the head
//  (model.norm, lm_head, the loss). A stage holds the layers of its chunks under the whole
//  model's Hugging Face names ("model.layers.3.self_attn.q_proj.weight", "lm_head.weight"),
//  taken (shared) from one LlamaForCausalLM built from one seed, registered in its order, so
//  its parameters, its math and its checkpoints are the non-pipelined model's. Every stage
//  computes the RoPE tables (cos, sin) of its micro-batch's positions from the model's
//  inverse frequencies, exactly as LlamaForCausalLMImpl::hidden does; nothing but the
//  hidden state (B, T, hidden_size) travels between stages. Sliding-window layers keep
//  their window (the attention builds its own mask). The head is
//  LlamaForCausalLMImpl::loss's math: targets equal to -100 (HF's ignore_index) or -1 are
//  ignored, the fused chunked LM-head loss except in fp16.
//  Untied (Llama-3-8B, Llama-2): lm_head.weight is an ordinary parameter of the last stage
//  and no tied weight travels. tie_word_embeddings (Llama-3.2-1B): embed_tokens.weight is
//  the first stage's parameter and the last stage keeps the tied copy exchanged as GPT-2's
//  wte ([Pipeline Tied Weights] in pipe/gpt2_pipe.h).
//  Not here (the caller refuses them by name): tensor parallelism inside a stage,
//  per-example attention (position ids), LoRA adapters, a partitioned (deferred_init) or
//  skeleton model.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "models/llama.h"
#include "pipe/partition.h"
#include "pipe/stage.h"

namespace zt::pipe {

// The pipeline layers of a Llama config with their types ("LlamaEmbedding",
// "LlamaDecoderLayer", "LlamaHead") and trainable parameter counts (the head counts its
// V x d weight, tied or not, as DeepSpeed counts a TiedLayerSpec): partition_layers' input.
std::vector<LayerInfo> llama_layers(const models::LlamaConfig& cfg);

class LlamaStageImpl : public PipeStageImpl {
 public:
  // `chunks[c]` = [begin, end) pipeline layers of local chunk c (ascending, disjoint).
  // Takes (shares) those layers' modules from `full` (built with deferred_init false).
  // `checkpoint_interval` > 0 recomputes the decoder layers of each range of that many
  // pipeline layers in backward (pipeline.activation_checkpoint_interval).
  LlamaStageImpl(const models::LlamaForCausalLM& full, std::vector<std::pair<int, int>> chunks,
                 int64_t checkpoint_interval);

  int64_t hidden_size() const override { return cfg_.hidden_size; }
  // See PipeStageImpl::forward; the loss is LlamaForCausalLMImpl::loss's.
  torch::Tensor forward(int chunk, const torch::Tensor& x, const torch::Tensor& targets) override;
  torch::Tensor embedding_weight() const override { return embed_tokens_ ? embed_tokens_->weight : torch::Tensor(); }
  const models::LlamaConfig& config() const { return cfg_; }

 private:
  // cos, sin (T, head_dim) in like's dtype and device: LlamaForCausalLMImpl::rope's values.
  std::pair<torch::Tensor, torch::Tensor> rope(int64_t T, const torch::Tensor& like) const;
  torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& targets);

  models::LlamaConfig cfg_;
  int64_t ckpt_interval_ = 0;
  models::LlamaRopeTables rope_tables_;  // [Rope Tables]
  // Registered as the whole model's: "model" {embed_tokens, layers {"i": ...}, norm}, lm_head.
  std::shared_ptr<torch::nn::Module> model_;
  torch::nn::Embedding embed_tokens_{nullptr};
  std::vector<models::LlamaDecoderLayer> layers_;  // index = decoder layer; null where not held
  models::RMSNorm norm_{nullptr};
  torch::nn::Linear lm_head_{nullptr};  // untied head only
};
TORCH_MODULE(LlamaStage);

}  // namespace zt::pipe
