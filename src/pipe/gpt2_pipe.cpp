// GPT-2 pipeline layers and stages. See pipe/gpt2_pipe.h.
#include "pipe/gpt2_pipe.h"

#include <limits>

#include "models/checkpoint.h"
#include "models/lm_head_loss.h"
#include "models/model_util.h"
#include "tp/cross_entropy.h"
#include "tp/layers.h"
#include "tp/mappings.h"
#include "zerotrain/error.h"

namespace zt::pipe {

namespace F = torch::nn::functional;

std::vector<LayerInfo> gpt2_layers(const models::GPT2Config& cfg) {
  const int64_t C = cfg.n_embd;
  std::vector<LayerInfo> out;
  out.push_back({"GPT2Embedding", cfg.vocab_size * C + cfg.n_positions * C, /*lookup=*/true});
  for (int64_t i = 0; i < cfg.n_layer; ++i) out.push_back({"GPT2Block", 12 * C * C + 13 * C});
  out.push_back({"GPT2Head", cfg.vocab_size * C + 2 * C});
  return out;
}

namespace {

// LayerNorm of GPT-2; under sequence parallelism its parameters see only this rank's
// positions, so their gradients are summed over tp (as GPT2TP's, see [TP Regions]).
torch::Tensor pipe_tp_layer_norm(const torch::nn::LayerNorm& ln, const torch::Tensor& x, const comm::GroupPtr& g,
                                 bool sp) {
  if (!sp) return models::layer_norm(ln, x);
  return at::layer_norm(x, {x.size(-1)}, tp::copy_to_region(ln->weight, g), tp::copy_to_region(ln->bias, g),
                        models::util::kGpt2LayerNormEps);
}

}  // namespace

GPT2StageImpl::GPT2StageImpl(const models::GPT2& full, std::vector<std::pair<int, int>> chunks,
                             int64_t checkpoint_interval)
    : PipeStageImpl(static_cast<int>(full->config().n_layer) + 2, std::move(chunks), /*tied=*/true),
      cfg_(full->config()),
      ckpt_interval_(checkpoint_interval) {
  ZT_CHECK_T(!cfg_.deferred_init, ConfigError, "pipeline stages take GPT-2 built with deferred_init false");
  const StageLayers held = stage_layers(chunks_, num_layers_);
  blocks_.assign(static_cast<size_t>(cfg_.n_layer), models::Block(nullptr));
  // Registration order = the whole model's (wte, wpe, h.*, ln_f), as the engine flattens.
  if (held.embedding) {
    wte_ = register_module("wte", full->wte);
    wpe_ = register_module("wpe", full->wpe);
    has_embedding_ = true;
  }
  if (!held.blocks.empty()) {
    h_ = register_module("h", torch::nn::ModuleDict());
    const auto all = full->blocks();
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> named;
    for (int i : held.blocks) {
      const auto& m = all[static_cast<size_t>(i)];
      blocks_[static_cast<size_t>(i)] = models::Block(std::dynamic_pointer_cast<models::BlockImpl>(m));
      named.emplace_back(std::to_string(i), m);
    }
    h_->update(named);
  }
  if (held.head) {
    ln_f_ = register_module("ln_f", full->ln_f);
    if (!held.embedding) tied_copy_ = full->wte->weight.detach().clone().set_requires_grad(true);
  }
}

GPT2StageImpl::GPT2StageImpl(const models::GPT2TP& full, std::vector<std::pair<int, int>> chunks,
                             int64_t checkpoint_interval)
    : PipeStageImpl(static_cast<int>(full->config().n_layer) + 2, std::move(chunks), /*tied=*/true),
      cfg_(full->config()),
      ckpt_interval_(checkpoint_interval),
      tp_model_(true),
      tp_(full->wte->group),
      sp_(full->sequence_parallel()) {
  const StageLayers held = stage_layers(chunks_, num_layers_);
  tp_blocks_.assign(static_cast<size_t>(cfg_.n_layer), models::TPBlock(nullptr));
  if (held.embedding) {
    tp_wte_ = register_module("wte", full->wte);
    wpe_ = register_module("wpe", full->wpe);
    has_embedding_ = true;
  }
  if (!held.blocks.empty()) {
    h_ = register_module("h", torch::nn::ModuleDict());
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> named;
    for (int i : held.blocks) {
      auto m = full->h->ptr(static_cast<size_t>(i));
      tp_blocks_[static_cast<size_t>(i)] = models::TPBlock(std::dynamic_pointer_cast<models::TPBlockImpl>(m));
      named.emplace_back(std::to_string(i), m);
    }
    h_->update(named);
  }
  if (held.head) {
    ln_f_ = register_module("ln_f", full->ln_f);
    if (!held.embedding) tied_copy_ = full->wte->weight.detach().clone().set_requires_grad(true);
  }
}

double GPT2StageImpl::norm_weight(const std::string& name) const {
  if (tp_size() == 1) return 1.0;
  return models::gpt2_tp_split_spec(cfg_, tp_size(), name).split() ? 1.0 : 1.0 / static_cast<double>(tp_size());
}

torch::Tensor GPT2StageImpl::run_blocks(int first, int last, const torch::Tensor& x) {
  torch::Tensor y = x;
  for (int i = first; i < last; ++i)
    y = tp_model_ ? tp_blocks_[static_cast<size_t>(i)]->forward(y) : blocks_[static_cast<size_t>(i)]->forward(y);
  return y;
}

torch::Tensor GPT2StageImpl::final_norm(const torch::Tensor& x) {
  return tp_model_ ? pipe_tp_layer_norm(ln_f_, x, tp_, sp_) : models::layer_norm(ln_f_, x);
}

torch::Tensor GPT2StageImpl::embed(const torch::Tensor& x) {
  if (!tp_model_) {
    auto pos = torch::arange(x.size(1), x.options());
    return wte_(x) + wpe_(pos);
  }
  // GPT2TPImpl::hidden's embedding: under sequence parallelism this rank's positions
  // [r*T/tp, (r+1)*T/tp), the lookups reduce-scattered to exactly those.
  const int64_t T = x.size(1), n = tp_size();
  ZT_CHECK_T(!sp_ || T % n == 0, ConfigError, "sequence parallelism: the sequence length ", T,
             " does not divide by the tensor-parallel size ", n, "; use a multiple of ", n);
  const int64_t Tl = hidden_len(T), t0 = sp_ ? (tp_ ? tp_->rank() : 0) * Tl : 0;
  auto pos = torch::arange(t0, t0 + Tl, x.options());
  const auto wpe_w = sp_ ? tp::copy_to_region(wpe_->weight, tp_) : wpe_->weight;
  return tp_wte_(x) + F::embedding(pos, wpe_w);
}

torch::Tensor GPT2StageImpl::head_loss(const torch::Tensor& x, const torch::Tensor& targets) {
  ZT_CHECK(targets.defined() && targets.dim() == 2 && targets.size(0) == x.size(0) &&
               hidden_len(targets.size(1)) == x.size(1),
           "GPT-2 pipeline head: targets must be (B, T) matching the hidden state ", x.sizes());
  const torch::Tensor w = tied_copy_.defined() ? tied_copy_ : embedding_weight();  // (V, C), or (Vp/tp, C)
  const auto h = final_norm(x);                                                      // (B, T or T/tp, C)
  if (tp_model_) {
    // GPT2TPImpl::loss: the tied weight's slice as a column-parallel LM head (all-gathering
    // the sequence under sequence parallelism), the vocab-parallel cross entropy.
    const auto lg = tp::column_parallel_linear(h, w, {}, tp_, sp_, /*seq_dim=*/1);  // (B, T, Vp/tp)
    return tp::vocab_parallel_cross_entropy(lg.reshape({-1, lg.size(-1)}), targets.reshape({-1}), cfg_.vocab_size,
                                            tp_);
  }
  // GPT2Impl::loss's two paths, so the pipeline computes the same values.
  if (cfg_.fused_lm_head_loss && h.scalar_type() != torch::kHalf) {
    return models::lm_head_cross_entropy(h.reshape({-1, h.size(-1)}), w, targets.reshape({-1}),
                                         cfg_.lm_head_pad_multiple, models::gpt2_loss_chunk_rows(cfg_));
  }
  const int64_t V = cfg_.vocab_size, Vp = models::gpt2_padded_vocab(cfg_);
  const auto wp = Vp > V ? at::constant_pad_nd(w, {0, 0, 0, Vp - V}) : w;
  auto lf = F::linear(h, wp).to(torch::kFloat).view({-1, Vp});
  if (Vp > V) lf.narrow(1, V, Vp - V).fill_(-std::numeric_limits<float>::infinity());
  return F::cross_entropy(lf, targets.reshape({-1}), F::CrossEntropyFuncOptions().ignore_index(-1));
}

torch::Tensor GPT2StageImpl::forward(int chunk, const torch::Tensor& x, const torch::Tensor& targets) {
  const auto [begin, end] = chunk_layers(chunk);
  torch::Tensor y = x;
  int l = begin;
  if (l == 0) {
    ZT_CHECK(x.dim() == 2 && x.scalar_type() == torch::kLong, "GPT-2 pipeline embedding: idx must be (B, T) int64, got ",
             x.sizes(), " ", x.scalar_type());
    ZT_CHECK(x.size(1) <= cfg_.n_positions, "GPT-2 pipeline embedding: sequence length ", x.size(1),
             " exceeds n_positions ", cfg_.n_positions);
    y = embed(x);
    l = 1;
  }
  // Blocks: layers [l, min(end, head)) = blocks [l-1, ...). With a checkpoint interval the
  // stage's layers are cut into ranges of that many from the chunk's first layer (as
  // DeepSpeed's exec_range_func) and each range's blocks run as one checkpoint.
  const int block_end = std::min(end, num_layers_ - 1);
  if (ckpt_interval_ > 0 && torch::GradMode::is_enabled()) {
    for (int r = begin; r < block_end; r += static_cast<int>(ckpt_interval_)) {
      const int a = std::max(r, l), b = std::min(block_end, r + static_cast<int>(ckpt_interval_));
      if (a >= b) continue;
      y = models::checkpoint([this, a, b](const torch::Tensor& t) { return run_blocks(a - 1, b - 1, t); }, y);
    }
  } else if (l < block_end) {
    y = run_blocks(l - 1, block_end - 1, y);
  }
  if (end == num_layers_) return head_loss(y, targets);
  return y;
}

}  // namespace zt::pipe
