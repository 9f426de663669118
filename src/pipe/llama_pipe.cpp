// Llama pipeline layers and stages. See [Llama Pipeline] in pipe/llama_pipe.h.
#include "pipe/llama_pipe.h"

#include <algorithm>

#include "models/checkpoint.h"
#include "models/llama_fused.h"
#include "models/lm_head_loss.h"
#include "zerotrain/error.h"

namespace zt::pipe {

namespace F = torch::nn::functional;

std::vector<LayerInfo> llama_layers(const models::LlamaConfig& cfg) {
  const int64_t L = cfg.num_hidden_layers;
  std::vector<LayerInfo> out;
  out.push_back({"LlamaEmbedding", 0, /*lookup=*/true});
  for (int64_t i = 0; i < L; ++i) out.push_back({"LlamaDecoderLayer", 0});
  out.push_back({"LlamaHead", 0});
  const std::string pre = "model.layers.";
  for (const auto& [name, shape] : models::llama_param_shapes(cfg)) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    if (name.rfind(pre, 0) == 0) {
      const int64_t i = std::stoll(name.substr(pre.size(), name.find('.', pre.size()) - pre.size()));
      out[static_cast<size_t>(i + 1)].params += n;
    } else if (name == "model.embed_tokens.weight") {
      out.front().params += n;
    } else {
      out.back().params += n;  // model.norm, lm_head
    }
  }
  if (cfg.tie_word_embeddings) out.back().params += cfg.vocab_size * cfg.hidden_size;  // the tied head
  return out;
}

LlamaStageImpl::LlamaStageImpl(const models::LlamaForCausalLM& full, std::vector<std::pair<int, int>> chunks,
                               int64_t checkpoint_interval)
    : PipeStageImpl(static_cast<int>(full->config().num_hidden_layers) + 2, std::move(chunks),
                    full->config().tie_word_embeddings),
      cfg_(full->config()),
      ckpt_interval_(checkpoint_interval) {
  ZT_CHECK_T(!cfg_.deferred_init, ConfigError, "Llama pipeline stages take a model built with deferred_init false");
  ZT_CHECK_T(full->model->embed_tokens->weight.dim() == 2 &&
                 full->model->embed_tokens->weight.size(0) == cfg_.vocab_size,
             ConfigError, "Llama pipeline stages take a model with its values (not a skeleton or placeholders)");
  const StageLayers held = stage_layers(chunks_, num_layers_);
  rope_tables_ = models::LlamaRopeTables(models::llama_rope_inv_freq(cfg_));
  layers_.assign(static_cast<size_t>(cfg_.num_hidden_layers), models::LlamaDecoderLayer(nullptr));
  // Registration order = the whole model's (model.embed_tokens, model.layers.*, model.norm,
  // lm_head), as the engine flattens and the checkpoint names them.
  model_ = register_module("model", std::make_shared<torch::nn::Module>("LlamaModel"));
  if (held.embedding) {
    embed_tokens_ = model_->register_module("embed_tokens", full->model->embed_tokens);
    has_embedding_ = true;
  }
  if (!held.blocks.empty()) {
    auto dict = model_->register_module("layers", torch::nn::ModuleDict());
    const auto all = full->decoder_layers();
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> named;
    for (int i : held.blocks) {
      const auto& m = all[static_cast<size_t>(i)];
      layers_[static_cast<size_t>(i)] =
          models::LlamaDecoderLayer(std::dynamic_pointer_cast<models::LlamaDecoderLayerImpl>(m));
      named.emplace_back(std::to_string(i), m);
    }
    dict->update(named);
  }
  if (held.head) {
    norm_ = model_->register_module("norm", full->model->norm);
    if (cfg_.tie_word_embeddings) {
      if (!held.embedding) tied_copy_ = full->model->embed_tokens->weight.detach().clone().set_requires_grad(true);
    } else {
      lm_head_ = register_module("lm_head", full->lm_head);
    }
  }
}

std::pair<torch::Tensor, torch::Tensor> LlamaStageImpl::rope(int64_t T, const torch::Tensor& like) const {
  return rope_tables_(T, like);  // LlamaForCausalLMImpl's tables ([Rope Tables]): the same values
}

torch::Tensor LlamaStageImpl::head_loss(const torch::Tensor& x, const torch::Tensor& targets) {
  ZT_CHECK(targets.defined() && targets.dim() == 2 && targets.size(0) == x.size(0) && targets.size(1) == x.size(1) &&
               targets.scalar_type() == torch::kLong,
           "Llama pipeline head: targets must be (B, T) int64 matching the hidden state ", x.sizes());
  // LlamaForCausalLMImpl::loss: -100 (HF's ignore_index) as -1, which the loss ignores.
  const auto t = targets.masked_fill(targets.eq(-100), -1).reshape({-1});
  const auto h = norm_(x);  // (B, T, d)
  const torch::Tensor w = cfg_.tie_word_embeddings ? (tied_copy_.defined() ? tied_copy_ : embed_tokens_->weight)
                                                   : lm_head_->weight;  // (V, d)
  if (h.scalar_type() != torch::kHalf) {
    const int64_t rows = models::llama_loss_chunk_rows(cfg_, models::lm_head_logit_bytes(h));
    return models::lm_head_cross_entropy(h.reshape({-1, h.size(-1)}), w, t, cfg_.lm_head_pad_multiple, rows);
  }
  const auto logits = F::linear(h, w).to(torch::kFloat).view({-1, cfg_.vocab_size});
  return F::cross_entropy(logits, t, F::CrossEntropyFuncOptions().ignore_index(-1));
}

torch::Tensor LlamaStageImpl::forward(int chunk, const torch::Tensor& x, const torch::Tensor& targets) {
  const auto [begin, end] = chunk_layers(chunk);
  torch::Tensor y = x;
  int l = begin;
  if (l == 0) {
    ZT_CHECK(x.dim() == 2 && x.scalar_type() == torch::kLong, "Llama pipeline embedding: idx must be (B, T) int64, got ",
             x.sizes(), " ", x.scalar_type());
    ZT_CHECK(x.size(1) <= cfg_.max_position_embeddings, "Llama pipeline embedding: sequence length ", x.size(1),
             " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
    // padding_idx as HF's nn.Embedding: no gradient into the pad row.
    y = models::llama_embedding(embed_tokens_->weight, x, cfg_.pad_token_id);  // (B, T, d)
    l = 1;
  }
  const int block_end = std::min(end, num_layers_ - 1);
  if (l < block_end) {
    const auto [cos, sin] = rope(y.size(1), y);
    auto run = [this, cos, sin](int a, int b, const torch::Tensor& t) {  // decoder layers [a, b)
      torch::Tensor z = t;
      for (int i = a; i < b; ++i) z = layers_[static_cast<size_t>(i)]->forward(z, cos, sin);
      return z;
    };
    // As GPT2Stage: ranges of ckpt_interval_ pipeline layers from the chunk's first layer,
    // each range's decoder layers one checkpoint (DeepSpeed's exec_range_func).
    if (ckpt_interval_ > 0 && torch::GradMode::is_enabled()) {
      for (int r = begin; r < block_end; r += static_cast<int>(ckpt_interval_)) {
        const int a = std::max(r, l), b = std::min(block_end, r + static_cast<int>(ckpt_interval_));
        if (a >= b) continue;
        y = models::checkpoint([run, a, b](const torch::Tensor& t) { return run(a - 1, b - 1, t); }, y);
      }
    } else {
      y = run(l - 1, block_end - 1, y);
    }
  }
  if (end == num_layers_) return head_loss(y, targets);
  return y;
}

}  // namespace zt::pipe
