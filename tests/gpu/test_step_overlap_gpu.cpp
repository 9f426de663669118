// [Step Overlap] (src/zero/step_overlap.h): the fused Adam step on a side stream, in forward
// order, with the next forward waiting per unit. The same kernels update every element in
// the same order as on the compute stream, so training with ZT_STEP_OVERLAP on and off must
// give the same losses and the same weights bit for bit: a Llama (tied embedding and head,
// units through Engine::run_unit) and a GPT-2 (units through the engine's unit hooks), bf16
// with gradient clipping, ZeRO-0 and ZeRO-2 on one rank, with and without activation
// checkpointing and gradient accumulation. Each overlapped run must report unit waits (the
// forward of steps 2.. waited for the previous step's units), so the comparison cannot pass
// with the overlap silently off. Deterministic algorithms are on (warn only) for every run,
// and a case is skipped, saying why, when two runs without the overlap already differ.
//
//   build/zt_gpu --gtest_filter='*StepOverlapGpu*'
//
// Skipped without a CUDA build, a GPU or zerotrain's kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/fused_adam.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/llama_engine.h"
#include "support/gpu_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt::models {
namespace test_step_overlap_gpu {
namespace {

struct Case {
  const char* name;
  bool llama;
  int stage;
  bool ckpt;
  int gas;
};

struct Trained {
  std::vector<double> losses;
  std::vector<int64_t> waits;  // step_overlap_unit_waits per step (-1: not reported)
  std::vector<torch::Tensor> master, params;
};

nlohmann::json config(int stage, int gas) {
  return {
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", gas},
      {"gradient_clipping", 0.05},  // small: the clip coefficient is < 1 at every step
      {"steps_per_print", 1000},
      {"bf16", {{"enabled", true}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
      // Small buckets: units and padding across several buckets.
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 20000}, {"overlap_comm", true}}},
  };
}

bool same(const Trained& a, const Trained& b) {
  if (a.losses != b.losses || a.master.size() != b.master.size() || a.params.size() != b.params.size()) return false;
  for (size_t i = 0; i < a.master.size(); ++i) {
    if (!torch::equal(a.master[i], b.master[i])) return false;
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    if (!torch::equal(a.params[i], b.params[i])) return false;
  }
  return true;
}

Trained train(const Case& c, bool overlap) {
  setenv("ZT_STEP_OVERLAP", overlap ? "1" : "0", 1);
  // Deterministic kernels where ATen has them (flash attention's backward accumulates dQ
  // in a fixed order then): two runs must be comparable bit for bit.
  const bool was_deterministic = at::globalContext().deterministicAlgorithms();
  const bool was_warn_only = at::globalContext().deterministicAlgorithmsWarnOnly();
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  const auto dev = test_support::rank_device();
  auto cfg = Config::from_json(config(c.stage, c.gas), comm::world_group()->size());
  torch::manual_seed(7);
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss_fn;
  EngineOptions eo;
  eo.device = dev;
  eo.print = false;
  LlamaForCausalLM llama{nullptr};
  GPT2 gpt{nullptr};
  if (c.llama) {
    LlamaConfig lc = named_llama("llama-tiny");
    lc.num_hidden_layers = 3;
    lc.tie_word_embeddings = true;  // as Llama-3.2-1B: the embedding is the head too
    llama = LlamaForCausalLM(lc);
    if (c.ckpt) llama->set_activation_checkpointing(true);
    llama_engine_options(llama, eo);
    module = llama.ptr();
    loss_fn = [&](const torch::Tensor& x, const torch::Tensor& y) { return llama->loss(x, y); };
  } else {
    gpt = GPT2(GPT2Config{3, 2, 64, 256, 64});
    if (c.ckpt) gpt->set_activation_checkpointing(true);
    module = gpt.ptr();
    loss_fn = [&](const torch::Tensor& x, const torch::Tensor& y) { return gpt->loss(x, y); };
  }
  auto engine = initialize(module, cfg, eo);
  if (c.llama) attach_llama_engine(*llama, *engine);
  torch::manual_seed(11);
  const auto data = torch::randint(0, 256, {8 * c.gas, 2, 33}, torch::kLong);
  Trained r;
  for (int s = 0; s < 4; ++s) {
    for (int m = 0; m < c.gas; ++m) {
      const auto batch = data[(s * c.gas + m) % data.size(0)].to(dev);
      const auto x = batch.narrow(1, 0, 32), y = batch.narrow(1, 1, 32);
      auto loss = engine->forward([&] { return loss_fn(x, y); });
      engine->backward(loss);
      engine->step();
    }
  }
  for (const auto& rep : engine->take_reports(/*wait=*/true)) {
    r.losses.push_back(rep.loss);
    r.waits.push_back(rep.extra.contains("step_overlap_unit_waits") ? rep.extra["step_overlap_unit_waits"].get<int64_t>()
                                                                    : -1);
  }
  for (const auto& t : engine->gather_master_params()) r.master.push_back(t.to(torch::kCPU));
  for (const auto& t : module->parameters()) r.params.push_back(t.detach().to(torch::kCPU));
  if (c.llama) llama->set_layer_runner({});
  engine.reset();
  unsetenv("ZT_STEP_OVERLAP");
  at::globalContext().setDeterministicAlgorithms(was_deterministic, was_warn_only);
  return r;
}

class StepOverlapGpu : public ::testing::TestWithParam<Case> {};

TEST_P(StepOverlapGpu, SameLossesAndWeightsAsTheComputeStreamStep) {
#ifndef ZT_WITH_CUDA
  GTEST_SKIP() << "zerotrain was built without CUDA (ZT_WITH_CUDA off)";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!kernels::kernels_available()) GTEST_SKIP() << "built without zerotrain's CUDA kernels";
  const Case& c = GetParam();
  const Trained off = train(c, false);
  // Without reproducible training (a kernel without a deterministic path on this device),
  // no comparison of two runs means anything: say so rather than blame the overlap.
  if (!same(off, train(c, false))) GTEST_SKIP() << c.name << ": two runs without the overlap differ on this device";
  const Trained on = train(c, true);
  ASSERT_EQ(off.losses.size(), 4u);
  ASSERT_EQ(on.losses.size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_EQ(off.losses[s], on.losses[s]) << c.name << ": step " << s + 1;
    EXPECT_EQ(off.waits[s], -1) << c.name << ": the off run reported unit waits";
  }
  // Step 1's forward had no step before it; every later forward waited for each of the 3
  // units once (the first micro-step's forward: later ones find no step in flight).
  EXPECT_EQ(on.waits[0], 0) << c.name;
  for (size_t s = 1; s < 4; ++s) EXPECT_EQ(on.waits[s], 3) << c.name << ": step " << s + 1;
  ASSERT_EQ(off.master.size(), on.master.size());
  for (size_t i = 0; i < off.master.size(); ++i) {
    EXPECT_TRUE(torch::equal(off.master[i], on.master[i])) << c.name << ": fp32 master of parameter " << i;
  }
  ASSERT_EQ(off.params.size(), on.params.size());
  for (size_t i = 0; i < off.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(off.params[i], on.params[i])) << c.name << ": bf16 parameter " << i;
  }
  // Training moved the weights (the comparison is not between two untouched models).
  EXPECT_NE(on.losses[0], on.losses[3]) << c.name;
#endif
}

INSTANTIATE_TEST_SUITE_P(Cases, StepOverlapGpu,
                         ::testing::Values(Case{"llama_z0", true, 0, false, 1}, Case{"llama_z2", true, 2, false, 1},
                                           Case{"llama_z0_ckpt", true, 0, true, 1},
                                           Case{"llama_z2_ckpt_gas2", true, 2, true, 2},
                                           Case{"gpt2_z0", false, 0, false, 1}, Case{"gpt2_z2", false, 2, false, 1},
                                           Case{"gpt2_z0_ckpt_gas2", false, 0, true, 2}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace test_step_overlap_gpu
}  // namespace zt::models
