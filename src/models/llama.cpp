// The Llama family's modules and model (see llama.h for the layout).
#include "models/model_util.h"
#include "models/llama.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <vector>
#include <string>
#include <tuple>

#include "models/gpt2.h"  // linear(): addmm whose backward accumulates into W.grad
#include "models/linear_adapter.h"
#include "models/llama_fused.h"
#include "models/lm_head_loss.h"
#include "models/parallel_init.h"
#include "models/shared_linear.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace F = torch::nn::functional;

namespace {
using util::ends_with;

// A Linear (in -> out), or a 1x1 placeholder (with a bias placeholder when it has one)
// when the model is built deferred.
torch::nn::Linear make_linear(const LlamaConfig& c, int64_t in, int64_t out, bool bias) {
  return c.deferred_init ? torch::nn::Linear(torch::nn::LinearOptions(1, 1).bias(bias))
                         : torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// y = x W^T (+ b). With a bias: GPT-2's linear() (one addmm; its backward accumulates
// into an existing W.grad). Without: at::linear (a custom autograd Function cannot take
// the undefined bias tensor as an input). The attention and MLP linears come here only
// when one of a group has a bias or an adapter (projs() below); Mixtral's experts always.
// Through the Linear's adapter when it carries one (linear() dispatches itself). [Linear Adapters]
torch::Tensor proj(const torch::nn::Linear& l, const torch::Tensor& x) {
  if (l->bias.defined()) return linear(l, x);
  return run_linear(*l, x, [&l](const torch::Tensor& t) { return F::linear(t, l->weight); });
}

// Bias-less and without an adapter: a linear shared_input_linear can take. [Shared-Input Linears]
bool plain(const torch::nn::Linear& l) { return !l->bias.defined() && linear_adapter(*l) == nullptr; }

// The linears `ls` of one input x: one shared_input_linear node when every one is plain (its
// backward accumulates dx and each W.grad in the GEMMs), else proj() each. [Shared-Input Linears]
std::vector<torch::Tensor> projs(const std::vector<torch::nn::Linear>& ls, const torch::Tensor& x) {
  if (std::all_of(ls.begin(), ls.end(), [](const torch::nn::Linear& l) { return plain(l); })) {
    std::vector<torch::Tensor> ws;
    for (const auto& l : ls) ws.push_back(l->weight);
    return shared_input_linear(x, ws);
  }
  std::vector<torch::Tensor> ys;
  for (const auto& l : ls) ys.push_back(proj(l, x));
  return ys;
}

}  // namespace

int64_t llama_loss_chunk_rows(const LlamaConfig& c, int64_t logit_bytes) {
  ZT_CHECK(logit_bytes > 0, "llama_loss_chunk_rows: logit_bytes ", logit_bytes, " must be positive");
  const int64_t m = std::max<int64_t>(1, c.lm_head_pad_multiple);
  const int64_t vp = (c.vocab_size + m - 1) / m * m;
  return std::max<int64_t>(64, (int64_t{512} << 20) / (logit_bytes * vp));
}

// ---- modules ------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  return llama_rms_norm(x, weight, eps);  // fused on CUDA: [Llama Fused Ops]
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, int64_t layer)
    : n_head(c.num_attention_heads),
      n_kv_head(c.num_key_value_heads),
      head_dim(c.head_dim),
      window(!c.layer_sliding.empty() && c.layer_sliding[static_cast<size_t>(layer)] ? c.sliding_window : 0) {
  q_proj = register_module("q_proj", make_linear(c, c.hidden_size, c.q_dim(), c.qkv_bias));
  k_proj = register_module("k_proj", make_linear(c, c.hidden_size, c.kv_dim(), c.qkv_bias));
  v_proj = register_module("v_proj", make_linear(c, c.hidden_size, c.kv_dim(), c.qkv_bias));
  o_proj = register_module("o_proj", make_linear(c, c.q_dim(), c.hidden_size, c.o_bias));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                          const torch::Tensor& mask) {
  const int64_t B = x.size(0), T = x.size(1);
  auto heads = [&](const torch::Tensor& t, int64_t n) { return t.view({B, T, n, head_dim}).transpose(1, 2); };
  const auto qkv = projs({q_proj, k_proj, v_proj}, x);
  auto q = heads(qkv[0], n_head);     // (B, H, T, hd)
  auto k = heads(qkv[1], n_kv_head);  // (B, KV, T, hd)
  auto v = heads(qkv[2], n_kv_head);  // (B, KV, T, hd)
  q = llama_rope(q, cos, sin);  // q * cos + rotate_half(q) * sin; fused on CUDA: [Llama Fused Ops]
  k = llama_rope(k, cos, sin);
  const bool gqa = n_kv_head != n_head;
  torch::Tensor y;
  if (mask.defined()) {  // [SFT Attention]: within each example (the window rule folded in by hidden())
    y = at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, std::nullopt, gqa);
  } else if (window > 0 && T > window) {
    // Sliding window: query i sees keys j with i - window < j <= i (transformers' rule).
    auto i = torch::arange(T, torch::TensorOptions().device(x.device()).dtype(torch::kLong)).unsqueeze(1);
    auto j = torch::arange(T, torch::TensorOptions().device(x.device()).dtype(torch::kLong)).unsqueeze(0);
    auto mask = (j <= i).logical_and(j > i - window);  // (T, T) bool, true = attend
    y = at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, std::nullopt, gqa);
  } else {
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/true, std::nullopt, gqa);
  }
  y = y.transpose(1, 2).contiguous().view({B, T, n_head * head_dim});
  return projs({o_proj}, y)[0];
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", make_linear(c, c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", make_linear(c, c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", make_linear(c, c.intermediate_size, c.hidden_size, c.mlp_bias));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  const auto gu = projs({gate_proj, up_proj}, x);  // 2 x (B, T, I)
  return projs({down_proj}, llama_swiglu(gu[0], gu[1]))[0];
}

torch::Tensor LlamaMLPImpl::forward_residual(const torch::Tensor& x, const torch::Tensor& residual) {
  // On CUDA a plain down_proj reads the residual in its GEMM (residual_linear); elsewhere
  // (the CPU's numerics pinned to transformers', an adapter, a bias) the add as written.
  if (!x.is_cuda() || !llama_fused_enabled() || !plain(down_proj) || residual.scalar_type() != x.scalar_type() ||
      residual.device() != x.device()) {
    return residual + forward(x);
  }
  const auto gu = projs({gate_proj, up_proj}, x);
  return residual_linear(llama_swiglu(gu[0], gu[1]), down_proj->weight, residual);
}

MixtralExpertImpl::MixtralExpertImpl(const LlamaConfig& c) {
  // HF's registration order: w1, w2, w3.
  w1 = register_module("w1", make_linear(c, c.hidden_size, c.intermediate_size, false));
  w2 = register_module("w2", make_linear(c, c.intermediate_size, c.hidden_size, false));
  w3 = register_module("w3", make_linear(c, c.hidden_size, c.intermediate_size, false));
}

torch::Tensor MixtralExpertImpl::forward(const torch::Tensor& x) {
  return proj(w2, llama_swiglu(proj(w1, x), proj(w3, x)));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, int64_t layer, comm::GroupPtr ep_group) {
  // Registration order = HF's: self_attn, mlp (block_sparse_moe), input_layernorm, post_attention_layernorm.
  self_attn = register_module("self_attn", LlamaAttention(c, layer));
  if (c.is_moe()) {
    // [Mixtral]: MixtralSparseMoeBlock = the MoE layer with Mixtral's routing (gate, experts).
    ZT_CHECK_T(!c.deferred_init, ConfigError, "MixtralForCausalLM: partitioned construction (deferred_init) is not "
               "implemented for the experts; build the model whole (ZeRO-3 then partitions it in initialize())");
    MoEOptions o;
    o.hidden = c.hidden_size;
    o.num_experts = c.num_local_experts;
    o.gate.routing = GateRouting::Mixtral;
    o.gate.k = c.num_experts_per_tok;
    o.ep_group = std::move(ep_group);
    block_sparse_moe = register_module("block_sparse_moe", MoE(o, [c] { return torch::nn::AnyModule(MixtralExpert(c)); }));
  } else {
    mlp = register_module("mlp", LlamaMLP(c));
  }
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                             const torch::Tensor& sin, const torch::Tensor& mask) {
  // [Residual Norm]: on CUDA the residual add and both gradient accumulations run inside
  // the norms' kernels; elsewhere x + attn and the norms as written.
  auto [y1, xs] = llama_rms_norm_keep(x, input_layernorm->weight, input_layernorm->eps);
  auto [h, y2] = llama_add_rms_norm(xs, self_attn(y1, cos, sin, mask), post_attention_layernorm->weight,
                                    post_attention_layernorm->eps);
  if (!block_sparse_moe) return mlp->forward_residual(y2, h);  // h + mlp(y2)
  auto out = block_sparse_moe(y2);  // [Mixtral]
  router_prob_mean = out.gate.prob_mean;
  router_choice_fraction = out.gate.choice_fraction;
  kept_per_expert = std::move(out.gate.kept_counts);
  return h + out.output;
}

torch::Tensor mixtral_load_balancing_loss(const std::vector<torch::Tensor>& prob_mean,
                                          const std::vector<torch::Tensor>& choice_fraction) {
  ZT_CHECK_T(!prob_mean.empty() && prob_mean.size() == choice_fraction.size(), InternalError,
             "mixtral_load_balancing_loss: ", prob_mean.size(), " probability means for ", choice_fraction.size(),
             " choice fractions");
  // Every layer routes the same tokens: the means over the concatenated logits are the
  // means of the layers' means.
  const auto me = torch::stack(prob_mean).mean(0);                 // [E]
  const auto ce = torch::stack(choice_fraction).mean(0).detach();  // [k, E]
  return (ce * me.unsqueeze(0)).sum() * static_cast<double>(me.size(0));
}

bool llama_is_expert_param(const std::string& name) {
  return name.find(".block_sparse_moe.experts.") != std::string::npos;
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c, comm::GroupPtr ep_group) {
  const bool d = c.deferred_init;
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(d ? 1 : c.vocab_size, d ? 1 : c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c, i, ep_group));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

// ---- the model ----------------------------------------------------------------------

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& cfg, comm::GroupPtr ep_group) : cfg_(cfg) {
  model = register_module("model", LlamaModel(cfg, std::move(ep_group)));
  for (size_t i = 0; i < model->layers->size(); ++i)
    layers_.push_back(LlamaDecoderLayer(model->layers->ptr<LlamaDecoderLayerImpl>(i)));
  if (!cfg.tie_word_embeddings) {
    lm_head = register_module("lm_head", make_linear(cfg, cfg.hidden_size, cfg.vocab_size, /*bias=*/false));
  }
  rope_tables_ = LlamaRopeTables(llama_rope_inv_freq(cfg));
  reset_parameters();
}

void LlamaForCausalLMImpl::reset_parameters() {
  if (cfg_.deferred_init || skeleton_) return;  // placeholders: init_parameter runs at materialisation
  torch::NoGradGuard no_grad;
  for (auto& kv : named_parameters()) init_parameter(kv.key(), kv.value());
}

std::vector<int64_t> LlamaForCausalLMImpl::param_shape(const std::string& name) const {
  return llama_param_shape(cfg_, name);
}

std::vector<int64_t> llama_param_shape(const LlamaConfig& cfg, const std::string& name) {
  // Layers are alike: look the name up with its layer index mapped to layer 0.
  std::string key = name;
  const std::string pre = "model.layers.";
  if (key.rfind(pre, 0) == 0) {
    const auto dot = key.find('.', pre.size());
    if (dot != std::string::npos) key = pre + "0" + key.substr(dot);
  }
  LlamaConfig one = cfg;
  one.num_hidden_layers = 1;
  one.layer_sliding.clear();
  for (const auto& [n, shape] : llama_param_shapes(one))
    if (n == key) return shape;
  throw InternalError("Llama: no parameter named '" + name + "'");
}

namespace {

// How Llama's init fills a parameter: RMSNorm weights 1, biases 0, matrices N(0, range);
// the embedding's pad row, when there is one, 0 after the draw (transformers' _init_weights).
enum class LlamaInit { kOnes, kZeros, kNormal };

LlamaInit llama_init_of(const std::string& name) {
  if (ends_with(name, "norm.weight")) return LlamaInit::kOnes;
  if (ends_with(name, ".bias")) return LlamaInit::kZeros;
  return LlamaInit::kNormal;
}

bool llama_zeroes_pad_row(const LlamaConfig& c, const std::string& name) {
  return name == "model.embed_tokens.weight" && c.pad_token_id >= 0;
}

// "model.layers.N" for a decoder layer's parameter, "" for the others: init_layerwise's groups.
std::string llama_init_group(const std::string& name) {
  const std::string pre = "model.layers.";
  if (name.rfind(pre, 0) != 0) return "";
  return name.substr(0, name.find('.', pre.size()));
}

}  // namespace

void LlamaForCausalLMImpl::init_parameter(const std::string& name, torch::Tensor& t) const {
  torch::NoGradGuard no_grad;
  const auto shape = param_shape(name);
  ZT_CHECK_T(t.sizes().vec() == shape, InternalError, "Llama: ", name, " has shape ", t.sizes(), ", expected ",
             c10::IntArrayRef(shape));
  switch (llama_init_of(name)) {
    case LlamaInit::kOnes: t.fill_(1.0); break;
    case LlamaInit::kZeros: t.zero_(); break;
    case LlamaInit::kNormal: t.normal_(0.0, cfg_.initializer_range); break;
  }
  if (llama_zeroes_pad_row(cfg_, name)) t[cfg_.pad_token_id].zero_();
}

// ---- [Layerwise Init] -------------------------------------------------------------------

std::shared_ptr<LlamaForCausalLMImpl> LlamaForCausalLMImpl::skeleton(const LlamaConfig& cfg) {
  ZT_CHECK_T(!cfg.deferred_init, ConfigError, "Llama skeleton: build from a config with deferred_init false");
  // The deferred constructor makes 1x1 placeholders (and draws for them): undo its draws.
  auto gen = at::detail::getDefaultCPUGenerator();
  at::Generator before;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    before = gen.clone();
  }
  LlamaConfig placeholders = cfg;
  placeholders.deferred_init = true;
  auto m = std::make_shared<LlamaForCausalLMImpl>(placeholders);
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(before.get_state());
  }
  m->cfg_ = cfg;
  m->skeleton_ = true;
  for (const auto& item : m->named_modules("", /*include_self=*/false)) {
    auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value());
    if (!lin) continue;
    const auto shape = m->param_shape(item.key() + ".weight");  // (out, in)
    lin->options.out_features(shape[0]);
    lin->options.in_features(shape[1]);
  }
  return m;
}

int64_t LlamaForCausalLMImpl::construction_draws(const LlamaConfig& c) {
  // torch::nn::Embedding: normal_(0, 1) on (V, d). torch::nn::Linear: kaiming_uniform_ on W
  // (out, in), then uniform_ on the bias (out): one draw per element.
  ZT_ASSERT(c.vocab_size * c.hidden_size >= 16, "construction_draws: an embedding under 16 elements");
  int64_t n = normal_draws(c.vocab_size * c.hidden_size);
  auto linear = [](int64_t in, int64_t out, bool bias) { return uniform_draws(in * out) + (bias ? uniform_draws(out) : 0); };
  const int64_t d = c.hidden_size, I = c.intermediate_size;
  const int64_t layer = linear(d, c.q_dim(), c.qkv_bias) + 2 * linear(d, c.kv_dim(), c.qkv_bias) +
                        linear(c.q_dim(), d, c.o_bias) + 2 * linear(d, I, c.mlp_bias) + linear(I, d, c.mlp_bias);
  n += c.num_hidden_layers * layer;
  if (!c.tie_word_embeddings) n += linear(d, c.vocab_size, false);
  return n;
}

void LlamaForCausalLMImpl::init_layerwise(const InitSink& sink) {
  ZT_CHECK_T(skeleton_, ConfigError, "Llama init_layerwise: the model is not a skeleton (build it with skeleton())");
  torch::NoGradGuard no_grad;
  auto gen = at::detail::getDefaultCPUGenerator();
  discard_draws(gen, construction_draws(cfg_));  // their values are overwritten below
  auto params = named_parameters();
  ParallelNormal normal;
  std::vector<std::pair<std::string, torch::Tensor>> group;  // drawn, not yet handed over
  // Buffers of taken parameters that nothing else references, by shape: the layers are alike,
  // so the next layer is drawn into them (no fresh pages to fault in, layer after layer).
  std::map<std::vector<int64_t>, std::vector<torch::Tensor>> spare;
  auto flush = [&] {
    normal.run();
    for (auto& [name, t] : group) {
      if (llama_zeroes_pad_row(cfg_, name)) t[cfg_.pad_token_id].zero_();
      torch::Tensor& p = params[name];
      const bool taken = sink && sink(name, t);
      p.set_data(taken ? torch::empty({0}, t.options()) : t);
      if (taken && t.storage().use_count() == 1) spare[t.sizes().vec()].push_back(std::move(t));
    }
    group.clear();
  };
  auto buffer = [&](const std::vector<int64_t>& shape) {
    auto it = spare.find(shape);
    if (it == spare.end() || it->second.empty()) return torch::empty(shape, torch::kFloat);
    torch::Tensor t = std::move(it->second.back());
    it->second.pop_back();
    return t;
  };
  std::string current;
  for (const auto& kv : params) {
    const std::string& name = kv.key();
    const std::string g = llama_init_group(name);
    if (!group.empty() && g != current) flush();
    current = g;
    auto t = buffer(param_shape(name));
    switch (llama_init_of(name)) {
      case LlamaInit::kOnes: t.fill_(1.0); break;
      case LlamaInit::kZeros: t.zero_(); break;
      case LlamaInit::kNormal: normal.add(t, 0.0, cfg_.initializer_range); break;  // in order: see [Parallel Init]
    }
    group.emplace_back(name, std::move(t));
  }
  flush();
  skeleton_ = false;
}

struct LlamaRopeTables::Cache {
  std::mutex mu;
  std::map<std::string, torch::Tensor> inv;  // device -> inv_freq there
  std::map<std::tuple<std::string, int, int64_t>, std::pair<torch::Tensor, torch::Tensor>> plain;
};

LlamaRopeTables::LlamaRopeTables(torch::Tensor inv_freq) : inv_(std::move(inv_freq)), cache_(std::make_shared<Cache>()) {}

std::pair<torch::Tensor, torch::Tensor> LlamaRopeTables::operator()(int64_t T, const torch::Tensor& like,
                                                                    const torch::Tensor& pos_ids) const {
  ZT_CHECK(cache_ != nullptr, "LlamaRopeTables: not built");
  torch::NoGradGuard no_grad;
  const std::string dev = like.device().str();
  torch::Tensor inv;
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->inv.find(dev);
    if (it == cache_->inv.end()) it = cache_->inv.emplace(dev, inv_.to(like.device())).first;
    inv = it->second;
    if (!pos_ids.defined()) {
      const auto key = std::make_tuple(dev, static_cast<int>(like.scalar_type()), T);
      if (auto t = cache_->plain.find(key); t != cache_->plain.end()) return t->second;
    }
  }
  if (pos_ids.defined()) {  // [SFT Attention]: the same values per position as below
    const auto freqs = pos_ids.to(like.device(), torch::kFloat).unsqueeze(-1) * inv;  // (B, T, hd/2)
    const auto emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);                     // (B, 1, T, hd)
    return {emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
  }
  const auto pos = torch::arange(T, torch::TensorOptions().device(like.device()).dtype(torch::kFloat));
  const auto freqs = pos.unsqueeze(1) * inv.unsqueeze(0);  // (T, hd/2)
  const auto emb = torch::cat({freqs, freqs}, -1);          // (T, hd)
  std::pair<torch::Tensor, torch::Tensor> out{emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
  std::lock_guard<std::mutex> lock(cache_->mu);
  if (cache_->plain.size() >= 8) cache_->plain.clear();  // varying lengths (generation): keep it small
  cache_->plain[std::make_tuple(dev, static_cast<int>(like.scalar_type()), T)] = out;
  return out;
}

std::pair<torch::Tensor, torch::Tensor> LlamaForCausalLMImpl::rope(int64_t T, const torch::Tensor& like,
                                                                   const torch::Tensor& pos_ids) const {
  return rope_tables_(T, like, pos_ids);  // [Rope Tables]
}

namespace {

// [SFT Attention] The block-diagonal causal mask of position ids `pos` (B, T): (B, 1, T, T)
// bool, true where query i may attend key j (same example, j <= i, and within `window`
// of i when window > 0 and some layer slides).
torch::Tensor llama_example_mask(const torch::Tensor& pos, int64_t window) {
  const int64_t T = pos.size(1);
  const auto doc = pos.eq(0).cumsum(1);  // (B, T): example index within the row
  const auto same = doc.unsqueeze(2).eq(doc.unsqueeze(1));  // (B, T, T)
  auto idx = torch::arange(T, pos.options());
  auto i = idx.unsqueeze(1), j = idx.unsqueeze(0);
  auto keep = j <= i;
  if (window > 0) keep = keep.logical_and(j > i - window);
  return same.logical_and(keep).unsqueeze(1);
}

}  // namespace

torch::Tensor LlamaForCausalLMImpl::hidden(const torch::Tensor& idx, const torch::Tensor& pos) {
  ZT_CHECK(idx.dim() == 2 && idx.scalar_type() == torch::kLong, "Llama: idx must be (B, T) int64, got ", idx.sizes(),
           " ", idx.scalar_type());
  ZT_CHECK(!skeleton_, "Llama: a skeleton has no values yet; run init_layerwise first");
  const int64_t T = idx.size(1);
  ZT_CHECK(T <= cfg_.max_position_embeddings, "Llama: sequence length ", T, " exceeds max_position_embeddings ",
           cfg_.max_position_embeddings);
  // padding_idx as HF's nn.Embedding: no gradient into the pad row.
  auto x = llama_embedding(model->embed_tokens->weight, idx, cfg_.pad_token_id);  // (B, T, d)
  torch::Tensor pos_ids = pos.defined() ? pos.to(idx.device()) : pos;
  ZT_CHECK(!pos.defined() || (pos.sizes() == idx.sizes() && pos.scalar_type() == torch::kLong), "Llama: pos ",
           pos.sizes(), " ", pos.scalar_type(), " must be int64 of idx's shape ", idx.sizes());
  const auto [cos, sin] = rope(T, x, pos_ids);
  torch::Tensor masks[2];  // [SFT Attention]: full causal layers, sliding-window layers
  if (pos_ids.defined()) {
    masks[0] = llama_example_mask(pos_ids, 0);
    if (cfg_.sliding_window > 0 && T > cfg_.sliding_window) masks[1] = llama_example_mask(pos_ids, cfg_.sliding_window);
  }
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    const auto& layer_ptr = layers_[static_cast<size_t>(i)];
    const bool slides = layer_ptr->self_attn->window > 0 && masks[1].defined();
    const torch::Tensor mask = slides ? masks[1] : masks[0];
    // Captures by value: a checkpointed body lives in the autograd graph until backward.
    CheckpointFn body = [layer = layer_ptr.ptr(), cos, sin, mask](const torch::Tensor& t) {
      return layer->forward(t, cos, sin, mask);
    };
    CheckpointFn fn = body;
    if (ckpt_enabled_ && i < ckpt_count_ && torch::GradMode::is_enabled()) {
      if (layer_ptr->block_sparse_moe) {
        // [Checkpointed Aux] (models/checkpoint.h), as GPT-2's MoE blocks: the loss takes this
        // forward's mean router probabilities, whose gradient reaches the gate through the
        // recompute; the recompute's are not kept.
        fn = [body, layer = layer_ptr.ptr(), cpu = ckpt_cpu_](const torch::Tensor& t) {
          auto both = checkpoint_with_aux(
              [body, layer](const torch::Tensor& u) {
                auto y = body(u);
                auto me = layer->router_prob_mean;
                if (in_checkpoint_recompute()) layer->router_prob_mean = me.detach();
                return std::make_pair(y, me);
              },
              t, cpu);
          layer->router_prob_mean = both.second;
          return both.first;
        };
      } else {
        fn = [body, cpu = ckpt_cpu_](const torch::Tensor& t) { return checkpoint(body, t, cpu); };
      }
    }
    x = runner_ ? runner_(i, fn, x) : fn(x);
  }
  if (cfg_.is_moe()) last_aux_ = router_aux_loss().detach();
  return model->norm(x);
}

torch::Tensor LlamaForCausalLMImpl::lm_head_weight() const {
  return cfg_.tie_word_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& idx, const torch::Tensor& pos) {
  return F::linear(hidden(idx, pos), lm_head_weight());  // (B, T, V)
}

torch::Tensor LlamaForCausalLMImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets,
                                         const torch::Tensor& pos) {
  ZT_CHECK(targets.sizes() == idx.sizes() && targets.scalar_type() == torch::kLong, "Llama::loss: targets ",
           targets.sizes(), " ", targets.scalar_type(), " must be int64 of idx's shape ", idx.sizes());
  // lm_head_cross_entropy ignores -1; HF's ignore_index is -100.
  const auto t = targets.masked_fill(targets.eq(-100), -1).reshape({-1});
  const auto h = hidden(idx, pos);  // (B, T, d)
  const auto w = lm_head_weight();
  torch::Tensor lm;
  if (h.scalar_type() != torch::kHalf) {
    lm = lm_head_cross_entropy(h.reshape({-1, h.size(-1)}), w, t, cfg_.lm_head_pad_multiple,
                               llama_loss_chunk_rows(cfg_, lm_head_logit_bytes(h)));
  } else {
    // fp16: unfused (see lm_head_loss.h), the softmax in fp32.
    const auto logits = F::linear(h, w).to(torch::kFloat).view({-1, cfg_.vocab_size});
    lm = F::cross_entropy(logits, t, F::CrossEntropyFuncOptions().ignore_index(-1));
  }
  // [Mixtral]: MixtralForCausalLM adds the load-balancing loss only with output_router_logits.
  if (!cfg_.is_moe() || !cfg_.output_router_logits) return lm;
  return lm + cfg_.router_aux_loss_coef * router_aux_loss();
}

torch::Tensor LlamaForCausalLMImpl::router_aux_loss() const {
  if (!cfg_.is_moe()) return {};
  std::vector<torch::Tensor> me, ce;
  for (const auto& l : layers_) {
    ZT_CHECK_T(l->router_prob_mean.defined(), InternalError, "Mixtral: router_aux_loss before a forward");
    me.push_back(l->router_prob_mean);
    ce.push_back(l->router_choice_fraction);
  }
  return mixtral_load_balancing_loss(me, ce);
}

std::vector<std::vector<int64_t>> LlamaForCausalLMImpl::last_moe_kept_per_expert() const {
  std::vector<std::vector<int64_t>> out;
  for (const auto& l : layers_)
    if (l->block_sparse_moe) out.push_back(l->kept_per_expert);
  return out;
}

std::string LlamaForCausalLMImpl::global_param_name(const std::string& name) const {
  return expert_global_name(name, "model.layers.", ".block_sparse_moe.experts.",
                            [this](int64_t layer) -> std::optional<int64_t> {
                              if (layer < 0 || layer >= cfg_.num_hidden_layers) return std::nullopt;
                              const auto& moe = layers_[static_cast<size_t>(layer)]->block_sparse_moe;
                              if (!moe) return std::nullopt;
                              return moe->first_expert();
                            },
                            "this Mixtral model");
}

void LlamaForCausalLMImpl::set_moe_timing(bool on) {
  for (auto& l : layers_)
    if (l->block_sparse_moe) l->block_sparse_moe->set_timing(on);
}

std::vector<DeviceSpan> LlamaForCausalLMImpl::take_moe_all_to_all_spans() {
  std::vector<DeviceSpan> out;
  for (auto& l : layers_) {
    if (!l->block_sparse_moe) continue;
    auto s = l->block_sparse_moe->take_all_to_all_spans();
    out.insert(out.end(), std::make_move_iterator(s.begin()), std::make_move_iterator(s.end()));
  }
  return out;
}

void LlamaForCausalLMImpl::set_activation_checkpointing(bool enabled, std::optional<int64_t> number_checkpoints,
                                                        bool cpu_checkpointing) {
  const int64_t n = number_checkpoints.value_or(cfg_.num_hidden_layers);
  ZT_CHECK_T(n >= 0 && n <= cfg_.num_hidden_layers, ConfigError, "activation_checkpointing.number_checkpoints = ", n,
             " must be in [0, num_hidden_layers = ", cfg_.num_hidden_layers, "]");
  ckpt_enabled_ = enabled;
  ckpt_count_ = enabled ? n : 0;
  ckpt_cpu_ = enabled && cpu_checkpointing;
}

std::vector<std::shared_ptr<torch::nn::Module>> LlamaForCausalLMImpl::decoder_layers() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& l : layers_) out.push_back(l.ptr());
  return out;
}

}  // namespace zt::models
