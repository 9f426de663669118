// LoRA (src/lora): options, peft's target_modules matching and its errors, the adapter's
// init and math inside GPT-2 and Llama (the models' forward reaches the adapter: the
// earlier draft's defect), frozen base, dropout, merge, the peft file format both ways, and
// logits equal to peft's on the committed fixtures (scripts/make_lora_fixtures.py).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/fs.h"
#include "io/safetensors.h"
#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/lora_spec.h"
#include "lora/peft_format.h"
#include "models/gpt2.h"
#include "models/hf_gpt2.h"
#include "models/hf_llama.h"
#include "models/llama.h"
#include "zerotrain/error.h"

namespace zt_test_lora {

namespace fs = std::filesystem;
using zt::lora::LoraOptions;

namespace {

const fs::path kFixtures = fs::path(ZT_SOURCE_DIR) / "tests" / "fixtures";

std::string tmp_dir(const std::string& name) {
  const auto d = fs::path(ZT_BINARY_DIR) / ("lora_test_" + name);
  zt::ckpt::remove_tree(d.string());
  zt::ckpt::make_dirs(d.string());
  return d.string();
}

zt::models::GPT2 tiny_gpt2(uint64_t seed = 3) {
  auto c = zt::models::named_gpt2("gpt2-tiny");
  c.n_embd = 32;
  c.n_head = 4;
  c.vocab_size = 64;
  c.n_positions = 32;
  torch::manual_seed(seed);
  return zt::models::GPT2(c);
}

zt::models::LlamaForCausalLM tiny_llama(uint64_t seed = 3) {
  auto c = zt::models::named_llama("llama-tiny");
  c.hidden_size = 32;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.vocab_size = 64;
  c.max_position_embeddings = 32;
  torch::manual_seed(seed);
  return zt::models::LlamaForCausalLM(c);
}

LoraOptions opts(std::vector<std::string> targets, int64_t r = 4, double alpha = 8) {
  LoraOptions o;
  o.r = r;
  o.alpha = alpha;
  o.target_modules = std::move(targets);
  return o;
}

// Non-zero B (and fresh A), so the adapter changes the output.
void randomize(const zt::lora::LoraModel& lm, uint64_t seed = 17) {
  torch::NoGradGuard ng;
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& a : lm.adapters) {
    a.adapter->lora_A.copy_(at::randn(a.adapter->lora_A.sizes(), g) * 0.3);
    a.adapter->lora_B.copy_(at::randn(a.adapter->lora_B.sizes(), g) * 0.3);
  }
}

torch::Tensor ids(int64_t vocab, uint64_t seed = 5) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(0, vocab, {2, 12}, g);
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::vector<std::string> paths(const std::vector<zt::lora::LoraSite>& s) {
  std::vector<std::string> out;
  for (const auto& x : s) out.push_back(x.path);
  return out;
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const zt::ConfigError& e) {
    return e.what();
  } catch (const zt::CheckpointError& e) {
    return std::string("CheckpointError: ") + e.what();
  }
  return "";
}

}  // namespace

TEST(LoraOptions, ScalingIsAlphaOverROrOverSqrtR) {
  auto o = opts({"c_attn"}, 16, 32);
  EXPECT_DOUBLE_EQ(o.scaling(), 2.0);
  o.use_rslora = true;
  EXPECT_DOUBLE_EQ(o.scaling(), 8.0);
}

TEST(LoraOptions, BadValuesNameTheField) {
  auto o = opts({"c_attn"});
  o.r = 0;
  EXPECT_NE(error_of([&] { o.validate(); }).find("r = 0"), std::string::npos);
  o = opts({"c_attn"});
  o.dropout = 1.0;
  EXPECT_NE(error_of([&] { o.validate(); }).find("dropout"), std::string::npos);
  o = opts({});
  EXPECT_NE(error_of([&] { o.validate(); }).find("no target modules"), std::string::npos);
  o = opts({"c_attn"});
  o.target_regex = ".*";
  EXPECT_NE(error_of([&] { o.validate(); }).find("not both"), std::string::npos);
  o = opts({});
  o.target_regex = "(";
  EXPECT_NE(error_of([&] { o.validate(); }).find("not a valid regex"), std::string::npos);
}

TEST(LoraTargets, NamesMatchAsPeftSuffixes) {
  auto m = tiny_gpt2();
  const auto space = zt::lora::lora_space(*m);
  ASSERT_EQ(space.sites.size(), 8u);  // 2 blocks x (c_attn, attn.c_proj, c_fc, mlp.c_proj)
  EXPECT_EQ(space.sites[0].hf_path, "transformer.h.0.attn.c_attn");
  // "c_proj" is both projections; "attn.c_proj" only the attention one; a full path one layer.
  EXPECT_EQ(paths(zt::lora::select_targets(space.sites, opts({"c_proj"}))),
            (std::vector<std::string>{"h.0.attn.c_proj", "h.0.mlp.c_proj", "h.1.attn.c_proj", "h.1.mlp.c_proj"}));
  EXPECT_EQ(paths(zt::lora::select_targets(space.sites, opts({"attn.c_proj", "c_attn"}))),
            (std::vector<std::string>{"h.0.attn.c_attn", "h.0.attn.c_proj", "h.1.attn.c_attn", "h.1.attn.c_proj"}));
  EXPECT_EQ(paths(zt::lora::select_targets(space.sites, opts({"transformer.h.1.mlp.c_fc"}))),
            (std::vector<std::string>{"h.1.mlp.c_fc"}));
  // "proj" is not a whole path component of "c_proj": nothing matches.
  const auto e = error_of([&] { zt::lora::select_targets(space.sites, opts({"c_attn", "proj"})); });
  EXPECT_NE(e.find("'proj' matches no adaptable linear layer"), std::string::npos) << e;
  EXPECT_NE(e.find("c_attn, c_fc, c_proj"), std::string::npos) << e;  // the available names
}

TEST(LoraTargets, RegexMustMatchTheWholePath) {
  auto m = tiny_llama();
  const auto space = zt::lora::lora_space(*m);
  ASSERT_EQ(space.sites.size(), 14u);  // 2 layers x 7; lm_head is not a site
  LoraOptions o = opts({});
  o.target_regex = R"(model\.layers\.\d+\.self_attn\.(q|v)_proj)";
  EXPECT_EQ(paths(zt::lora::select_targets(space.sites, o)),
            (std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                      "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}));
  o.target_regex = "q_proj";  // a search would find it; peft's fullmatch does not
  const auto e = error_of([&] { zt::lora::select_targets(space.sites, o); });
  EXPECT_NE(e.find("matches no adaptable linear layer"), std::string::npos) << e;
  EXPECT_NE(e.find("down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"), std::string::npos) << e;
  const auto e2 = error_of([&] { zt::lora::select_targets(space.sites, opts({"lm_head"})); });
  EXPECT_NE(e2.find("'lm_head' matches no adaptable linear layer"), std::string::npos) << e2;
}

TEST(LoraAdapter, PeftInitAndTheAdaptedModelStartsAtTheBase) {
  auto m = tiny_llama();
  m->eval();
  const auto x = ids(64);
  const auto before = m->forward(x).detach().clone();
  auto space = zt::lora::lora_space(*m);
  const auto lm = zt::lora::apply_lora(*m, space.sites, opts({"q_proj", "down_proj"}));
  ASSERT_EQ(lm.adapters.size(), 4u);
  for (const auto& a : lm.adapters) {
    const auto& A = a.adapter->lora_A;
    const double bound = 1.0 / std::sqrt(static_cast<double>(A.size(1)));  // kaiming_uniform(a=sqrt(5))
    EXPECT_LE(A.abs().max().item<double>(), bound);
    EXPECT_GT(A.abs().max().item<double>(), 0.5 * bound);
    EXPECT_EQ(a.adapter->lora_B.abs().max().item<double>(), 0.0);
    EXPECT_EQ(A.size(0), 4);
  }
  // down_proj: A (r, intermediate), B (hidden, r).
  EXPECT_EQ(lm.adapters[1].site.path, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(lm.adapters[1].adapter->lora_A.sizes(), c10::IntArrayRef({4, 48}));
  EXPECT_EQ(lm.adapters[1].adapter->lora_B.sizes(), c10::IntArrayRef({32, 4}));
  EXPECT_EQ(lm.trainable_params(), 2 * (4 * 32 + 32 * 4) + 2 * (4 * 48 + 32 * 4));
  EXPECT_TRUE(torch::equal(m->forward(x), before));  // B = 0: exactly the base
}

// The draft's defect: a replaced submodule the model's forward never called. Here the
// adapted forward must equal the model with W + scaling * B A, and differ from the base.
TEST(LoraAdapter, ModelForwardUsesTheAdapterAndEqualsTheMergedWeights) {
  for (bool rslora : {false, true}) {
    auto m = tiny_gpt2();
    m->eval();
    const auto x = ids(64);
    const auto base = m->forward(x).detach().clone();
    auto o = opts({"c_attn", "c_fc", "c_proj"}, 4, 6);
    o.use_rslora = rslora;
    auto lm = zt::lora::apply_lora(*m, zt::lora::lora_space(*m).sites, o);
    randomize(lm);
    const auto adapted = m->forward(x).detach().clone();
    EXPECT_GT(max_diff(adapted, base), 1e-2) << "the adapter is not on the forward path";
    zt::lora::merge_lora(lm);
    EXPECT_TRUE(lm.adapters.empty());
    for (const auto& kv : m->named_parameters()) EXPECT_EQ(kv.key().find("lora"), std::string::npos) << kv.key();
    // fp32: the two orders of the same sums differ by rounding, ~1e-7 relative.
    EXPECT_LE(max_diff(m->forward(x), adapted), 1e-5) << "rslora " << rslora;
  }
  auto m = tiny_llama();
  m->eval();
  const auto x = ids(64);
  auto lm = zt::lora::apply_lora(*m, zt::lora::lora_space(*m).sites,
                                 opts({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  randomize(lm);
  const auto adapted = m->forward(x).detach().clone();
  zt::lora::merge_lora(lm);
  EXPECT_LE(max_diff(m->forward(x), adapted), 1e-5);
}

TEST(LoraAdapter, OnlyTheAdaptersTrain) {
  auto m = tiny_llama();
  auto lm = zt::lora::apply_lora(*m, zt::lora::lora_space(*m).sites, opts({"v_proj", "up_proj"}));
  int64_t trainable = 0;
  for (const auto& kv : m->named_parameters()) {
    const bool lora = kv.key().find(".lora.lora_") != std::string::npos;
    EXPECT_EQ(kv.value().requires_grad(), lora) << kv.key();
    if (kv.value().requires_grad()) trainable += kv.value().numel();
  }
  EXPECT_EQ(trainable, lm.trainable_params());
  EXPECT_EQ(trainable, 2 * (4 * 32 + 16 * 4) + 2 * (4 * 32 + 48 * 4));  // v_proj out = 2 kv heads x 8
  const auto x = ids(64);
  m->loss(x, ids(64, 6)).backward();
  for (const auto& kv : m->named_parameters()) {
    if (!kv.value().requires_grad()) EXPECT_FALSE(kv.value().grad().defined()) << kv.key();
  }
  for (const auto& a : lm.adapters) {
    ASSERT_TRUE(a.adapter->lora_B.grad().defined());
    EXPECT_GT(a.adapter->lora_B.grad().abs().max().item<double>(), 0.0);  // B = 0 gives A no gradient yet
  }
}

TEST(LoraAdapter, DropoutActsInTrainModeOnly) {
  auto m = tiny_gpt2();
  auto o = opts({"c_attn"});
  o.dropout = 0.5;
  auto lm = zt::lora::apply_lora(*m, zt::lora::lora_space(*m).sites, o);
  randomize(lm);
  const auto x = ids(64);
  m->train();
  torch::manual_seed(1);
  const auto a = m->forward(x).detach().clone();
  const auto b = m->forward(x).detach().clone();
  EXPECT_GT(max_diff(a, b), 1e-4);
  m->eval();
  EXPECT_TRUE(torch::equal(m->forward(x), m->forward(x)));
}

TEST(LoraAdapter, ApplyTwiceAndPlaceholdersAreErrors) {
  auto m = tiny_gpt2();
  auto space = zt::lora::lora_space(*m);
  zt::lora::apply_lora(*m, space.sites, opts({"c_attn"}));
  EXPECT_NE(error_of([&] { zt::lora::apply_lora(*m, space.sites, opts({"c_attn"})); }).find("already carries"),
            std::string::npos);
  auto c = m->config();
  c.deferred_init = true;
  zt::models::GPT2 d(c);
  const auto e = error_of([&] { zt::lora::apply_lora(*d, zt::lora::lora_space(*d).sites, opts({"c_fc"})); });
  EXPECT_NE(e.find("deferred_init (placeholder weights)"), std::string::npos) << e;
}

TEST(PeftFormat, SaveWritesPeftNamesAndLoadRestoresTheModel) {
  const auto dir = tmp_dir("roundtrip");
  auto m = tiny_gpt2();
  m->eval();
  auto space = zt::lora::lora_space(*m);
  auto o = opts({"c_attn", "mlp.c_proj"}, 2, 5);
  o.use_rslora = true;
  o.dropout = 0.05;
  auto lm = zt::lora::apply_lora(*m, space.sites, o);
  randomize(lm);
  const auto x = ids(64);
  const auto want = m->forward(x).detach().clone();
  zt::lora::save_peft_adapter(dir, lm, space, "gpt2-test");

  const auto file = zt::io::load_safetensors(dir + "/adapter_model.safetensors");
  std::vector<std::string> keys;
  for (const auto& kv : file) keys.push_back(kv.first);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight",
                      "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight",
                      "base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight",
                      "base_model.model.transformer.h.0.mlp.c_proj.lora_B.weight",
                      "base_model.model.transformer.h.1.attn.c_attn.lora_A.weight",
                      "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight",
                      "base_model.model.transformer.h.1.mlp.c_proj.lora_A.weight",
                      "base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight",
                  }));
  EXPECT_EQ(file.at("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight").sizes(),
            c10::IntArrayRef({96, 2}));  // (out = 3C, r)
  const auto j = nlohmann::json::parse(std::ifstream(dir + "/adapter_config.json"));
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 2);
  EXPECT_EQ(j["lora_alpha"], 5);
  EXPECT_TRUE(j["lora_alpha"].is_number_integer());
  EXPECT_DOUBLE_EQ(j["lora_dropout"].get<double>(), 0.05);
  EXPECT_EQ(j["use_rslora"], true);
  EXPECT_EQ(j["fan_in_fan_out"], true);  // GPT-2's Conv1D
  EXPECT_EQ(j["target_modules"], nlohmann::json({"c_attn", "mlp.c_proj"}));
  EXPECT_EQ(j["base_model_name_or_path"], "gpt2-test");

  // A fresh base with another seed's adapters: loading the adapter restores the output.
  auto m2 = tiny_gpt2();
  m2->eval();
  auto space2 = zt::lora::lora_space(*m2);
  const auto lm2 = zt::lora::load_peft_adapter(*m2, space2, dir);
  EXPECT_EQ(lm2.adapters.size(), 4u);
  EXPECT_DOUBLE_EQ(lm2.options.scaling(), 5.0 / std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(lm2.options.dropout, 0.05);
  EXPECT_TRUE(torch::equal(m2->forward(x), want));
}

TEST(PeftFormat, ConfigsAndFilesThatDoNotFitAreErrors) {
  const auto dir = tmp_dir("errors");
  auto m = tiny_llama();
  auto space = zt::lora::lora_space(*m);
  auto lm = zt::lora::apply_lora(*m, space.sites, opts({"q_proj"}));
  zt::lora::save_peft_adapter(dir, lm, space, "x");
  auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    auto j = nlohmann::json::parse(std::ifstream(dir + "/adapter_config.json"));
    f(j);
    std::ofstream(dir + "/edited.json") << j.dump();
    return error_of([&] { zt::lora::read_peft_config(dir + "/edited.json", space); });
  };
  EXPECT_NE(edit([](auto& j) { j["use_dora"] = true; }).find("use_dora = true is not supported"), std::string::npos);
  EXPECT_NE(edit([](auto& j) { j["bias"] = "all"; }).find("bias = \"all\""), std::string::npos);
  EXPECT_NE(edit([](auto& j) { j["rank_pattern"] = {{"q_proj", 8}}; }).find("rank_pattern"), std::string::npos);
  EXPECT_NE(edit([](auto& j) { j["fan_in_fan_out"] = true; }).find("does not fit a llama model"), std::string::npos);
  EXPECT_NE(edit([](auto& j) { j["peft_type"] = "IA3"; }).find("only LORA"), std::string::npos);
  EXPECT_NE(edit([](auto& j) { j.erase("target_modules"); }).find("target_modules is missing"), std::string::npos);
  EXPECT_EQ(edit([](auto& j) { j["peft_version"] = "9.9"; }), "");  // informational keys are fine

  // The file's tensors must be exactly the adapted layers'.
  auto other = tiny_llama();
  auto other_space = zt::lora::lora_space(*other);
  auto other_lm = zt::lora::apply_lora(*other, other_space.sites, opts({"q_proj", "v_proj"}));
  const auto e = error_of([&] { zt::lora::load_peft_weights(other_lm, dir); });
  EXPECT_NE(e.find("has no tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight'"),
            std::string::npos)
      << e;
  auto k = tiny_llama();
  auto k_space = zt::lora::lora_space(*k);
  auto k_lm = zt::lora::apply_lora(*k, k_space.sites, opts({"model.layers.0.self_attn.q_proj"}));
  const auto e2 = error_of([&] { zt::lora::load_peft_weights(k_lm, dir); });
  EXPECT_NE(e2.find("layers.1.self_attn.q_proj.lora_A.weight', which belongs to no adapted layer"), std::string::npos)
      << e2;
  auto r8 = tiny_llama();
  auto r8_space = zt::lora::lora_space(*r8);
  auto r8_lm = zt::lora::apply_lora(*r8, r8_space.sites, opts({"q_proj"}, 8));
  EXPECT_NE(error_of([&] { zt::lora::load_peft_weights(r8_lm, dir); }).find("another r"), std::string::npos);
}

// peft's logits on the committed fixtures: zerotrain loads the HF base and peft's adapter.
// fp32; the bases alone match transformers to ~1e-6 (test_llama), the adapters add a few
// small matmuls: 1e-5 absolute on logits of magnitude ~5.
class PeftEquivalence : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftEquivalence, LogitsMatchPeft) {
  const std::string name = GetParam();
  const auto adapter = (kFixtures / "lora" / name).string();
  const auto io = zt::io::load_safetensors(adapter + "/io.safetensors");
  const auto& x = io.at("input_ids");
  torch::Tensor base_logits, logits, merged;
  if (name == "gpt2") {
    auto m = zt::models::load_hf_gpt2_pretrained((kFixtures / "lora" / "gpt2_base").string());
    m->eval();
    base_logits = m->forward(x).detach().clone();
    auto lm = zt::lora::load_peft_adapter(*m, zt::lora::lora_space(*m), adapter);
    EXPECT_EQ(lm.adapters.size(), 8u);
    logits = m->forward(x).detach().clone();
    zt::lora::merge_lora(lm);
    merged = m->forward(x).detach().clone();
  } else {
    auto m = zt::models::load_hf_llama_pretrained((kFixtures / "llama" / "llama").string());
    m->eval();
    base_logits = m->forward(x).detach().clone();
    auto lm = zt::lora::load_peft_adapter(*m, zt::lora::lora_space(*m), adapter);
    EXPECT_EQ(lm.adapters.size(), name == "llama" ? 14u : 2u);
    logits = m->forward(x).detach().clone();
    zt::lora::merge_lora(lm);
    merged = m->forward(x).detach().clone();
  }
  EXPECT_LE(max_diff(base_logits, io.at("base_logits")), 1e-5) << name << ": the base already differs";
  EXPECT_GT(max_diff(io.at("logits"), io.at("base_logits")), 1e-1) << name << ": the adapter must matter";
  EXPECT_LE(max_diff(logits, io.at("logits")), 1e-5) << name;
  EXPECT_LE(max_diff(merged, io.at("logits")), 1e-5) << name << " merged";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PeftEquivalence, ::testing::Values("llama", "llama_rslora", "gpt2"));

TEST(LoraSpec, ParsesTheCommandLineSpec) {
  const auto o = zt::lora::parse_lora_spec("r=16,alpha=32,dropout=0.05,targets=q_proj|v_proj,rslora");
  EXPECT_EQ(o.r, 16);
  EXPECT_DOUBLE_EQ(o.alpha, 32);
  EXPECT_DOUBLE_EQ(o.dropout, 0.05);
  EXPECT_TRUE(o.use_rslora);
  EXPECT_EQ(o.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_DOUBLE_EQ(o.scaling(), 8.0);
  const auto d = zt::lora::parse_lora_spec("r=4,targets=c_attn");
  EXPECT_DOUBLE_EQ(d.alpha, 4.0);  // alpha defaults to r: scaling 1
  EXPECT_FALSE(d.use_rslora);
  const auto re = zt::lora::parse_lora_spec(R"(r=2,regex=.*\.(q_proj|v_proj),x)");
  EXPECT_EQ(re.target_regex, R"(.*\.(q_proj|v_proj),x)");  // the rest of the spec
  EXPECT_TRUE(re.target_modules.empty());
  EXPECT_EQ(zt::lora::parse_lora_spec(zt::lora::lora_spec_string(o)).target_modules, o.target_modules);
}

TEST(LoraSpec, BadSpecsNameTheItem) {
  EXPECT_NE(error_of([] { zt::lora::parse_lora_spec("r=16,alpah=3,targets=q_proj"); }).find("unknown key 'alpah'"),
            std::string::npos);
  EXPECT_NE(error_of([] { zt::lora::parse_lora_spec("r=1.5,targets=q_proj"); }).find("positive integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { zt::lora::parse_lora_spec("r=8,dropout=x,targets=q"); }).find("dropout=x is not a number"),
            std::string::npos);
  EXPECT_NE(error_of([] { zt::lora::parse_lora_spec("r=8"); }).find("no target modules"), std::string::npos);
  EXPECT_NE(error_of([] { zt::lora::parse_lora_spec("r=8,targets=q||v"); }).find("empty name"), std::string::npos);
  EXPECT_NE(error_of([] { zt::lora::parse_lora_spec("r=8,targets=q,fast"); }).find("'fast' is not KEY=VALUE"),
            std::string::npos);
}

}  // namespace zt_test_lora
