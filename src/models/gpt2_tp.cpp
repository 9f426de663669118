#include "models/gpt2_tp.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "models/gpt2_shapes.h"
#include "models/model_util.h"
#include "models/checkpoint.h"
#include "tp/cross_entropy.h"
#include "tp/mappings.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace F = torch::nn::functional;

namespace {
using util::ends_with;

// LayerNorm; under sequence parallelism its parameters see only this rank's positions, so
// their gradients are summed over tp (see [TP Regions]).
torch::Tensor tp_layer_norm(const torch::nn::LayerNorm& ln, const torch::Tensor& x, const comm::GroupPtr& g, bool sp) {
  if (!sp) return layer_norm(ln, x);  // GPT2's own LayerNorm (same kernels as tp 1)
  return at::layer_norm(x, {x.size(-1)}, tp::copy_to_region(ln->weight, g), tp::copy_to_region(ln->bias, g),
                        util::kGpt2LayerNormEps);
}

}  // namespace

tp::SplitSpec gpt2_tp_split_spec(const GPT2Config& cfg, int tp, const std::string& name) {
  if (name == "wte.weight") return {0, 1, tp::padded_vocab(cfg.vocab_size, tp, cfg.lm_head_pad_multiple)};
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) return {0, 3, 0};
  if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias")) return {0, 1, 0};
  if (ends_with(name, "attn.c_proj.weight") || ends_with(name, "mlp.c_proj.weight")) return {1, 1, 0};
  if (name == "wpe.weight" || ends_with(name, "c_proj.bias") || name.find("ln_") != std::string::npos) return {};
  throw zt::InternalError("GPT2TP: no parameter named '" + name + "'");
}

std::map<std::string, torch::Tensor> gpt2_tp_cut(const GPT2Config& cfg, const std::map<std::string, torch::Tensor>& full,
                                                 int rank, int tp) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : full) out[name] = tp::cut(t, gpt2_tp_split_spec(cfg, tp, name), rank, tp);
  return out;
}

std::map<std::string, torch::Tensor> gpt2_full_state(torch::nn::Module& gpt2) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& kv : gpt2.named_parameters()) out[kv.key()] = kv.value().detach().to(torch::kCPU, torch::kFloat).clone();
  return out;
}

// ---- modules ------------------------------------------------------------------------

TPAttentionImpl::TPAttentionImpl(const GPT2Config& cfg, const comm::GroupPtr& g, bool sp) {
  const int n = g ? g->size() : 1;
  local_heads = cfg.n_head / n;
  tp::ColumnParallelOptions co;
  co.sequence_parallel = sp;
  co.blocks = 3;  // q, k, v: each cut by heads
  c_attn = register_module("c_attn", tp::ColumnParallelLinear(cfg.n_embd, 3 * cfg.n_embd, g, co));
  tp::RowParallelOptions ro;
  ro.sequence_parallel = sp;
  c_proj = register_module("c_proj", tp::RowParallelLinear(cfg.n_embd, cfg.n_embd, g, ro));
}

torch::Tensor TPAttentionImpl::forward(const torch::Tensor& x) {
  auto qkv = c_attn(x);  // (B, T, 3C/tp): this rank's q, k, v (full T under sequence parallelism)
  const int64_t B = qkv.size(0), T = qkv.size(1), Cl = qkv.size(2) / 3, hs = Cl / local_heads;
  auto parts = qkv.split(Cl, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, local_heads, hs}).transpose(1, 2); };
  auto y = at::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), /*attn_mask=*/{},
                                            /*dropout_p=*/0.0, /*is_causal=*/true);
  y = y.transpose(1, 2).contiguous().view({B, T, Cl});  // this rank's heads
  return c_proj(y);                                      // summed (or reduce-scattered) over tp
}

TPMLPImpl::TPMLPImpl(const GPT2Config& cfg, const comm::GroupPtr& g, bool sp) {
  tp::ColumnParallelOptions co;
  co.sequence_parallel = sp;
  c_fc = register_module("c_fc", tp::ColumnParallelLinear(cfg.n_embd, 4 * cfg.n_embd, g, co));
  tp::RowParallelOptions ro;
  ro.sequence_parallel = sp;
  c_proj = register_module("c_proj", tp::RowParallelLinear(4 * cfg.n_embd, cfg.n_embd, g, ro));
}

torch::Tensor TPMLPImpl::forward(const torch::Tensor& x) { return c_proj(torch::gelu(c_fc(x), "tanh")); }

TPBlockImpl::TPBlockImpl(const GPT2Config& cfg, const comm::GroupPtr& g, bool sp) : group(g), sequence_parallel(sp) {
  ln_1 = register_module("ln_1", util::make_gpt2_ln(cfg.n_embd));
  attn = register_module("attn", TPAttention(cfg, g, sp));
  ln_2 = register_module("ln_2", util::make_gpt2_ln(cfg.n_embd));
  mlp = register_module("mlp", TPMLP(cfg, g, sp));
}

torch::Tensor TPBlockImpl::forward(const torch::Tensor& x) {
  auto h1 = x + attn(tp_layer_norm(ln_1, x, group, sequence_parallel));
  return h1 + mlp(tp_layer_norm(ln_2, h1, group, sequence_parallel));
}

GPT2TPImpl::GPT2TPImpl(const GPT2Config& cfg, comm::GroupPtr g, bool sequence_parallel)
    : cfg_(cfg), group_(std::move(g)), sp_(sequence_parallel) {
  const int n = tp_size();
  ZT_CHECK_T(cfg.n_layer > 0 && cfg.n_head > 0 && cfg.n_embd > 0 && cfg.vocab_size > 0 && cfg.n_positions > 0 &&
                 cfg.n_embd % cfg.n_head == 0,
             zt::ConfigError, "GPT2TP: invalid GPT-2 sizes (n_embd ", cfg.n_embd, " must divide by n_head ",
             cfg.n_head, ")");
  ZT_CHECK_T(cfg.n_head % n == 0, zt::ConfigError, "tensor parallelism: GPT-2's n_head = ", cfg.n_head,
             " does not divide by the tensor-parallel size ", n,
             " (attention is split by heads); choose tensor_parallel.autotp_size dividing ", cfg.n_head);
  ZT_CHECK_T(!cfg.deferred_init, zt::ConfigError,
             "GPT2TP: deferred_init is not supported with tensor parallelism; build the model eagerly");
  // The initialisation below draws full-size tensors in registration order, so the weights
  // do not depend on tp: keep the generator's state from before the layers' own draws.
  auto gen = at::detail::getDefaultCPUGenerator();
  const auto state = gen.get_state();
  wte = register_module("wte", tp::VocabParallelEmbedding(cfg.vocab_size, cfg.n_embd, group_, cfg.lm_head_pad_multiple,
                                                          sp_, /*seq_dim=*/1));
  wpe = register_module("wpe", torch::nn::Embedding(cfg.n_positions, cfg.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks_.emplace_back(cfg, group_, sp_);
    h->push_back(blocks_.back());
  }
  ln_f = register_module("ln_f", util::make_gpt2_ln(cfg.n_embd));
  gen.set_state(state);
  // GPT-2's scheme (GPT2Impl::init_parameter) on the full tensor, then this rank's slice.
  torch::NoGradGuard no_grad;
  for (auto& kv : named_parameters()) {
    const auto& name = kv.key();
    auto full = torch::empty(gpt2_param_shape(cfg_, name));
    if (name.find("ln_") != std::string::npos) {
      ends_with(name, ".weight") ? full.fill_(1.0) : full.zero_();
    } else if (ends_with(name, ".bias")) {
      full.zero_();
    } else if (ends_with(name, "c_proj.weight")) {
      full.normal_(0.0, util::kGpt2InitStd / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer)));
    } else {
      full.normal_(0.0, util::kGpt2InitStd);
    }
    kv.value().copy_(tp::cut(full, split_spec(name), tp_rank(), n));
  }
}

void GPT2TPImpl::load_full(const std::map<std::string, torch::Tensor>& full) {
  torch::NoGradGuard no_grad;
  for (auto& kv : named_parameters()) {
    auto it = full.find(kv.key());
    ZT_CHECK_T(it != full.end(), zt::CheckpointError, "GPT2TP::load_full: the full state has no '", kv.key(), "'");
    ZT_CHECK_T(it->second.sizes().vec() == gpt2_param_shape(cfg_, kv.key()), zt::CheckpointError, "GPT2TP::load_full: '",
               kv.key(), "' has shape ", it->second.sizes(), ", expected ", c10::IntArrayRef(gpt2_param_shape(cfg_, kv.key())));
    kv.value().copy_(tp::cut(it->second, split_spec(kv.key()), tp_rank(), tp_size()));
  }
}

std::map<std::string, torch::Tensor> GPT2TPImpl::full_state() {
  std::map<std::string, torch::Tensor> out;
  for (const auto& kv : named_parameters()) {
    const auto spec = split_spec(kv.key());
    const auto shape = gpt2_param_shape(cfg_, kv.key());
    const int64_t full_size = spec.split() ? shape[static_cast<size_t>(spec.dim)] : 0;
    out[kv.key()] = tp::gather_full(kv.value().detach(), spec, full_size, group_).to(torch::kCPU, torch::kFloat).clone();
  }
  return out;
}

zt::TensorParallelSpec GPT2TPImpl::tensor_parallel_spec(const std::string& name) const {
  const auto s = split_spec(name);
  if (!s.split()) return {};
  return {s.dim, "tp", s.blocks, s.padded, gpt2_param_shape(cfg_, name)[static_cast<size_t>(s.dim)], tp_rank(), tp_size()};
}

double GPT2TPImpl::norm_weight(const std::string& name) const {
  return split_spec(name).split() ? 1.0 : 1.0 / static_cast<double>(tp_size());
}

void GPT2TPImpl::set_activation_checkpointing(bool enabled) {
  if (enabled) {
    set_activation_checkpointing(TpCheckpointOptions{});
  } else {
    ckpt_.reset();
  }
}

void GPT2TPImpl::set_activation_checkpointing(const TpCheckpointOptions& o) {
  ckpt_ = std::make_shared<TpCheckpointer>(group_, cfg_.n_layer, o, sp_);
}

std::vector<zt::ModelUnit> GPT2TPImpl::zero_units() const {
  std::vector<zt::ModelUnit> out;
  for (size_t b = 0; b < blocks_.size(); ++b) out.push_back({"h." + std::to_string(b), blocks_[b]->parameters()});
  return out;
}

double GPT2TPImpl::flops_per_token(int64_t seq) const {
  return gpt2_flops_per_token(cfg_, seq) / static_cast<double>(tp_size());
}

torch::Tensor GPT2TPImpl::run_block(int64_t i, const torch::Tensor& x) {
  auto body = [blk = blocks_[static_cast<size_t>(i)].ptr(), hooks = hooks_, i](const torch::Tensor& t) {
    const bool recompute = in_checkpoint_recompute();
    if (hooks.pre_forward) hooks.pre_forward(i, recompute);
    auto y = blk->forward(t);
    if (hooks.post_forward) hooks.post_forward(i, recompute);
    return y;
  };
  // A checkpointed block recomputes its collectives in backward, on every tp rank alike.
  auto y = ckpt_ ? ckpt_->run(i, body, x) : body(x);
  return hooks_.wrap_output ? hooks_.wrap_output(i, y) : y;
}

torch::Tensor GPT2TPImpl::hidden(const torch::Tensor& idx) {
  ZT_CHECK(idx.dim() == 2 && idx.scalar_type() == torch::kLong, "GPT2TP: idx must be (B, T) int64, got ",
           idx.sizes(), " ", idx.scalar_type());
  const int64_t T = idx.size(1);
  ZT_CHECK(T <= cfg_.n_positions, "GPT2TP: sequence length ", T, " exceeds n_positions ", cfg_.n_positions);
  ZT_CHECK_T(!sp_ || T % tp_size() == 0, zt::ConfigError, "sequence parallelism: the sequence length ", T,
             " does not divide by the tensor-parallel size ", tp_size(), "; use a multiple of ", tp_size());
  // Sequence parallelism: this rank's positions [r*T/tp, (r+1)*T/tp); the embedding
  // reduce-scatters its partial lookups to exactly those.
  const int64_t Tl = sp_ ? T / tp_size() : T, t0 = sp_ ? tp_rank() * Tl : 0;
  auto pos = torch::arange(t0, t0 + Tl, idx.options());
  const auto wpe_w = sp_ ? tp::copy_to_region(wpe->weight, group_) : wpe->weight;
  auto x = wte(idx) + F::embedding(pos, wpe_w);  // (B, Tl, C)
  for (int64_t i = 0; i < cfg_.n_layer; ++i) x = run_block(i, x);
  return tp_layer_norm(ln_f, x, group_, sp_);
}

torch::Tensor GPT2TPImpl::local_logits(const torch::Tensor& idx) {
  // Enter the vocabulary region: every rank needs all positions' hidden states (all-gathered
  // under sequence parallelism). The tied LM head is column-parallel over the vocabulary.
  return tp::column_parallel_linear(hidden(idx), wte->weight, {}, group_, sp_, /*seq_dim=*/1);  // (B, T, Vp/tp)
}

torch::Tensor GPT2TPImpl::forward(const torch::Tensor& idx) {
  auto logits = tp::gather_from_region(local_logits(idx), group_, -1);  // (B, T, Vp)
  return logits.narrow(-1, 0, cfg_.vocab_size).contiguous();
}

torch::Tensor GPT2TPImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  ZT_CHECK(targets.sizes() == idx.sizes(), "GPT2TP::loss: targets ", targets.sizes(), " must match idx ", idx.sizes());
  const auto lg = local_logits(idx);
  return tp::vocab_parallel_cross_entropy(lg.reshape({-1, lg.size(-1)}), targets.reshape({-1}), cfg_.vocab_size,
                                          group_);
}

}  // namespace zt::models
