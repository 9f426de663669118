// The CLI end to end on CPU ranks, for the Llama family: a Hugging Face checkpoint (the
// committed transformers fixture) -> `zerotrain train --init-from` at ZeRO-3 on 2 ranks
// with activation checkpointing -> checkpoint -> `zerotrain convert` (sharded) -> the
// Hugging Face directory holds the same weights and gives transformers' logits. lr 0
// keeps the weights where they started, so the comparison is exact.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "ckpt/fs.h"
#include "models/hf_checkpoint.h"
#include "models/hf_llama.h"
#include "io/safetensors.h"

namespace zt_test_llama_cli {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(LlamaCli, InitFromTrainAtStage3ConvertBackToHuggingFace) {
  const std::string fixture = ZT_SOURCE_DIR "/tests/fixtures/llama/qwen2_bias";
  const std::string dir = ZT_BINARY_DIR "/llama_cli_test";
  zt::ckpt::remove_tree(dir);
  zt::ckpt::make_dirs(dir);
  std::ofstream(dir + "/ds.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})";
  const std::string zt = "timeout -k 5 300 " ZT_BINARY_DIR "/zerotrain ";
  const std::string train = "OMP_NUM_THREADS=1 " + zt + "launch -n 2 -- " ZT_BINARY_DIR "/zerotrain train --config " +
                            dir + "/ds.json --init-from " + fixture +
                            " --device cpu --steps 2 --seq 16 --checkpoint-activations --save " + dir + "/ckpt > " +
                            dir + "/train.log 2>&1";
  ASSERT_EQ(std::system(train.c_str()), 0) << read_all(dir + "/train.log");
  const std::string log = read_all(dir + "/train.log");
  EXPECT_NE(log.find("initializing from Hugging Face weights"), std::string::npos) << log;
  EXPECT_NE(log.find("Qwen2ForCausalLM"), std::string::npos) << log;
  EXPECT_NE(log.find("ZeRO stage 3"), std::string::npos) << log;

  // 50 KB shards: the ~100 KB model is written as several files and an index.
  const std::string convert =
      zt + "convert " + dir + "/ckpt " + dir + "/hf --max-shard-gb 0.00005 > " + dir + "/convert.log 2>&1";
  ASSERT_EQ(std::system(convert.c_str()), 0) << read_all(dir + "/convert.log");
  EXPECT_TRUE(zt::ckpt::path_exists(dir + "/hf/model.safetensors.index.json")) << read_all(dir + "/convert.log");

  const auto original = zt::models::load_hf_llama_pretrained(fixture);
  auto back = zt::models::load_hf_llama_pretrained(dir + "/hf");
  EXPECT_EQ(back->config().architecture, "Qwen2ForCausalLM");
  const auto a = original->named_parameters(), b = back->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& p : a) EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  auto io = zt::io::load_safetensors(fixture + "/io.safetensors");
  torch::NoGradGuard no_grad;
  EXPECT_LE((back->forward(io.at("input_ids")) - io.at("logits")).abs().max().item<double>(), 1e-4);
  zt::ckpt::remove_tree(dir);
}

}  // namespace zt_test_llama_cli
