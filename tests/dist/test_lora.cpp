// LoRA through zt::initialize on real ranks (world 1, 2 and 4): Llama and GPT-2 with
// adapters train at ZeRO stages 0-3 (stage 3 also with activation checkpointing) and
// follow stage 0 step for step; only the adapters are the engine's (optimizer state and
// master weights for them alone); the frozen base is bit-for-bit unchanged after the
// steps; the trained adapter saved in peft's format loads into a fresh base with the same
// logits, and merging it (W + scaling * B A) gives them too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/peft_format.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/llama_engine.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt_test_lora {

namespace {

constexpr int64_t kMicro = 2, kSeq = 16, kVocab = 96;
constexpr int kSteps = 4;

struct Built {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  std::function<torch::Tensor(const torch::Tensor&)> logits;
  zt::models::LlamaForCausalLM llama{nullptr};
  zt::lora::LoraTargetSpace space;
};

// The same base on every rank (seed 5); adapters drawn after it (seed 6).
Built build(const std::string& family, bool checkpointing) {
  Built b;
  torch::manual_seed(5);
  if (family == "llama") {
    auto c = zt::models::named_llama("llama-tiny");
    c.hidden_size = 64;
    c.head_dim = 16;
    c.intermediate_size = 96;
    c.vocab_size = kVocab;
    c.max_position_embeddings = 32;
    zt::models::LlamaForCausalLM m(c);
    m->set_activation_checkpointing(checkpointing);
    b.module = m.ptr();
    b.loss = [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); };
    b.logits = [p = m.ptr()](const torch::Tensor& x) { return p->forward(x); };
    b.llama = m;
    b.space = zt::lora::lora_space(*m);
  } else {
    auto c = zt::models::named_gpt2("gpt2-tiny");
    c.n_embd = 64;
    c.vocab_size = kVocab;
    c.n_positions = 32;
    zt::models::GPT2 m(c);
    m->set_activation_checkpointing(checkpointing);
    b.module = m.ptr();
    b.loss = [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); };
    b.logits = [p = m.ptr()](const torch::Tensor& x) { return p->forward(x); };
    b.space = zt::lora::lora_space(*m);
  }
  return b;
}

zt::lora::LoraOptions options(const std::string& family) {
  zt::lora::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.target_modules = family == "llama" ? std::vector<std::string>{"q_proj", "v_proj", "o_proj", "down_proj"}
                                       : std::vector<std::string>{"c_attn", "c_fc", "c_proj"};
  return o;
}

torch::Tensor eval_ids() {
  auto g = at::make_generator<at::CPUGeneratorImpl>(77);
  return at::randint(0, kVocab, {2, kSeq}, g);
}

struct LoraRun {
  std::vector<torch::Tensor> adapters;  // fp32 master, full, after kSteps
  std::vector<double> losses;
  int64_t frozen_changed = 0;           // frozen parameters not bit-equal to their start
  int64_t frozen_numel = 0, trainable = 0;
  zt::ModelStateBytes bytes;            // this rank's
  int64_t frozen_peak = 0;              // stage 3: most frozen bytes gathered at once in the last step
  torch::Tensor logits;                 // eval logits of the trained model (full)
};

// adapter_dir non-empty: rank 0 saves the trained adapter there in peft's format.
// lean (stage 3): no prefetch and no reuse of a unit between its forward and backward, so
// that units come and go (with the default window this tiny model is gathered whole).
LoraRun train(const std::string& family, int stage, bool checkpointing, const std::string& adapter_dir = "",
              bool lean = false) {
  auto group = zt::comm::world_group();
  const int world = group->size(), rank = group->rank();
  Built b = build(family, checkpointing);
  std::vector<torch::Tensor> frozen_start;
  for (const auto& p : b.module->parameters()) frozen_start.push_back(p.detach().clone());
  torch::manual_seed(6);
  const auto lm = zt::lora::apply_lora(*b.module, b.space.sites, options(family));
  const int64_t trainable = lm.trainable_params();  // full sizes: ZeRO-3 partitions them below
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", stage}, {"reduce_bucket_size", 3000}, {"stage3_prefetch_bucket_size", lean ? 0 : 1e6},
        {"stage3_max_reuse_distance", lean ? 0 : 1e9}, {"stage3_param_persistence_threshold", 0}}},
  };
  auto cfg = zt::Config::from_json(j, world);
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  if (b.llama) {
    zt::models::llama_engine_options(b.llama, o);  // units: the decoder layers (adapters inside)
    o.param_shape = nullptr;  // the base is whole: no placeholders to fill
    o.param_init = nullptr;
  }
  auto engine = zt::initialize(b.module, cfg, o);
  if (b.llama) zt::models::attach_llama_engine(*b.llama, *engine);
  LoraRun r;
  r.trainable = trainable;
  for (int s = 0; s < kSteps; ++s) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(99);  // one batch, so the loss must fall
    auto idx = at::randint(0, kVocab, {kMicro * world, kSeq + 1}, g);
    auto x = idx.narrow(0, rank * kMicro, kMicro).narrow(1, 0, kSeq).contiguous();
    auto y = idx.narrow(0, rank * kMicro, kMicro).narrow(1, 1, kSeq).contiguous();
    auto loss = engine->forward([&] { return b.loss(x, y); });
    engine->backward(loss);
    engine->step();
    r.losses.push_back(engine->last_report().loss);
    r.frozen_peak = engine->last_report().frozen_gathered_peak_bytes;
  }
  r.adapters = engine->gather_master_params();
  r.bytes = engine->model_state_bytes();
  // Between steps at stage 3 the frozen base is partitioned too ([Frozen Units]): every
  // parameter of the model is an empty placeholder until gathered.
  if (stage == 3) {
    int64_t whole = 0;
    for (const auto& p : b.module->parameters()) whole += p.numel();
    EXPECT_EQ(whole, 0) << "stage 3: the base and the adapters are partitioned between steps";
  }
  engine->gather_params();  // ZeRO-3: the base and the adapters whole for the checks, the evaluation and the save
  // The frozen base: never changed by the engine (same dtype here: fp32).
  const auto params = b.module->parameters();
  size_t k = 0;  // the frozen parameters keep their order; the adapters come in between
  for (const auto& p : params) {
    if (p.requires_grad()) continue;
    EXPECT_LT(k, frozen_start.size());
    if (k >= frozen_start.size()) break;
    r.frozen_numel += p.numel();
    if (p.sizes() != frozen_start[k].sizes() || !torch::equal(p.detach(), frozen_start[k])) ++r.frozen_changed;
    ++k;
  }
  EXPECT_EQ(k, frozen_start.size());
  b.module->eval();
  {
    torch::NoGradGuard ng;
    r.logits = b.logits(eval_ids()).detach().clone();
  }
  if (!adapter_dir.empty() && rank == 0) zt::lora::save_peft_adapter(adapter_dir, lm, b.space, "test-base");
  engine->release_params();
  if (b.llama) b.llama->set_layer_runner({});
  return r;
}

void expect_same(const LoraRun& a, const LoraRun& b, const std::string& what) {
  ASSERT_EQ(a.adapters.size(), b.adapters.size()) << what;
  // fp32 on CPU ranks: the stages differ only in the order gradients are summed; AdamW
  // normalises each step, so a ~1e-7 relative gradient difference stays ~1e-6 after 4
  // steps of lr 1e-2 (measured <= 2e-7 on the adapters).
  for (size_t i = 0; i < a.adapters.size(); ++i)
    EXPECT_LE((a.adapters[i] - b.adapters[i]).abs().max().item<double>(), 2e-5) << what << ": adapter tensor " << i;
  for (size_t s = 0; s < a.losses.size(); ++s) EXPECT_NEAR(a.losses[s], b.losses[s], 1e-5) << what << ": step " << s;
  EXPECT_LE((a.logits - b.logits).abs().max().item<double>(), 1e-4) << what << ": eval logits";
}

class LoraTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraTraining, StagesFollowStage0AndOnlyAdaptersTrain) {
  const std::string family = GetParam();
  const int world = zt::comm::world_group()->size();
  const LoraRun r0 = train(family, 0, false);
  EXPECT_LT(r0.losses.back(), r0.losses.front() - 0.05) << "it trains";
  for (const auto& [stage, ckpt] : std::vector<std::pair<int, bool>>{{0, false}, {1, false}, {2, false}, {3, false},
                                                                      {3, true}}) {
    const std::string what = family + " stage " + std::to_string(stage) + (ckpt ? " + checkpointing" : "");
    const bool lean = stage == 3 && !ckpt;
    const LoraRun r = stage == 0 ? r0 : train(family, stage, ckpt, "", lean);
    if (stage != 0) expect_same(r0, r, what);
    EXPECT_EQ(r.frozen_changed, 0) << what << ": the frozen base moved";
    EXPECT_GT(r.frozen_numel, 10 * r.trainable) << what;
    // Adam's two fp32 moments and the fp32 master exist for the adapters only: stage 0
    // holds them whole, stages 1-3 a 1/world shard each. The flat layout pads the managed
    // numel to a multiple of 64 x world (measured: 4352 for 4132 adapter elements at 4 ranks).
    const int64_t t = r.trainable, pad = 64 * world;
    auto v = torch::tensor({r.bytes.optimizer, r.bytes.master, r.bytes.params}, torch::kLong);
    if (stage > 0) zt::comm::world_group()->all_reduce(v, zt::comm::ReduceOp::kSum);
    // Stage 0: this rank's whole state; stages 1-3: the sum of the ranks' shards.
    EXPECT_GE(v[0].item<int64_t>(), 8 * t) << what;
    EXPECT_LE(v[0].item<int64_t>(), 8 * (t + pad)) << what;
    EXPECT_GE(v[1].item<int64_t>(), 4 * t) << what;
    EXPECT_LE(v[1].item<int64_t>(), 4 * (t + pad)) << what;
    if (stage > 0) EXPECT_LE(r.bytes.optimizer, 8 * (t / world + pad)) << what;
    // The frozen base: at stage 3 a 1/world shard on each rank (4 bytes per element in fp32,
    // padded to 64 x world per unit), at stages 0-2 whole in the model and not counted.
    auto fz = torch::tensor({r.bytes.frozen}, torch::kLong);
    zt::comm::world_group()->all_reduce(fz, zt::comm::ReduceOp::kSum);
    if (stage == 3) {
      EXPECT_GE(fz.item<int64_t>(), 4 * r.frozen_numel) << what << ": the shards hold the whole base";
      EXPECT_LE(r.bytes.frozen, 4 * (r.frozen_numel / world + 16 * pad)) << what << ": this rank's share of the base";
      // Gathered per unit: never the whole base at once (the root unit, embeddings and
      // head, stays for the step; the decoder layers come and go).
      EXPECT_GT(r.frozen_peak, 0) << what;
      if (lean) EXPECT_LT(r.frozen_peak, 4 * r.frozen_numel) << what << ": the whole base was gathered at once";
    } else {
      EXPECT_EQ(fz.item<int64_t>(), 0) << what;
    }
    if (stage <= 2) {  // compute-dtype parameters: the adapters, whole on every rank (summed at 1-2)
      EXPECT_GE(v[2].item<int64_t>(), (stage == 0 ? 1 : world) * 4 * t) << what;
      EXPECT_LE(v[2].item<int64_t>(), (stage == 0 ? 1 : world) * 4 * (t + pad)) << what;
    }
  }
}

// The trained adapter in peft's files, loaded into a fresh copy of the base, gives the
// trained model's logits; merged into the base weights, too.
TEST_P(LoraTraining, SavedAdapterLoadsAndMergesToTheTrainedModel) {
  const std::string family = GetParam();
  auto group = zt::comm::world_group();
  zt::test_support::SharedTempDir dir(group, "lora_adapter");
  const LoraRun r = train(family, 3, false, dir.path);
  group->barrier();
  if (group->rank() != 0) return;
  Built b = build(family, false);
  b.module->eval();
  torch::NoGradGuard ng;
  const auto base = b.logits(eval_ids());
  auto lm = zt::lora::load_peft_adapter(*b.module, b.space, dir.path);
  const auto adapted = b.logits(eval_ids());
  EXPECT_GT((adapted - base).abs().max().item<double>(), 1e-3) << "training moved the adapters";
  EXPECT_LE((adapted - r.logits).abs().max().item<double>(), 1e-6);  // the same fp32 tensors
  zt::lora::merge_lora(lm);
  EXPECT_LE((b.logits(eval_ids()) - r.logits).abs().max().item<double>(), 1e-5);  // summation order only
}

INSTANTIATE_TEST_SUITE_P(Families, LoraTraining, ::testing::Values("llama", "gpt2"));

}  // namespace

}  // namespace zt_test_lora
