// The Llama family (Llama / Mistral / Qwen2, models/llama.h) with Megatron-style tensor
// parallelism and optional sequence parallelism over a tp group, as models/gpt2_tp.h does
// for GPT-2:
//   attention  q_proj, k_proj, v_proj column-parallel, cut by heads: each rank runs
//              num_attention_heads/tp query heads and num_key_value_heads/tp key/value
//              heads (grouped-query attention keeps its group structure: query head j of a
//              rank uses that rank's kv head j / (H/KV)); o_proj row-parallel
//   MLP        gate_proj and up_proj column-parallel, SiLU(gate) * up local, down_proj row
//   embedding  model.embed_tokens vocab-parallel (padded to a multiple of tp *
//              lm_head_pad_multiple); lm_head (or the tied embedding) column-parallel over
//              the vocabulary into the vocab-parallel cross entropy; RMSNorms replicated
// Names are Hugging Face's, each parameter holding this rank's slice; llama_tp_cut /
// load_full cut a full state, full_state() joins it back.
//
// ConfigError before any step: num_attention_heads or num_key_value_heads not divisible
// by tp (name, value and the fix), deferred_init, pad_token_id >= 0 (not yet); with
// sequence parallelism, a sequence length not divisible by tp.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/llama.h"
#include "models/tp_checkpoint.h"
#include "tp/layers.h"
#include "tp/shard.h"
#include "zerotrain/comm.h"
#include "zerotrain/model.h"

namespace zt::models {

struct LlamaTPAttentionImpl : torch::nn::Module {
  LlamaTPAttentionImpl(const LlamaConfig& cfg, int64_t layer, const comm::GroupPtr& tp, bool sp);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

  int64_t local_heads, local_kv_heads, head_dim, window;
  tp::ColumnParallelLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};
  tp::RowParallelLinear o_proj{nullptr};
};
TORCH_MODULE(LlamaTPAttention);

struct LlamaTPMLPImpl : torch::nn::Module {
  LlamaTPMLPImpl(const LlamaConfig& cfg, const comm::GroupPtr& tp, bool sp);
  torch::Tensor forward(const torch::Tensor& x);
  tp::ColumnParallelLinear gate_proj{nullptr}, up_proj{nullptr};
  tp::RowParallelLinear down_proj{nullptr};
};
TORCH_MODULE(LlamaTPMLP);

struct LlamaTPLayerImpl : torch::nn::Module {
  LlamaTPLayerImpl(const LlamaConfig& cfg, int64_t layer, const comm::GroupPtr& tp, bool sp);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  comm::GroupPtr group;
  bool sequence_parallel;
  LlamaTPAttention self_attn{nullptr};
  LlamaTPMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaTPLayer);

struct LlamaTPModelImpl : torch::nn::Module {
  LlamaTPModelImpl(const LlamaConfig& cfg, const comm::GroupPtr& tp, bool sp);
  tp::VocabParallelEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaTPModel);

tp::SplitSpec llama_tp_split_spec(const LlamaConfig& cfg, int tp, const std::string& name);
std::map<std::string, torch::Tensor> llama_tp_cut(const LlamaConfig& cfg,
                                                  const std::map<std::string, torch::Tensor>& full, int rank, int tp);

struct LlamaTPImpl : torch::nn::Module, zt::ZeroModel {
  LlamaTPImpl(const LlamaConfig& cfg, comm::GroupPtr tp, bool sequence_parallel = false);

  torch::Tensor forward(const torch::Tensor& idx);       // full logits (B, T, V) on every rank
  torch::Tensor local_logits(const torch::Tensor& idx);  // (B, T, Vp/tp)
  // Targets already shifted; -100 (HF's ignore_index) or any negative value is ignored.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  torch::Tensor hidden(const torch::Tensor& idx);

  void load_full(const std::map<std::string, torch::Tensor>& full);
  std::map<std::string, torch::Tensor> full_state();  // collective over tp
  tp::SplitSpec split_spec(const std::string& name) const { return llama_tp_split_spec(cfg_, tp_size(), name); }
  zt::TensorParallelSpec tensor_parallel_spec(const std::string& name) const override;
  double norm_weight(const std::string& name) const;
  // ZeRO-3 gather units: one per decoder layer ("model.layers.<i>"); the embedding, the
  // final norm and the LM head are the root unit. hidden() runs each layer through the
  // hooks (in a checkpointed layer's recompute too), as GPT2TPImpl does.
  std::vector<zt::ModelUnit> zero_units() const override;
  void set_unit_hooks(zt::UnitHooks hooks) override { hooks_ = std::move(hooks); }
  double flops_per_token(int64_t seq) const override;

  // Activation checkpointing per decoder layer, as GPT2TPImpl's ([TP Activation
  // Checkpointing]): enabled = every layer with the default options.
  void set_activation_checkpointing(bool enabled);
  void set_activation_checkpointing(const TpCheckpointOptions& o);
  bool activation_checkpointing() const { return ckpt_ != nullptr; }
  const TpCheckpointer* activation_checkpointer() const { return ckpt_.get(); }

  const LlamaConfig& config() const { return cfg_; }
  int tp_size() const { return group_ ? group_->size() : 1; }
  int tp_rank() const { return group_ ? group_->rank() : 0; }

  LlamaTPModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // untied: weight (Vp/tp, d), "lm_head.weight"
  torch::Tensor lm_head_weight;        // lm_head's weight or the tied embedding's

 private:
  std::vector<int64_t> full_shape(const std::string& name) const;

  LlamaConfig cfg_;
  comm::GroupPtr group_;
  bool sp_ = false;
  LlamaRopeTables rope_tables_;  // [Rope Tables]
  std::vector<LlamaTPLayer> layers_;
  std::shared_ptr<TpCheckpointer> ckpt_;
  zt::UnitHooks hooks_;
};
TORCH_MODULE(LlamaTP);

}  // namespace zt::models
