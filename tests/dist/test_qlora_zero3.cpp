// QLoRA's NF4 base partitioned by ZeRO-3 ([NF4 At ZeRO-3] in src/lora/qlora.h), on real ranks
// (1, 2 and 4): the tiny QLoRA Llama (tests/support/tiny_llama.h) with NF4 bases on all seven
// projections trains at ZeRO-3 with its NF4 storage handed to the engine
// (lora::partition_nf4_bases) exactly as with the NF4 whole on every rank (the bytes are the
// same, only where they live differs, so the math is bit for bit the same: losses, gradient
// norms and adapters compared with ==); each rank holds the partition formula's share of the
// NF4 bytes; with activation checkpointing the recompute gathers the NF4 again (released
// after forward, so a missing gather is an error); an adapter checkpoint saved and loaded
// at ZeRO-3 resumes bit for bit; the storage is refused below stage 3.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/qlora.h"
#include "models/llama.h"
#include "models/llama_engine.h"
#include "support/dist_util.h"
#include "support/tiny_llama.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt_test_qlora_zero3 {

namespace {

constexpr int64_t kQzMicro = 2, kQzSeq = 16;
constexpr int kQzSteps = 3;

struct QzModel {
  zt::models::LlamaForCausalLM llama{nullptr};
  std::shared_ptr<zt::lora::LoraModel> lm;
  int64_t nf4_bytes = 0;
};

// The same base (seed 3) and adapters (seed 4) on every rank; NF4 on all seven kinds.
QzModel qz_build(bool checkpointing) {
  QzModel m;
  torch::manual_seed(3);
  m.llama = zt::models::LlamaForCausalLM(zt_test::tiny_qlora_llama_config());
  m.llama->set_activation_checkpointing(checkpointing);
  zt::lora::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  torch::manual_seed(4);
  const auto space = zt::lora::lora_space(*m.llama);
  m.lm = std::make_shared<zt::lora::LoraModel>(zt::lora::apply_lora(*m.llama, space.sites, o));
  m.nf4_bytes = zt::lora::quantize_lora_bases(*m.lm);
  return m;
}

struct QzRun {
  std::vector<double> losses, grad_norms;
  std::vector<torch::Tensor> adapters;  // fp32 masters after the steps
  zt::ModelStateBytes bytes;
  int64_t frozen_peak = 0;              // last step's most frozen bytes gathered at once
  int64_t nf4_whole_after_forward = 0;  // NF4 bytes whole in the model right after a forward
  int64_t nf4_whole_between_steps = 0;  // ... and after the last step
};

nlohmann::json qz_config(int stage) {
  return {
      {"train_micro_batch_size_per_gpu", kQzMicro},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      // Lean: no prefetch, no keep between a unit's forward and its backward, nothing
      // persistent, so every decoder layer's NF4 is gathered and released around each use.
      {"zero_optimization",
       {{"stage", stage}, {"reduce_bucket_size", 3000}, {"stage3_prefetch_bucket_size", 0},
        {"stage3_max_reuse_distance", 0}, {"stage3_param_persistence_threshold", 0}}},
  };
}

std::unique_ptr<zt::Engine> qz_engine(QzModel& m, int stage, bool partition) {
  auto cfg = zt::Config::from_json(qz_config(stage), zt::comm::world_group()->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  zt::models::llama_engine_options(m.llama, o);  // units: the decoder layers (adapters inside)
  o.param_shape = nullptr;
  o.param_init = nullptr;
  if (partition) EXPECT_EQ(zt::lora::partition_nf4_bases(*m.lm, o), m.nf4_bytes);
  auto engine = zt::initialize(m.llama.ptr(), cfg, o);
  zt::models::attach_llama_engine(*m.llama, *engine);
  return engine;
}

// NF4 bytes whole in the model now (adapters whose NF4 can be read without a gather).
int64_t qz_whole_nf4(const QzModel& m) {
  int64_t n = 0;
  for (const auto& a : m.lm->adapters) {
    auto q = std::dynamic_pointer_cast<zt::lora::QLoraAdapterImpl>(a.adapter.ptr());
    if (!q->storage_shared()) {
      n += q->nf4_bytes();
    } else {
      try {
        (void)q->nf4();
        n += q->nf4_bytes();
      } catch (const zt::ConfigError&) {
        // partitioned and not gathered
      }
    }
  }
  return n;
}

// Steps [first, last) on the fixed batch stream (step s draws from seed 100 + s).
void qz_steps(zt::Engine& e, QzModel& m, int first, int last, QzRun& r) {
  const int world = zt::comm::world_group()->size(), rank = zt::comm::world_group()->rank();
  const int64_t vocab = m.llama->config().vocab_size;
  for (int s = first; s < last; ++s) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(100 + s);
    auto idx = at::randint(0, vocab, {kQzMicro * world, kQzSeq + 1}, g);
    auto x = idx.narrow(0, rank * kQzMicro, kQzMicro).narrow(1, 0, kQzSeq).contiguous();
    auto y = idx.narrow(0, rank * kQzMicro, kQzMicro).narrow(1, 1, kQzSeq).contiguous();
    auto loss = e.forward([&] { return m.llama->loss(x, y); });
    r.nf4_whole_after_forward = std::max(r.nf4_whole_after_forward, qz_whole_nf4(m));
    e.backward(loss);
    e.step();
    r.losses.push_back(e.last_report().loss);
    r.grad_norms.push_back(e.last_report().grad_norm);
    r.frozen_peak = e.last_report().frozen_gathered_peak_bytes;
  }
  r.nf4_whole_between_steps = qz_whole_nf4(m);
  r.adapters = e.gather_master_params();
  r.bytes = e.model_state_bytes();
}

QzRun qz_train(bool checkpointing, bool partition) {
  QzModel m = qz_build(checkpointing);
  auto e = qz_engine(m, 3, partition);
  QzRun r;
  qz_steps(*e, m, 0, kQzSteps, r);
  m.llama->set_layer_runner({});
  return r;
}

void qz_expect_equal(const QzRun& a, const QzRun& b, const std::string& what) {
  // Bit for bit: the same NF4 bytes dequantized by the same ops; only where they are kept
  // between uses differs.
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_EQ(a.losses[s], b.losses[s]) << what << ": loss of step " << s;
    EXPECT_EQ(a.grad_norms[s], b.grad_norms[s]) << what << ": gradient norm of step " << s;
  }
  ASSERT_EQ(a.adapters.size(), b.adapters.size()) << what;
  for (size_t i = 0; i < a.adapters.size(); ++i)
    EXPECT_TRUE(torch::equal(a.adapters[i], b.adapters[i])) << what << ": adapter tensor " << i;
}

// Each rank's NF4 bytes by the partition formula: per unit (decoder layer) the sizes of its
// adapters' storage (absmax2 x 4 + packed + qabsmax, rounded up to 4) summed, padded to a
// multiple of 64 x world, over world.
int64_t qz_nf4_per_rank(const QzModel& m, int world) {
  std::map<std::string, int64_t> unit_bytes;
  for (const auto& a : m.lm->adapters) {
    auto q = std::dynamic_pointer_cast<zt::lora::QLoraAdapterImpl>(a.adapter.ptr());
    const auto n = q->nf4();
    const int64_t used = 4 * n.absmax2.numel() + n.packed.numel() + n.qabsmax.numel();
    const std::string layer = a.site.path.substr(0, a.site.path.find(".self_attn") == std::string::npos
                                                        ? a.site.path.find(".mlp")
                                                        : a.site.path.find(".self_attn"));
    unit_bytes[layer] += (used + 3) / 4 * 4;
  }
  int64_t per_rank = 0;
  const int64_t pad = 64 * world;
  for (const auto& [layer, b] : unit_bytes) per_rank += (b + pad - 1) / pad * pad / world;
  EXPECT_EQ(static_cast<int64_t>(unit_bytes.size()), m.llama->config().num_hidden_layers);
  return per_rank;
}

class QLoraZero3 : public ::testing::TestWithParam<bool> {};

TEST_P(QLoraZero3, PartitionedNf4EqualsTheWholeBaseAndHoldsItsShare) {
  const bool checkpointing = GetParam();
  const int world = zt::comm::world_group()->size();
  const std::string what = checkpointing ? "with activation checkpointing" : "without checkpointing";
  const QzRun whole = qz_train(checkpointing, /*partition=*/false);
  const QzRun part = qz_train(checkpointing, /*partition=*/true);
  EXPECT_LT(whole.losses.back(), whole.losses.front()) << what << ": it trains";
  qz_expect_equal(whole, part, what);

  const QzModel ref = qz_build(false);
  const int64_t expect = qz_nf4_per_rank(ref, world);
  // The whole-base run keeps the NF4 in the model on every rank; the engine holds none.
  EXPECT_EQ(whole.bytes.frozen_storage, 0) << what;
  EXPECT_EQ(whole.nf4_whole_between_steps, ref.nf4_bytes) << what;
  // Partitioned: exactly the formula's share on this rank (about nf4 / world), nothing
  // whole between steps nor right after forward (every layer released: the backward, and
  // with checkpointing the recompute, gathered it again, or it would have thrown).
  EXPECT_EQ(part.bytes.frozen_storage, expect) << what;
  EXPECT_LE(part.bytes.frozen_storage, ref.nf4_bytes / world + 64 * ref.llama->config().num_hidden_layers) << what;
  EXPECT_GE(part.bytes.frozen_storage * world, ref.nf4_bytes - 4 * static_cast<int64_t>(ref.lm->adapters.size()))
      << what << ": the shards hold every NF4 byte (the offsets are floats kept by each adapter)";
  EXPECT_EQ(part.nf4_whole_between_steps, 0) << what;
  // Right after forward only the last layer's NF4 is gathered (its backward comes next:
  // within stage3_max_reuse_distance 0); every other layer's was released, so its backward
  // (and with checkpointing its recompute) gathered it again, or nf4() would have thrown.
  const std::string last = "model.layers." + std::to_string(ref.llama->config().num_hidden_layers - 1) + ".";
  int64_t last_layer = 0;
  for (const auto& a : ref.lm->adapters) {
    if (a.site.path.rfind(last, 0) == 0) last_layer += std::dynamic_pointer_cast<zt::lora::QLoraAdapterImpl>(a.adapter.ptr())->nf4_bytes();
  }
  EXPECT_GT(last_layer, 0);
  EXPECT_EQ(part.nf4_whole_after_forward, last_layer) << what;
  EXPECT_EQ(whole.nf4_whole_after_forward, ref.nf4_bytes) << what;
  // The most frozen bytes gathered at once: the NF4 of at most two layers (plus the
  // partitioned bf16/fp32 base's), not the whole NF4.
  EXPECT_GT(part.frozen_peak - whole.frozen_peak, 0) << what;
  EXPECT_LT(part.frozen_peak - whole.frozen_peak, ref.nf4_bytes) << what;
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, QLoraZero3, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Recompute" : "Plain"; });

// The checkpoint holds the adapters (and their optimizer state) only: saved at ZeRO-3 with
// the NF4 partitioned, loaded into a fresh partitioned model, the next step is bit for bit
// the uninterrupted run's.
TEST(QLoraZero3Checkpoint, AdapterCheckpointResumesBitForBit) {
  auto group = zt::comm::world_group();
  zt::test_support::SharedTempDir dir(group, "qlora_zero3_ckpt");
  QzRun straight;
  {
    QzModel m = qz_build(false);
    auto e = qz_engine(m, 3, true);
    qz_steps(*e, m, 0, 2, straight);
    e->save_checkpoint(dir.path, "two");
    e->wait_checkpoint();
    qz_steps(*e, m, 2, 3, straight);
    m.llama->set_layer_runner({});
  }
  QzRun resumed;
  {
    QzModel m = qz_build(false);
    auto e = qz_engine(m, 3, true);
    e->load_checkpoint(dir.path, "two");
    EXPECT_EQ(e->global_steps(), 2);
    qz_steps(*e, m, 2, 3, resumed);
    m.llama->set_layer_runner({});
  }
  ASSERT_EQ(straight.losses.size(), 3u);
  ASSERT_EQ(resumed.losses.size(), 1u);
  EXPECT_EQ(resumed.losses[0], straight.losses[2]);
  ASSERT_EQ(resumed.adapters.size(), straight.adapters.size());
  for (size_t i = 0; i < straight.adapters.size(); ++i)
    EXPECT_TRUE(torch::equal(resumed.adapters[i], straight.adapters[i])) << "adapter tensor " << i;
}

// Below stage 3 the engine keeps no shard group for it: handing the NF4 over is an error,
// not ignored.
TEST(QLoraZero3Errors, FrozenStorageBelowStage3IsRefused) {
  QzModel m = qz_build(false);
  auto cfg = zt::Config::from_json(qz_config(2), zt::comm::world_group()->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  zt::lora::partition_nf4_bases(*m.lm, o);
  try {
    auto e = zt::initialize(m.llama.ptr(), cfg, o);
    ADD_FAILURE() << "frozen_storage at stage 2 was accepted";
  } catch (const zt::ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("EngineOptions.frozen_storage"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("stage 3 only"), std::string::npos) << err.what();
  }
}

}  // namespace

}  // namespace zt_test_qlora_zero3
