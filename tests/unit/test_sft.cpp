// Supervised fine-tuning data ([SFT Packing] in data/sft.h, [SFT Mask] in data/shards.h):
// the mask covers exactly the response tokens and the EOS, ShardDataset turns prompt
// targets into -1, and the losses of GPT-2 (fused and unfused) and Llama are the mean
// cross entropy over the response targets only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "ckpt/fs.h"
#include "data/bpe_tokenizer.h"
#include "data/sft.h"
#include "data/shards.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "support/run_shell.h"
#include "zerotrain/error.h"

namespace zt_test_sft {

namespace fs = std::filesystem;
using namespace zt::data;

namespace {

// Three hand-made examples; eos 1. Positions: ex1 0-5, ex2 6-13, ex3 14-21 (prompt 14-18).
struct Packed {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
};
Packed three_examples() {
  Packed p;
  append_sft_example({5, 6, 7}, {8, 9}, 1, p.tokens, p.mask);
  append_sft_example({10, 11, 12, 13}, {14, 15, 16}, 1, p.tokens, p.mask);
  append_sft_example({17, 18, 19, 20, 21}, {22, 23}, 1, p.tokens, p.mask);
  return p;
}

// Writes tokens (and the mask unless `with_mask` is false) as DIR/NAME.bin / .mask.
std::string write(const fs::path& dir, const std::string& name, const Packed& p, bool with_mask) {
  const std::string path = (dir / (name + ".bin")).string();
  write_shard(path, p.tokens, 2, 64);
  if (with_mask) write_shard(mask_path(path), std::vector<uint32_t>(p.mask.begin(), p.mask.end()), 2, kSftMaskValues);
  return path;
}

class SftData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zt_sft_" + std::to_string(::getpid()));
    zt::ckpt::remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { zt::ckpt::remove_tree(dir_); }
  fs::path dir_;
};

}  // namespace

TEST(SftPacking, MaskCoversExactlyTheResponseAndEos) {
  const Packed p = three_examples();
  const std::vector<uint32_t> want_tokens = {5, 6, 7, 8, 9, 1, 10, 11, 12, 13, 14, 15, 16, 1, 17, 18, 19, 20, 21, 22, 23, 1};
  // Bit 0: a target (response and EOS); bit 1 (value 2): the first token of an example.
  const std::vector<uint8_t> want_mask = {2, 0, 0, 1, 1, 1, 2, 0, 0, 0, 1, 1, 1, 1, 2, 0, 0, 0, 0, 1, 1, 1};
  EXPECT_EQ(p.tokens, want_tokens);
  EXPECT_EQ(p.mask, want_mask);
  // An empty prompt trains on everything; an empty response on the EOS only.
  Packed q;
  append_sft_example({}, {3}, 2, q.tokens, q.mask);
  append_sft_example({4}, {}, 2, q.tokens, q.mask);
  EXPECT_EQ(q.tokens, (std::vector<uint32_t>{3, 2, 4, 2}));
  EXPECT_EQ(q.mask, (std::vector<uint8_t>{3, 1, 2, 1}));
}

TEST(SftPacking, LinesAreParsedAndMessagesNeedATemplate) {
  const auto t = parse_sft_json(nlohmann::json{{"prompt", "Q"}, {"response", "A"}, {"id", 3}}, "f:1", nullptr);
  EXPECT_EQ(t.segments, (std::vector<ChatSegment>{{"Q", false}, {"A", true}}));
  EXPECT_TRUE(t.eos);
  auto message = [](const nlohmann::json& j) {
    try {
      parse_sft_json(j, "f.jsonl:7", nullptr);
    } catch (const zt::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string m = message(nlohmann::json{{"messages", nlohmann::json::array()}});
  EXPECT_NE(m.find("f.jsonl:7: a 'messages' line needs the tokenizer's chat template"), std::string::npos) << m;
  const std::string r = message(nlohmann::json{{"prompt", "Q"}});
  EXPECT_NE(r.find("no string field 'response'"), std::string::npos) << r;
  const std::string n = message(nlohmann::json{{"prompt", 3}, {"response", "A"}});
  EXPECT_NE(n.find("no string field 'prompt'"), std::string::npos) << n;
}

TEST_F(SftData, DatasetIgnoresExactlyThePromptTargets) {
  const Packed p = three_examples();
  const std::string path = write(dir_, "d_train_000000", p, true);
  EXPECT_EQ(mask_path(path), (dir_ / "d_train_000000.mask").string());
  for (int64_t seq : {4, 7, 16}) {
    ShardDataset ds({path}, seq, 64);
    EXPECT_EQ(ds.masked_shards(), 1);
    for (int64_t w = 0; w < ds.size(); ++w) {
      const Example e = ds.get(w);
      for (int64_t i = 0; i < seq; ++i) {
        const auto pos = static_cast<size_t>(w * seq + i);
        EXPECT_EQ(e.x[i].item<int64_t>(), p.tokens[pos]);
        const int64_t want = (p.mask[pos + 1] & kSftTarget) ? static_cast<int64_t>(p.tokens[pos + 1]) : -1;
        EXPECT_EQ(e.y[i].item<int64_t>(), want) << "seq " << seq << " window " << w << " position " << i;
      }
    }
  }
  // A mask of another length is an error naming both files.
  write_shard(mask_path(path), std::vector<uint32_t>(5, 1), 2, 2);
  try {
    ShardDataset bad({path}, 4, 64);
    ADD_FAILURE() << "no error";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has 5 entries but its shard"), std::string::npos) << e.what();
  }
}

TEST_F(SftData, LossIsTheMeanCrossEntropyOverResponseTargets) {
  Packed p = three_examples();
  ASSERT_EQ(p.mask[16], 0);  // window 0 of seq 16 ends on a prompt token: only a target
  Packed other = p;
  other.tokens[16] = 30;     // changes y[15] only, never x
  const std::string a = write(dir_, "a", p, true), b = write(dir_, "b", other, true);
  const std::string a_plain = write(dir_, "a_plain", p, false), b_plain = write(dir_, "b_plain", other, false);
  constexpr int64_t kSeq = 16;
  auto example = [&](const std::string& f) { return ShardDataset({f}, kSeq, 64).get(0); };
  // The models under test: GPT-2 with the fused LM-head loss and without, and Llama.
  struct Case {
    std::string name;
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
    std::function<torch::Tensor(const torch::Tensor&)> logits;
  };
  std::vector<Case> cases;
  for (bool fused : {true, false}) {
    torch::manual_seed(7);
    zt::models::GPT2Config cfg;
    cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 32, cfg.vocab_size = 64, cfg.n_positions = 32;
    cfg.fused_lm_head_loss = fused;
    zt::models::GPT2 m(cfg);
    cases.push_back({fused ? "gpt2 fused LM-head loss" : "gpt2 unfused loss",
                     [m](const torch::Tensor& x, const torch::Tensor& y) mutable { return m->loss(x, y); },
                     [m](const torch::Tensor& x) mutable { return m->forward(x); }});
  }
  {
    torch::manual_seed(7);
    auto cfg = zt::models::named_llama("llama-tiny");
    cfg.vocab_size = 64, cfg.max_position_embeddings = 32;
    zt::models::LlamaForCausalLM m(cfg);
    cases.push_back({"llama-tiny", [m](const torch::Tensor& x, const torch::Tensor& y) mutable { return m->loss(x, y); },
                     [m](const torch::Tensor& x) mutable { return m->forward(x); }});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    torch::NoGradGuard ng;
    const Example e = example(a);
    const auto x = e.x.unsqueeze(0), y = e.y.unsqueeze(0);  // (1, T)
    const double loss = c.loss(x, y).item<double>();
    // By hand: -log softmax(logits)[target] in fp64, averaged over the response targets.
    const auto logp = torch::log_softmax(c.logits(x).to(torch::kDouble)[0], -1);  // (T, V)
    double sum = 0;
    int n = 0;
    for (int64_t i = 0; i < kSeq; ++i) {
      if (!(p.mask[static_cast<size_t>(i + 1)] & kSftTarget)) continue;
      sum -= logp[i][static_cast<int64_t>(p.tokens[static_cast<size_t>(i + 1)])].item<double>();
      ++n;
    }
    EXPECT_EQ(n, 7);  // the response + EOS tokens among positions 1..16: 3-5 and 10-13
    EXPECT_NEAR(loss, sum / n, 1e-6);
    // The prompt token that is only a target: changing it leaves the masked loss exactly
    // as it was, and changes the unmasked one (so the test can fail).
    const Example eb = example(b);
    ASSERT_TRUE(torch::equal(eb.x, e.x));
    EXPECT_EQ(c.loss(eb.x.unsqueeze(0), eb.y.unsqueeze(0)).item<double>(), loss);
    const Example pa = example(a_plain), pb = example(b_plain);
    const double plain_a = c.loss(pa.x.unsqueeze(0), pa.y.unsqueeze(0)).item<double>();
    EXPECT_NE(plain_a, c.loss(pb.x.unsqueeze(0), pb.y.unsqueeze(0)).item<double>());
    EXPECT_GT(std::abs(plain_a - loss), 1e-3);
  }
}

// tokenize --sft -> train: the shards and masks hold prompt, response, EOS per example, a
// `messages` line without tokenizer_config.json is an error, and train reads the masks and
// prints losses.
TEST_F(SftData, TokenizeSftThenTrain) {
  const std::string fixture = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/bpe/";
  const std::string bin = std::string(ZT_BINARY_DIR) + "/zerotrain";
  struct SftText {
    std::string prompt, response;
  };
  std::vector<SftText> examples;
  {
    std::ofstream j(dir_ / "sft.jsonl");
    for (int k = 0; k < 60; ++k) {
      examples.push_back({"Question " + std::to_string(k) + ": what is " + std::to_string(k) + " + " +
                              std::to_string(2 * k) + "?",
                          " The answer is " + std::to_string(3 * k) + "."});
      j << nlohmann::json({{"prompt", examples.back().prompt}, {"response", examples.back().response}}).dump() << "\n";
    }
  }
  auto run = [](const std::string& cmd) { return zt::test_support::run_shell("OMP_NUM_THREADS=1 timeout -k 5 300 " + cmd); };
  const std::string out = (dir_ / "shards").string();
  const auto t = run(bin + " tokenize --sft --tokenizer " + fixture + "tokenizer.json --out " + out +
                     " --shard-tokens 600 --threads 2 " + (dir_ / "sft.jsonl").string());
  ASSERT_EQ(t.code, 0) << t.output;
  const auto tok = BpeTokenizer::from_file(fixture + "tokenizer.json");
  const int32_t eot = *tok.token_to_id("<|endoftext|>");
  Packed want;
  for (const auto& e : examples) append_sft_example(tok.encode(e.prompt), tok.encode(e.response), eot, want.tokens, want.mask);
  Packed got;
  const auto files = expand_glob(out + "/data_train_*.bin");
  EXPECT_GE(files.size(), 2u);  // shards cut mid-example: the mask follows
  for (const auto& f : files) {
    MappedShard s(f), m(mask_path(f));
    ASSERT_EQ(s.info().num_tokens, m.info().num_tokens);
    for (int64_t i = 0; i < s.info().num_tokens; ++i) {
      got.tokens.push_back(s.token(i));
      got.mask.push_back(static_cast<uint8_t>(m.token(i)));
    }
  }
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.mask, want.mask);

  std::ofstream(dir_ / "chat.jsonl") << R"({"messages": [{"role": "user", "content": "hi"}]})" << "\n";
  const auto c = run(bin + " tokenize --sft --tokenizer " + fixture + "tokenizer.json --out " + out + "_chat " +
                     (dir_ / "chat.jsonl").string());
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.output.find("tokenizer_config.json' (a `messages` line needs the model's tokenizer_config.json"),
            std::string::npos)
      << c.output;

  std::ofstream(dir_ / "config.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}, "zero_optimization": {"stage": 2}})";
  const auto r = run(bin + " train --device cpu --model gpt2-tiny --vocab 3000 --seq 32 --steps 3 --config " +
                     (dir_ / "config.json").string() + " --data '" + out + "/data_train_*.bin'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("have a loss mask (SFT): prompt targets are ignored"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Step 3/3, Loss: "), std::string::npos) << r.output;
}

}  // namespace zt_test_sft
