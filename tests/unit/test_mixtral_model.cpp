// [Mixtral] (models/llama.h): the Mixtral-shaped Llama. Its logits, loss and gradients
// against a reference written here token by token (RMSNorm by formula, the layer's attention
// module, then per token: softmax over the gate logits, top-k, renormalised weights, each
// chosen expert's w2(silu(w1 x) * w3 x) from its weight matrices), and the aux loss against
// Hugging Face's load_balancing_loss_func written out here: the router logits of ALL layers
// concatenated, one softmax / top-k / one-hot, the means over the concatenation. Also the
// config.json fields, the mixtral-tiny preset, a checkpoint written here under HF's tensor
// names read back by name, and transformers' own MixtralForCausalLM on a committed fixture.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "ckpt/fs.h"
#include "io/safetensors.h"
#include "models/hf_llama.h"
#include "models/llama.h"
#include "zerotrain/error.h"

namespace zt_test_mixtral_model {

namespace fs = std::filesystem;
using zt::models::LlamaConfig;
using zt::models::LlamaForCausalLM;

namespace {

LlamaConfig mixtral_model_test_config(int64_t k) {
  LlamaConfig c = zt::models::named_llama("mixtral-tiny");
  c.vocab_size = 48;
  c.num_experts_per_tok = k;
  return c;
}

torch::Tensor mixtral_ref_rms(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return w * (x * torch::rsqrt(x.pow(2).mean(-1, true) + eps));
}

struct MixtralRef {
  torch::Tensor logits, ce, aux, loss;
  std::vector<torch::Tensor> router_logits;  // per layer [B*T, E]
};

// The model's math written out; uses the model's parameter tensors (so gradients land in them).
MixtralRef mixtral_reference(LlamaForCausalLM& m, const torch::Tensor& idx, const torch::Tensor& targets) {
  const LlamaConfig& c = m->config();
  const int64_t B = idx.size(0), T = idx.size(1), d = c.hidden_size, E = c.num_local_experts, k = c.num_experts_per_tok;
  auto x = m->model->embed_tokens->weight.index_select(0, idx.reshape({-1})).view({B, T, d});
  const auto inv = zt::models::llama_rope_inv_freq(c);
  const auto freqs = torch::arange(T, torch::kFloat).unsqueeze(1) * inv.unsqueeze(0);
  const auto emb = torch::cat({freqs, freqs}, -1);
  const auto cos = emb.cos(), sin = emb.sin();
  MixtralRef r;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto layer = m->model->layers->ptr<zt::models::LlamaDecoderLayerImpl>(static_cast<size_t>(l));
    auto h = x + layer->self_attn(mixtral_ref_rms(x, layer->input_layernorm->weight, c.rms_norm_eps), cos, sin);
    auto n = mixtral_ref_rms(h, layer->post_attention_layernorm->weight, c.rms_norm_eps).reshape({B * T, d});
    const auto& moe = layer->block_sparse_moe;
    auto logits = torch::matmul(n, moe->gate->weight.t());  // [S, E]
    r.router_logits.push_back(logits);
    std::vector<torch::Tensor> rows;
    for (int64_t s = 0; s < B * T; ++s) {
      auto p = torch::softmax(logits[s], 0);
      auto top = p.topk(k);
      auto w = std::get<0>(top) / std::get<0>(top).sum();
      auto idxs = std::get<1>(top);
      torch::Tensor y = torch::zeros({d});
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = idxs[j].item<int64_t>();
        auto ex = moe->experts->ptr<zt::models::MixtralExpertImpl>(static_cast<size_t>(e));
        auto v = n[s];
        auto g = torch::matmul(ex->w1->weight, v), u = torch::matmul(ex->w3->weight, v);
        y = y + w[j] * torch::matmul(ex->w2->weight, torch::silu(g) * u);
      }
      rows.push_back(y);
    }
    x = h + torch::stack(rows).view({B, T, d});
  }
  auto hN = mixtral_ref_rms(x, m->model->norm->weight, c.rms_norm_eps);
  r.logits = torch::matmul(hN, m->lm_head->weight.t());
  r.ce = torch::nn::functional::cross_entropy(r.logits.reshape({-1, c.vocab_size}), targets.reshape({-1}));
  // HF load_balancing_loss_func (attention_mask None): concatenated gate logits of all layers.
  auto cat = torch::cat(r.router_logits, 0);              // [L*S, E]
  auto probs = torch::softmax(cat, -1);
  auto selected = std::get<1>(probs.topk(k, -1));          // [L*S, k]
  auto mask = torch::one_hot(selected, E).to(torch::kFloat);  // [L*S, k, E]
  auto tokens_per_expert = mask.mean(0);                   // [k, E]
  auto router_prob_per_expert = probs.mean(0);             // [E]
  r.aux = (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * static_cast<double>(E);
  r.loss = c.output_router_logits ? r.ce + c.router_aux_loss_coef * r.aux : r.ce;
  return r;
}

std::map<std::string, torch::Tensor> mixtral_grads(LlamaForCausalLM& m) {
  std::map<std::string, torch::Tensor> g;
  for (auto& kv : m->named_parameters()) {
    g[kv.key()] = kv.value().grad().defined() ? kv.value().grad().clone() : torch::zeros_like(kv.value());
    kv.value().mutable_grad() = torch::Tensor();
  }
  return g;
}

}  // namespace

TEST(MixtralModel, LogitsLossAndGradientsEqualThePerTokenReference) {
  for (int64_t k : {1, 2, 3}) {
    SCOPED_TRACE("top-" + std::to_string(k));
    torch::manual_seed(11);
    LlamaForCausalLM m(mixtral_model_test_config(k));
    {
      // A sharper gate than the init's, so that the routing is uneven and the choices matter.
      torch::NoGradGuard ng;
      for (auto& kv : m->named_parameters())
        if (kv.key().ends_with("block_sparse_moe.gate.weight")) kv.value().mul_(40.0);
    }
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    const auto idx = torch::randint(0, 48, {2, 8}, gen, torch::kLong);
    const auto tgt = torch::randint(0, 48, {2, 8}, gen, torch::kLong);

    const auto logits = m->forward(idx);
    auto loss = m->loss(idx, tgt);
    const double aux = m->router_aux_loss().item<double>();
    loss.backward();
    auto got = mixtral_grads(m);

    auto ref = mixtral_reference(m, idx, tgt);
    ref.loss.backward();
    auto want = mixtral_grads(m);

    EXPECT_LE((logits - ref.logits).abs().max().item<double>(), 1e-6);
    EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-6);
    EXPECT_NEAR(aux, ref.aux.item<double>(), 1e-6);
    EXPECT_NEAR(m->last_moe_aux_tensor().item<double>(), ref.aux.item<double>(), 1e-6);
    // The aux loss is in the loss (output_router_logits on in the preset): it moves it.
    EXPECT_GT(std::abs(loss.item<double>() - ref.ce.item<double>()), 1e-3);
    double worst = 0;
    for (const auto& [name, g] : want) {
      const double dg = (got.at(name) - g).abs().max().item<double>();
      EXPECT_LE(dg, 1e-6) << name;
      worst = std::max(worst, dg);
    }
    // The gate's gradient comes from the routing weights and the aux loss (HF: through the
    // mean probabilities only): non-zero.
    EXPECT_GT(want.at("model.layers.0.block_sparse_moe.gate.weight").abs().max().item<double>(), 1e-4);
    // The formula can fail: a mean (or sum) of per-layer losses is not HF's concatenated one.
    double per_layer = 0;
    for (const auto& lg : ref.router_logits) {
      auto p = torch::softmax(lg, -1);
      auto mask = torch::one_hot(std::get<1>(p.topk(k, -1)), 4).to(torch::kFloat).mean(0);
      per_layer += 4.0 * (mask * p.mean(0).unsqueeze(0)).sum().item<double>() / static_cast<double>(ref.router_logits.size());
    }
    EXPECT_GT(std::abs(per_layer - ref.aux.item<double>()), 1e-4) << "mean of per-layer aux losses";
    std::printf("[mixtral] top-%lld: aux %.6f (mean of per-layer %.6f), largest gradient difference %.3g\n",
                static_cast<long long>(k), ref.aux.item<double>(), per_layer, worst);
    // Experts' counts: every token at k experts per layer.
    for (const auto& row : m->last_moe_kept_per_expert()) {
      int64_t sum = 0;
      for (int64_t v : row) sum += v;
      EXPECT_EQ(sum, 16 * k);
    }
  }
}

TEST(MixtralMatchesTransformers, LogitsLossAndAux) {
  // tests/fixtures/llama/mixtral (tests/fixtures/make_mixtral_fixture.py, transformers 5.24):
  // a random MixtralForCausalLM saved by save_pretrained (the Hub's block_sparse_moe names),
  // its logits, its loss with output_router_logits (cross entropy + 0.02 x aux) and its aux.
  const fs::path dir = fs::path(ZT_SOURCE_DIR) / "tests" / "fixtures" / "llama" / "mixtral";
  LlamaForCausalLM m = zt::models::load_hf_llama_pretrained(dir.string());
  EXPECT_EQ(m->config().num_local_experts, 4);
  EXPECT_TRUE(m->config().output_router_logits);
  const auto io = zt::io::load_safetensors((dir / "io.safetensors").string());
  const auto ids = io.at("input_ids"), labels = io.at("labels");
  // HF's labels -> zerotrain's targets: shifted left by one, -100 appended.
  auto targets = torch::full_like(labels, -100);
  targets.narrow(1, 0, labels.size(1) - 1).copy_(labels.narrow(1, 1, labels.size(1) - 1));
  torch::NoGradGuard ng;
  const double dl = (m->forward(ids) - io.at("logits")).abs().max().item<double>();
  EXPECT_LE(dl, 1e-4);
  const auto loss = m->loss(ids, targets);
  EXPECT_NEAR(loss.item<double>(), io.at("loss").item<double>(), 1e-5);
  EXPECT_NEAR(m->router_aux_loss().item<double>(), io.at("aux_loss").item<double>(), 1e-5);
  std::printf("[mixtral] vs transformers: logits %.3g, loss %.3g, aux %.3g\n", dl,
              std::abs(loss.item<double>() - io.at("loss").item<double>()),
              std::abs(m->router_aux_loss().item<double>() - io.at("aux_loss").item<double>()));
}

TEST(MixtralModel, AuxLossOnlyWithOutputRouterLogits) {
  auto c = mixtral_model_test_config(2);
  c.output_router_logits = false;  // HF's default
  torch::manual_seed(11);
  LlamaForCausalLM m(c);
  const auto idx = torch::randint(0, 48, {1, 8}, torch::kLong), tgt = torch::randint(0, 48, {1, 8}, torch::kLong);
  const auto loss = m->loss(idx, tgt);
  const auto ref = mixtral_reference(m, idx, tgt);
  EXPECT_NEAR(loss.item<double>(), ref.ce.item<double>(), 1e-6);
  EXPECT_NEAR(m->last_moe_aux_tensor().item<double>(), ref.aux.item<double>(), 1e-6);  // still logged
}

TEST(MixtralModel, CheckpointedLayersGiveTheSameLossAndGradients) {
  // [Checkpointed Aux]: the recomputed layers keep the first forward's router probabilities.
  torch::manual_seed(5);
  LlamaForCausalLM a(mixtral_model_test_config(2));
  const auto idx = torch::randint(0, 48, {2, 8}, torch::kLong), tgt = torch::randint(0, 48, {2, 8}, torch::kLong);
  auto la = a->loss(idx, tgt);
  la.backward();
  auto ga = mixtral_grads(a);
  a->set_activation_checkpointing(true);
  auto lb = a->loss(idx, tgt);
  lb.backward();
  auto gb = mixtral_grads(a);
  EXPECT_NEAR(la.item<double>(), lb.item<double>(), 1e-7);
  for (const auto& [name, g] : ga) EXPECT_LE((gb.at(name) - g).abs().max().item<double>(), 1e-6) << name;
}

TEST(MixtralConfig, PresetAndHfConfigJson) {
  const LlamaConfig t = zt::models::named_llama("mixtral-tiny");
  EXPECT_EQ(t.architecture, "MixtralForCausalLM");
  EXPECT_EQ(t.num_local_experts, 4);
  EXPECT_EQ(t.num_experts_per_tok, 2);
  EXPECT_TRUE(t.output_router_logits);
  EXPECT_EQ(t.router_aux_loss_coef, 0.02);
  EXPECT_LT(t.num_key_value_heads, t.num_attention_heads);  // GQA
  // Parameters: every expert counted; FLOPs: k of E experts per token.
  const int64_t d = 64, I = 128, V = 256, L = 2, E = 4;
  const int64_t attn = d * 64 + 2 * d * 32 + 64 * d;
  const int64_t layer = attn + E * d + E * 3 * d * I + 2 * d;
  EXPECT_EQ(zt::models::llama_num_params(t), V * d + L * layer + d + V * d);
  const double dense_layers = static_cast<double>(L * (layer - (E - 2) * 3 * d * I));
  EXPECT_DOUBLE_EQ(zt::models::llama_flops_per_token(t, 32), 6.0 * (dense_layers + d + V * d) + 12.0 * L * 64 * 32);

  // An HF Mixtral config.json (Mixtral-8x7B's keys, shrunk): read, written back, read again.
  const std::string text = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
      "vocab_size": 100, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
      "rope_theta": 1e6, "sliding_window": null, "num_local_experts": 8, "num_experts_per_tok": 2,
      "router_aux_loss_coef": 0.02, "output_router_logits": false, "router_jitter_noise": 0.0,
      "hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": false, "bos_token_id": 1})";
  const LlamaConfig c = zt::models::llama_config_from_hf_json_text(text, "mixtral.json");
  EXPECT_EQ(c.architecture, "MixtralForCausalLM");
  EXPECT_EQ(c.num_local_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.router_aux_loss_coef, 0.02);
  EXPECT_FALSE(c.output_router_logits);
  EXPECT_EQ(c.head_dim, 8);
  const auto back = zt::models::llama_config_from_hf_json_text(zt::models::llama_config_to_hf_json(c), "back");
  EXPECT_EQ(back.num_local_experts, 8);
  EXPECT_EQ(back.router_aux_loss_coef, 0.02);
  EXPECT_FALSE(back.output_router_logits);
  EXPECT_TRUE(nlohmann::json::parse(zt::models::llama_config_to_hf_json(c))["model_type"] == "mixtral");
  // model_type alone, MixtralConfig's defaults (8 experts, top-2, output_router_logits off).
  const auto by_type = zt::models::llama_config_from_hf_json_text(
      R"({"model_type": "mixtral", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 8,
          "num_hidden_layers": 1, "num_attention_heads": 2})", "type.json");
  EXPECT_EQ(by_type.num_local_experts, 8);
  EXPECT_EQ(by_type.num_experts_per_tok, 2);
  EXPECT_EQ(by_type.router_aux_loss_coef, 0.001);
  EXPECT_FALSE(by_type.output_router_logits);

  auto error_of = [](const std::string& json) {
    try {
      zt::models::llama_config_from_hf_json_text(json, "bad.json");
    } catch (const zt::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string base = R"("vocab_size": 10, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2)";
  EXPECT_NE(error_of(R"({"model_type": "qwen2_moe", )" + base + "}").find("shared expert"), std::string::npos);
  EXPECT_NE(error_of(R"({"architectures": ["Qwen2MoeForCausalLM"], )" + base + "}").find("not built"), std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "mixtral", "router_jitter_noise": 0.1, )" + base + "}").find("router_jitter_noise"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "mixtral", "num_experts_per_tok": 9, )" + base + "}").find("num_experts_per_tok"),
            std::string::npos);
}

TEST(MixtralHf, ReadsACheckpointWrittenUnderHfNames) {
  // A tiny HF-format Mixtral directory written here: config.json with HF's keys and one
  // model.safetensors whose tensor names are spelled out as MixtralForCausalLM's state dict.
  const fs::path dir = fs::temp_directory_path() / ("zt_mixtral_hf_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
      "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
      "rope_theta": 1e6, "num_local_experts": 3, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
      "output_router_logits": true, "tie_word_embeddings": false})";
  std::map<std::string, torch::Tensor> t;
  torch::manual_seed(2);
  t["model.embed_tokens.weight"] = torch::randn({40, 16});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "self_attn.q_proj.weight"] = torch::randn({16, 16});
    t[p + "self_attn.k_proj.weight"] = torch::randn({8, 16});
    t[p + "self_attn.v_proj.weight"] = torch::randn({8, 16});
    t[p + "self_attn.o_proj.weight"] = torch::randn({16, 16});
    t[p + "block_sparse_moe.gate.weight"] = torch::randn({3, 16});
    for (int e = 0; e < 3; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      t[x + "w1.weight"] = torch::randn({24, 16});
      t[x + "w2.weight"] = torch::randn({16, 24});
      t[x + "w3.weight"] = torch::randn({24, 16});
    }
    t[p + "input_layernorm.weight"] = torch::rand({16});
    t[p + "post_attention_layernorm.weight"] = torch::rand({16});
  }
  t["model.norm.weight"] = torch::rand({16});
  t["lm_head.weight"] = torch::randn({40, 16});
  zt::io::save_safetensors((dir / "model.safetensors").string(), t);

  LlamaForCausalLM m = zt::models::load_hf_llama_pretrained(dir.string());
  size_t n = 0;
  for (const auto& kv : m->named_parameters()) {
    ASSERT_TRUE(t.count(kv.key())) << kv.key() << " is not an HF Mixtral name";
    EXPECT_TRUE(torch::equal(kv.value(), t.at(kv.key()))) << kv.key();
    ++n;
  }
  EXPECT_EQ(n, t.size());
  // Written back (zerotrain convert's writer) under the same names.
  const fs::path out = dir / "out";
  zt::models::save_hf_llama(*m, out.string());
  const auto back = zt::io::load_safetensors((out / "model.safetensors").string());
  std::set<std::string> names;
  for (const auto& [k, v] : back) names.insert(k);
  std::set<std::string> want;
  for (const auto& [k, v] : t) want.insert(k);
  EXPECT_EQ(names, want);
  zt::ckpt::remove_tree(dir.string());  // not fs::remove_all: libtorch ships a conflicting copy
}

}  // namespace zt_test_mixtral_model
