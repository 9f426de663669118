// Parameter groups (EngineOptions::param_groups) with real ranks (CPU, MPI): equivalence
// with a single-process plain-LibTorch optimizer holding the same two param groups, for
// every stage, Adam / AdamW / SGD, CPU and NVMe offload; the configuration errors; and
// no_decay_groups on GPT-2 tiny. Run at world 1, 2 and 4 by ctest.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>

#include "ckpt/fs.h"
#include "models/gpt2.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "support/dist_util.h"

namespace zt_test_param_groups {

namespace {

using zt::test_support::Mlp;
using zt::test_support::global_batch;

constexpr int64_t kMicro = 2;
constexpr int kSteps = 5;
constexpr double kLr = 1e-2;
// Group 0 "matrices": weight_decay 0.1, lr_scale 1. Group 1 "vectors": weight_decay 0,
// lr_scale 0.5. The config's weight_decay (0.01) applies to neither.
constexpr double kMatrixWd = 0.1, kVectorScale = 0.5, kConfigWd = 0.01;

enum class Opt { kAdamW, kAdamL2, kSgd };
const char* opt_name(Opt o) { return o == Opt::kAdamW ? "adamw" : o == Opt::kAdamL2 ? "adam_l2" : "sgd"; }

struct Case {
  int stage;
  const char* dtype;
  Opt opt = Opt::kAdamW;
  int offload = 0;  // 1: offload_optimizer cpu; 2: offload_optimizer nvme
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "stage " << c.stage << " " << c.dtype << " " << opt_name(c.opt) << " offload " << c.offload;
}

nlohmann::json make_config(const Case& c, const std::string& nvme_dir) {
  nlohmann::json opt;
  if (c.opt == Opt::kAdamW) opt = {{"type", "AdamW"}, {"params", {{"lr", kLr}, {"weight_decay", kConfigWd}}}};
  if (c.opt == Opt::kAdamL2) {
    opt = {{"type", "Adam"}, {"params", {{"lr", kLr}, {"weight_decay", kConfigWd}, {"adam_w_mode", false}}}};
  }
  if (c.opt == Opt::kSgd) {
    opt = {{"type", "SGD"}, {"params", {{"lr", kLr}, {"weight_decay", kConfigWd}, {"momentum", 0.9}}}};
  }
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", opt},
      // Small buckets: several buckets, shards that cut through both groups.
      {"zero_optimization",
       {{"stage", c.stage}, {"reduce_bucket_size", 200}, {"allgather_bucket_size", 300},
        {"stage3_param_persistence_threshold", 0}}},
  };
  if (std::string(c.dtype) == "bf16") j["bf16"] = {{"enabled", true}};
  if (c.offload == 1) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (c.offload == 2) {
    j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", nvme_dir}, {"buffer_count", 3}};
    j["zero_optimization"]["sub_group_size"] = 150;  // sub-groups that cut through both groups
  }
  return j;
}

// The engine's groups for `m`: matrices (dim 2) and vectors (dim 1), registration order.
std::vector<zt::ParamGroup> two_groups(Mlp& m) {
  zt::ParamGroup matrices, vectors;
  matrices.name = "matrices";
  matrices.weight_decay = kMatrixWd;
  vectors.name = "vectors";
  vectors.weight_decay = 0.0;
  vectors.lr_scale = kVectorScale;
  for (auto& p : m->parameters()) (p.dim() >= 2 ? matrices : vectors).params.push_back(p);
  return {matrices, vectors};
}

// Plain LibTorch with the same two param groups (group lr = lr x lr_scale), full batch,
// global-norm clipping, fp32 master weights; forward/backward on a `compute` copy.
std::vector<torch::Tensor> reference(const Case& c, int64_t global) {
  const auto compute = std::string(c.dtype) == "bf16" ? torch::kBFloat16 : torch::kFloat;
  torch::manual_seed(7);
  Mlp master;
  torch::manual_seed(7);
  Mlp work;
  work->to(compute);
  std::vector<torch::Tensor> mats, vecs;
  for (auto& p : master->parameters()) (p.dim() >= 2 ? mats : vecs).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::unique_ptr<torch::optim::Optimizer> opt;
  auto add = [&](auto options) {
    using O = decltype(options);
    O a = options, b = options;
    a.lr(kLr).weight_decay(kMatrixWd);
    b.lr(kLr * kVectorScale).weight_decay(0.0);
    groups.emplace_back(mats, std::make_unique<O>(a));
    groups.emplace_back(vecs, std::make_unique<O>(b));
  };
  if (c.opt == Opt::kAdamW) {
    add(torch::optim::AdamWOptions(kLr));
    opt = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(kLr));
  } else if (c.opt == Opt::kAdamL2) {
    add(torch::optim::AdamOptions(kLr));
    opt = std::make_unique<torch::optim::Adam>(groups, torch::optim::AdamOptions(kLr));
  } else {
    add(torch::optim::SGDOptions(kLr).momentum(0.9));
    opt = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(kLr).momentum(0.9));
  }
  auto mp = master->parameters(), wp = work->parameters();
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = global_batch(s, global);
    {
      torch::NoGradGuard g;
      for (size_t i = 0; i < mp.size(); ++i) wp[i].copy_(mp[i]);
    }
    opt->zero_grad();
    for (auto& p : wp) p.mutable_grad() = torch::Tensor();
    auto loss = torch::mse_loss(work->forward(x.to(compute)).to(torch::kFloat), y);
    loss.backward();
    for (size_t i = 0; i < mp.size(); ++i) mp[i].mutable_grad() = wp[i].grad().to(torch::kFloat);
    torch::nn::utils::clip_grad_norm_(master->parameters(), 1.0);
    opt->step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : mp) out.push_back(p.detach().clone());
  return out;
}

// A directory of this rank's own for NVMe swap files (removed at the end).
struct NvmeDir : zt::test_support::LocalTempDir {
  NvmeDir() : LocalTempDir("nvme_groups_test") {}
};

std::vector<torch::Tensor> run_engine(const Case& c) {
  auto group = zt::comm::world_group();
  const int world = group->size(), rank = group->rank();
  std::optional<NvmeDir> nvme;
  if (c.offload == 2) nvme.emplace();
  auto cfg = zt::Config::from_json(make_config(c, nvme ? nvme->path : ""), world);
  torch::manual_seed(7);
  Mlp m;
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.param_groups = two_groups(m);
  auto engine = zt::initialize(m.ptr(), cfg, o);
  const int64_t global = kMicro * world;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = global_batch(s, global);
    auto xb = x.narrow(0, rank * kMicro, kMicro).to(engine->compute_dtype());
    auto yb = y.narrow(0, rank * kMicro, kMicro);
    auto loss = engine->forward([&] { return torch::mse_loss(m->forward(xb).to(torch::kFloat), yb); });
    engine->backward(loss);
    EXPECT_TRUE(engine->step());
  }
  EXPECT_EQ(engine->global_steps(), kSteps);
  return engine->gather_master_params();  // the managed parameters: registration order
}

class ParamGroupEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(ParamGroupEquivalence, MatchesLibTorchWithTheSameGroups) {
  const Case c = GetParam();
  const int world = zt::comm::world_group()->size();
  auto ref = reference(c, kMicro * world);
  auto got = run_engine(c);
  ASSERT_EQ(got.size(), ref.size());
  // As in test_engine.cpp: fp32 differs by summation order only; bf16 by rounding.
  const bool bf16 = std::string(c.dtype) == "bf16";
  const double tol = bf16 ? 2e-2 : 2e-5;
  const double mean_tol = bf16 ? 1e-3 : 2e-6;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LE((got[i] - ref[i]).abs().max().item<double>(), tol) << "parameter " << i;
    EXPECT_LE((got[i] - ref[i]).abs().mean().item<double>(), mean_tol) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Stages, ParamGroupEquivalence,
    ::testing::Values(Case{0, "fp32"}, Case{1, "fp32"}, Case{2, "fp32"}, Case{3, "fp32"}, Case{0, "bf16"},
                      Case{2, "bf16"}, Case{3, "bf16"}, Case{1, "fp32", Opt::kAdamL2}, Case{3, "fp32", Opt::kAdamL2},
                      Case{0, "fp32", Opt::kSgd}, Case{2, "fp32", Opt::kSgd}, Case{3, "fp32", Opt::kSgd},
                      Case{2, "fp32", Opt::kAdamW, 1}, Case{3, "bf16", Opt::kAdamW, 1},
                      Case{3, "fp32", Opt::kAdamW, 2}, Case{2, "fp32", Opt::kAdamL2, 2}),
    [](const auto& info) {
      const Case& c = info.param;
      return "stage" + std::to_string(c.stage) + "_" + c.dtype + "_" + opt_name(c.opt) +
             (c.offload == 2 ? "_nvme" : c.offload == 1 ? "_offload" : "");
    });

// The groups matter: without them (one group, the config's weight decay) the result differs.
TEST(ParamGroupEquivalence, GroupsChangeTheResult) {
  const int world = zt::comm::world_group()->size();
  auto ref = reference(Case{2, "fp32"}, kMicro * world);
  auto group = zt::comm::world_group();
  auto cfg = zt::Config::from_json(make_config(Case{2, "fp32"}, ""), world);
  torch::manual_seed(7);
  Mlp m;
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  auto engine = zt::initialize(m.ptr(), cfg, o);
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = global_batch(s, kMicro * world);
    auto xb = x.narrow(0, group->rank() * kMicro, kMicro);
    auto yb = y.narrow(0, group->rank() * kMicro, kMicro);
    auto loss = engine->forward([&] { return torch::mse_loss(m->forward(xb), yb); });
    engine->backward(loss);
    engine->step();
  }
  auto got = engine->gather_master_params();
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, (got[i] - ref[i]).abs().max().item<double>());
  EXPECT_GT(worst, 1e-3);
}

// Runs initialize() with `groups` and returns the ConfigError's message ("" when none).
std::string init_error(Mlp& m, std::vector<zt::ParamGroup> groups, std::vector<torch::Tensor> params = {}) {
  auto cfg = zt::Config::from_json(make_config(Case{2, "fp32"}, ""), zt::comm::world_group()->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.param_groups = std::move(groups);
  o.params = std::move(params);
  try {
    zt::initialize(m.ptr(), cfg, o);
  } catch (const zt::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ParamGroupErrors, NamedWithParameterAndGroup) {
  torch::manual_seed(7);
  Mlp m;
  {
    auto g = two_groups(m);
    g[1].params.push_back(m->fc2->weight);  // also in "matrices"
    const std::string msg = init_error(m, g);
    EXPECT_NE(msg.find("'fc2.weight' is in two parameter groups ('matrices' and 'vectors')"), std::string::npos)
        << msg;
  }
  {
    auto g = two_groups(m);
    m->fc1->bias.set_requires_grad(false);
    const std::string msg = init_error(m, g);
    m->fc1->bias.set_requires_grad(true);
    EXPECT_NE(msg.find("'fc1.bias' in parameter group 'vectors' does not require grad"), std::string::npos) << msg;
  }
  {
    auto g = two_groups(m);
    g[0].params.push_back(torch::zeros({3, 3}, torch::requires_grad()));
    const std::string msg = init_error(m, g);
    EXPECT_NE(msg.find("'matrices' holds a tensor of shape [3, 3] that is not a parameter"), std::string::npos) << msg;
  }
  {
    auto g = two_groups(m);
    g[1].params.clear();
    const std::string msg = init_error(m, g);
    EXPECT_NE(msg.find("'vectors' has no parameters"), std::string::npos) << msg;
  }
  {
    auto g = two_groups(m);
    g[1].lr_scale = -1;
    g[1].name.clear();
    const std::string msg = init_error(m, g);
    EXPECT_NE(msg.find("'group 1': lr_scale -1 must be finite and >= 0"), std::string::npos) << msg;
  }
  {
    auto g = two_groups(m);
    g[0].weight_decay = -0.1;
    const std::string msg = init_error(m, g);
    EXPECT_NE(msg.find("'matrices': weight_decay -0.1 must be finite and >= 0"), std::string::npos) << msg;
  }
  {
    const std::string msg = init_error(m, two_groups(m), {m->fc1->weight});
    EXPECT_NE(msg.find("EngineOptions.params and EngineOptions.param_groups are both set"), std::string::npos) << msg;
  }
}

// Parameters in no group are frozen: they do not move, the grouped ones do.
TEST(ParamGroupErrors, ParametersOutsideTheGroupsStayFrozen) {
  auto group = zt::comm::world_group();
  auto cfg = zt::Config::from_json(make_config(Case{1, "fp32"}, ""), group->size());
  torch::manual_seed(7);
  Mlp m;
  zt::ParamGroup only;
  only.params = {m->fc1->weight, m->fc2->weight};
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.param_groups = {only};
  auto fc3_before = m->fc3->weight.detach().clone();
  auto fc1_before = m->fc1->weight.detach().clone();
  auto engine = zt::initialize(m.ptr(), cfg, o);
  auto [x, y] = global_batch(0, kMicro);
  auto loss = engine->forward([&] { return torch::mse_loss(m->forward(x), y); });
  engine->backward(loss);
  engine->step();
  EXPECT_EQ(engine->gather_master_params().size(), 2u);
  EXPECT_TRUE(torch::equal(m->fc3->weight.detach(), fc3_before));
  EXPECT_FALSE(torch::equal(m->fc1->weight.detach(), fc1_before));
}

TEST(NoDecayGroups, SplitsGpt2TinyByDimension) {
  auto mc = zt::models::named_gpt2("gpt2-tiny");
  zt::models::GPT2 model(mc);
  auto groups = zt::no_decay_groups(*model, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].name, "decay");
  EXPECT_EQ(groups[0].weight_decay, std::optional<double>(0.1));
  EXPECT_EQ(groups[1].name, "no_decay");
  EXPECT_EQ(groups[1].weight_decay, std::optional<double>(0.0));
  EXPECT_EQ(groups[0].lr_scale, 1.0);
  EXPECT_EQ(groups[1].lr_scale, 1.0);
  // 2 blocks: wte, wpe + 4 weight matrices per block; 8 biases / LayerNorm tensors per
  // block + ln_f's 2.
  EXPECT_EQ(groups[0].params.size(), 10u);
  EXPECT_EQ(groups[1].params.size(), 18u);
  auto named = model->named_parameters();
  auto name_of = [&](const torch::Tensor& t) {
    for (const auto& kv : named) {
      if (kv.value().unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return kv.key();
    }
    return std::string();
  };
  EXPECT_EQ(name_of(groups[0].params[0]), "wte.weight");
  EXPECT_EQ(name_of(groups[0].params[2]), "h.0.attn.c_attn.weight");
  EXPECT_EQ(name_of(groups[1].params[0]), "h.0.ln_1.weight");
  EXPECT_EQ(name_of(groups[1].params.back()), "ln_f.bias");
  for (auto& p : groups[0].params) EXPECT_GE(p.dim(), 2);
  for (auto& p : groups[1].params) EXPECT_LT(p.dim(), 2);
  // Frozen parameters are in neither group.
  model->wpe->weight.set_requires_grad(false);
  EXPECT_EQ(zt::no_decay_groups(*model, 0.1)[0].params.size(), 9u);
}

// GPT-2 tiny with no_decay_groups: ZeRO-3 (one unit per block, both groups inside every
// unit) gives the parameters of stage 0.
TEST(NoDecayGroups, Gpt2TinyStage3MatchesStage0) {
  auto group = zt::comm::world_group();
  const int world = group->size(), rank = group->rank();
  auto run = [&](int stage) {
    nlohmann::json j = {
        {"train_micro_batch_size_per_gpu", 2},
        {"gradient_accumulation_steps", 1},
        {"gradient_clipping", 1.0},
        {"steps_per_print", 1000},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.1}}}}},
        {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}},
    };
    auto cfg = zt::Config::from_json(j, world);
    auto mc = zt::models::named_gpt2("gpt2-tiny");
    mc.n_positions = 16;
    torch::manual_seed(3);
    zt::models::GPT2 model(mc);
    zt::EngineOptions o;
    o.device = torch::Device(torch::kCPU);
    o.print = false;
    o.param_groups = zt::no_decay_groups(*model, 0.1);
    o.param_groups[1].lr_scale = 0.5;
    auto engine = zt::initialize(model.ptr(), cfg, o);
    for (int s = 0; s < 3; ++s) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + s);
      auto tokens = at::randint(0, mc.vocab_size, {2 * world, 17}, gen);
      auto mine = tokens.narrow(0, 2 * rank, 2);
      auto x = mine.narrow(1, 0, 16), y = mine.narrow(1, 1, 16);
      auto loss = engine->forward([&] { return model->loss(x, y); });
      engine->backward(loss);
      engine->step();
    }
    return engine->gather_master_params();
  };
  auto a = run(0), b = run(3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 2e-5) << "parameter " << i;
  }
}

}  // namespace

}  // namespace zt_test_param_groups
