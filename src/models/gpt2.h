// GPT-2 family on torch::nn, laid out so named_parameters() match Hugging Face's
// GPT2Model names ("wte.weight", "h.0.attn.c_attn.weight", "ln_f.bias", ...). The LM
// head is tied to wte: there is no separate lm_head parameter.
//
// Differences from HF that matter to a loader: c_attn/c_proj/c_fc are torch::nn::Linear,
// whose weight is (out, in); HF's Conv1D stores (in, out), so load_hf_gpt2 transposes.
// There is no dropout (HF's defaults of 0.1 only act in train mode; benchmarks and the
// anchor comparisons run without it), so forward is deterministic — which activation
// checkpointing relies on when it recomputes a block.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/moe.h"
#include "zerotrain/comm.h"
#include "zerotrain/model.h"

namespace zt::models {

struct GPT2Config {
  int64_t n_layer = 12;       // transformer blocks
  int64_t n_head = 12;        // attention heads; n_embd % n_head == 0
  int64_t n_embd = 768;       // model width C
  int64_t vocab_size = 50257; // V (256 for the byte tokenizer)
  int64_t n_positions = 1024; // longest sequence T the position table holds
  // Partitioned construction: the matrices (embeddings, Linear weights and biases) are
  // built as 1x1 placeholders and materialised later, one ZeRO-3 unit at a time on the
  // device, through param_shape()/init_parameter() (the engine does this at initialize).
  // LayerNorm parameters (2C per norm) are built for real.
  bool deferred_init = false;
  // The LM head multiplies by wte padded with zero rows up to a multiple of this (50257 ->
  // 50304 for 64): a vocabulary of odd size makes the logits' row stride odd, which sends
  // cuBLAS to unaligned kernels that took 26 of GPT-2 Large's 139 ms per step on an H200.
  // The padded logits are never seen: forward() returns the first V columns and loss()
  // masks the rest with -inf, so the math is unchanged. The parameter stays (V, C).
  // 1 = no padding.
  int64_t lm_head_pad_multiple = 64;
  // loss() computes the LM head and the cross entropy as one chunked function
  // (src/models/lm_head_loss.h): about 4 GB less at the end of forward for GPT-2 Large at
  // 8 x 1024 tokens. fp16 always takes the unfused path (see there why).
  bool fused_lm_head_loss = true;
  // [GPT-2 MoE] Mixture of Experts (docs/moe.md). 0 = the dense GPT-2 (every field below
  // unused). E > 0: blocks moe_every-1, 2*moe_every-1, ... (every other block for 2, the
  // odd ones as in GShard/Switch) replace their MLP by an MoE layer (models/moe.h) of E copies of
  // GPT-2's MLP (c_fc -> GELU -> c_proj), parameters "h.<i>.moe.gate.weight" and
  // "h.<i>.moe.experts.<e>.c_fc.weight", ...; loss() adds moe_aux_loss_coef times the sum of
  // the MoE blocks' load-balancing losses. No noisy gate and no second-expert sampling: the
  // routing draws nothing from a generator, so a seed gives the same routing at every ep.
  int64_t moe_num_experts = 0;
  int64_t moe_every = 2;             // >= 1; 1 = every block
  int64_t moe_k = 2;                 // top-k: 1 or 2
  double moe_capacity_factor = 1.0;  // training and eval (DeepSpeed doubles it for top-2)
  int64_t moe_min_capacity = 4;
  bool moe_drop_tokens = false;      // false: dropless (no token dropped)
  double moe_aux_loss_coef = 0.01;   // DeepSpeed's usual load-balancing coefficient
};

// True for the blocks whose MLP is an MoE under cfg ([GPT-2 MoE]).
bool gpt2_is_moe_block(const GPT2Config& cfg, int64_t block);
// True for an expert parameter of the MoE GPT-2 ("....moe.experts.<e>...."), the engine's
// EngineOptions::is_expert.
bool gpt2_is_expert_param(const std::string& name);

// "gpt2-tiny" (2/4/128, V=256, T=256: the byte-tokenizer model that trains on a laptop
// CPU), "gpt2-tiny-moe" (gpt2-tiny with block 1's MLP an MoE of 4 experts, top-2,
// dropless: [GPT-2 MoE]), "gpt2" (124M), "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1.5B).
// Throws ConfigError listing the known names for anything else.
GPT2Config named_gpt2(const std::string& name);
std::vector<std::string> gpt2_names();

// Reads a HF config.json (a file, or a directory holding one). Throws ConfigError when a
// field this implementation does not support is set (non-tanh GELU, eps != 1e-5, untied
// embeddings, reorder_and_upcast_attn, scale_attn_by_inverse_layer_idx).
GPT2Config gpt2_config_from_hf_json(const std::string& path);
// The HF config.json for `cfg` (model_type gpt2, tied embeddings, gelu_new, eps 1e-5).
std::string gpt2_config_to_hf_json(const GPT2Config& cfg);

// Sizes without building the model (memory estimates before allocating anything).
// Per block 12C^2 + 13C; plus wte (V*C, also the LM head), wpe (n_positions*C), ln_f 2C.
int64_t gpt2_num_params(const GPT2Config& cfg);
int64_t gpt2_num_params_non_embedding(const GPT2Config& cfg);  // minus wpe
// 6*N + 12*n_layer*n_embd*seq with N = gpt2_num_params_non_embedding (see flops_per_token).
double gpt2_flops_per_token(const GPT2Config& cfg, int64_t seq);
// The LM head's vocabulary: vocab_size rounded up to lm_head_pad_multiple (50304 for GPT-2).
int64_t gpt2_padded_vocab(const GPT2Config& cfg);
// Rows per chunk of the fused LM-head loss: about 512 MiB of fp32 logits, at least 64
// (2668 rows of 50304 for GPT-2). The model and zerotrain estimate both use it.
int64_t gpt2_loss_chunk_rows(const GPT2Config& cfg);

// The layers GPT-2's blocks run through (gpt2.cpp): y = x W^T + b as one addmm whose
// backward accumulates into an existing W.grad in the GEMM, and LayerNorm with ATen's
// forward and input gradient and, on CUDA, zerotrain's kernels for the bias and
// LayerNorm parameter gradients. Same values as torch::nn::Linear / LayerNorm.
torch::Tensor linear(const torch::nn::Linear& l, const torch::Tensor& x);
torch::Tensor layer_norm(const torch::nn::LayerNorm& ln, const torch::Tensor& x);

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GPT2Config& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C)

  int64_t n_head;
  torch::nn::Linear c_attn{nullptr};  // weight (3C, C): q, k, v stacked along rows
  torch::nn::Linear c_proj{nullptr};  // weight (C, C); residual projection
};
TORCH_MODULE(CausalSelfAttention);

struct MLPImpl : torch::nn::Module {
  explicit MLPImpl(const GPT2Config& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C)

  torch::nn::Linear c_fc{nullptr};    // weight (4C, C)
  torch::nn::Linear c_proj{nullptr};  // weight (C, 4C); residual projection
};
TORCH_MODULE(MLP);

struct BlockImpl : torch::nn::Module {
  // moe: this block's MLP is an MoE over ep_group ([GPT-2 MoE]).
  explicit BlockImpl(const GPT2Config& cfg, bool moe = false, comm::GroupPtr ep_group = nullptr);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C), pre-LN

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  MLP mlp{nullptr};                      // null in an MoE block
  MoE moe{nullptr};                      // null in a dense block
  torch::Tensor aux_loss;                // the MoE's load-balancing loss of the last forward
  double dropped_fraction = 0.0;         // and its dropped fraction
  std::vector<int64_t> kept_per_expert;  // and the assignments each (global) expert kept
};
TORCH_MODULE(Block);

// Called around every block's forward, including the recompute of a checkpointed block
// during backward: the engine's unit hooks (zerotrain/model.h), one unit per block.
using BlockHooks = zt::UnitHooks;

// Implements zt::ZeroModel: the blocks are the ZeRO-3 units ("h.0", "h.1", ...), driven by
// block hooks; deferred_init builds placeholders the engine materialises.
struct GPT2Impl : torch::nn::Module, zt::ZeroModel {
  // Parameters are created on the CPU in fp32 with GPT-2 init drawn from the global
  // generator (seed it with torch::manual_seed for reproducible weights).
  // ep_group: the MoE blocks' experts split over it ([Expert Parallel] in models/moe.h);
  // null = every expert here. Parameters of experts are local (experts.0 .. E/ep - 1).
  explicit GPT2Impl(const GPT2Config& cfg, comm::GroupPtr ep_group = nullptr);

  // idx (B, T) int64 with T <= n_positions -> logits (B, T, V) in the parameter dtype.
  torch::Tensor forward(const torch::Tensor& idx);
  // Mean cross entropy over all positions, computed in fp32 whatever the param dtype;
  // targets (B, T) int64, entries equal to -1 are ignored. Returns a scalar fp32 tensor.
  // With MoE blocks, plus moe_aux_loss_coef x the sum of their aux losses ([GPT-2 MoE]).
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  // The trunk: embeddings, blocks, final LayerNorm. idx (B, T) -> (B, T, C).
  torch::Tensor hidden(const torch::Tensor& idx);
  // x (B, T, C) -> logits (B, T, Vp) over the padded vocabulary (lm_head_pad_multiple).
  torch::Tensor lm_head(const torch::Tensor& x);

  // Re-initialises every parameter with GPT-2's scheme: N(0, 0.02) for Linear and
  // Embedding weights, N(0, 0.02/sqrt(2*n_layer)) for the residual projections
  // (attn.c_proj, mlp.c_proj), zero biases, LayerNorm weight 1 / bias 0.
  void reset_parameters();
  // The full shape of a parameter by name, and GPT-2's initialisation for it (the scheme
  // reset_parameters applies; placeholders of a deferred_init model get their values here).
  std::vector<int64_t> param_shape(const std::string& name) const override;
  void init_parameter(const std::string& name, torch::Tensor& t) const override;
  bool deferred_init() const override { return cfg_.deferred_init; }

  // Checkpoints blocks [0, number_checkpoints) (all blocks when nullopt): their
  // activations are dropped after forward and recomputed in backward, keeping only each
  // block's input (in pinned host memory when cpu_checkpointing and CUDA is present).
  // Only applies while grad mode is on; eval/no-grad forwards are unaffected.
  void set_activation_checkpointing(bool enabled, std::optional<int64_t> number_checkpoints = std::nullopt,
                                    bool cpu_checkpointing = false);
  bool activation_checkpointing() const { return ckpt_enabled_; }
  void set_block_hooks(BlockHooks hooks) { hooks_ = std::move(hooks); }
  void set_unit_hooks(zt::UnitHooks hooks) override { set_block_hooks(std::move(hooks)); }
  // One unit per block, "h.<i>", in forward order.
  std::vector<zt::ModelUnit> zero_units() const override;

  // The transformer blocks in execution order (the engine's ZeRO-3 gather units).
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const;
  const Block& blocks_at(int64_t i) const { return blocks_.at(static_cast<size_t>(i)); }
  const GPT2Config& config() const { return cfg_; }
  // [GPT-2 MoE] The name parameter `name` has at ep 1: "h.<b>.moe.experts.<i>.<rest>" (local
  // expert i of this rank) becomes "h.<b>.moe.experts.<first_expert() + i>.<rest>"; any other
  // name is returned as it is. EngineOptions::expert_global_name (checkpoints store experts by
  // global index, so a checkpoint of any ep loads at any other).
  std::string global_param_name(const std::string& name) const;
  // The MoE blocks' aux loss of the last loss() (unscaled sum; 0 without MoE), and their
  // dropped fraction (mean over the MoE blocks), for the log.
  double last_moe_aux_loss() const { return last_aux_.defined() ? last_aux_.item<double>() : 0.0; }
  double last_moe_dropped_fraction() const { return last_dropped_; }
  // The same aux loss as a detached scalar on the model's device (no sync), and the
  // assignments each expert kept (after drops) in the last loss(), per MoE block in block
  // order: this process's tokens, all E experts by global index (under expert
  // parallelism too); each block's row sums to tokens x k x (1 - its dropped fraction).
  const torch::Tensor& last_moe_aux_tensor() const { return last_aux_; }
  std::vector<std::vector<int64_t>> last_moe_kept_per_expert() const;
  // [MoE Timing] in models/moe.h: time every MoE block's all-to-alls (expert parallelism),
  // and hand over the spans recorded since the last call (forward and backward).
  void set_moe_timing(bool on);
  std::vector<DeviceSpan> take_moe_all_to_all_spans();

  int64_t num_params() const;               // all parameters (wte counted once: tied)
  int64_t num_params_non_embedding() const; // num_params minus wpe (wte stays: it is the LM head)
  // Training FLOPs per token at sequence length `seq`: 6*N + 12*n_layer*n_embd*seq, with
  // N = num_params_non_embedding() (the 6N covers forward+backward of every matmul, the
  // tied LM head included; the second term is attention's QK^T and AV). Same as nanoGPT's
  // MFU estimate and PaLM appendix B.
  double flops_per_token(int64_t seq) const override;

  torch::nn::Embedding wte{nullptr};  // (V, C), also the LM head
  torch::nn::Embedding wpe{nullptr};  // (n_positions, C)
  torch::nn::ModuleList h{nullptr};   // n_layer Blocks
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  torch::Tensor run_block(int64_t i, const torch::Tensor& x);
  torch::Tensor lm_loss(const torch::Tensor& h, const torch::Tensor& targets);  // h (B, T, C)

  GPT2Config cfg_;
  std::vector<Block> blocks_;
  bool ckpt_enabled_ = false;
  int64_t ckpt_count_ = 0;
  bool ckpt_cpu_ = false;
  BlockHooks hooks_;
  torch::Tensor last_aux_;  // detached: read (a device sync) only when the log asks
  double last_dropped_ = 0.0;
};
TORCH_MODULE(GPT2);

}  // namespace zt::models
