// Hugging Face weights read straight into the tensor-parallel models ([HF TP Load] in
// models/hf_tp.h), on real ranks (CPU, MPI, fp32; tp = the world: 1, 2 and 4 ranks).
//
// Rank 0 writes a tiny HF checkpoint (save_hf_gpt2 / save_hf_llama: GPT-2's Conv1D (in, out)
// weights and fused c_attn, Llama's q/k/v by heads with grouped-query attention, a
// vocabulary that divides by neither 2 nor 4, tied and untied heads, a bf16 file and a
// sharded one); every rank then loads the unsplit model from the files (load_hf_gpt2 /
// load_hf_llama) and the tp model's slices (load_hf_gpt2_tp / load_hf_llama_tp). Compared:
//   * every slice equals tp::cut of the unsplit model's parameter, bitwise (the layout)
//   * the tp model's logits (gathered over the vocabulary) equal the unsplit model's within
//     1e-5 (summation order only: partial GEMMs summed by the all-reduce)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "models/gpt2.h"
#include "models/gpt2_tp.h"
#include "models/hf_gpt2.h"
#include "models/hf_llama.h"
#include "models/hf_tp.h"
#include "models/llama.h"
#include "models/llama_tp.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace test_hf_tp {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kHfTpSeed = 5, kHfTpVocab = 250, kHfTpSeq = 12;
constexpr double kHfTpLogitTol = 1e-5;

struct HfTpCase {
  const char* name;
  bool llama;
  bool tied;               // Llama: tie_word_embeddings (GPT-2 always ties)
  bool qkv_bias;           // Llama: Qwen2's q/k/v biases (random values below)
  at::ScalarType dtype;    // stored dtype
  int64_t max_shard_bytes; // Llama: shards + index when small
};

const HfTpCase kHfTpCases[] = {
    {"gpt2", false, true, false, at::kFloat, 0},
    {"gpt2_bf16", false, true, false, at::kBFloat16, 0},
    {"llama_gqa_untied", true, false, false, at::kFloat, 0},
    {"llama_gqa_untied_sharded", true, false, false, at::kFloat, 40'000},
    {"llama_gqa_tied_qkv_bias", true, true, true, at::kFloat, 0},
    {"llama_gqa_tied_bf16", true, true, false, at::kBFloat16, 0},
};

GPT2Config hftp_gpt2_config() {
  auto c = named_gpt2("gpt2-tiny");  // 2 layers, 4 heads, C 128
  c.n_positions = 32;
  c.vocab_size = kHfTpVocab;
  return c;
}

// 8 query heads over 4 kv heads: grouped-query attention at tp 1, 2 and 4 (2 groups a rank at tp 2).
LlamaConfig hftp_llama_config(const HfTpCase& c) {
  auto m = named_llama("llama-tiny");
  m.max_position_embeddings = 32;
  m.vocab_size = kHfTpVocab;
  m.hidden_size = 64;
  m.num_attention_heads = 8;
  m.num_key_value_heads = 4;
  m.head_dim = 8;
  m.intermediate_size = 96;
  m.tie_word_embeddings = c.tied;
  m.qkv_bias = c.qkv_bias;
  if (c.qkv_bias) m.architecture = "Qwen2ForCausalLM";
  m.layer_sliding.assign(static_cast<size_t>(m.num_hidden_layers), false);
  return m;
}

// Random values everywhere (LayerNorm / RMSNorm weights and biases too), so a slice in the
// wrong place changes the logits.
void hftp_randomize(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.normal_(0.0, 0.1).add_(p.dim() == 1 ? 1.0 : 0.0);
}


void hftp_expect_cut_equal(const std::map<std::string, torch::Tensor>& full, torch::nn::Module& tp_model,
                           const std::function<tp::SplitSpec(const std::string&)>& spec, int rank, int size) {
  for (const auto& kv : tp_model.named_parameters()) {
    const auto want = tp::cut(full.at(kv.key()), spec(kv.key()), rank, size);
    EXPECT_TRUE(torch::equal(kv.value().detach(), want)) << kv.key() << " at tp rank " << rank;
  }
}

class HfTensorParallel : public ::testing::TestWithParam<HfTpCase> {};

TEST_P(HfTensorParallel, SlicesAndLogitsEqualTheUnsplitModel) {
  const auto& c = GetParam();
  auto world = comm::world_group();
  const int rank = world->rank(), size = world->size();
  test_support::SharedTempDir tmp(world, std::string("hf_tp_") + c.name);
  const fs::path dir = tmp.path;
  torch::manual_seed(kHfTpSeed);
  const auto idx = torch::randint(kHfTpVocab, {2, kHfTpSeq}, torch::kLong);
  if (c.llama) {
    const auto mc = hftp_llama_config(c);
    if (rank == 0) {
      LlamaForCausalLM src(mc);
      hftp_randomize(*src);
      save_hf_llama(*src, dir.string(), c.dtype, c.max_shard_bytes > 0 ? c.max_shard_bytes : kHfMaxShardBytes);
    }
    world->barrier();
    if (c.max_shard_bytes > 0) ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
    auto ref = load_hf_llama_pretrained(dir.string());
    HfCheckpointReader ckpt(dir.string());
    LlamaTP m(llama_config_from_hf_json(dir.string()), world);
    load_hf_llama_tp(*m, ckpt);
    std::map<std::string, torch::Tensor> full;
    for (const auto& kv : ref->named_parameters()) full[kv.key()] = kv.value().detach();
    hftp_expect_cut_equal(full, *m, [&](const std::string& n) { return m->split_spec(n); }, rank, size);
    torch::NoGradGuard no_grad;
    const auto want = ref->forward(idx), got = m->forward(idx);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double diff = (got - want).abs().max().item<double>();
    EXPECT_LE(diff, kHfTpLogitTol);
    if (rank == 0) std::printf("[hf tp] %s tp %d: logits max |diff| %.2e\n", c.name, size, diff);
  } else {
    if (rank == 0) {
      GPT2 src(hftp_gpt2_config());
      hftp_randomize(*src);
      save_hf_gpt2(*src, dir.string(), c.dtype);
    }
    world->barrier();
    auto ref = load_hf_gpt2_pretrained(dir.string());
    HfCheckpointReader ckpt(dir.string());
    GPT2TP m(gpt2_config_from_hf_json(dir.string() + "/config.json"), world);
    load_hf_gpt2_tp(*m, ckpt);
    hftp_expect_cut_equal(gpt2_full_state(*ref), *m, [&](const std::string& n) { return m->split_spec(n); }, rank,
                          size);
    torch::NoGradGuard no_grad;
    ref->eval();
    m->eval();
    const auto want = ref->forward(idx), got = m->forward(idx);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double diff = (got - want).abs().max().item<double>();
    EXPECT_LE(diff, kHfTpLogitTol);
    if (rank == 0) std::printf("[hf tp] %s tp %d: logits max |diff| %.2e\n", c.name, size, diff);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, HfTensorParallel, ::testing::ValuesIn(kHfTpCases),
                         [](const ::testing::TestParamInfo<HfTpCase>& i) { return std::string(i.param.name); });

// A checkpoint of another shape is a ConfigError naming the tensor, before any slice is read.
TEST(HfTensorParallelErrors, AnotherShapeIsAConfigErrorNamingTheTensor) {
  auto world = comm::world_group();
  test_support::SharedTempDir tmp(world, "hf_tp_errors");
  const fs::path dir = tmp.path;
  if (world->rank() == 0) {
    GPT2 src(hftp_gpt2_config());
    save_hf_gpt2(*src, dir.string());
  }
  world->barrier();
  HfCheckpointReader ckpt(dir.string());
  auto fewer = hftp_gpt2_config();
  fewer.n_layer = 1;  // the checkpoint has h.1.*
  GPT2TP one_layer(fewer, world);
  try {
    load_hf_gpt2_tp(*one_layer, ckpt);
    ADD_FAILURE() << "no error for a 2-layer checkpoint in a 1-layer model";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.1."), std::string::npos) << e.what();
  }
  auto wider = hftp_gpt2_config();
  wider.vocab_size = kHfTpVocab + 1;
  GPT2TP more_vocab(wider, world);
  try {
    load_hf_gpt2_tp(*more_vocab, ckpt);
    ADD_FAILURE() << "no error for another vocabulary";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.wte.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has shape [250, 128] but the model expects [251, 128]"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace test_hf_tp
}  // namespace zt::models
