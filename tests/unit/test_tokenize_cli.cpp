// `zerotrain tokenize` and `zerotrain train` on shards, end to end through the CLI:
// shard contents equal the tokenizer's ids with the end-of-text token before each
// document, the validation split, training with validation loss on 2 ranks (ZeRO-2 and
// ZeRO-3), resume of the data position, and the errors for data that does not fit the model.
#include <gtest/gtest.h>
#include "support/run_shell.h"
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/fs.h"
#include "data/bpe_tokenizer.h"
#include "data/sentencepiece.h"
#include "data/shards.h"

namespace zt_test_tokenize_cli {

namespace fs = std::filesystem;
using namespace zt::data;

namespace {

const std::string kFixture = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/bpe/";
const std::string kBin = std::string(ZT_BINARY_DIR) + "/zerotrain";

using CliRun = zt::test_support::ShellRun;

CliRun run(const std::string& args) { return zt::test_support::run_shell("OMP_NUM_THREADS=1 timeout -k 5 300 " + args); }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<uint32_t> read_stream(const std::vector<std::string>& files) {
  std::vector<uint32_t> out;
  for (const auto& f : files) {
    MappedShard s(f);
    for (int64_t i = 0; i < s.info().num_tokens; ++i) out.push_back(s.token(i));
  }
  return out;
}

// The shared data directory: tokenized once for all tests of this file.
class TokenizeCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(ZT_BINARY_DIR) / ("tokenize_cli_" + std::to_string(::getpid()));
    zt::ckpt::remove_tree(dir_);
    fs::create_directories(dir_);
    // 40 JSONL documents cut from the fixture text, then the whole text as one document.
    const std::string text = read_file(kFixture + "test.txt");
    std::ofstream j(dir_ / "docs.jsonl");
    for (int k = 0; k < 40; ++k) {
      // Cut at character boundaries (a UTF-8 continuation byte is 10xxxxxx).
      auto boundary = [&](size_t i) {
        while (i < text.size() && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) ++i;
        return i;
      };
      const size_t from = boundary(static_cast<size_t>(k) * 1500), to = boundary(from + 1500 + k * 7);
      docs_.push_back(text.substr(from, to - from));
      j << nlohmann::json({{"id", k}, {"text", docs_.back()}}).dump() << "\n";
      if (k == 5) j << "\n";  // blank lines are skipped
    }
    j.close();
    docs_.push_back(text);
    std::ofstream(dir_ / "config_z2.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
      "zero_optimization": {"stage": 2}})";
    std::ofstream(dir_ / "config_z3.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
      "zero_optimization": {"stage": 3}})";
    tokenize_ = run(kBin + " tokenize --tokenizer " + kFixture + "tokenizer.json --out " + (dir_ / "shards").string() +
                    " --val-fraction 0.2 --shard-tokens 20000 --threads 2 " + (dir_ / "docs.jsonl").string() + " " +
                    kFixture + "test.txt");
  }
  static void TearDownTestSuite() { zt::ckpt::remove_tree(dir_); }
  static std::string train_cmd(const std::string& extra) {
    return kBin + " launch -n 2 -- " + kBin + " train --device cpu --model gpt2-tiny --vocab 3000 --seq 32 " +
           "--data '" + (dir_ / "shards/data_train_*.bin").string() + "' " + extra;
  }
  static fs::path dir_;
  static std::vector<std::string> docs_;
  static CliRun tokenize_;
};
fs::path TokenizeCli::dir_;
std::vector<std::string> TokenizeCli::docs_;
CliRun TokenizeCli::tokenize_;

}  // namespace

TEST_F(TokenizeCli, ShardsHoldTheTokenizersIdsWithEotBeforeEachDocument) {
  ASSERT_EQ(tokenize_.code, 0) << tokenize_.output;
  EXPECT_TRUE(has(tokenize_.output, "INFO [rank 0] tokenize: 100% (")) << tokenize_.output;  // the progress line
  const auto tok = BpeTokenizer::from_file(kFixture + "tokenizer.json");
  const int32_t eot = *tok.token_to_id("<|endoftext|>");
  // Documents g with floor((g+1) * 0.2) > floor(g * 0.2) (every 5th) are validation.
  std::vector<uint32_t> want_train, want_val;
  for (size_t g = 0; g < docs_.size(); ++g) {
    auto& dst = std::floor((g + 1) * 0.2) > std::floor(g * 0.2) ? want_val : want_train;
    dst.push_back(static_cast<uint32_t>(eot));
    for (int32_t t : tok.encode(docs_[g])) dst.push_back(static_cast<uint32_t>(t));
  }
  const auto train = expand_glob((dir_ / "shards/data_train_*.bin").string());
  const auto val = expand_glob((dir_ / "shards/data_val_*.bin").string());
  EXPECT_GE(train.size(), 3u);  // > 40 000 tokens at 20 000 per shard
  for (const auto& f : train) {
    const ShardInfo info = read_shard_info(f);
    EXPECT_EQ(info.token_bytes, 2);
    EXPECT_EQ(info.vocab_size, 3000);
    if (f != train.back()) EXPECT_EQ(info.num_tokens, 20000);
  }
  EXPECT_EQ(read_stream(train), want_train);
  EXPECT_EQ(read_stream(val), want_val);
}

TEST_F(TokenizeCli, TrainOnShardsReportsValidationLossAndResumes) {
  ASSERT_EQ(tokenize_.code, 0) << tokenize_.output;
  const std::string val = "--val-data '" + (dir_ / "shards/data_val_*.bin").string() + "'";
  const std::string summary = (dir_ / "summary.jsonl").string();
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string metrics = (dir_ / "metrics.jsonl").string();
  CliRun r = run(train_cmd("--config " + (dir_ / "config_z2.json").string() + " --steps 4 --eval-every 2 " + val +
                        " --summary " + summary + " --save " + ckpt + " --metrics " + metrics));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "--data: ")) << r.output;
  EXPECT_TRUE(has(r.output, "vocabulary 3000")) << r.output;
  EXPECT_TRUE(has(r.output, "validation at step 2: loss")) << r.output;
  EXPECT_TRUE(has(r.output, "validation at step 4: loss")) << r.output;
  const auto s = nlohmann::json::parse(read_file(summary));
  ASSERT_TRUE(s.contains("val_loss")) << s.dump();
  const double loss = s["val_loss"].get<double>();
  // Near ln(3000) = 8.0 for a barely trained model, and finite.
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 3.0);
  EXPECT_LT(loss, 9.0);
  EXPECT_NEAR(s["val_ppl"].get<double>(), std::exp(loss), 1e-6 * std::exp(loss));
  EXPECT_EQ(s["validation"].size(), 2u);
  // --metrics: the engine's 4 step lines, then the 2 validation lines.
  std::istringstream ml(read_file(metrics));
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(ml, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_FALSE(lines[3].contains("val_loss"));
  EXPECT_EQ(lines[4]["step"], 2);
  EXPECT_EQ(lines[5]["step"], 4);
  EXPECT_DOUBLE_EQ(lines[5]["val_loss"].get<double>(), loss);

  // Resume: the data position comes back from the checkpoint.
  CliRun r2 = run(train_cmd("--config " + (dir_ / "config_z2.json").string() + " --steps 6 --load " + ckpt));
  ASSERT_EQ(r2.code, 0) << r2.output;
  EXPECT_TRUE(has(r2.output, "resuming at step 4 of 6")) << r2.output;
  // Another --seq gives other windows: the saved position does not apply.
  CliRun r3 = run(kBin + " launch -n 2 -- " + kBin + " train --device cpu --model gpt2-tiny --vocab 3000 --seq 16 --data '" +
               (dir_ / "shards/data_train_*.bin").string() + "' --config " + (dir_ / "config_z2.json").string() +
               " --steps 6 --load " + ckpt);
  EXPECT_NE(r3.code, 0);
  EXPECT_TRUE(has(r3.output, "resume with the same --data and --seq")) << r3.output;
}

TEST_F(TokenizeCli, ValidationUnderZero3) {
  ASSERT_EQ(tokenize_.code, 0) << tokenize_.output;
  CliRun r = run(train_cmd("--config " + (dir_ / "config_z3.json").string() + " --steps 2 --eval-batches 3 --val-data '" +
                        (dir_ / "shards/data_val_*.bin").string() + "'"));
  ASSERT_EQ(r.code, 0) << r.output;
  // 3 batches of 2 windows of 32 tokens on each of 2 ranks.
  EXPECT_TRUE(has(r.output, "validation at step 2: loss")) << r.output;
  EXPECT_TRUE(has(r.output, "(384 tokens")) << r.output;
}

TEST_F(TokenizeCli, DataThatDoesNotFitTheModelIsAnError) {
  ASSERT_EQ(tokenize_.code, 0) << tokenize_.output;
  const std::string cfg = " --config " + (dir_ / "config_z2.json").string() + " --steps 1";
  const std::string train_glob = "'" + (dir_ / "shards/data_train_*.bin").string() + "'";
  // Ids beyond the model's vocabulary.
  CliRun small = run(kBin + " train --device cpu --model gpt2-tiny --seq 32 --data " + train_glob + cfg);
  EXPECT_EQ(small.code, 1);
  EXPECT_TRUE(has(small.output, "tokenizer vocabulary of 3000 but the model's vocabulary is 256")) << small.output;
  // --init-from weights with another tokenizer's vocabulary (only config.json: the check comes first).
  fs::create_directories(dir_ / "hf");
  std::ofstream(dir_ / "hf/config.json")
      << R"({"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 50257, "n_positions": 256})";
  CliRun hf = run(kBin + " train --device cpu --seq 32 --init-from " + (dir_ / "hf").string() + " --data " + train_glob +
               cfg);
  EXPECT_EQ(hf.code, 1);
  EXPECT_TRUE(has(hf.output, "--init-from weights have a vocabulary of 50257")) << hf.output;
  // A text file is byte tokens: wrong for Hugging Face weights.
  CliRun bytes = run(kBin + " train --device cpu --seq 32 --init-from " + (dir_ / "hf").string() + " --data " +
                  kFixture + "test.txt" + cfg);
  EXPECT_EQ(bytes.code, 1);
  EXPECT_TRUE(has(bytes.output, "fed as byte tokens")) << bytes.output;
  CliRun none = run(kBin + " train --device cpu --model gpt2-tiny --data '" + (dir_ / "nothing_*.bin").string() + "'" + cfg);
  EXPECT_EQ(none.code, 1);
  EXPECT_TRUE(has(none.output, "no file matches")) << none.output;
  CliRun eval = run(kBin + " train --device cpu --model gpt2-tiny --eval-every 2" + cfg);
  EXPECT_EQ(eval.code, 1);
  EXPECT_TRUE(has(eval.output, "--eval-every needs --val-data")) << eval.output;
}

TEST_F(TokenizeCli, SentencePieceModelsTokenizeToo) {
  const std::string spm_model = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/spm/spm.model";
  CliRun r = run(kBin + " tokenize --tokenizer " + spm_model + " --name spm --out " + (dir_ / "shards").string() +
                 " --threads 2 " + (dir_ / "docs.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto sp = zt::data::SentencePieceTokenizer::from_file(spm_model);
  std::vector<uint32_t> want;
  for (size_t g = 0; g + 1 < docs_.size(); ++g) {  // the JSONL documents (not the whole text)
    want.push_back(static_cast<uint32_t>(sp.eos_id()));
    for (int32_t t : sp.encode(docs_[g])) want.push_back(static_cast<uint32_t>(t));
  }
  const auto files = expand_glob((dir_ / "shards/spm_train_*.bin").string());
  EXPECT_EQ(read_shard_info(files[0]).vocab_size, 2000);
  EXPECT_EQ(read_stream(files), want);
}

}  // namespace zt_test_tokenize_cli
