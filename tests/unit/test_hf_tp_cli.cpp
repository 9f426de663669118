// `zerotrain train --tp N --init-from DIR` ([HF TP Load] in models/hf_tp.h): each tp rank
// reads only its slices of the Hugging Face weights, and the run prints the losses of the
// same run without --tp on one rank. fp32 on CPU ranks, AdamW (lr 1e-3, clip 1.0), random
// tokens (--data random: the fixtures' vocabularies are not bytes), seq 16, 5 steps; the
// differences are summation order (~1e-7): 1e-5 on the printed 6 decimals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/hf_gpt2.h"
#include "support/file_util.h"
#include "support/run_shell.h"
#include "support/train_losses.h"

namespace zt_test_hf_tp_cli {
namespace {

const std::string kHfTpZt = ZT_BINARY_DIR "/zerotrain";
const std::string kHfTpFixtures = ZT_SOURCE_DIR "/tests/fixtures/llama/";
using zt::test_support::train_printed_losses;

bool hftp_has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

zt::test_support::ShellRun hftp_run(const std::string& cmd) {
  return zt::test_support::run_shell("OMP_NUM_THREADS=1 timeout -k 5 300 " + cmd);
}

// A random GPT-2 tiny (2 layers, C 128) in Hugging Face format: Conv1D (in, out) weights,
// fused c_attn, tied head, a vocabulary of 250 (divides by neither 2 nor 4: padded under tp).
void hftp_write_gpt2(const std::string& dir, int64_t n_head) {
  auto c = zt::models::named_gpt2("gpt2-tiny");
  c.vocab_size = 250;
  c.n_positions = 32;
  c.n_head = n_head;
  torch::manual_seed(3);
  zt::models::GPT2 m(c);
  zt::models::save_hf_gpt2(*m, dir);
}

TEST(HfTensorParallelCli, TrainTpInitFromEqualsOneRank) {
  zt::test_support::BuildTempDir tmp("hf_tp_cli_");
  const std::string gpt2 = tmp.path + "/gpt2";
  hftp_write_gpt2(gpt2, 4);
  const std::string cfg = tmp.path + "/ds.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})";
  struct Case {
    const char* name;
    std::string init_from;
    int ranks;
    const char* flags;      // the tp run's
    const char* reference;  // the one-rank run's extra flags
  };
  const Case cases[] = {
      {"gpt2_tp2", gpt2, 2, " --tp 2", ""},
      {"gpt2_tp2_sequence_parallel", gpt2, 2, " --tp 2 --set tensor_parallel.sequence_parallel=true", ""},
      {"mistral_gqa_untied_tp2", kHfTpFixtures + "mistral_gqa", 2, " --tp 2", ""},
      {"qwen2_bias_tied_tp2", kHfTpFixtures + "qwen2_bias", 2, " --tp 2", ""},
      {"qwen2_bias_tied_dp2_tp2_zero3", kHfTpFixtures + "qwen2_bias", 4, " --tp 2 --set zero_optimization.stage=3",
       " --set gradient_accumulation_steps=4"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string flags = " train --config " + cfg + " --init-from " + c.init_from +
                              " --device cpu --steps 5 --warmup 1 --seq 16 --print-every 1";
    const auto one = hftp_run(kHfTpZt + flags + c.reference);
    ASSERT_EQ(one.code, 0) << one.output;
    const auto tp = hftp_run(kHfTpZt + " launch -n " + std::to_string(c.ranks) + " -- " + kHfTpZt + flags + c.flags);
    ASSERT_EQ(tp.code, 0) << tp.output;
    EXPECT_TRUE(hftp_has(tp.output, "each of the 2 tp ranks read only its slices")) << tp.output;
    const auto want = train_printed_losses(one.output, 5), got = train_printed_losses(tp.output, 5);
    ASSERT_EQ(want.size(), 5u) << one.output;
    ASSERT_EQ(got.size(), 5u) << tp.output;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5) << "step " << i + 1;
      worst = std::max(worst, std::abs(got[i] - want[i]));
    }
    std::printf("[hf tp cli] %s: losses %.6f .. %.6f, max |diff| to one rank %.3g\n", c.name, got.front(), got.back(),
                worst);
  }
}

// Heads that do not divide by tp: a ConfigError naming the count and the fix, before any
// weight is read (the models' own checks run at construction, before the load).
TEST(HfTensorParallelCli, HeadsThatDoNotDivideAreRefusedBeforeLoading) {
  zt::test_support::BuildTempDir tmp("hf_tp_cli_err_");
  const std::string gpt2 = tmp.path + "/gpt2_1head";
  hftp_write_gpt2(gpt2, 1);
  const std::string cfg = tmp.path + "/ds.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 1})";
  const std::string common = " train --config " + cfg + " --device cpu --steps 1 --seq 16 --tp 2 --init-from ";
  auto r = hftp_run(kHfTpZt + " launch -n 2 -- " + kHfTpZt + common + gpt2);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(hftp_has(r.output, "GPT-2's n_head = 1 does not divide by the tensor-parallel size 2")) << r.output;
  EXPECT_FALSE(hftp_has(r.output, "read only its slices")) << r.output;
  EXPECT_FALSE(hftp_has(r.output, "Loss:")) << r.output;
  // llama3_rope: 2 query heads over 1 kv head.
  r = hftp_run(kHfTpZt + " launch -n 2 -- " + kHfTpZt + common + kHfTpFixtures + "llama3_rope");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(hftp_has(r.output, "num_key_value_heads = 1 does not divide by the tensor-parallel size 2")) << r.output;
  EXPECT_FALSE(hftp_has(r.output, "read only its slices")) << r.output;
  EXPECT_FALSE(hftp_has(r.output, "Loss:")) << r.output;
}

}  // namespace
}  // namespace zt_test_hf_tp_cli
