// The Llama family: named shapes, config.json in and out, logits and loss equal to
// transformers' on the committed fixtures (tests/fixtures/make_llama_fixtures.py),
// Hugging Face weights in and out (sharded), activation checkpointing, learning.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/fs.h"
#include "models/hf_checkpoint.h"
#include "models/hf_llama.h"
#include "models/llama.h"
#include "models/lm_head_loss.h"
#include "io/safetensors.h"
#include "zerotrain/error.h"

namespace zt_test_llama {

namespace fs = std::filesystem;
using zt::models::LlamaConfig;
using zt::models::LlamaForCausalLM;

namespace {

const fs::path kFixtures = fs::path(ZT_SOURCE_DIR) / "tests" / "fixtures" / "llama";

struct Fixture {
  LlamaConfig cfg;
  LlamaForCausalLM model{nullptr};
  torch::Tensor ids, labels, logits, loss;
};

Fixture load_fixture(const std::string& name) {
  Fixture f;
  const auto dir = (kFixtures / name).string();
  f.cfg = zt::models::llama_config_from_hf_json(dir);
  f.model = zt::models::load_hf_llama_pretrained(dir);
  auto io = zt::io::load_safetensors((kFixtures / name / "io.safetensors").string());
  f.ids = io.at("input_ids");
  f.labels = io.at("labels");
  f.logits = io.at("logits");
  f.loss = io.at("loss");
  return f;
}

// HF's labels -> zerotrain's targets: shifted left by one, -100 appended.
torch::Tensor shift_labels(const torch::Tensor& labels) {
  auto t = torch::full_like(labels, -100);
  t.narrow(1, 0, labels.size(1) - 1).copy_(labels.narrow(1, 1, labels.size(1) - 1));
  return t;
}

std::string tmp_dir(const std::string& name) {
  const auto d = fs::path(ZT_BINARY_DIR) / ("llama_test_" + name);
  zt::ckpt::remove_tree(d.string());  // not fs::remove_all: see ckpt/fs.h
  zt::ckpt::make_dirs(d.string());
  return d.string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

LlamaConfig tiny_config() {
  auto c = zt::models::named_llama("llama-tiny");
  c.max_position_embeddings = 32;
  return c;
}

}  // namespace

TEST(LlamaConfig, NamedShapesHaveTheRealParameterCounts) {
  // transformers' LlamaForCausalLM(config).num_parameters() for Meta's configs.
  EXPECT_EQ(zt::models::llama_num_params(zt::models::named_llama("llama3.2-1b")), 1235814400);
  EXPECT_EQ(zt::models::llama_num_params(zt::models::named_llama("llama3-8b")), 8030261248);
  const auto b1 = zt::models::named_llama("llama3.2-1b");
  EXPECT_TRUE(b1.tie_word_embeddings);
  EXPECT_EQ(b1.rope_type, zt::models::RopeType::kLlama3);
  EXPECT_EQ(b1.num_key_value_heads, 8);
  EXPECT_FALSE(zt::models::named_llama("llama3-8b").tie_word_embeddings);
  auto t = zt::models::named_llama("llama-tiny");
  LlamaForCausalLM m(t);
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(n, zt::models::llama_num_params(t));
  EXPECT_EQ(m->num_params(), n);
  EXPECT_THROW(zt::models::named_llama("llama-huge"), zt::ConfigError);
  EXPECT_TRUE(zt::models::is_llama_name("llama3-8b"));
  EXPECT_FALSE(zt::models::is_llama_name("gpt2"));
}

TEST(LlamaConfig, FlopsPerTokenFormula) {
  // 6 (N - V d) + 12 L (H hd) T for the tied 1B: the embedding table is a lookup, the
  // tied head's matmul is the V d term.
  const auto c = zt::models::named_llama("llama3.2-1b");
  const double N = 1235814400.0, Vd = 128256.0 * 2048.0;
  EXPECT_DOUBLE_EQ(zt::models::llama_flops_per_token(c, 2048), 6.0 * (N - Vd + Vd) + 12.0 * 16 * 2048 * 2048);
  const auto e = zt::models::named_llama("llama3-8b");  // untied: N counts both tables
  const double N8 = 8030261248.0, Vd8 = 128256.0 * 4096.0;
  EXPECT_DOUBLE_EQ(zt::models::llama_flops_per_token(e, 8192), 6.0 * (N8 - 2 * Vd8 + Vd8) + 12.0 * 32 * 4096 * 8192);
}

TEST(LlamaLmHead, ChunkRowsCountTheLogitsInTheirDtypeOnTheFusedPath) {
  // About 512 MiB of logits per chunk: 1B (Vp 128256) at 4 x 2048 tokens is 8 chunks of fp32
  // logits (the CPU, or fp32 on CUDA) and 4 of bf16/fp16 ones (the fused CUDA path keeps the
  // chunk in x's dtype).
  const auto c = zt::models::named_llama("llama3.2-1b");
  const int64_t r4 = zt::models::llama_loss_chunk_rows(c, 4), r2 = zt::models::llama_loss_chunk_rows(c, 2);
  EXPECT_EQ(r4, (int64_t{512} << 20) / (4 * 128256));  // 1046
  EXPECT_EQ(r2, 2 * r4);                               // 2092
  EXPECT_EQ((8192 + r4 - 1) / r4, 8);
  EXPECT_EQ((8192 + r2 - 1) / r2, 4);
  // At least 64 rows however wide the vocabulary.
  auto wide = c;
  wide.vocab_size = int64_t{1} << 24;
  EXPECT_EQ(zt::models::llama_loss_chunk_rows(wide, 2), 64);
  // The CPU takes the unfused path (fp32 logits) whatever x's dtype: its chunks are unchanged.
  EXPECT_EQ(zt::models::lm_head_logit_bytes(torch::zeros({2, 3}, torch::kBFloat16)), 4);
  EXPECT_EQ(zt::models::lm_head_logit_bytes(torch::zeros({2, 3}, torch::kFloat)), 4);
}

TEST(LlamaConfig, HuggingFaceParameterNamesAndShapes) {
  auto c = tiny_config();
  LlamaForCausalLM m(c);
  const auto want = zt::models::llama_param_shapes(c);
  const auto got = m->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].key(), want[i].first);
    EXPECT_EQ(got[i].value().sizes().vec(), want[i].second) << want[i].first;
    EXPECT_EQ(m->param_shape(want[i].first), want[i].second);
  }
  EXPECT_EQ(want.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(want[1].first, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(want.back().first, "lm_head.weight");
  EXPECT_EQ(m->named_parameters()["model.layers.1.self_attn.k_proj.weight"].sizes(), torch::IntArrayRef({64, 128}));
  EXPECT_EQ(m->decoder_layers().size(), 2u);
  // Deferred: the same names, placeholders for the matrices, real norms.
  c.deferred_init = true;
  LlamaForCausalLM d(c);
  EXPECT_EQ(d->named_parameters()["model.layers.0.mlp.up_proj.weight"].numel(), 1);
  EXPECT_EQ(d->named_parameters()["model.norm.weight"].numel(), 128);
  EXPECT_EQ(d->param_shape("model.layers.1.mlp.down_proj.weight"), (std::vector<int64_t>{128, 384}));
  EXPECT_THROW(d->param_shape("model.layers.0.mlp.c_fc.weight"), zt::InternalError);
}

TEST(LlamaConfig, RejectsOtherArchitecturesAndUnsupportedMath) {
  const auto dir = tmp_dir("config_reject");
  const std::string path = dir + "/config.json";
  auto base = nlohmann::json::parse(std::ifstream((kFixtures / "llama" / "config.json").string()));
  auto expect_error = [&](nlohmann::json j, const std::string& needle) {
    write_text(path, j.dump());
    try {
      zt::models::llama_config_from_hf_json(path);
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const zt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto j = base;
  j["architectures"] = {"GPT2LMHeadModel"};
  expect_error(j, "GPT2LMHeadModel");
  j = base;
  j["hidden_act"] = "gelu";
  expect_error(j, "hidden_act");
  j = base;
  j["attention_dropout"] = 0.1;
  expect_error(j, "attention_dropout");
  j = base;
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e4}};
  expect_error(j, "yarn");
  j = base;
  j["num_key_value_heads"] = 3;
  expect_error(j, "num_key_value_heads");
  j = base;
  j.erase("hidden_size");
  expect_error(j, "hidden_size");
  // transformers 4 spelling: rope_theta + rope_scaling {"type": ...}.
  j = base;
  j.erase("rope_parameters");
  j["rope_theta"] = 5e5;
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  write_text(path, j.dump());
  const auto c = zt::models::llama_config_from_hf_json(path);
  EXPECT_EQ(c.rope_type, zt::models::RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_factor, 2.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e5);
}

TEST(LlamaConfig, HfJsonRoundTripKeepsEveryField) {
  for (const char* name : {"llama", "mistral_gqa", "qwen2_bias", "llama3_rope", "llama_linear"}) {
    const auto a = zt::models::llama_config_from_hf_json((kFixtures / name).string());
    const auto b = zt::models::llama_config_from_hf_json_text(zt::models::llama_config_to_hf_json(a), name);
    EXPECT_EQ(a.architecture, b.architecture) << name;
    EXPECT_EQ(zt::models::llama_param_shapes(a), zt::models::llama_param_shapes(b)) << name;
    EXPECT_EQ(a.head_dim, b.head_dim) << name;
    EXPECT_EQ(a.rope_type, b.rope_type) << name;
    EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta) << name;
    EXPECT_DOUBLE_EQ(a.rope_factor, b.rope_factor) << name;
    EXPECT_EQ(a.sliding_window, b.sliding_window) << name;
    EXPECT_EQ(a.layer_sliding, b.layer_sliding) << name;
    EXPECT_EQ(a.pad_token_id, b.pad_token_id) << name;
    EXPECT_DOUBLE_EQ(a.rms_norm_eps, b.rms_norm_eps) << name;
    EXPECT_TRUE(torch::equal(zt::models::llama_rope_inv_freq(a), zt::models::llama_rope_inv_freq(b))) << name;
  }
  // What the fixtures exercise.
  EXPECT_EQ(zt::models::llama_config_from_hf_json((kFixtures / "mistral_gqa").string()).sliding_window, 8);
  const auto q = zt::models::llama_config_from_hf_json((kFixtures / "qwen2_bias").string());
  EXPECT_TRUE(q.qkv_bias && !q.o_bias && q.tie_word_embeddings && q.num_key_value_heads == 2);
  const auto l3 = zt::models::llama_config_from_hf_json((kFixtures / "llama3_rope").string());
  EXPECT_TRUE(l3.qkv_bias && l3.o_bias && l3.mlp_bias && l3.rope_type == zt::models::RopeType::kLlama3);
}

// Logits and loss against transformers' (fp32). Tolerance 1e-4 on logits of magnitude
// ~1-5: the same math in a different summation order (sdpa vs eager attention, fused
// loss chunks) differs by ~1e-6; a wrong rope, mask, bias or norm moves them by > 1e-3
// (the fixture script checks that each case's feature moves them by more).
class LlamaMatchesTransformers : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaMatchesTransformers, LogitsAndLoss) {
  auto f = load_fixture(GetParam());
  torch::NoGradGuard no_grad;
  const auto logits = f.model->forward(f.ids);
  ASSERT_EQ(logits.sizes(), f.logits.sizes());
  const double diff = (logits - f.logits).abs().max().item<double>();
  EXPECT_LE(diff, 1e-4) << GetParam();
  const double loss = f.model->loss(f.ids, shift_labels(f.labels)).item<double>();
  EXPECT_NEAR(loss, f.loss.item<double>(), 1e-5) << GetParam();
  std::printf("[ llama    ] %-12s max |logits - transformers| = %.2e, |loss - transformers| = %.2e\n", GetParam(), diff,
              std::abs(loss - f.loss.item<double>()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaMatchesTransformers,
                         ::testing::Values("llama", "mistral_gqa", "qwen2_bias", "llama3_rope", "llama_linear"));

TEST(LlamaLoss, IgnoresMinus100AndMatchesCrossEntropy) {
  auto f = load_fixture("llama");
  torch::NoGradGuard no_grad;
  auto targets = shift_labels(f.labels);
  const auto logits = f.model->forward(f.ids).view({-1, f.cfg.vocab_size});
  const auto want = torch::nn::functional::cross_entropy(
      logits, targets.view({-1}), torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  EXPECT_NEAR(f.model->loss(f.ids, targets).item<double>(), want.item<double>(), 1e-5);
  // Masking changes the value (the test above would notice a loss that ignored it).
  auto unmasked = targets.clamp_min(0);
  EXPECT_GT(std::abs(f.model->loss(f.ids, unmasked).item<double>() - want.item<double>()), 1e-3);
}

TEST(LlamaHf, ShardedSaveRoundTripsAndIsStreamedShardByShard) {
  auto f = load_fixture("qwen2_bias");
  const auto dir = tmp_dir("sharded");
  // About 100 KB of fp32 weights in 30 KB shards: several shards and an index.
  const auto files = zt::models::save_hf_llama(*f.model, dir, at::kFloat, 30000);
  ASSERT_GE(files.size(), 4u);
  EXPECT_EQ(fs::path(files.back()).filename().string(), "model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  auto idx = nlohmann::json::parse(std::ifstream(files.back()));
  int64_t total = 0;
  for (const auto& [n, s] : zt::models::llama_param_shapes(f.cfg)) {
    int64_t k = 4;
    for (auto d : s) k *= d;
    total += k;
    EXPECT_TRUE(idx["weight_map"].contains(n)) << n;
  }
  EXPECT_EQ(idx["metadata"]["total_size"].get<int64_t>(), total);
  for (size_t i = 0; i + 1 < files.size(); ++i) {
    // A shard passes the limit only when one tensor alone does (the embedding, 24 KB, does not).
    EXPECT_LE(static_cast<int64_t>(fs::file_size(files[i])), 30000 + 4096) << files[i];
  }
  auto back = zt::models::load_hf_llama_pretrained(dir);
  const auto a = f.model->named_parameters(), b = back->named_parameters();
  for (const auto& p : a) EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(back->forward(f.ids), f.model->forward(f.ids)));
  // Saving again unsharded replaces the shards and the index.
  const auto one = zt::models::save_hf_llama(*f.model, dir, at::kBFloat16);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(files.front()));
  zt::models::HfCheckpointReader r(dir);
  EXPECT_EQ(r.entry("model.norm.weight").dtype, at::kBFloat16);
  auto cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(cfg["architectures"][0], "Qwen2ForCausalLM");
}

TEST(LlamaHf, LoadErrorsNameTheTensor) {
  // Mistral's fixture into the Llama fixture's config: k/v have half the rows.
  auto cfg = zt::models::llama_config_from_hf_json((kFixtures / "llama").string());
  LlamaForCausalLM m(cfg);
  zt::models::HfCheckpointReader mistral((kFixtures / "mistral_gqa" / "model.safetensors").string());
  try {
    zt::models::load_hf_llama(*m, mistral);
    ADD_FAILURE() << "loaded a checkpoint of another shape";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
  }
  // The tied Qwen2 checkpoint has no lm_head.weight: an untied config lacks it.
  auto q = zt::models::llama_config_from_hf_json((kFixtures / "qwen2_bias").string());
  q.tie_word_embeddings = false;
  LlamaForCausalLM u(q);
  try {
    zt::models::load_hf_llama(*u, (kFixtures / "qwen2_bias").string());
    ADD_FAILURE() << "loaded without lm_head.weight";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lacks parameters: lm_head.weight"), std::string::npos) << e.what();
  }
  // An index naming a shard that does not hold the tensor.
  const auto dir = tmp_dir("bad_index");
  {
    std::ifstream in((kFixtures / "llama" / "model.safetensors").string(), std::ios::binary);
    std::ofstream(dir + "/model-00001-of-00001.safetensors", std::ios::binary) << in.rdbuf();
  }
  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"model.norm.weight": "model-00001-of-00001.safetensors",
                                "model.extra.weight": "model-00001-of-00001.safetensors"}})");
  EXPECT_THROW(zt::models::HfCheckpointReader{dir}, zt::Error);
}

TEST(Llama, ActivationCheckpointingGivesIdenticalGradients) {
  auto c = tiny_config();
  torch::manual_seed(3);
  LlamaForCausalLM a(c);
  torch::manual_seed(3);
  LlamaForCausalLM b(c);
  b->set_activation_checkpointing(true);
  auto g = at::make_generator<at::CPUGeneratorImpl>(7);
  auto idx = torch::randint(c.vocab_size, {2, 17}, g, torch::kLong);
  auto x = idx.narrow(1, 0, 16).contiguous(), y = idx.narrow(1, 1, 16).contiguous();
  int calls = 0;
  b->set_layer_runner([&](int64_t, const zt::models::CheckpointFn& fn, const torch::Tensor& t) {
    ++calls;
    return fn(t);
  });
  a->loss(x, y).backward();
  b->loss(x, y).backward();
  EXPECT_EQ(calls, 2);  // the runner sees every layer once per forward
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& p : pa) {
    ASSERT_TRUE(pb[p.key()].grad().defined()) << p.key();
    EXPECT_TRUE(torch::allclose(p.value().grad(), pb[p.key()].grad(), 1e-6, 1e-7)) << p.key();
  }
}

TEST(Llama, LearnsARepeatedSequence) {
  auto c = tiny_config();
  torch::manual_seed(11);
  LlamaForCausalLM m(c);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(3e-3));
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  auto idx = torch::randint(c.vocab_size, {4, 17}, g, torch::kLong);
  auto x = idx.narrow(1, 0, 16).contiguous(), y = idx.narrow(1, 1, 16).contiguous();
  double first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    opt.zero_grad();
    auto loss = m->loss(x, y);
    loss.backward();
    opt.step();
    (s == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(256.0), 0.5);  // random init: about uniform
  EXPECT_LT(last, 0.5 * first);
}

TEST(Llama, BFloat16ForwardIsCloseToFp32) {
  auto f = load_fixture("mistral_gqa");
  torch::NoGradGuard no_grad;
  f.model->to(torch::kBFloat16);
  const auto logits = f.model->forward(f.ids).to(torch::kFloat);
  // bf16 has 8 mantissa bits: logits of magnitude ~3 move by a few 1e-2.
  EXPECT_LE((logits - f.logits).abs().max().item<double>(), 0.15);
  EXPECT_EQ(f.model->loss(f.ids, shift_labels(f.labels)).scalar_type(), torch::kFloat);
}

}  // namespace zt_test_llama
