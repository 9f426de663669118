// `zerotrain generate` (src/cli/generate.cpp) run as a user runs it: greedy decoding from
// the tiny Llama fixture reproduces transformers' generate() id for id
// (tests/fixtures/make_generate_fixture.py), sampling is seeded, and bad input is named.
#include <gtest/gtest.h>
#include "support/run_shell.h"

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace zt_test_generate_cli {

namespace {

using Ran = zt::test_support::ShellRun;

Ran run(const std::string& args) {
  return zt::test_support::run_shell("timeout -k 5 120 " ZT_BINARY_DIR "/zerotrain generate " + args);
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

const std::string kDir = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/llama/llama";

TEST(CliGenerate, GreedyEqualsTransformers) {
  std::ifstream f(kDir + "/generate_greedy.json");
  ASSERT_TRUE(f.good());
  const auto fx = nlohmann::json::parse(f);
  std::string prompt, want = "ids:";
  for (const auto& t : fx["prompt_ids"]) prompt += (prompt.empty() ? "" : ",") + std::to_string(t.get<int64_t>());
  for (const auto& t : fx["generated_ids"]) want += " " + std::to_string(t.get<int64_t>());
  Ran r = run("--model-dir " + kDir + " --prompt-ids " + prompt + " --max-new-tokens " +
              std::to_string(fx["max_new_tokens"].get<int64_t>()));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, want + "\n")) << "want " << want << "\n" << r.output;
}

TEST(CliGenerate, SamplingIsSeeded) {
  const std::string base = "--model-dir " + kDir + " --prompt-ids 1,2,3 --max-new-tokens 12 --temperature 1.5 --top-k 20";
  Ran a = run(base + " --seed 7"), b = run(base + " --seed 7"), c = run(base + " --seed 8");
  EXPECT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output) << "another seed, other samples";
}

TEST(CliGenerate, BadInputIsNamed) {
  Ran out_of_vocab = run("--model-dir " + kDir + " --prompt-ids 1,500");
  EXPECT_EQ(out_of_vocab.code, 1) << out_of_vocab.output;
  EXPECT_TRUE(contains(out_of_vocab.output, "prompt id 500 is outside the model's vocabulary of 128")) << out_of_vocab.output;
  Ran too_long = run("--model-dir " + kDir + " --prompt-ids 1 --max-new-tokens 100");
  EXPECT_EQ(too_long.code, 1) << too_long.output;
  EXPECT_TRUE(contains(too_long.output, "exceed the model's 64 positions")) << too_long.output;
  // The byte-level BPE fixture (GPT-2's 50 257 tokens) does not fit a 128-token model.
  Ran tok = run("--model-dir " + kDir + " --prompt hello --tokenizer " + std::string(ZT_SOURCE_DIR) +
                "/tests/fixtures/bpe/tokenizer.json");
  EXPECT_EQ(tok.code, 1) << tok.output;
  EXPECT_TRUE(contains(tok.output, "but the model's vocabulary is 128")) << tok.output;
  Ran both = run("--model-dir " + kDir);
  EXPECT_EQ(both.code, 2) << both.output;
  EXPECT_TRUE(contains(both.output, "give one of --prompt TEXT and --prompt-ids LIST")) << both.output;
}

}  // namespace

}  // namespace zt_test_generate_cli
