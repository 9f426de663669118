// The parallel degrees in the config and on the command line (docs/parallel.md):
// tensor_parallel.autotp_size, pipeline.stages, expert_parallel.enabled/autoep_size and
// `train --tp/--pp/--ep`. They are validated with the world size, change the
// data-parallel size the batch rule counts, show in the resolved config, and a degree
// above 1 is "not supported yet" for zt::initialize from the config alone (never silently
// ignored); `zerotrain train` runs tp ([Tensor-Parallel Train]) and pp ([Pipeline Train]).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "ckpt/fs.h"
#include "config/tensor_parallel_options.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"
#include "support/run_shell.h"
#include "support/train_losses.h"

namespace zt_test_parallel_config {

namespace {

using nlohmann::json;
using zt::test_support::train_printed_losses;
namespace fs = std::filesystem;

std::string parse_error(const std::string& text, int world, bool full = false) {
  try {
    if (full) {
      zt::Config::from_json(json::parse(text), world);
    } else {
      zt::Config::parse(json::parse(text), world);
    }
  } catch (const zt::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for " << text;
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ParallelConfig, DefaultsAreOneRankPerDegree) {
  auto c = zt::Config::from_json(json::parse(R"({"train_micro_batch_size_per_gpu": 2})"), 4);
  EXPECT_EQ(c.tp_size(), 1);
  EXPECT_EQ(c.pp_size(), 1);
  EXPECT_EQ(c.ep_size(), 1);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.dp_world_size, 4);
  EXPECT_EQ(c.train_batch_size, 8);
  json j = c.to_json();
  EXPECT_EQ(j.at("tensor_parallel"), json::parse(R"({"autotp_size": 0})"));
  EXPECT_EQ(j.at("pipeline"), json::parse(R"({"stages": 1})"));
  EXPECT_EQ(j.at("expert_parallel"), json::parse(R"({"enabled": false, "autoep_size": 1})"));
  EXPECT_EQ(zt::Config::parse(j, 4).to_json(), j);
}

TEST(ParallelConfig, DegreesSetTheDataParallelSizeAndAreNotSupportedYet) {
  // 8 ranks = tp 2 x pp 2 x dp 2: the batch counts 2 data-parallel ranks.
  auto c = zt::Config::parse(json::parse(R"({"train_micro_batch_size_per_gpu": 4,
      "tensor_parallel": {"autotp_size": 2}, "pipeline": {"stages": 2},
      "expert_parallel": {"enabled": true, "autoep_size": 2}})"),
                             8);
  EXPECT_EQ(c.tp_size(), 2);
  EXPECT_EQ(c.pp_size(), 2);
  EXPECT_EQ(c.ep_size(), 2);
  EXPECT_EQ(c.dp_world_size, 2);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.train_batch_size, 8);
  ASSERT_EQ(c.not_supported_yet.size(), 3u);
  EXPECT_TRUE(contains(c.not_supported_yet[0], "tensor_parallel.autotp_size = 2 is not supported yet by zerotrain: "
                                               "tensor parallelism (tp 2) runs through zerotrain train --tp"))
      << c.not_supported_yet[0];
  EXPECT_TRUE(contains(c.not_supported_yet[1], "pipeline.stages = 2 is not supported yet by zerotrain: pipeline "
                                               "parallelism (pp 2) runs through zt::pipe::PipeEngine and zerotrain train"))
      << c.not_supported_yet[1];
  EXPECT_TRUE(contains(c.not_supported_yet[2], "expert parallelism (ep 2) is not implemented yet"))
      << c.not_supported_yet[2];
  json j = c.to_json();
  EXPECT_EQ(j.at("tensor_parallel").at("autotp_size"), 2);
  EXPECT_EQ(j.at("pipeline").at("stages"), 2);
  EXPECT_EQ(zt::Config::parse(j, 8).to_json(), j);
  // from_json (what initialize uses) refuses them.
  const std::string e = parse_error(R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 2}})", 2, true);
  EXPECT_TRUE(contains(e, "not zt::initialize from the config alone")) << e;
}

// tensor_parallel.sequence_parallel (zerotrain's key, config/tensor_parallel_options.h):
// read with the degree, an error without tp > 1 (it would change nothing), typed.
TEST(ParallelConfig, SequenceParallelTakesEffectOnlyWithTensorParallelism) {
  const json on = json::parse(R"({"train_batch_size": 4, "tensor_parallel": {"autotp_size": 2,
      "sequence_parallel": true}})");
  auto c = zt::Config::parse(on, 2);
  ASSERT_EQ(c.not_supported_yet.size(), 1u);  // the autotp_size note only (train --tp drops it)
  zt::config::drop_tensor_parallel_note(c.not_supported_yet);
  EXPECT_TRUE(c.not_supported_yet.empty()) << c.not_supported_yet[0];
  const auto o = zt::config::tensor_parallel_options(on);
  EXPECT_EQ(o.size, 2);
  EXPECT_TRUE(o.sequence_parallel);
  EXPECT_FALSE(zt::config::tensor_parallel_options(json::parse(R"({"train_batch_size": 4})")).sequence_parallel);
  EXPECT_EQ(zt::config::tensor_parallel_options(json::parse(R"({"tensor_parallel": {"autotp_size": 0}})")).size, 1);

  c = zt::Config::parse(json::parse(R"({"train_batch_size": 4, "tensor_parallel": {"sequence_parallel": true}})"), 2);
  ASSERT_EQ(c.not_supported_yet.size(), 1u);
  EXPECT_TRUE(contains(c.not_supported_yet[0], "tensor_parallel.sequence_parallel = true is set but takes effect only "
                                               "with tensor_parallel.autotp_size > 1"))
      << c.not_supported_yet[0];
  EXPECT_TRUE(zt::Config::parse(json::parse(R"({"train_batch_size": 4, "tensor_parallel": {"sequence_parallel": false}})"),
                                2).not_supported_yet.empty());
  const std::string e = parse_error(R"({"train_batch_size": 4, "tensor_parallel": {"autotp_size": 2,
      "sequence_parallel": "yes"}})", 2);
  EXPECT_TRUE(contains(e, "tensor_parallel.sequence_parallel")) << e;
  EXPECT_THROW(zt::config::tensor_parallel_options(json::parse(R"({"tensor_parallel": {"sequence_parallel": 3}})")),
               zt::ConfigError);
}

TEST(ParallelConfig, OneMeansOff) {
  auto c = zt::Config::from_json(json::parse(R"({"train_batch_size": 4, "tensor_parallel": {"autotp_size": 1},
      "pipeline": {"stages": "auto"}, "expert_parallel": {"enabled": false}})"),
                                 2);
  EXPECT_EQ(c.tp_size(), 1);
  EXPECT_EQ(c.pp_size(), 1);
  EXPECT_EQ(c.dp_world_size, 2);
  EXPECT_EQ(c.auto_defaulted, std::vector<std::string>{"pipeline.stages"});
}

TEST(ParallelConfig, BadDegreesNameTheFactorsAndTheKeys) {
  std::string e = parse_error(R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 3}})", 4);
  EXPECT_TRUE(contains(e, "tp 3 x pp 1 = 3 does not divide world size 4")) << e;
  EXPECT_TRUE(contains(e, "tensor_parallel.autotp_size 3, pipeline.stages 1")) << e;
  EXPECT_FALSE(contains(e, "train_batch_size")) << "no batch error when dp is unknown: " << e;
  e = parse_error(R"({"train_batch_size": 8, "expert_parallel": {"enabled": true, "autoep_size": 3}})", 4);
  EXPECT_TRUE(contains(e, "ep 3 does not divide dp 4")) << e;
  e = parse_error(R"({"train_batch_size": 8, "expert_parallel": {"autoep_size": 2}})", 4);
  EXPECT_TRUE(contains(e, "expert_parallel.autoep_size = 2 takes effect only with expert_parallel.enabled true")) << e;
  e = parse_error(R"({"train_batch_size": 8, "pipeline": {"stages": 0}})", 4);
  EXPECT_TRUE(contains(e, "pipeline.stages")) << e;
  e = parse_error(R"({"train_batch_size": 8, "pipeline": {"stagez": 2}})", 4);
  EXPECT_TRUE(contains(e, "unknown key pipeline.stagez")) << e;
}

TEST(ParallelConfig, OtherKeysOfTheSectionsAtDeepSpeedDefaultsOnly) {
  auto c = zt::Config::parse(json::parse(R"({"train_batch_size": 4,
      "pipeline": {"partition": "best", "seed_layers": false, "activation_checkpoint_interval": 0,
                   "pipe_partitioned": true, "grad_partitioned": true},
      "tensor_parallel": {"autotp_size": 0, "tp_overlap_comm": false, "preset_model": null}})"),
                             1);
  EXPECT_TRUE(c.not_supported_yet.empty());
  c = zt::Config::parse(json::parse(R"({"train_batch_size": 4, "pipeline": {"partition": "parameters"},
      "tensor_parallel": {"preset_model": "llama", "tp": {"tp_size": 2}}})"),
                        1);
  ASSERT_EQ(c.not_supported_yet.size(), 3u);
  std::string all;
  for (const auto& m : c.not_supported_yet) all += m + "\n";
  // Without a pipeline (stages 1) a pipeline key has nothing to act on (docs/pipeline.md).
  EXPECT_TRUE(contains(all, "pipeline.partition is set but takes effect only with pipeline.stages > 1")) << all;
  EXPECT_TRUE(contains(all, "tensor_parallel.preset_model = \"llama\" is not supported yet")) << all;
  EXPECT_TRUE(contains(all, "tensor_parallel.tp is not supported yet")) << all;
}

// ---- the command line ------------------------------------------------------------------

struct CmdResult {
  int rc = -1;
  std::string out;
};

CmdResult run(const std::string& cmd) {
  const auto r = zt::test_support::run_shell("timeout -k 5 300 " + cmd);
  return {r.code, r.output};
}

fs::path write_config(const std::string& name, const std::string& text) {
  fs::path p = fs::path(ZT_BINARY_DIR) / ("parallel_config_" + std::to_string(::getpid()) + "_" + name + ".json");
  std::ofstream(p) << text;
  return p;
}

// A run resumed at step 3 of 6 (--steps 6 --load): it says so, and its printed losses of
// steps 4-6 equal `want`'s (the uninterrupted run's 6) within 1e-5. Prints them and the
// largest difference under `tag`.
void expect_resumed_losses(const CmdResult& res, const std::vector<double>& want, const std::string& tag) {
  ASSERT_EQ(res.rc, 0) << res.out;
  EXPECT_TRUE(contains(res.out, "resuming at step 3 of 6")) << res.out;
  const auto got = train_printed_losses(res.out, 6);
  ASSERT_EQ(got.size(), 3u) << res.out;
  ASSERT_GE(want.size(), 6u);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i + 3], 1e-5) << "step " << i + 4;
    worst = std::max(worst, std::abs(got[i] - want[i + 3]));
  }
  std::printf("%s: steps 4-6 %.6f %.6f %.6f, max |diff| to the uninterrupted run %.3g\n", tag.c_str(), got[0], got[1],
              got[2], worst);
}

const std::string kZt = ZT_BINARY_DIR "/zerotrain";
const std::string kTiny = " --model gpt2-tiny --device cpu --steps 1 --warmup 0 --seq 16 --micro-batch 1";

TEST(ParallelCli, TrainPrintsTheTopology) {
  const fs::path cfg = write_config("plain", R"({"train_micro_batch_size_per_gpu": 1})");
  const CmdResult r = run(kZt + " train --config " + cfg.string() + kTiny + " --tp 1 --pp 1 --ep 1");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "INFO [rank 0] topology: dp 1 x tp 1 x pp 1 = 1 rank, ep 1 (rank = tp + 1*(dp + 1*pp)); "
                              "rank 0: dp 0, tp 0, pp 0, ep 0, expert_dp 0; pipeline prev -, next -"))
      << r.out;
  fs::remove(cfg);
}

TEST(ParallelCli, TrainRefusesDegreesAboveOne) {
  const fs::path cfg = write_config("refuse", R"({"train_micro_batch_size_per_gpu": 1})");
  const std::string launch2 = kZt + " launch -n 2 -- " + kZt + " train --config " + cfg.string() + kTiny;
  // --tp runs ([Tensor-Parallel Train]; ParallelCli.TrainTensorParallelEqualsOneRank; its
  // checkpoints: ParallelCli.TrainTensorParallelCheckpointResumesAtAnotherTp; with
  // --init-from: HfTensorParallelCli.*, tests/unit/test_hf_tp_cli.cpp).
  CmdResult r;
  // --tp with --pp runs (ParallelCli.TrainTensorPipelineEqualsOneRank), its checkpoints too
  // (ParallelCli.TrainTensorPipelineCheckpointLoadsAtDp4).
  // --pp runs ([Pipeline Train]; ParallelCli.TrainPipelineEqualsOneRank; its checkpoints:
  // ParallelCli.TrainPipelineCheckpointLoadsAtAnotherPp), but not with what the pipeline
  // does not do yet: named before the first step.
  // A Llama pipelines at tp 1 (ParallelCli.TrainLlamaPipelineEqualsOneRank), not with --tp.
  r = run(kZt + " launch -n 4 -- " + kZt + " train --config " + cfg.string() + kTiny + " --pp 2 --tp 2 --model llama-tiny");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "train: --tp 2 with --pp and the Llama model llama-tiny is not supported yet")) << r.out;
  EXPECT_FALSE(contains(r.out, "Loss:")) << r.out;
  // --ep runs with an MoE model ([Expert-Parallel Train]; ParallelCli.TrainExpertParallelEqualsEpOne),
  // but not on a model without experts, nor with what it does not do yet.
  r = run(launch2 + " --ep 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "train: --ep 2 splits the experts of an MoE model; gpt2-tiny has none")) << r.out;
  EXPECT_FALSE(contains(r.out, "Loss:")) << r.out;
  // 4 experts over 3 ranks: the layer names both before the first step.
  r = run(kZt + " launch -n 3 -- " + kZt + " train --config " + cfg.string() + kTiny + " --model gpt2-tiny-moe --ep 3");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "MoE: num_experts 4 does not divide by the expert-parallel size 3")) << r.out;
  EXPECT_FALSE(contains(r.out, "Loss:")) << r.out;
  // One rank: checked before the degrees meet the world size, or without --ep.
  r = run(kZt + " train --config " + cfg.string() + kTiny + " --model gpt2-tiny-moe --tp 2 --ep 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "train: --ep 2 with --tp is not supported yet")) << r.out;
  // Degrees that do not fit the world: named, with the product.
  r = run(kZt + " train --config " + cfg.string() + kTiny + " --tp 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "tp 2 x pp 1 = 2 does not divide world size 1")) << r.out;
  // A flag that contradicts the config.
  const fs::path tp4 = write_config("tp4", R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 4}})");
  r = run(kZt + " train --config " + tp4.string() + kTiny + " --tp 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "train: --tp 2 but the config sets tensor_parallel.autotp_size = 4")) << r.out;
  r = run(kZt + " train --config " + cfg.string() + kTiny + " --pp 0");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "--pp must be at least 1")) << r.out;
  fs::remove(cfg);
  fs::remove(tp4);
}

// [Pipeline Train]: `train --pp 2` on 2 ranks (1F1B, 4 micro-batches) trains to the losses of
// the same run without a pipeline on 1 rank, step for step (the library's equivalence tests
// are in tests/dist/test_pipeline.cpp; this is the command line's path).
TEST(ParallelCli, TrainPipelineEqualsOneRank) {
  const fs::path cfg = write_config("pipe", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  const std::string flags = " train --config " + cfg.string() + " --model gpt2-tiny --device cpu --steps 6 --warmup 1 "
                            "--seq 32 --print-every 1 --data " + std::string(ZT_SOURCE_DIR) + "/README.md";
  const CmdResult pp = run(kZt + " launch -n 2 -- " + kZt + flags + " --pp 2");
  ASSERT_EQ(pp.rc, 0) << pp.out;
  EXPECT_TRUE(contains(pp.out, "pipeline: GPT-2 gpt2-tiny in 2 stages")) << pp.out;
  const CmdResult one = run(kZt + flags);
  ASSERT_EQ(one.rc, 0) << one.out;
  auto losses = [](const std::string& out) { return train_printed_losses(out, 6); };
  const auto a = losses(pp.out), b = losses(one.out);
  ASSERT_EQ(a.size(), 6u) << pp.out;
  ASSERT_EQ(b.size(), 6u) << one.out;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "step " << i + 1;
  EXPECT_LT(a.back(), a.front() - 0.3) << "it trains";
  // zb-h1 with each W right after its B ([ZB-H1 Pending Cap]) through --set: the same losses.
  const CmdResult zb = run(kZt + " launch -n 2 -- " + kZt + flags +
                           " --pp 2 --set pipeline.schedule=zb-h1 --set pipeline.zb_max_pending_w=0");
  ASSERT_EQ(zb.rc, 0) << zb.out;
  EXPECT_TRUE(contains(zb.out, "schedule zb-h1 (zb_max_pending_w 0)")) << zb.out;
  const auto z = losses(zb.out);
  ASSERT_EQ(z.size(), 6u) << zb.out;
  for (size_t i = 0; i < z.size(); ++i) EXPECT_NEAR(z[i], b[i], 1e-5) << "zb-h1 step " << i + 1;
  // check-config takes the pipeline config train takes.
  const fs::path pcfg = write_config("pipe_cc", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "pipeline": {"stages": 2}})");
  const CmdResult cc = run(kZt + " check-config " + pcfg.string() + " --world 2");
  EXPECT_EQ(cc.rc, 0) << cc.out;
  // ... and names the cap without zb-h1.
  const fs::path capped = write_config("pipe_cc_cap", R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 4, "pipeline": {"stages": 2, "zb_max_pending_w": 0}})");
  const CmdResult cc2 = run(kZt + " check-config " + capped.string() + " --world 2");
  EXPECT_NE(cc2.rc, 0) << cc2.out;
  EXPECT_TRUE(contains(cc2.out, "pipeline.zb_max_pending_w = 0 caps the pending weight passes of the zb-h1 schedule "
                                "only")) << cc2.out;
  fs::remove(cfg);
  fs::remove(pcfg);
  fs::remove(capped);
}

// [Pipeline Train] with a Llama ([Llama Pipeline] in src/pipe/llama_pipe.h): `train --model
// llama-tiny --pp 2` on 2 ranks (1F1B, 4 micro-batches) prints the losses of `--pp 1` on 1 rank
// within 1e-5, step for step (the library's equivalence, parameters included, is
// tests/dist/test_pipeline_llama.cpp); its checkpoint (--save at step 3) continues without
// --pp on 1 rank to the uninterrupted run's losses of steps 4-6.
TEST(ParallelCli, TrainLlamaPipelineEqualsOneRank) {
  const fs::path cfg = write_config("llama_pipe", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  const fs::path dir = fs::temp_directory_path() / ("zt_llama_pp_ckpt_" + std::to_string(::getpid()));
  zt::ckpt::remove_tree(dir.string());
  const std::string flags = " train --config " + cfg.string() + " --model llama-tiny --device cpu --warmup 1 "
                            "--seq 32 --print-every 1 --data " + std::string(ZT_SOURCE_DIR) + "/README.md";
  const CmdResult pp = run(kZt + " launch -n 2 -- " + kZt + flags + " --steps 6 --pp 2");
  ASSERT_EQ(pp.rc, 0) << pp.out;
  EXPECT_TRUE(contains(pp.out, "pipeline: Llama llama-tiny in 2 stages")) << pp.out;
  const CmdResult one = run(kZt + flags + " --steps 6 --pp 1");
  ASSERT_EQ(one.rc, 0) << one.out;
  const auto a = train_printed_losses(pp.out, 6), b = train_printed_losses(one.out, 6);
  ASSERT_EQ(a.size(), 6u) << pp.out;
  ASSERT_EQ(b.size(), 6u) << one.out;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "step " << i + 1;
  EXPECT_LT(a.back(), a.front() - 0.1) << "it trains";
  // The pipeline's checkpoint holds the HF names: it continues without a pipeline.
  const CmdResult first = run(kZt + " launch -n 2 -- " + kZt + flags + " --steps 3 --pp 2 --save " + dir.string());
  ASSERT_EQ(first.rc, 0) << first.out;
  const CmdResult resumed = run(kZt + flags + " --steps 6 --load " + dir.string());
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, "resuming at step 3 of 6")) << resumed.out;
  const auto got = train_printed_losses(resumed.out, 6);
  ASSERT_EQ(got.size(), 3u) << resumed.out;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], a[i + 3], 1e-5) << "step " << i + 4;
  zt::ckpt::remove_tree(dir.string());
  fs::remove(cfg);
}

// [Pipeline Train] with --tp ([Pipeline x Tensor Parallel] in src/pipe/gpt2_pipe.h): `train
// --tp 2 --pp 2` on 4 ranks (dp 1; 1F1B and GPipe, the second with sequence parallelism and
// ZeRO 2) trains to the losses of `--tp 1 --pp 1` on 1 rank, step for step, within 1e-5 on
// the printed 6 decimals (the library's equivalence, parameters included, is
// tests/dist/test_pipeline_tp.cpp).
TEST(ParallelCli, TrainTensorPipelineEqualsOneRank) {
  const fs::path cfg = write_config("tpxpp", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  const std::string flags = " train --config " + cfg.string() + " --model gpt2-tiny --device cpu --steps 5 --warmup 1 "
                            "--seq 32 --print-every 1 --data " + std::string(ZT_SOURCE_DIR) + "/README.md";
  const CmdResult one = run(kZt + flags + " --tp 1 --pp 1");
  ASSERT_EQ(one.rc, 0) << one.out;
  const auto want = train_printed_losses(one.out, 5);
  ASSERT_EQ(want.size(), 5u) << one.out;
  const char* variants[] = {
      " --tp 2 --pp 2",
      " --tp 2 --pp 2 --set pipeline.schedule=gpipe --set tensor_parallel.sequence_parallel=true "
      "--set zero_optimization.stage=2",
  };
  for (const char* v : variants) {
    SCOPED_TRACE(v);
    const CmdResult r = run(kZt + " launch -n 4 -- " + kZt + flags + v);
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "topology: dp 1 x tp 2 x pp 2 = 4 ranks")) << r.out;
    EXPECT_TRUE(contains(r.out, "pipeline: GPT-2 gpt2-tiny in 2 stages")) << r.out;
    EXPECT_TRUE(contains(r.out, ", tp 2")) << r.out;
    const auto got = train_printed_losses(r.out, 5);
    ASSERT_EQ(got.size(), 5u) << r.out;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "step " << i + 1;
    EXPECT_LT(got.back(), got.front() - 0.3) << "it trains";
  }
  fs::remove(cfg);
}

// [Tensor-Parallel Train]: `train --tp 2` (GPT2TP / LlamaTP cut from the model the seed
// gives, tests/dist/test_tensor_parallel.cpp for the library's equivalence) trains to the
// losses of the same run without tp on 1 rank, step for step, with and without sequence
// parallelism; dp 2 x tp 2 on 4 ranks to the one-rank run over the same global batch
// (gradient accumulation 2x: the same windows each step, the dp replicas' mean loss).
// fp32 on CPU ranks; the differences are summation order (~1e-7): 1e-5 on the printed
// 6 decimals. AdamW: the key bias, whose gradient is zero up to rounding, takes
// sign-of-rounding steps (docs/tensor-parallel.md), but it does not change the loss.
TEST(ParallelCli, TrainTensorParallelEqualsOneRank) {
  const fs::path cfg = write_config("tp", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  auto losses = [](const std::string& out) { return train_printed_losses(out, 5); };
  struct Case {
    const char* name;
    const char* model;
    int ranks;
    const char* flags;      // the tp run's
    const char* reference;  // the one-rank run's extra flags
  };
  const Case cases[] = {
      {"gpt2_tp2", "gpt2-tiny", 2, " --tp 2", ""},
      {"gpt2_tp2_sequence_parallel", "gpt2-tiny", 2, " --tp 2 --set tensor_parallel.sequence_parallel=true", ""},
      {"llama_tp2", "llama-tiny", 2, " --tp 2", ""},
      {"llama_tp2_sequence_parallel_stage2", "llama-tiny", 2,
       " --tp 2 --set tensor_parallel.sequence_parallel=true --set zero_optimization.stage=2", ""},
      {"gpt2_dp2_tp2_stage2", "gpt2-tiny", 4, " --tp 2 --set zero_optimization.stage=2",
       " --set gradient_accumulation_steps=4"},
  };
  std::map<std::string, std::vector<double>> reference;  // by model + reference flags
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string flags = " train --config " + cfg.string() + " --model " + c.model +
                              " --device cpu --steps 5 --warmup 1 --seq 32 --print-every 1 --data " +
                              std::string(ZT_SOURCE_DIR) + "/README.md";
    const std::string key = std::string(c.model) + c.reference;
    if (!reference.count(key)) {
      const CmdResult one = run(kZt + flags + c.reference);
      ASSERT_EQ(one.rc, 0) << one.out;
      reference[key] = losses(one.out);
    }
    const CmdResult tp = run(kZt + " launch -n " + std::to_string(c.ranks) + " -- " + kZt + flags + c.flags);
    ASSERT_EQ(tp.rc, 0) << tp.out;
    EXPECT_TRUE(contains(tp.out, "tensor parallelism: " + std::string(c.model) + " split over tp 2")) << tp.out;
    const auto& want = reference[key];
    const auto got = losses(tp.out);
    ASSERT_EQ(want.size(), 5u);
    ASSERT_EQ(got.size(), 5u) << tp.out;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "step " << i + 1;
    EXPECT_LT(got.back(), got.front() - 0.3) << "it trains";
  }
  fs::remove(cfg);
}

// ZeRO-3 with tp (docs/tensor-parallel.md#zero-3-with-tp): `train --tp 2` at
// zero_optimization.stage 3 on 4 ranks (dp 2 x tp 2: each tp slice partitioned over dp and
// gathered per block / decoder layer) prints the losses of the same run at stage 2, step for
// step (1e-6 relative on the printed 6 decimals), GPT-2 with sequence parallelism and Llama
// without. Its checkpoint (--save at step 3) resumes at stage 2 to the uninterrupted stage 3
// run's losses (the library's tests: tests/dist/test_tp_zero3.cpp).
TEST(ParallelCli, TrainTensorParallelZero3EqualsStage2) {
  const fs::path cfg = write_config("tp_z3", R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}})");
  // Stage 3 with the matrices gathered per unit (gpt2-tiny's are all below the default
  // persistence threshold of 1e5 elements, which would keep them gathered like the norms).
  const std::string stage3 = " --set zero_optimization.stage=3 --set zero_optimization.stage3_param_persistence_threshold=1000";
  const fs::path dir = fs::temp_directory_path() / ("zt_tp_z3_ckpt_" + std::to_string(::getpid()));
  zt::ckpt::remove_tree(dir.string());
  struct Case {
    const char* name;
    const char* flags;
  };
  const Case cases[] = {
      {"gpt2_dp2_tp2_sequence_parallel", " --model gpt2-tiny --set tensor_parallel.sequence_parallel=true"},
      {"llama_dp2_tp2", " --model llama-tiny"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string base = kZt + " launch -n 4 -- " + kZt + " train --config " + cfg.string() + c.flags +
                             " --tp 2 --device cpu --warmup 1 --seq 32 --print-every 1 --data " +
                             std::string(ZT_SOURCE_DIR) + "/README.md";
    const CmdResult z2 = run(base + " --steps 6");
    ASSERT_EQ(z2.rc, 0) << z2.out;
    const CmdResult z3 = run(base + " --steps 6" + stage3);
    ASSERT_EQ(z3.rc, 0) << z3.out;
    EXPECT_TRUE(contains(z3.out, "| ZeRO stage 3,")) << z3.out;
    EXPECT_TRUE(contains(z3.out, "split over tp 2")) << z3.out;
    const auto want = train_printed_losses(z2.out, 6), got = train_printed_losses(z3.out, 6);
    ASSERT_EQ(want.size(), 6u) << z2.out;
    ASSERT_EQ(got.size(), 6u) << z3.out;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]) << "step " << i + 1;
      worst = std::max(worst, std::abs(got[i] - want[i]) / want[i]);
    }
    EXPECT_LT(got.back(), got.front() - 0.3) << "it trains";
    std::printf("[tp zero3 cli] %s: ZeRO-3 losses %.6f ... %.6f, max rel diff to ZeRO-2 %.3g\n", c.name, got.front(),
                got.back(), worst);
    if (c.name != cases[0].name) continue;
    // A ZeRO-3 tp checkpoint: saved at step 3, resumed at stage 2 (the same dp x tp).
    const CmdResult first = run(base + " --steps 3" + stage3 + " --save " + dir.string());
    ASSERT_EQ(first.rc, 0) << first.out;
    expect_resumed_losses(run(base + " --steps 6 --load " + dir.string()), got,
                          std::string("[tp zero3 cli] ") + c.name + " saved at ZeRO-3, resumed at ZeRO-2");
  }
  zt::ckpt::remove_tree(dir.string());
  fs::remove(cfg);
}

// [TP Reshard]: `train --tp 2 --save` stores the split parameters as tp shards with their
// cut; `--load` continues at another tp: on 1 rank without --tp and at --tp 4 on 4 ranks
// (dp 1 everywhere, so every run reads the same windows), the printed losses of steps 4-6
// equal the uninterrupted --tp 2 run's (1e-5 on the printed 6 decimals: summation order).
// AdamW, ZeRO 1 (the optimizer state sharded when saved at tp 2, re-cut at tp 1 and 4).
TEST(ParallelCli, TrainTensorParallelCheckpointResumesAtAnotherTp) {
  const fs::path cfg = write_config("tp_ckpt", R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  const fs::path dir = fs::temp_directory_path() / ("zt_tp_ckpt_" + std::to_string(::getpid()));
  zt::ckpt::remove_tree(dir.string());  // not fs::remove_all: see ckpt/fs.h
  const std::string flags = " train --config " + cfg.string() +
                            " --model gpt2-tiny --device cpu --warmup 1 --seq 32 --print-every 1 --data " +
                            std::string(ZT_SOURCE_DIR) + "/README.md";
  const std::string tp2 = kZt + " launch -n 2 -- " + kZt + flags + " --tp 2";
  const CmdResult straight = run(tp2 + " --steps 6");
  ASSERT_EQ(straight.rc, 0) << straight.out;
  const auto want = train_printed_losses(straight.out, 6);
  ASSERT_EQ(want.size(), 6u) << straight.out;
  const CmdResult first = run(tp2 + " --steps 3 --save " + dir.string());
  ASSERT_EQ(first.rc, 0) << first.out;
  struct Resume {
    const char* name;
    std::string cmd;
  };
  const Resume resumes[] = {{"tp1_one_rank", kZt + flags},
                            {"tp4_four_ranks", kZt + " launch -n 4 -- " + kZt + flags + " --tp 4"}};
  for (const auto& r : resumes) {
    SCOPED_TRACE(r.name);
    expect_resumed_losses(run(r.cmd + " --steps 6 --load " + dir.string()), want,
                          std::string("[tp ckpt cli] ") + r.name + " (uninterrupted: --tp 2)");
  }
  // convert joins the tp shards into the whole parameters (Hugging Face names).
  const fs::path hf = dir.string() + "_hf", out = hf / "model.safetensors";
  const CmdResult conv = run(kZt + " convert " + dir.string() + " " + out.string());
  EXPECT_EQ(conv.rc, 0) << conv.out;
  EXPECT_TRUE(fs::exists(out)) << conv.out;
  zt::ckpt::remove_tree(dir.string());
  zt::ckpt::remove_tree(hf.string());
  fs::remove(cfg);
}

// [Pipeline Checkpoints]: `train --pp 2 --save` (2 ranks) writes one checkpoint of the whole
// GPT-2, which `--load` continues without --pp on 1 rank, at --pp 2 (the same layout), and
// at --pp 4 on 4 ranks (dp 1 everywhere: every run reads the same windows): the printed
// losses of steps 4-6 equal the uninterrupted --pp 2 run's within 1e-5 (the printed 6
// decimals; the library's tests, tests/dist/test_pipeline_checkpoint.cpp, find them equal).
// A checkpoint of the non-pipelined run on 1 rank continues at --pp 2 the same way. The
// save run's --summary lists the save and --metrics has one line per step.
TEST(ParallelCli, TrainPipelineCheckpointLoadsAtAnotherPp) {
  const fs::path cfg = write_config("pp_ckpt", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  const std::string tag = std::to_string(::getpid());
  const fs::path dir = fs::temp_directory_path() / ("zt_pp_ckpt_" + tag), plain = fs::temp_directory_path() / ("zt_pp_ckpt_plain_" + tag);
  const fs::path summary = fs::temp_directory_path() / ("zt_pp_ckpt_summary_" + tag + ".jsonl");
  const fs::path metrics = fs::temp_directory_path() / ("zt_pp_ckpt_metrics_" + tag + ".jsonl");
  for (const auto& d : {dir, plain}) zt::ckpt::remove_tree(d.string());
  fs::remove(summary);
  fs::remove(metrics);
  const std::string flags = " train --config " + cfg.string() +
                            " --model gpt2-tiny --device cpu --warmup 1 --seq 32 --print-every 1 --data " +
                            std::string(ZT_SOURCE_DIR) + "/README.md";
  const std::string pp2 = kZt + " launch -n 2 -- " + kZt + flags + " --pp 2";
  const CmdResult straight = run(pp2 + " --steps 6");
  ASSERT_EQ(straight.rc, 0) << straight.out;
  const auto want = train_printed_losses(straight.out, 6);
  ASSERT_EQ(want.size(), 6u) << straight.out;
  const CmdResult first =
      run(pp2 + " --steps 3 --save " + dir.string() + " --summary " + summary.string() + " --metrics " + metrics.string());
  ASSERT_EQ(first.rc, 0) << first.out;
  EXPECT_TRUE(contains(first.out, "saved checkpoint 'global_step3'")) << first.out;
  {
    std::ifstream f(summary);
    std::string line;
    ASSERT_TRUE(static_cast<bool>(std::getline(f, line))) << summary;
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("pp").get<int>(), 2);
    EXPECT_EQ(j.at("checkpoint_saves").size(), 1u) << line;
    EXPECT_EQ(j.at("checkpoint_saves")[0].at("step").get<int>(), 3) << line;
    std::ifstream m(metrics);
    int lines = 0;
    while (std::getline(m, line)) lines += nlohmann::json::parse(line).contains("stage_timing") ? 1 : 0;
    EXPECT_EQ(lines, 3);
  }
  struct Resume {
    const char* name;
    std::string cmd;
    fs::path from;
  };
  std::vector<Resume> resumes = {{"pp1_one_rank", kZt + flags, dir}, {"pp2_two_ranks", pp2, dir},
                                 {"pp4_four_ranks", kZt + " launch -n 4 -- " + kZt + flags + " --pp 4", dir}};
  // The non-pipelined run's checkpoint, continued at --pp 2.
  const CmdResult one = run(kZt + flags + " --steps 3 --save " + plain.string());
  ASSERT_EQ(one.rc, 0) << one.out;
  resumes.push_back({"from_pp1_to_pp2", pp2, plain});
  for (const auto& r : resumes) {
    SCOPED_TRACE(r.name);
    expect_resumed_losses(run(r.cmd + " --steps 6 --load " + r.from.string()), want,
                          std::string("[pp ckpt cli] ") + r.name + " (uninterrupted: --pp 2)");
  }
  for (const auto& d : {dir, plain}) zt::ckpt::remove_tree(d.string());
  fs::remove(summary);
  fs::remove(metrics);
  fs::remove(cfg);
}

// Tensor x pipeline checkpoints (issues 19, 26): `launch -n 4 train --tp 2 --pp 2 --save D
// --steps 3` (gpt2-tiny, 4 micro-batches of 2 per step, dp 1), then `launch -n 4 train --load
// D --steps 6` without --tp/--pp (dp 4, gradient_accumulation_steps 1: the same 8 windows per
// step, [Resume Data Position] in src/cli/train.cpp) and at --tp 2 (dp 2, 2 micro-batches)
// print the uninterrupted --tp 2 --pp 2 run's losses of steps 4-6 within 1e-5. At dp 4 the
// plain path prints each rank's own loss (ZT_LOG_RANKS=all): their mean is the batch's.
// --summary of the --pp run has peak_gib_per_stage and peak_gib (null on CPU).
TEST(ParallelCli, TrainTensorPipelineCheckpointLoadsAtDp4) {
  const fs::path cfg = write_config("tpxpp_ckpt", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  const std::string tag = std::to_string(::getpid());
  const fs::path dir = fs::temp_directory_path() / ("zt_tpxpp_ckpt_" + tag);
  const fs::path summary = fs::temp_directory_path() / ("zt_tpxpp_ckpt_summary_" + tag + ".jsonl");
  zt::ckpt::remove_tree(dir.string());
  fs::remove(summary);
  const std::string flags = " train --config " + cfg.string() +
                            " --model gpt2-tiny --device cpu --warmup 1 --seq 32 --print-every 1 --data " +
                            std::string(ZT_SOURCE_DIR) + "/README.md";
  const std::string four = kZt + " launch -n 4 -- " + kZt + flags;
  const CmdResult straight = run(four + " --tp 2 --pp 2 --steps 6");
  ASSERT_EQ(straight.rc, 0) << straight.out;
  const auto want = train_printed_losses(straight.out, 6);
  ASSERT_EQ(want.size(), 6u) << straight.out;
  const CmdResult first = run(four + " --tp 2 --pp 2 --steps 3 --save " + dir.string() + " --summary " + summary.string());
  ASSERT_EQ(first.rc, 0) << first.out;
  EXPECT_TRUE(contains(first.out, "saved checkpoint 'global_step3'")) << first.out;
  {
    std::ifstream f(summary);
    std::string line;
    ASSERT_TRUE(static_cast<bool>(std::getline(f, line))) << summary;
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("tp").get<int>(), 2);
    EXPECT_EQ(j.at("pp").get<int>(), 2);
    ASSERT_TRUE(j.contains("peak_gib_per_stage")) << line;
    EXPECT_TRUE(j.at("peak_gib_per_stage").is_null()) << "not measured on CPU: " << line;
    EXPECT_TRUE(j.at("peak_gib").is_null()) << line;
  }
  // dp 4, no tp or pipeline: each rank's own loss; the batch's is their mean.
  {
    const CmdResult r = run("env ZT_LOG_RANKS=all " + four + " --set gradient_accumulation_steps=1 --steps 6 --load " + dir.string());
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "resuming at step 3 of 6")) << r.out;
    const std::regex re("\\[rank ([0-3])\\] Epoch [0-9]+, Step ([4-6])/6, Loss: ([0-9.]+)");
    std::map<int, std::map<int, double>> by_step;  // step -> rank -> loss
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), re); it != std::sregex_iterator(); ++it) {
      by_step[std::stoi((*it)[2].str())][std::stoi((*it)[1].str())] = std::stod((*it)[3].str());
    }
    ASSERT_EQ(by_step.size(), 3u) << r.out;
    double worst = 0;
    for (const auto& [step, ranks] : by_step) {
      ASSERT_EQ(ranks.size(), 4u) << "step " << step << ": " << r.out;
      double mean = 0;
      for (const auto& [rk, l] : ranks) mean += l / 4;
      EXPECT_NEAR(mean, want[static_cast<size_t>(step - 1)], 1e-5) << "step " << step;
      worst = std::max(worst, std::abs(mean - want[static_cast<size_t>(step - 1)]));
    }
    std::printf("[tp x pp ckpt cli] tp2_pp2 -> dp4: steps 4-6 mean of the ranks' losses, max |diff| %.3g\n", worst);
  }
  // tp 2 x dp 2 without a pipeline (prints the dp mean).
  expect_resumed_losses(run(four + " --tp 2 --set gradient_accumulation_steps=2 --steps 6 --load " + dir.string()), want,
                        "[tp x pp ckpt cli] tp2_pp2 -> tp2_dp2");
  zt::ckpt::remove_tree(dir.string());
  fs::remove(summary);
  fs::remove(cfg);
}

// [Expert-Parallel Train]: `train --ep 2 --model gpt2-tiny-moe` (4 experts, top-2, dropless:
// the routing draws nothing) starts from ep 1's weights and equals the same run at ep 1 on
// the same ranks (so dp and each rank's data are the same) step for step: the printed loss
// is rank 0's in both, to the 6 printed decimals (tolerance 1e-5: the experts' gradient is
// summed over the ep group then scaled by 1/ep, a different order than ep 1's average;
// measured: at most 1e-6). World 4: ep 2 (expert-dp 2) at stage 2 against ep 1 (ep 4 at
// world 4 is MoEEngine.ExpertParallelTrainsLikeEpOne's). ZeRO-3 at world 2 and 4 (ep 2):
// the MoE GPT-2 built whole, then the dense part partitioned over dp and the experts over
// expert-dp, gathered per block. The model
// without --ep on one rank trains too (loss falls) and logs its aux loss.
TEST(ParallelCli, TrainExpertParallelEqualsEpOne) {
  const fs::path cfg = write_config("ep", R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  auto losses = [](const std::string& out) { return train_printed_losses(out, 5); };
  const std::string flags = " train --config " + cfg.string() +
                            " --model gpt2-tiny-moe --device cpu --steps 5 --warmup 1 --seq 32 --print-every 1 --data " +
                            std::string(ZT_SOURCE_DIR) + "/README.md";
  {
    SCOPED_TRACE("one rank, no --ep");
    const CmdResult one = run(kZt + flags);
    ASSERT_EQ(one.rc, 0) << one.out;
    const auto l = losses(one.out);
    ASSERT_EQ(l.size(), 5u) << one.out;
    EXPECT_LT(l.back(), l.front() - 0.3) << "it trains";
    EXPECT_TRUE(contains(one.out, "moe aux ")) << one.out;
    // --moe-experts 4 on gpt2-tiny is gpt2-tiny-moe (the same losses); the other --moe-*
    // flags act: capacity 0.5 of top-1 over 2 experts drops half of the tokens at step 1.
    const std::string plain = " train --config " + cfg.string() +
                              " --model gpt2-tiny --device cpu --steps 5 --warmup 1 --seq 32 --print-every 1 --data " +
                              std::string(ZT_SOURCE_DIR) + "/README.md";
    const CmdResult flagged = run(kZt + plain + " --moe-experts 4");
    ASSERT_EQ(flagged.rc, 0) << flagged.out;
    EXPECT_EQ(losses(flagged.out), l);
    const CmdResult drops = run(kZt + plain + " --moe-experts 2 --moe-k 1 --moe-every 1 --moe-capacity-factor 0.5 "
                                              "--moe-aux-coef 0.1");
    ASSERT_EQ(drops.rc, 0) << drops.out;
    EXPECT_TRUE(contains(drops.out, "Step 1/5, Loss: ")) << drops.out;
    EXPECT_TRUE(contains(drops.out, "dropped 0.500")) << drops.out;
    EXPECT_NE(losses(drops.out), l);
    // A --moe-* flag on a model without experts, or on Llama: named.
    CmdResult r = run(kZt + plain + " --moe-k 1");
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "gpt2-tiny has none: add --moe-experts N")) << r.out;
    r = run(kZt + plain + " --moe-experts 2 --model llama-tiny");
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "a Llama's experts come from its config.json")) << r.out;
  }
  struct Case {
    const char* name;
    int ranks;
    const char* flags;  // both runs'
    int ep;
  };
  const Case cases[] = {
      {"world2_ep2_stage1", 2, "", 2},
      {"world4_ep2_expert_dp2_stage2", 4, " --set zero_optimization.stage=2", 2},
      // ZeRO-3: dense part over dp, experts over expert-dp, both gathered per block.
      {"world2_ep2_stage3", 2, " --set zero_optimization.stage=3", 2},
      {"world4_ep2_expert_dp2_stage3", 4, " --set zero_optimization.stage=3", 2},
      // [Checkpointed Aux]: the MoE blocks recomputed in backward, the aux loss kept.
      {"world2_ep2_stage3_checkpointing", 2, " --set zero_optimization.stage=3 --checkpoint-activations", 2},
  };
  std::map<std::string, std::vector<double>> reference;  // ep 1, by ranks + flags
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string launch = kZt + " launch -n " + std::to_string(c.ranks) + " -- " + kZt + flags + c.flags;
    const std::string key = std::to_string(c.ranks) + c.flags;
    if (!reference.count(key)) {
      const CmdResult one = run(launch);
      ASSERT_EQ(one.rc, 0) << one.out;
      reference[key] = losses(one.out);
    }
    const CmdResult ep = run(launch + " --ep " + std::to_string(c.ep));
    ASSERT_EQ(ep.rc, 0) << ep.out;
    EXPECT_TRUE(contains(ep.out, "expert parallelism: the experts of gpt2-tiny-moe split over ep " +
                                     std::to_string(c.ep) + ", expert-dp " + std::to_string(c.ranks / c.ep)))
        << ep.out;
    const auto& want = reference[key];
    const auto got = losses(ep.out);
    ASSERT_EQ(want.size(), 5u);
    ASSERT_EQ(got.size(), 5u) << ep.out;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "step " << i + 1;
    EXPECT_LT(got.back(), got.front() - 0.3) << "it trains";
  }
  fs::remove(cfg);
}

// [TP Activation Checkpointing]: `train --tp 2 --model llama-tiny --checkpoint-activations`
// with partition_activations and cpu_checkpointing in the config trains to the losses of
// the same run without checkpointing (recompute runs the same kernels on the same values:
// equal to the printed 6 decimals), and says what the keys do; profile prints its line.
TEST(ParallelCli, TrainTensorParallelCheckpointingEqualsWithout) {
  const std::string common = R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1})";
  const fs::path plain = write_config("tp_ckpt_plain", common + "}");
  const fs::path part = write_config("tp_ckpt_part", common + R"(, "activation_checkpointing": {
      "partition_activations": true, "cpu_checkpointing": true, "synchronize_checkpoint_boundary": true,
      "profile": true}})");
  auto losses = [](const std::string& out) { return train_printed_losses(out, 3); };
  const std::string flags = " --model llama-tiny --device cpu --steps 3 --warmup 1 --seq 32 --print-every 1 --tp 2 "
                            "--data " + std::string(ZT_SOURCE_DIR) + "/README.md";
  const std::string launch2 = kZt + " launch -n 2 -- " + kZt + " train --config ";
  const CmdResult without = run(launch2 + plain.string() + flags);
  ASSERT_EQ(without.rc, 0) << without.out;
  const CmdResult with = run(launch2 + part.string() + flags + " --checkpoint-activations");
  ASSERT_EQ(with.rc, 0) << with.out;
  EXPECT_TRUE(contains(with.out, "partition_activations: each tp rank keeps 1/2 of every checkpointed layer input"))
      << with.out;
  EXPECT_TRUE(contains(with.out, "synchronize_checkpoint_boundary: on the CPU")) << with.out;
  EXPECT_TRUE(contains(with.out, "activation checkpointing profile (ms, forward/restore/recompute): L0 ")) << with.out;
  const auto a = losses(without.out), b = losses(with.out);
  ASSERT_EQ(a.size(), 3u) << without.out;
  ASSERT_EQ(b.size(), 3u) << with.out;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-6) << "step " << i + 1;
  // Without tp the keys that need it are refused with the fix.
  const CmdResult one = run(kZt + " train --config " + part.string() + kTiny);
  EXPECT_NE(one.rc, 0) << one.out;
  EXPECT_TRUE(contains(one.out, "it takes effect with tensor parallelism only")) << one.out;
  fs::remove(plain);
  fs::remove(part);
}

// [Expert Checkpoints]: `train --ep 2 --save` stores the experts by global index; `--load`
// continues without --ep (ep 1) on the same 2 ranks (dp 2 both times, so every rank reads
// the same windows): the printed losses of steps 4-6 equal the uninterrupted ep-1 run's
// (1e-5 on the printed 6 decimals: the experts' gradient sums in another order at ep 2,
// as in ParallelCli.TrainExpertParallelEqualsEpOne). AdamW, ZeRO 1: the experts' optimizer
// state was sharded over expert-dp and is read back by global name. `convert --raw` reads
// the checkpoint as any other.
TEST(ParallelCli, TrainExpertParallelCheckpointResumesAtEpOne) {
  const fs::path cfg = write_config("ep_ckpt", R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})");
  const fs::path dir = fs::temp_directory_path() / ("zt_ep_ckpt_" + std::to_string(::getpid()));
  zt::ckpt::remove_tree(dir.string());  // not fs::remove_all: see ckpt/fs.h
  const std::string two = kZt + " launch -n 2 -- " + kZt + " train --config " + cfg.string() +
                          " --model gpt2-tiny-moe --device cpu --warmup 1 --seq 32 --print-every 1 --data " +
                          std::string(ZT_SOURCE_DIR) + "/README.md";
  const CmdResult straight = run(two + " --steps 6");
  ASSERT_EQ(straight.rc, 0) << straight.out;
  const auto want = train_printed_losses(straight.out, 6);
  ASSERT_EQ(want.size(), 6u) << straight.out;
  const CmdResult first = run(two + " --ep 2 --steps 3 --save " + dir.string());
  ASSERT_EQ(first.rc, 0) << first.out;
  const auto before = train_printed_losses(first.out, 3);
  ASSERT_EQ(before.size(), 3u) << first.out;
  for (size_t i = 0; i < before.size(); ++i) EXPECT_NEAR(before[i], want[i], 1e-5) << "step " << i + 1 << " at --ep 2";
  expect_resumed_losses(run(two + " --steps 6 --load " + dir.string()), want,
                        "[ep ckpt cli] saved at --ep 2, resumed at ep 1");
  const fs::path out = dir.string() + "_raw.safetensors";
  const CmdResult conv = run(kZt + " convert " + dir.string() + " " + out.string() + " --raw");
  EXPECT_EQ(conv.rc, 0) << conv.out;
  EXPECT_TRUE(fs::exists(out)) << conv.out;
  zt::ckpt::remove_tree(dir.string());
  fs::remove(out);
  fs::remove(cfg);
}

TEST(ParallelCli, CheckConfigShowsTheDegrees) {
  const fs::path cfg = write_config("check", R"({"train_micro_batch_size_per_gpu": 2,
      "tensor_parallel": {"autotp_size": 2}})");
  const CmdResult r = run(kZt + " check-config " + cfg.string() + " --world 4");
  EXPECT_EQ(r.rc, 0) << r.out;  // train --tp takes it
  EXPECT_TRUE(contains(r.out, "OK: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "parallel: dp 2 x tp 2 x pp 1 = 4 ranks, ep 1")) << r.out;
  EXPECT_TRUE(contains(r.out, "train_batch_size 4 = train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 1 "
                              "x data-parallel ranks 2"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "\"autotp_size\": 2")) << r.out;
  // tp and pp together train takes too (ParallelCli.TrainTensorPipelineEqualsOneRank).
  const fs::path both = write_config("check_both", R"({"train_micro_batch_size_per_gpu": 2,
      "tensor_parallel": {"autotp_size": 2}, "pipeline": {"stages": 2}})");
  const CmdResult rb = run(kZt + " check-config " + both.string() + " --world 8");
  EXPECT_EQ(rb.rc, 0) << rb.out;
  EXPECT_TRUE(contains(rb.out, "parallel: dp 2 x tp 2 x pp 2 = 8 ranks, ep 1")) << rb.out;
  fs::remove(cfg);
  fs::remove(both);
}

}  // namespace

}  // namespace zt_test_parallel_config
