// GPT-2 with Megatron-style tensor parallelism (and optional sequence parallelism) over a
// tp group: the same network as models/gpt2.h, each rank holding 1/tp of every matrix.
//
//   attention  c_attn column-parallel, cut by heads (q, k, v each cut: blocks = 3, see
//              [TP Slices] in tp/shard.h), each rank runs its n_head/tp heads;
//              c_proj row-parallel (input = this rank's heads), its sum all-reduced
//   MLP        c_fc column-parallel (4C/tp columns), GELU local, c_proj row-parallel
//   embedding  wte vocab-parallel (V padded to a multiple of tp * lm_head_pad_multiple),
//              tied to the LM head: the logits stay cut by vocabulary and go straight
//              into the vocab-parallel cross entropy (tp/cross_entropy.h); wpe,
//              LayerNorms and the row-parallel biases replicated
//   sequence parallelism (optional): the residual stream, LayerNorms and the embedding sum
//              hold this rank's T/tp positions; all-gather before each column-parallel
//              layer and the LM head, reduce-scatter after each row-parallel layer and
//              the embedding (Korthikanti et al. 2022). Replicated parameters used there
//              get their gradients summed over tp (see [TP Regions] in tp/mappings.h).
//
// Parameter names are GPT2's ("wte.weight", "h.0.attn.c_attn.weight", ...), each holding
// this rank's slice, so a full GPT-2 state (models/gpt2.h, or a Hugging Face checkpoint
// loaded into one) is cut with gpt2_tp_cut() and a trained tp model joined back with
// full_state(). With the same full weights, tp 2/4/8 computes what tp 1 does up to
// summation order (tests/dist/test_tensor_parallel.cpp).
//
// Checked at construction (ConfigError before any step): n_head divisible by tp (the heads
// are what attention splits); deferred_init is not supported with tp. Sequence
// parallelism also needs the sequence length divisible by tp (checked in forward).
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/tp_checkpoint.h"
#include "tp/layers.h"
#include "tp/shard.h"
#include "zerotrain/comm.h"
#include "zerotrain/model.h"

namespace zt::models {

struct TPAttentionImpl : torch::nn::Module {
  TPAttentionImpl(const GPT2Config& cfg, const comm::GroupPtr& tp, bool sequence_parallel);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T or T/tp, C) -> same

  int64_t local_heads;
  tp::ColumnParallelLinear c_attn{nullptr};  // weight (3C/tp, C): this rank's q, k, v rows
  tp::RowParallelLinear c_proj{nullptr};     // weight (C, C/tp)
};
TORCH_MODULE(TPAttention);

struct TPMLPImpl : torch::nn::Module {
  TPMLPImpl(const GPT2Config& cfg, const comm::GroupPtr& tp, bool sequence_parallel);
  torch::Tensor forward(const torch::Tensor& x);

  tp::ColumnParallelLinear c_fc{nullptr};  // weight (4C/tp, C)
  tp::RowParallelLinear c_proj{nullptr};   // weight (C, 4C/tp)
};
TORCH_MODULE(TPMLP);

struct TPBlockImpl : torch::nn::Module {
  TPBlockImpl(const GPT2Config& cfg, const comm::GroupPtr& tp, bool sequence_parallel);
  torch::Tensor forward(const torch::Tensor& x);  // pre-LN, as GPT2's Block

  comm::GroupPtr group;
  bool sequence_parallel;
  torch::nn::LayerNorm ln_1{nullptr};
  TPAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  TPMLP mlp{nullptr};
};
TORCH_MODULE(TPBlock);

// How a parameter of GPT-2 is cut at tensor-parallel size `tp` (see [TP Slices]);
// replicated parameters get a SplitSpec with dim < 0. InternalError for unknown names.
tp::SplitSpec gpt2_tp_split_spec(const GPT2Config& cfg, int tp, const std::string& name);
// Rank `rank`'s slices of a full GPT-2 state (keys as GPT2's named_parameters()).
std::map<std::string, torch::Tensor> gpt2_tp_cut(const GPT2Config& cfg, const std::map<std::string, torch::Tensor>& full,
                                                 int rank, int tp);
// The full GPT-2 state of a GPT2 model (a copy, fp32 on the CPU).
std::map<std::string, torch::Tensor> gpt2_full_state(torch::nn::Module& gpt2);

struct GPT2TPImpl : torch::nn::Module, zt::ZeroModel {
  // tp: the tensor-parallel group (Topology::tp()); null = one rank. Weights are GPT-2's
  // init drawn per slice (not equal to a tp 1 model's): load_full() for that.
  GPT2TPImpl(const GPT2Config& cfg, comm::GroupPtr tp, bool sequence_parallel = false);

  // idx (B, T) -> full logits (B, T, V), the same on every rank (all-gathers the vocab).
  torch::Tensor forward(const torch::Tensor& idx);
  // idx (B, T) -> this rank's logits (B, T, Vp/tp) over the padded vocabulary.
  torch::Tensor local_logits(const torch::Tensor& idx);
  // Mean cross entropy (targets -1 ignored), the same scalar on every rank of tp.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  // The trunk: idx (B, T) -> (B, T, C) after ln_f, or (B, T/tp, C) with sequence parallelism.
  torch::Tensor hidden(const torch::Tensor& idx);

  // Copies this rank's slices of a full GPT-2 state into the parameters.
  void load_full(const std::map<std::string, torch::Tensor>& full);
  // Every parameter full-size (joined over tp; collective over the tp group).
  std::map<std::string, torch::Tensor> full_state();
  // The SplitSpec of a parameter (by name) at this model's tp size.
  tp::SplitSpec split_spec(const std::string& name) const { return gpt2_tp_split_spec(cfg_, tp_size(), name); }
  // ZeroModel: split parameters say their dim, over group "tp".
  zt::TensorParallelSpec tensor_parallel_spec(const std::string& name) const override;
  // Weight of a parameter's gradient in the model-parallel norm: 1/tp when replicated
  // (EngineOptions::norm_weight), 1 when split.
  double norm_weight(const std::string& name) const;

  // Every block recomputes in backward (enabled), or none; the options of the config's
  // activation_checkpointing section: the overload below ([TP Activation Checkpointing]).
  void set_activation_checkpointing(bool enabled);
  void set_activation_checkpointing(const TpCheckpointOptions& o);
  bool activation_checkpointing() const { return ckpt_ != nullptr; }
  // The checkpoint store (bytes held, notes); null without checkpointing.
  const TpCheckpointer* activation_checkpointer() const { return ckpt_.get(); }
  void set_unit_hooks(zt::UnitHooks hooks) override { hooks_ = std::move(hooks); }
  std::vector<zt::ModelUnit> zero_units() const override;
  // This rank's share of the training FLOPs per token: GPT-2's / tp.
  double flops_per_token(int64_t seq) const override;

  const GPT2Config& config() const { return cfg_; }
  int tp_size() const { return group_ ? group_->size() : 1; }
  int tp_rank() const { return group_ ? group_->rank() : 0; }
  bool sequence_parallel() const { return sp_; }

  tp::VocabParallelEmbedding wte{nullptr};  // (Vp/tp, C), also the LM head
  torch::nn::Embedding wpe{nullptr};        // (n_positions, C), replicated
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  torch::Tensor run_block(int64_t i, const torch::Tensor& x);

  GPT2Config cfg_;
  comm::GroupPtr group_;
  bool sp_ = false;
  std::shared_ptr<TpCheckpointer> ckpt_;
  std::vector<TPBlock> blocks_;
  zt::UnitHooks hooks_;
};
TORCH_MODULE(GPT2TP);

}  // namespace zt::models
