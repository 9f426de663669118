// The Llama family (Llama 2/3, Mistral, Qwen2) on torch::nn, laid out so that
// named_parameters() are Hugging Face's LlamaForCausalLM names
// ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", ...,
// "model.norm.weight", "lm_head.weight" when untied), so HF safetensors load by name
// with no transposes (HF's nn.Linear is (out, in), as torch::nn::Linear).
//
// One decoder layer, pre-norm:
//   h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))   n1 = RMSNorm(x)
//   y = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))                    n2 = RMSNorm(h)
// Attention is at::scaled_dot_product_attention (is_causal, enable_gqa for grouped-query
// attention), so CUDA runs flash attention; a sliding window (Mistral, Qwen2) longer than
// the sequence needs no mask, a shorter one becomes a boolean mask (math kernel).
// There is no dropout (attention_dropout must be 0): forward is deterministic, which
// activation checkpointing relies on when it recomputes a layer.
//
// [SFT Attention] Per-example attention for packed SFT windows (`train --sft-attention
// per-example`): forward/hidden/loss take optional position ids `pos` (B, T) int64 that
// restart at 0 on each example's first token (ShardDataset's Example::pos). Then RoPE uses
// pos (as transformers with position_ids), and attention is block-diagonal causal: query i
// sees key j when j <= i and no position 0 lies in (j, i], i.e. within its own example
// (one (B, 1, T, T) bool mask for all layers, through SDPA's attn_mask; with a sliding
// window also j > i - window). An example packed after others thus gives the logits it
// gives alone from position 0, as transformers' packing with position_ids / flash varlen
// does. Without pos nothing changes: is_causal, no mask (flash attention on CUDA).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint.h"  // sibling-relative, as gpt2.h's users expect
#include "moe.h"
#include "zerotrain/comm.h"

namespace zt::models {

// Hugging Face rope_scaling / rope_parameters["rope_type"].
enum class RopeType { kDefault, kLinear, kLlama3 };

struct LlamaConfig {
  // The HF class this config builds: "LlamaForCausalLM", "MistralForCausalLM" or
  // "Qwen2ForCausalLM" (written back to config.json's architectures / model_type).
  std::string architecture = "LlamaForCausalLM";
  int64_t vocab_size = 32000;               // V
  int64_t hidden_size = 4096;               // d
  int64_t intermediate_size = 11008;        // SwiGLU width
  int64_t num_hidden_layers = 32;           // L
  int64_t num_attention_heads = 32;         // query heads H
  int64_t num_key_value_heads = 32;         // key/value heads; H % this == 0 (GQA when <)
  int64_t head_dim = 128;                   // per head (HF: hidden_size / H unless set)
  int64_t max_position_embeddings = 2048;   // longest sequence forward accepts
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeType rope_type = RopeType::kDefault;
  double rope_factor = 1.0;                 // linear and llama3
  double rope_low_freq_factor = 1.0;        // llama3
  double rope_high_freq_factor = 4.0;       // llama3
  int64_t rope_original_max_position_embeddings = 8192;  // llama3
  // Biases: q/k/v (Qwen2 always; Llama's attention_bias also sets o), o, and the MLP's.
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  bool tie_word_embeddings = false;         // LM head = embed_tokens (no lm_head.weight)
  // Sliding-window attention: a layer with layer_sliding[i] attends to the last
  // sliding_window positions (itself included). 0 = no window anywhere.
  int64_t sliding_window = 0;
  std::vector<bool> layer_sliding;          // empty = no layer slides
  double initializer_range = 0.02;          // N(0, this) for matrices
  // HF's nn.Embedding padding_idx: this row of embed_tokens starts at 0 and gets no
  // gradient. -1 = none.
  int64_t pad_token_id = -1;
  // config.json fields that do not change the math (token ids, torch_dtype, ...), kept
  // as JSON text so that writing the config back preserves them.
  std::string hf_extra_json = "{}";
  // Partitioned construction, as GPT2Config::deferred_init: Linear and Embedding weights
  // are 1x1 placeholders, filled later through param_shape()/init_parameter() (or an HF
  // checkpoint, see hf_llama.h) one ZeRO-3 unit at a time. RMSNorm weights are real.
  bool deferred_init = false;
  // Pads the LM head to a multiple of this (see GPT2Config::lm_head_pad_multiple).
  int64_t lm_head_pad_multiple = 64;
  // [Mixtral] Hugging Face's MixtralForCausalLM (architecture "MixtralForCausalLM"):
  // num_local_experts E > 0 makes every decoder layer's MLP an MoE ("block_sparse_moe":
  // gate (E, d) and E SwiGLU experts w1/w3 (I, d), w2 (d, I)) with GateRouting::Mixtral
  // (models/moe.h [Mixtral Routing]): top num_experts_per_tok of softmax(gate logits),
  // renormalised, dropless. With output_router_logits the loss adds router_aux_loss_coef x
  // HF's load_balancing_loss_func over the router logits of ALL layers concatenated (not a
  // sum of per-layer losses), as MixtralForCausalLM does; without it nothing is added.
  int64_t num_local_experts = 0;      // 0 = dense (LlamaMLP)
  int64_t num_experts_per_tok = 2;    // k, 1..E
  double router_aux_loss_coef = 0.001;  // HF MixtralConfig's default
  bool output_router_logits = false;    // HF's default: no aux loss in the loss

  bool is_moe() const { return num_local_experts > 0; }

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// "llama-tiny" (2 layers, d 128, 4 heads / 2 kv heads, V 256 for the byte tokenizer:
// trains on a laptop CPU), "llama3.2-1b" and "llama3-8b" (Meta's HF hyperparameters:
// V 128256, rope_theta 5e5; 3.2-1B with llama3 rope scaling and tied embeddings),
// "mixtral-tiny" ([Mixtral]: 2 layers, d 64, 4 heads / 2 kv heads, 4 experts of width
// 128, top-2, V 256, output_router_logits on with coefficient 0.02 as Mixtral-8x7B's).
// Throws ConfigError listing the known names for anything else.
LlamaConfig named_llama(const std::string& name);
std::vector<std::string> llama_names();
bool is_llama_name(const std::string& name);

// Reads an HF config.json (a file, or a directory holding one). architectures (or
// model_type) must be Llama, Mistral, Qwen2 or Mixtral ([Mixtral]); any other is a
// ConfigError naming it (Qwen-MoE: naming what is not built).
// Fields that change the math and are not implemented (hidden_act other than silu,
// attention_dropout, other rope types, partial rotary) are ConfigErrors too. Both the
// transformers 4 keys (rope_theta, rope_scaling {"type"|"rope_type"}) and 5
// (rope_parameters) are read.
LlamaConfig llama_config_from_hf_json(const std::string& path);
LlamaConfig llama_config_from_hf_json_text(const std::string& text, const std::string& where);
// The HF config.json for `cfg` (architectures, model_type, every field above).
std::string llama_config_to_hf_json(const LlamaConfig& cfg);
// True when `path` (a config.json or a directory with one) names a Llama-family class.
bool is_llama_hf_config(const std::string& path);

// Parameter names and full shapes in registration order (HF's order).
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_param_shapes(const LlamaConfig& cfg);
// The full shape of one parameter by name (layers are alike: looked up as layer 0);
// InternalError for a name the model does not have.
std::vector<int64_t> llama_param_shape(const LlamaConfig& cfg, const std::string& name);
int64_t llama_num_params(const LlamaConfig& cfg);  // the tied head counted once
// Training FLOPs per token at sequence length T, PaLM-style:
//   6 * (N_layers + V * d) + 12 * L * (H * head_dim) * T
// N_layers = every parameter but the embedding table and the LM head (the embedding is a
// lookup; the LM head's matmul is the V*d term, tied or not); the last term is attention's
// QK^T and AV (full T x T, as nanoGPT and the MFU figure count it). [Mixtral]:
// N_layers counts the num_experts_per_tok experts a token runs through, not all E.
double llama_flops_per_token(const LlamaConfig& cfg, int64_t seq);

// Rows per chunk of the fused LM-head loss: about 512 MiB of logits at `logit_bytes` per logit
// (lm_head_logit_bytes of the hidden state: 2 for bf16/fp16 on the fused CUDA path, 4 on the
// CPU and for fp32), at least 64: what LlamaForCausalLMImpl::loss passes to
// lm_head_cross_entropy (a pipeline head does the same). Llama-3.2-1B (V 128256) at 4 x 2048
// tokens: 1046 rows, 8 chunks, at 4 bytes; 2092 rows, 4 chunks, at 2. Fewer chunks, less
// traffic: each chunk's head-gradient GEMM reads and writes the whole fp32 (V, C) accumulator.
int64_t llama_loss_chunk_rows(const LlamaConfig& cfg, int64_t logit_bytes);

// The rotary inverse frequencies (head_dim / 2, fp32) exactly as transformers computes
// them for the config's rope type.
torch::Tensor llama_rope_inv_freq(const LlamaConfig& cfg);

// [Rope Tables] A model's rotary tables: inv_freq (fp32, kept on the host), its copy on
// each device made once, and cos/sin of positions 0..T-1 made once per (device, dtype, T)
// (the 8 most recent shapes). transformers' formula: freqs = pos * inv_freq in fp32, emb =
// cat(freqs, freqs), cos/sin cast to the activations' dtype. Copying the pageable inv_freq
// to the device in every forward made ATen synchronise the stream each step (the host then
// waited for the previous step's work before launching the next forward).
class LlamaRopeTables {
 public:
  LlamaRopeTables() = default;
  explicit LlamaRopeTables(torch::Tensor inv_freq);
  // cos, sin: (T, hd) for positions 0..T-1, or (B, 1, T, hd) for position ids `pos` (B, T),
  // in like's dtype on like's device. The cached tables are shared: never modify them.
  std::pair<torch::Tensor, torch::Tensor> operator()(int64_t T, const torch::Tensor& like,
                                                     const torch::Tensor& pos = {}) const;

 private:
  struct Cache;
  torch::Tensor inv_;
  std::shared_ptr<Cache> cache_;
};

struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  // HF's LlamaRMSNorm: normalise in fp32, cast back to x's dtype, times weight.
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  // (d), init 1
  double eps;
};
TORCH_MODULE(RMSNorm);

struct LlamaAttentionImpl : torch::nn::Module {
  LlamaAttentionImpl(const LlamaConfig& cfg, int64_t layer);
  // x (B, T, d), cos/sin (T, head_dim) or (B, 1, T, head_dim) in x's dtype -> (B, T, d).
  // `mask` (B, 1, T, T) bool (true = attend) replaces the causal rule when defined
  // ([SFT Attention]).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask = {});

  int64_t n_head, n_kv_head, head_dim, window;  // window 0 = full causal
  torch::nn::Linear q_proj{nullptr};  // (H*hd, d)
  torch::nn::Linear k_proj{nullptr};  // (KV*hd, d)
  torch::nn::Linear v_proj{nullptr};  // (KV*hd, d)
  torch::nn::Linear o_proj{nullptr};  // (d, H*hd)
};
TORCH_MODULE(LlamaAttention);

struct LlamaMLPImpl : torch::nn::Module {
  explicit LlamaMLPImpl(const LlamaConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // down(silu(gate(x)) * up(x))
  // residual + forward(x); on CUDA with the fused ops on and a plain down_proj, the
  // residual is added in down_proj's GEMM (residual_linear, [Residual Norm]).
  torch::Tensor forward_residual(const torch::Tensor& x, const torch::Tensor& residual);
  torch::nn::Linear gate_proj{nullptr};  // (I, d)
  torch::nn::Linear up_proj{nullptr};    // (I, d)
  torch::nn::Linear down_proj{nullptr};  // (d, I)
};
TORCH_MODULE(LlamaMLP);

// [Mixtral] One expert (HF MixtralBlockSparseTop2MLP): w2(silu(w1 x) * w3 x), no biases.
struct MixtralExpertImpl : torch::nn::Module {
  explicit MixtralExpertImpl(const LlamaConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear w1{nullptr};  // (I, d)
  torch::nn::Linear w2{nullptr};  // (d, I)
  torch::nn::Linear w3{nullptr};  // (I, d)
};
TORCH_MODULE(MixtralExpert);

struct LlamaDecoderLayerImpl : torch::nn::Module {
  // ep_group: a [Mixtral] layer's experts split over it (models/moe.h [Expert Parallel]);
  // null = every expert here.
  LlamaDecoderLayerImpl(const LlamaConfig& cfg, int64_t layer, comm::GroupPtr ep_group = nullptr);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask = {});
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};               // null in a [Mixtral] layer
  MoE block_sparse_moe{nullptr};       // [Mixtral] only: gate + experts.<i>.w1/w2/w3
  RMSNorm input_layernorm{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  // [Mixtral] The routing of the last forward: mean router probability per expert [E]
  // (differentiable: the aux loss's gradient path), the fraction of tokens whose j-th choice
  // is e [k, E], and the assignments each global expert got (host).
  torch::Tensor router_prob_mean, router_choice_fraction;
  std::vector<int64_t> kept_per_expert;
};
TORCH_MODULE(LlamaDecoderLayer);

// [Mixtral] HF's load_balancing_loss_func over the router logits of all layers concatenated
// (L layers of T tokens each): E x sum_{j,e} ce[j, e] x me[e], ce = mean over layers of each
// layer's choice fraction [k, E], me = mean over layers of its mean probability [E] (the
// means over the concatenation, every layer having the same tokens). Gradient through me only.
torch::Tensor mixtral_load_balancing_loss(const std::vector<torch::Tensor>& prob_mean,
                                          const std::vector<torch::Tensor>& choice_fraction);

// [Mixtral] True for an expert parameter ("....block_sparse_moe.experts.<e>...."), the
// engine's EngineOptions::is_expert.
bool llama_is_expert_param(const std::string& name);

// HF's LlamaModel: the trunk, registered as "model" so names carry the "model." prefix.
struct LlamaModelImpl : torch::nn::Module {
  explicit LlamaModelImpl(const LlamaConfig& cfg, comm::GroupPtr ep_group = nullptr);
  torch::nn::Embedding embed_tokens{nullptr};  // (V, d)
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

// How a decoder layer is run: fn(x) is the layer (checkpointed when enabled). A ZeRO-3
// engine passes Engine::run_unit here (gather before, release after, gather again before
// its backward); the default runs fn(x). See llama_engine_units in hf_llama.h.
using LayerRunner = std::function<torch::Tensor(int64_t layer, const CheckpointFn& fn, const torch::Tensor& x)>;

struct LlamaForCausalLMImpl : torch::nn::Module {
  // Parameters on the CPU in fp32, N(0, initializer_range) from the global generator.
  // ep_group: a [Mixtral] model's experts split over it (local experts.0 .. E/ep - 1 of each
  // layer; global_param_name maps them); null = every expert here.
  explicit LlamaForCausalLMImpl(const LlamaConfig& cfg, comm::GroupPtr ep_group = nullptr);

  // idx (B, T) int64, T <= max_position_embeddings -> logits (B, T, V). `pos` (B, T)
  // int64: per-example position ids ([SFT Attention]); undefined = plain causal.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& pos = {});
  // Mean next-token cross entropy in fp32 ([Mixtral] with output_router_logits: plus
  // router_aux_loss_coef x the load-balancing loss of this forward); targets (B, T) int64 are the labels already
  // shifted (targets[t] is the token after idx[t]); entries equal to -100 (HF's
  // ignore_index, for masked fine-tuning) are ignored. The mean is over the counted
  // targets: transformers' loss for labels L equals loss(idx, L shifted left by one with
  // -100 appended).
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets, const torch::Tensor& pos = {});
  torch::Tensor hidden(const torch::Tensor& idx, const torch::Tensor& pos = {});  // (B, T, d) after the final norm

  void reset_parameters();
  std::vector<int64_t> param_shape(const std::string& name) const;  // full shape by HF name

  // [Layerwise Init] Building a large frozen base (QLoRA, LoRA) without holding it whole in
  // fp32 nor drawing it on one thread:
  //   auto m = LlamaForCausalLMImpl::skeleton(cfg);   // structure only, nothing drawn
  //   ... read m's structure (lora_space, select_targets) ...
  //   m->init_layerwise(sink);                        // the values
  // gives bit for bit the parameters LlamaForCausalLM(cfg) has (cfg.deferred_init false) and
  // leaves the default CPU generator where that constructor leaves it, so whatever draws next
  // (LoRA's A matrices) draws the same. init_layerwise skips the constructors' draws
  // (kaiming_uniform_ of each Linear, normal_ of the embedding: their values are overwritten)
  // and draws init_parameter's values one group at a time (the embedding; each decoder layer;
  // the final norm and lm_head), the group's normal_ on the intra-op threads ([Parallel
  // Init], models/parallel_init.h). Each parameter, once drawn, goes to `sink` in
  // named_parameters() order; when it returns true the sink has taken what it needs (e.g.
  // the NF4 form) and the parameter becomes a 0-element placeholder, freed at once; false
  // keeps it. Host peak: one group in fp32 beyond what the sink keeps.
  using InitSink = std::function<bool(const std::string& name, const torch::Tensor& value)>;
  // Every parameter a placeholder, each Linear's options its real sizes (apply_lora reads
  // them); config() is cfg. Nothing else may use the model before init_layerwise.
  static std::shared_ptr<LlamaForCausalLMImpl> skeleton(const LlamaConfig& cfg);
  void init_layerwise(const InitSink& sink);
  // Draws LlamaForCausalLM(cfg)'s constructor takes from the default CPU generator before
  // reset_parameters (the values init_layerwise skips).
  static int64_t construction_draws(const LlamaConfig& cfg);
  // Llama's init: RMSNorm weights 1, biases 0, matrices N(0, initializer_range).
  void init_parameter(const std::string& name, torch::Tensor& t) const;

  // As GPT2Impl::set_activation_checkpointing: layers [0, n) recompute in backward.
  void set_activation_checkpointing(bool enabled, std::optional<int64_t> number_checkpoints = std::nullopt,
                                    bool cpu_checkpointing = false);
  bool activation_checkpointing() const { return ckpt_enabled_; }
  void set_layer_runner(LayerRunner runner) { runner_ = std::move(runner); }

  // The decoder layers in order (one ZeRO-3 gather unit each).
  std::vector<std::shared_ptr<torch::nn::Module>> decoder_layers() const;
  const LlamaConfig& config() const { return cfg_; }
  int64_t num_params() const { return llama_num_params(cfg_); }
  double flops_per_token(int64_t seq) const { return llama_flops_per_token(cfg_, seq); }
  torch::Tensor lm_head_weight() const;  // (V, d): lm_head, or embed_tokens when tied

  // [Mixtral] The load-balancing loss of the last hidden()/forward()/loss() (unscaled,
  // differentiable; undefined for a dense model), its detached copy as loss() saw it (also
  // computed when output_router_logits is off, for the log), and the assignments each global
  // expert got per layer.
  torch::Tensor router_aux_loss() const;
  const torch::Tensor& last_moe_aux_tensor() const { return last_aux_; }
  std::vector<std::vector<int64_t>> last_moe_kept_per_expert() const;
  // "model.layers.<l>.block_sparse_moe.experts.<i>.<rest>" (local expert i) -> its ep-1 name
  // (global index first_expert() + i); any other name unchanged. EngineOptions::expert_global_name.
  std::string global_param_name(const std::string& name) const;
  void set_moe_timing(bool on);
  std::vector<DeviceSpan> take_moe_all_to_all_spans();

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  // cos, sin: (T, hd) for positions 0..T-1, or (B, 1, T, hd) for position ids `pos` (B, T).
  std::pair<torch::Tensor, torch::Tensor> rope(int64_t T, const torch::Tensor& like,
                                               const torch::Tensor& pos = {}) const;

  LlamaConfig cfg_;
  torch::Tensor last_aux_;  // [Mixtral] detached
  bool skeleton_ = false;  // built by skeleton(), init_layerwise not yet run
  std::vector<LlamaDecoderLayer> layers_;
  LlamaRopeTables rope_tables_;  // [Rope Tables]
  bool ckpt_enabled_ = false;
  int64_t ckpt_count_ = 0;
  bool ckpt_cpu_ = false;
  LayerRunner runner_;
};
TORCH_MODULE(LlamaForCausalLM);

}  // namespace zt::models
