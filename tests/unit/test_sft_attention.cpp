// Per-example attention for packed SFT windows ([SFT Attention] in models/llama.h): with
// position ids that restart per example, an example packed after another gives the logits
// it gives alone from position 0; without them (plain causal) it does not. The position ids
// come from the example starts of the .mask shards ([SFT Mask]) through ShardDataset and
// the Loader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ckpt/fs.h"
#include "data/sft.h"
#include "data/shards.h"
#include "models/llama.h"
#include "support/run_shell.h"
#include "zerotrain/data/loader.h"
#include "zerotrain/data/sampler.h"
#include "zerotrain/error.h"

namespace zt_test_sft_attention {

namespace fs = std::filesystem;
using namespace zt::data;

namespace {

zt::models::LlamaForCausalLM tiny_llama(int64_t sliding_window) {
  torch::manual_seed(11);
  auto cfg = zt::models::named_llama("llama-tiny");  // 4 heads, 2 kv heads (GQA)
  cfg.vocab_size = 64, cfg.max_position_embeddings = 64;
  if (sliding_window > 0) {
    cfg.sliding_window = sliding_window;
    cfg.layer_sliding = {true, false};
  }
  return zt::models::LlamaForCausalLM(cfg);
}

torch::Tensor ids(std::initializer_list<int64_t> v) { return torch::tensor(std::vector<int64_t>(v), torch::kLong); }

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

class SftAttentionData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zt_sft_attn_" + std::to_string(::getpid()));
    zt::ckpt::remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { zt::ckpt::remove_tree(dir_); }
  fs::path dir_;
};

}  // namespace

// A window of two examples (7 then 9 tokens); a batch whose second row packs them the other
// way round. With pos, each example's logits equal its logits alone within 1e-5 (fp32; the
// softmax sums run over other lengths); without pos the second example attends to the
// first and its logits move by far more. Full causal layers and a sliding-window layer.
TEST(SftAttention, PackedExampleGivesItsLogitsAlone) {
  const auto a = ids({5, 9, 13, 2, 33, 41, 1}), b = ids({7, 7, 20, 50, 3, 18, 60, 22, 1});
  const auto pos_a = torch::arange(7, torch::kLong), pos_b = torch::arange(9, torch::kLong);
  const auto x = torch::stack({torch::cat({a, b}), torch::cat({b, a})});              // (2, 16)
  const auto pos = torch::stack({torch::cat({pos_a, pos_b}), torch::cat({pos_b, pos_a})});  // (2, 16)
  for (int64_t window : {0, 4}) {
    SCOPED_TRACE("sliding_window " + std::to_string(window));
    auto m = tiny_llama(window);
    torch::NoGradGuard ng;
    const auto alone_a = m->forward(a.unsqueeze(0))[0], alone_b = m->forward(b.unsqueeze(0))[0];  // (T, V)
    const auto packed = m->forward(x, pos);                                                     // (2, 16, V)
    EXPECT_LE(max_diff(packed[0].narrow(0, 0, 7), alone_a), 1e-5);
    EXPECT_LE(max_diff(packed[0].narrow(0, 7, 9), alone_b), 1e-5);
    EXPECT_LE(max_diff(packed[1].narrow(0, 0, 9), alone_b), 1e-5);
    EXPECT_LE(max_diff(packed[1].narrow(0, 9, 7), alone_a), 1e-5);
    // Off: plain causal over the window. The first example is unchanged, the second differs.
    const auto plain = m->forward(x);
    EXPECT_LE(max_diff(plain[0].narrow(0, 0, 7), alone_a), 1e-5);
    EXPECT_GT(max_diff(plain[0].narrow(0, 7, 9), alone_b), 1e-3);
    EXPECT_GT(max_diff(plain[1].narrow(0, 9, 7), alone_a), 1e-3);
    // The loss takes pos too: the mean cross entropy of the packed row equals the
    // token-weighted mean of the two examples' losses alone.
    auto targets = [](const torch::Tensor& t) { return torch::cat({t.narrow(0, 1, t.size(0) - 1), ids({-100})}); };
    const auto y = torch::cat({targets(a), targets(b)}).unsqueeze(0);
    const double packed_loss = m->loss(x.narrow(0, 0, 1), y, pos.narrow(0, 0, 1)).item<double>();
    const double la = m->loss(a.unsqueeze(0), targets(a).unsqueeze(0)).item<double>();
    const double lb = m->loss(b.unsqueeze(0), targets(b).unsqueeze(0)).item<double>();
    EXPECT_NEAR(packed_loss, (6 * la + 8 * lb) / 14, 1e-5);
  }
}

// Gradients flow through the masked path, and activation checkpointing recomputes it.
TEST(SftAttention, BackwardWithCheckpointingMatches) {
  auto m = tiny_llama(0);
  const auto x = torch::randint(1, 64, {2, 12}, torch::kLong);
  const auto y = torch::randint(1, 64, {2, 12}, torch::kLong);
  const auto pos = torch::stack({torch::cat({torch::arange(5), torch::arange(7)}), torch::arange(12)});
  auto grads = [&](bool ckpt) {
    m->set_activation_checkpointing(ckpt);
    m->zero_grad();
    m->loss(x, y, pos).backward();
    std::vector<torch::Tensor> g;
    for (const auto& p : m->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto plain = grads(false), ckpt = grads(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::allclose(plain[i], ckpt[i], 1e-5, 1e-6)) << i;
}

// ShardDataset's positions: 0 on each example's first token and on the window's first
// token, +1 otherwise; the Loader stacks them. Shards without example starts are refused.
TEST_F(SftAttentionData, DatasetPositionsRestartAtExampleStarts) {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
  append_sft_example({5, 6, 7}, {8, 9}, 1, tokens, mask);           // tokens 0-5
  append_sft_example({10, 11, 12, 13}, {14, 15, 16}, 1, tokens, mask);  // 6-13
  append_sft_example({17, 18, 19, 20, 21}, {22, 23}, 1, tokens, mask);  // 14-21
  const std::string path = (dir_ / "d_train_000000.bin").string();
  write_shard(path, tokens, 2, 64);
  write_shard(mask_path(path), std::vector<uint32_t>(mask.begin(), mask.end()), 2, kSftMaskValues);
  auto ds = std::make_shared<ShardDataset>(std::vector<std::string>{path}, 7, 64);
  EXPECT_TRUE(ds->has_example_starts());
  EXPECT_FALSE(ds->get(0).pos.defined());  // off by default
  ds->set_example_positions(true);
  // Windows of 7: tokens 0-6, 7-13, 14-20.
  EXPECT_TRUE(torch::equal(ds->get(0).pos, ids({0, 1, 2, 3, 4, 5, 0})));
  EXPECT_TRUE(torch::equal(ds->get(1).pos, ids({0, 1, 2, 3, 4, 5, 6})));  // starts mid-example
  EXPECT_TRUE(torch::equal(ds->get(2).pos, ids({0, 1, 2, 3, 4, 5, 6})));
  Loader loader(ds, DistributedSampler(ds->size(), /*rank=*/0, /*world=*/1, /*shuffle=*/false), 3);
  const Batch batch = loader.next_batch();
  ASSERT_TRUE(batch.pos.defined());
  EXPECT_TRUE(torch::equal(batch.pos, torch::stack({ds->get(0).pos, ds->get(1).pos, ds->get(2).pos})));

  // A mask of the older format (0 / 1, header[3] = 2) and no mask: errors naming the fix.
  write_shard(mask_path(path), std::vector<uint32_t>(tokens.size(), 1), 2, 2);
  ShardDataset old({path}, 7, 64);
  EXPECT_FALSE(old.has_example_starts());
  try {
    old.set_example_positions(true);
    ADD_FAILURE() << "no error";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("without example starts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenize the data again with zerotrain tokenize --sft"), std::string::npos);
  }
  fs::remove(mask_path(path));
  ShardDataset none({path}, 7, 64);
  try {
    none.set_example_positions(true);
    ADD_FAILURE() << "no error";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has no loss mask"), std::string::npos) << e.what();
  }
}

// train --sft-attention per-example on tokenize --sft shards (Llama) trains, at ZeRO-2 and
// ZeRO-3 (layers gathered by the engine) with validation on per-example windows too; GPT-2
// and shards without masks are errors naming the flag.
TEST_F(SftAttentionData, TrainPerExample) {
  const std::string fixture = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/bpe/";
  const std::string bin = std::string(ZT_BINARY_DIR) + "/zerotrain";
  {
    std::ofstream j(dir_ / "sft.jsonl");
    for (int k = 0; k < 40; ++k)
      j << nlohmann::json({{"prompt", "Q" + std::to_string(k) + ": " + std::to_string(k) + " + 1?"},
                           {"response", " " + std::to_string(k + 1)}})
               .dump()
        << "\n";
  }
  std::ofstream(dir_ / "plain.txt") << "Some plain text for pre-training shards, long enough for a window or two. "
                                       "More words follow here so that the shard holds several windows of tokens.";
  auto run = [](const std::string& cmd) { return zt::test_support::run_shell("OMP_NUM_THREADS=1 timeout -k 5 300 " + cmd); };
  const std::string sft = (dir_ / "sft").string(), plain = (dir_ / "plain").string();
  const auto t = run(bin + " tokenize --sft --tokenizer " + fixture + "tokenizer.json --out " + sft +
                     " --val-fraction 0.25 " + (dir_ / "sft.jsonl").string());
  ASSERT_EQ(t.code, 0) << t.output;
  const auto tp = run(bin + " tokenize --tokenizer " + fixture + "tokenizer.json --out " + plain + " " +
                      (dir_ / "plain.txt").string());
  ASSERT_EQ(tp.code, 0) << tp.output;
  for (int stage : {2, 3}) {
    std::ofstream(dir_ / ("config" + std::to_string(stage) + ".json"))
        << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}, "zero_optimization": {"stage": )"
        << stage << "}}";
  }
  auto train = [&](const std::string& model, const std::string& data, int stage = 2, const std::string& extra = "") {
    return run(bin + " train --device cpu --model " + model + " --vocab 3000 --seq 16 --steps 2 --config " +
               (dir_ / ("config" + std::to_string(stage) + ".json")).string() + " --sft-attention per-example --data '" +
               data + "' " + extra);
  };
  for (int stage : {2, 3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    const auto r = train("llama-tiny", sft + "/data_train_*.bin", stage, "--val-data '" + sft + "/data_val_*.bin'");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("--data: per-example attention"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--val-data: per-example attention"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Step 2/2, Loss: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("validation at step 2: loss "), std::string::npos) << r.output;
  }
  const auto g = train("gpt2-tiny", sft + "/data_train_*.bin");
  EXPECT_NE(g.code, 0);
  EXPECT_NE(g.output.find("--sft-attention per-example needs a Llama-family model"), std::string::npos) << g.output;
  const auto p = train("llama-tiny", plain + "/data_train_*.bin");
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.output.find("train: --sft-attention per-example: --data shard"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("has no loss mask"), std::string::npos) << p.output;
}

}  // namespace zt_test_sft_attention
