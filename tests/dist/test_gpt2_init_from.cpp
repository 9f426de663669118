// GPT-2 from Hugging Face weights under ZeRO-3: the model is built partitioned
// (deferred_init), load_hf_gpt2 checks the file and loads the LayerNorms, and
// hf_gpt2_param_init fills each placeholder from the file as the engine materialises its
// unit. It trains exactly like the eagerly loaded model at stage 0. (Before, stage 3 with
// --init-from failed on a shape check: the placeholders were loaded as if full-size.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/gpt2.h"
#include "models/hf_gpt2.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace {

zt::models::GPT2Config tiny() {
  auto c = zt::models::named_gpt2("gpt2-tiny");
  c.n_positions = 32;
  return c;
}

std::vector<torch::Tensor> train_from(int stage, const std::string& dir, std::vector<double>* losses) {
  auto group = zt::comm::world_group();
  const int world = group->size(), rank = group->rank();
  auto mc = tiny();
  mc.deferred_init = stage == 3;
  torch::manual_seed(77);  // a different init: every value must come from the file
  zt::models::GPT2 m(mc);
  zt::models::load_hf_gpt2(*m, dir);
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 1},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}}},
      {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}},
  };
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  if (mc.deferred_init) {
    o.param_shape = [p = m.ptr()](const std::string& n) { return p->param_shape(n); };
    o.param_init = zt::models::hf_gpt2_param_init(dir);
  }
  auto engine = zt::initialize(m.ptr(), zt::Config::from_json(j, world), o);
  for (int s = 0; s < 2; ++s) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(31 + s);
    auto idx = at::randint(0, mc.vocab_size, {2 * world, 17}, g);
    auto x = idx.narrow(0, rank * 2, 2).narrow(1, 0, 16).contiguous();
    auto y = idx.narrow(0, rank * 2, 2).narrow(1, 1, 16).contiguous();
    auto loss = engine->forward([&] { return m->loss(x, y); });
    engine->backward(loss);
    engine->step();
    losses->push_back(engine->last_report().loss);
  }
  return engine->gather_master_params();
}

}  // namespace

TEST(Gpt2InitFrom, Stage3PartitionedLoadMatchesStage0) {
  auto group = zt::comm::world_group();
  zt::test_support::SharedTempDir dir(group, "gpt2_init_from");
  if (group->rank() == 0) {
    torch::manual_seed(5);
    zt::models::GPT2 m(tiny());
    zt::models::save_hf_gpt2(*m, dir.path);
  }
  group->barrier();
  std::vector<double> l0, l3;
  const auto p0 = train_from(0, dir.path, &l0);
  const auto p3 = train_from(3, dir.path, &l3);
  ASSERT_EQ(p0.size(), p3.size());
  // fp32 CPU ranks; the stages differ only in the order gradients are summed.
  for (size_t i = 0; i < p0.size(); ++i) EXPECT_LE((p3[i] - p0[i]).abs().max().item<double>(), 2e-5) << i;
  for (size_t s = 0; s < l0.size(); ++s) EXPECT_NEAR(l3[s], l0[s], 1e-5) << s;
}
