#include "models/llama_tp.h"

#include <ATen/CPUGeneratorImpl.h>

#include "models/checkpoint.h"
#include "models/model_util.h"
#include "tp/cross_entropy.h"
#include "tp/mappings.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace F = torch::nn::functional;

namespace {
using util::ends_with;
using util::rotate_half;

// RMSNorm (models/llama.h); under sequence parallelism its weight's gradient is summed
// over tp (see [TP Regions]).
torch::Tensor tp_rms_norm(RMSNorm& n, const torch::Tensor& x, const comm::GroupPtr& g, bool sp) {
  if (!sp) return n->forward(x);
  const auto xf = x.to(torch::kFloat);
  const auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + n->eps);
  return tp::copy_to_region(n->weight, g) * y.to(x.scalar_type());
}

tp::ColumnParallelLinear column(int64_t in, int64_t out, bool bias, const comm::GroupPtr& g, bool sp) {
  tp::ColumnParallelOptions o;
  o.bias = bias;
  o.sequence_parallel = sp;
  return tp::ColumnParallelLinear(in, out, g, o);
}

tp::RowParallelLinear row(int64_t in, int64_t out, bool bias, const comm::GroupPtr& g, bool sp) {
  tp::RowParallelOptions o;
  o.bias = bias;
  o.sequence_parallel = sp;
  return tp::RowParallelLinear(in, out, g, o);
}

}  // namespace

tp::SplitSpec llama_tp_split_spec(const LlamaConfig& cfg, int tp, const std::string& name) {
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
    return {0, 1, tp::padded_vocab(cfg.vocab_size, tp, cfg.lm_head_pad_multiple)};
  for (const char* col : {"q_proj.", "k_proj.", "v_proj.", "gate_proj.", "up_proj."})
    if (name.find(col) != std::string::npos) return {0, 1, 0};
  if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight")) return {1, 1, 0};
  if (ends_with(name, "o_proj.bias") || ends_with(name, "down_proj.bias") || ends_with(name, "norm.weight")) return {};
  throw zt::InternalError("LlamaTP: no parameter named '" + name + "'");
}

std::map<std::string, torch::Tensor> llama_tp_cut(const LlamaConfig& cfg,
                                                  const std::map<std::string, torch::Tensor>& full, int rank, int tp) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : full) out[name] = tp::cut(t, llama_tp_split_spec(cfg, tp, name), rank, tp);
  return out;
}

LlamaTPAttentionImpl::LlamaTPAttentionImpl(const LlamaConfig& c, int64_t layer, const comm::GroupPtr& g, bool sp)
    : local_heads(c.num_attention_heads / (g ? g->size() : 1)),
      local_kv_heads(c.num_key_value_heads / (g ? g->size() : 1)),
      head_dim(c.head_dim),
      window(!c.layer_sliding.empty() && c.layer_sliding[static_cast<size_t>(layer)] ? c.sliding_window : 0) {
  q_proj = register_module("q_proj", column(c.hidden_size, c.q_dim(), c.qkv_bias, g, sp));
  k_proj = register_module("k_proj", column(c.hidden_size, c.kv_dim(), c.qkv_bias, g, sp));
  v_proj = register_module("v_proj", column(c.hidden_size, c.kv_dim(), c.qkv_bias, g, sp));
  o_proj = register_module("o_proj", row(c.q_dim(), c.hidden_size, c.o_bias, g, sp));
}

torch::Tensor LlamaTPAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                            const torch::Tensor& sin) {
  auto q = q_proj(x);  // (B, T, H/tp * hd), full T under sequence parallelism
  const int64_t B = q.size(0), T = q.size(1);
  auto heads = [&](const torch::Tensor& t, int64_t n) { return t.view({B, T, n, head_dim}).transpose(1, 2); };
  q = heads(q, local_heads);
  auto k = heads(k_proj(x), local_kv_heads);
  auto v = heads(v_proj(x), local_kv_heads);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  // This rank's query heads and the kv heads they share (GQA groups stay on one rank).
  const bool gqa = local_kv_heads != local_heads;
  torch::Tensor y;
  if (window > 0 && T > window) {
    auto i = torch::arange(T, torch::TensorOptions().device(x.device()).dtype(torch::kLong)).unsqueeze(1);
    auto j = torch::arange(T, torch::TensorOptions().device(x.device()).dtype(torch::kLong)).unsqueeze(0);
    auto mask = (j <= i).logical_and(j > i - window);
    y = at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, std::nullopt, gqa);
  } else {
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/true, std::nullopt, gqa);
  }
  y = y.transpose(1, 2).contiguous().view({B, T, local_heads * head_dim});
  return o_proj(y);
}

LlamaTPMLPImpl::LlamaTPMLPImpl(const LlamaConfig& c, const comm::GroupPtr& g, bool sp) {
  gate_proj = register_module("gate_proj", column(c.hidden_size, c.intermediate_size, c.mlp_bias, g, sp));
  up_proj = register_module("up_proj", column(c.hidden_size, c.intermediate_size, c.mlp_bias, g, sp));
  down_proj = register_module("down_proj", row(c.intermediate_size, c.hidden_size, c.mlp_bias, g, sp));
}

torch::Tensor LlamaTPMLPImpl::forward(const torch::Tensor& x) { return down_proj(F::silu(gate_proj(x)) * up_proj(x)); }

LlamaTPLayerImpl::LlamaTPLayerImpl(const LlamaConfig& c, int64_t layer, const comm::GroupPtr& g, bool sp)
    : group(g), sequence_parallel(sp) {
  self_attn = register_module("self_attn", LlamaTPAttention(c, layer, g, sp));
  mlp = register_module("mlp", LlamaTPMLP(c, g, sp));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaTPLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto h = x + self_attn(tp_rms_norm(input_layernorm, x, group, sequence_parallel), cos, sin);
  return h + mlp(tp_rms_norm(post_attention_layernorm, h, group, sequence_parallel));
}

LlamaTPModelImpl::LlamaTPModelImpl(const LlamaConfig& c, const comm::GroupPtr& g, bool sp) {
  embed_tokens = register_module(
      "embed_tokens", tp::VocabParallelEmbedding(c.vocab_size, c.hidden_size, g, c.lm_head_pad_multiple, sp, 1));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaTPLayer(c, i, g, sp));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

LlamaTPImpl::LlamaTPImpl(const LlamaConfig& cfg, comm::GroupPtr g, bool sequence_parallel)
    : cfg_(cfg), group_(std::move(g)), sp_(sequence_parallel) {
  const int n = tp_size();
  ZT_CHECK_T(cfg.num_attention_heads % n == 0, zt::ConfigError, "tensor parallelism: num_attention_heads = ",
             cfg.num_attention_heads, " does not divide by the tensor-parallel size ", n,
             " (attention is split by heads); choose a tp degree dividing it");
  ZT_CHECK_T(cfg.num_key_value_heads % n == 0, zt::ConfigError, "tensor parallelism: num_key_value_heads = ",
             cfg.num_key_value_heads, " does not divide by the tensor-parallel size ", n,
             " (each rank holds whole key/value heads of grouped-query attention); choose a tp degree dividing ",
             cfg.num_key_value_heads);
  ZT_CHECK_T(cfg.pad_token_id < 0, zt::ConfigError, "LlamaTP: pad_token_id = ", cfg.pad_token_id,
             " (an embedding row without gradient) is not supported with tensor parallelism yet; set it to -1");
  ZT_CHECK_T(!cfg.deferred_init, zt::ConfigError,
             "LlamaTP: deferred_init is not supported with tensor parallelism; build the model eagerly");
  auto gen = at::detail::getDefaultCPUGenerator();
  const auto state = gen.get_state();
  model = register_module("model", LlamaTPModel(cfg, group_, sp_));
  for (size_t i = 0; i < model->layers->size(); ++i)
    layers_.push_back(LlamaTPLayer(model->layers->ptr<LlamaTPLayerImpl>(i)));
  if (cfg.tie_word_embeddings) {
    lm_head_weight = model->embed_tokens->weight;
  } else {
    const auto& w = model->embed_tokens->weight;  // (Vp/tp, d)
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(w.size(1), w.size(0)).bias(false)));
    lm_head_weight = lm_head->weight;
  }
  rope_tables_ = LlamaRopeTables(llama_rope_inv_freq(cfg));
  gen.set_state(state);
  // Llama's init (LlamaForCausalLMImpl::init_parameter) on the full tensor, then the slice.
  torch::NoGradGuard no_grad;
  for (auto& kv : named_parameters()) {
    const auto& name = kv.key();
    auto full = torch::empty(full_shape(name));
    if (ends_with(name, "norm.weight")) {
      full.fill_(1.0);
    } else if (ends_with(name, ".bias")) {
      full.zero_();
    } else {
      full.normal_(0.0, cfg_.initializer_range);
    }
    kv.value().copy_(tp::cut(full, split_spec(name), tp_rank(), n));
  }
}

std::vector<int64_t> LlamaTPImpl::full_shape(const std::string& name) const { return llama_param_shape(cfg_, name); }

void LlamaTPImpl::load_full(const std::map<std::string, torch::Tensor>& full) {
  torch::NoGradGuard no_grad;
  for (auto& kv : named_parameters()) {
    auto it = full.find(kv.key());
    ZT_CHECK_T(it != full.end(), zt::CheckpointError, "LlamaTP::load_full: the full state has no '", kv.key(), "'");
    ZT_CHECK_T(it->second.sizes().vec() == full_shape(kv.key()), zt::CheckpointError, "LlamaTP::load_full: '",
               kv.key(), "' has shape ", it->second.sizes(), ", expected ", c10::IntArrayRef(full_shape(kv.key())));
    kv.value().copy_(tp::cut(it->second, split_spec(kv.key()), tp_rank(), tp_size()));
  }
}

std::map<std::string, torch::Tensor> LlamaTPImpl::full_state() {
  std::map<std::string, torch::Tensor> out;
  for (const auto& kv : named_parameters()) {
    const auto spec = split_spec(kv.key());
    const auto shape = full_shape(kv.key());
    const int64_t full_size = spec.split() ? shape[static_cast<size_t>(spec.dim)] : 0;
    out[kv.key()] = tp::gather_full(kv.value().detach(), spec, full_size, group_).to(torch::kCPU, torch::kFloat).clone();
  }
  return out;
}

zt::TensorParallelSpec LlamaTPImpl::tensor_parallel_spec(const std::string& name) const {
  const auto s = split_spec(name);
  if (!s.split()) return {};
  return {s.dim, "tp", s.blocks, s.padded, full_shape(name)[static_cast<size_t>(s.dim)], tp_rank(), tp_size()};
}

double LlamaTPImpl::norm_weight(const std::string& name) const {
  return split_spec(name).split() ? 1.0 : 1.0 / static_cast<double>(tp_size());
}

std::vector<zt::ModelUnit> LlamaTPImpl::zero_units() const {
  std::vector<zt::ModelUnit> out;
  for (size_t i = 0; i < layers_.size(); ++i) out.push_back({"model.layers." + std::to_string(i), layers_[i]->parameters()});
  return out;
}

double LlamaTPImpl::flops_per_token(int64_t seq) const {
  return llama_flops_per_token(cfg_, seq) / static_cast<double>(tp_size());
}

torch::Tensor LlamaTPImpl::hidden(const torch::Tensor& idx) {
  ZT_CHECK(idx.dim() == 2 && idx.scalar_type() == torch::kLong, "LlamaTP: idx must be (B, T) int64, got ",
           idx.sizes(), " ", idx.scalar_type());
  const int64_t T = idx.size(1);
  ZT_CHECK(T <= cfg_.max_position_embeddings, "LlamaTP: sequence length ", T, " exceeds max_position_embeddings ",
           cfg_.max_position_embeddings);
  ZT_CHECK_T(!sp_ || T % tp_size() == 0, zt::ConfigError, "sequence parallelism: the sequence length ", T,
             " does not divide by the tensor-parallel size ", tp_size(), "; use a multiple of ", tp_size());
  auto x = model->embed_tokens(idx);  // (B, T or T/tp, d)
  // Attention sees the full sequence (the column-parallel q/k/v all-gather it), so the
  // rotary tables cover all T positions.
  const auto [cos, sin] = rope_tables_(T, x);  // [Rope Tables]
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto u = static_cast<int64_t>(i);
    // ZeRO-3: the layer is gathered around its forward (and around its recompute when it is
    // checkpointed); wrap_output gathers it again before its backward.
    auto body = [layer = layers_[i].ptr(), hooks = hooks_, u, cos, sin](const torch::Tensor& t) {
      const bool recompute = in_checkpoint_recompute();
      if (hooks.pre_forward) hooks.pre_forward(u, recompute);
      auto y = layer->forward(t, cos, sin);
      if (hooks.post_forward) hooks.post_forward(u, recompute);
      return y;
    };
    // A checkpointed layer recomputes its collectives in backward, on every tp rank alike;
    // cos and sin are no function of x (the same tables in recompute).
    x = ckpt_ ? ckpt_->run(u, body, x) : body(x);
    if (hooks_.wrap_output) x = hooks_.wrap_output(u, x);
  }
  return tp_rms_norm(model->norm, x, group_, sp_);
}

void LlamaTPImpl::set_activation_checkpointing(bool enabled) {
  if (enabled) {
    set_activation_checkpointing(TpCheckpointOptions{});
  } else {
    ckpt_.reset();
  }
}

void LlamaTPImpl::set_activation_checkpointing(const TpCheckpointOptions& o) {
  ckpt_ = std::make_shared<TpCheckpointer>(group_, cfg_.num_hidden_layers, o, sp_);
}

torch::Tensor LlamaTPImpl::local_logits(const torch::Tensor& idx) {
  return tp::column_parallel_linear(hidden(idx), lm_head_weight, {}, group_, sp_, /*seq_dim=*/1);
}

torch::Tensor LlamaTPImpl::forward(const torch::Tensor& idx) {
  auto logits = tp::gather_from_region(local_logits(idx), group_, -1);
  return logits.narrow(-1, 0, cfg_.vocab_size).contiguous();
}

torch::Tensor LlamaTPImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  ZT_CHECK(targets.sizes() == idx.sizes(), "LlamaTP::loss: targets ", targets.sizes(), " must match idx ",
           idx.sizes());
  const auto lg = local_logits(idx);
  return tp::vocab_parallel_cross_entropy(lg.reshape({-1, lg.size(-1)}), targets.reshape({-1}), cfg_.vocab_size,
                                          group_);
}

}  // namespace zt::models
