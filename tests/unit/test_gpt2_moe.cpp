// [GPT-2 MoE] (models/gpt2.h): the MoE variant of GPT-2, gpt2-tiny-moe. The layer itself is
// tested in test_moe.cpp; the CLI (train, train --ep) in test_parallel_config.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "models/gpt2.h"
#include "zerotrain/error.h"

namespace zt_test_gpt2_moe {

using namespace zt::models;

// Every other block (block 1 of 2) is an MoE of 4 GPT-2 MLPs with a gate (4, C); the
// parameter count from the config equals the built model's.
TEST(GPT2MoE, BlocksNamesAndParameterCount) {
  const GPT2Config c = named_gpt2("gpt2-tiny-moe");
  EXPECT_EQ(c.moe_num_experts, 4);
  EXPECT_FALSE(gpt2_is_moe_block(c, 0));
  EXPECT_TRUE(gpt2_is_moe_block(c, 1));
  torch::manual_seed(0);
  GPT2 m(c);
  std::set<std::string> names;
  int64_t n = 0, experts = 0;
  for (const auto& kv : m->named_parameters()) {
    names.insert(kv.key());
    n += kv.value().numel();
    if (gpt2_is_expert_param(kv.key())) experts += kv.value().numel();
  }
  EXPECT_TRUE(names.count("h.0.mlp.c_fc.weight"));
  EXPECT_FALSE(names.count("h.1.mlp.c_fc.weight"));
  EXPECT_TRUE(names.count("h.1.moe.gate.weight"));
  EXPECT_TRUE(names.count("h.1.moe.experts.3.c_proj.bias"));
  EXPECT_FALSE(gpt2_is_expert_param("h.1.moe.gate.weight"));
  const int64_t C = c.n_embd;
  EXPECT_EQ(experts, 4 * (8 * C * C + 5 * C));
  EXPECT_EQ(n, gpt2_num_params(c));  // wte counted once (tied)
  EXPECT_EQ(n, m->num_params());
  // The FLOPs count the k = 2 experts a token runs through, not all 4.
  GPT2Config dense = c;
  dense.moe_num_experts = 0;
  EXPECT_NEAR(gpt2_flops_per_token(c, 32) - gpt2_flops_per_token(dense, 32), 6.0 * (8 * C * C + 5 * C + 4 * C), 1e-3);
  // Experts start as GPT-2's MLP does: residual projection scaled by 1/sqrt(2 n_layer).
  const auto w = m->blocks_at(1)->moe->experts->ptr(0)->named_parameters()["c_proj.weight"];
  EXPECT_NEAR(w.std().item<double>(), 0.02 / 2.0, 0.002);
}

// loss() = the LM loss + moe_aux_loss_coef x the MoE blocks' aux loss (same weights, the
// coefficient 0 against 0.5), and the aux loss reaches the gate's gradient.
TEST(GPT2MoE, LossAddsTheScaledAuxLoss) {
  GPT2Config c = named_gpt2("gpt2-tiny-moe");
  c.moe_aux_loss_coef = 0.0;
  torch::manual_seed(1);
  GPT2 m0(c);
  c.moe_aux_loss_coef = 0.5;
  GPT2 m1(c);
  {
    torch::NoGradGuard g;
    auto p1 = m1->named_parameters();
    for (const auto& kv : m0->named_parameters()) p1[kv.key()].copy_(kv.value());
  }
  const auto idx = torch::randint(0, 256, {2, 16}, torch::kLong);
  const auto tgt = torch::randint(0, 256, {2, 16}, torch::kLong);
  const double l0 = m0->loss(idx, tgt).item<double>();
  const auto loss1 = m1->loss(idx, tgt);
  const double aux = m1->last_moe_aux_loss();
  EXPECT_GT(aux, 0.5);  // E * sum me*ce: 1 when perfectly balanced
  EXPECT_NEAR(m0->last_moe_aux_loss(), aux, 1e-6);
  EXPECT_NEAR(loss1.item<double>(), l0 + 0.5 * aux, 1e-5);
  EXPECT_EQ(m1->last_moe_dropped_fraction(), 0.0);  // dropless by default
  loss1.backward();
  const auto gw = m1->named_parameters()["h.1.moe.gate.weight"].grad();
  ASSERT_TRUE(gw.defined());
  EXPECT_GT(gw.abs().sum().item<double>(), 0.0);
}

// What the MoE GPT-2 does not take is a ConfigError naming it.
TEST(GPT2MoE, UnsupportedSetupsAreConfigErrors) {
  GPT2Config c = named_gpt2("gpt2-tiny-moe");
  c.deferred_init = true;
  EXPECT_THROW(GPT2{c}, zt::ConfigError);
  c = named_gpt2("gpt2-tiny-moe");
  c.moe_every = 3;  // > n_layer
  EXPECT_THROW(GPT2{c}, zt::ConfigError);
  c = named_gpt2("gpt2-tiny-moe");
  c.moe_k = 3;
  EXPECT_THROW(GPT2{c}, zt::ConfigError);
}

// [Checkpointed Aux] (models/checkpoint.h): with activation checkpointing the loss takes the
// first forward's aux loss once, and its gradient still reaches the gate through the
// recompute: loss and every gradient equal the run without checkpointing (top-2 dropless and
// top-1 with drops; 1e-6, fp32: the same kernels, the reentrant backward sums in another
// order). Without the aux path (the recompute's aux dropped) the gate's gradient would lose
// the aux term, checked against coefficient 0 below.
TEST(GPT2MoE, ActivationCheckpointingKeepsTheAuxLoss) {
  for (int k : {2, 1}) {
    SCOPED_TRACE("top-" + std::to_string(k));
    GPT2Config c = named_gpt2("gpt2-tiny-moe");
    c.moe_k = k;
    c.moe_aux_loss_coef = 0.5;
    if (k == 1) {
      c.moe_capacity_factor = 0.5;
      c.moe_drop_tokens = true;
    }
    GPT2Config c0 = c;
    c0.moe_aux_loss_coef = 0.0;
    torch::manual_seed(3);
    GPT2 plain(c), ckpt(c), no_aux(c0);
    {
      torch::NoGradGuard g;
      auto pc = ckpt->named_parameters(), pn = no_aux->named_parameters();
      for (const auto& kv : plain->named_parameters()) {
        pc[kv.key()].copy_(kv.value());
        pn[kv.key()].copy_(kv.value());
      }
    }
    ckpt->set_activation_checkpointing(true);
    const auto idx = torch::randint(0, 256, {2, 16}, torch::kLong);
    const auto tgt = torch::randint(0, 256, {2, 16}, torch::kLong);
    const auto l0 = plain->loss(idx, tgt);
    const auto l1 = ckpt->loss(idx, tgt);
    EXPECT_NEAR(l1.item<double>(), l0.item<double>(), 1e-6);
    EXPECT_NEAR(ckpt->last_moe_aux_loss(), plain->last_moe_aux_loss(), 1e-6);
    l0.backward();
    l1.backward();
    auto pc = ckpt->named_parameters();
    for (const auto& kv : plain->named_parameters()) {
      const auto& g0 = kv.value().grad();
      const auto& g1 = pc[kv.key()].grad();
      ASSERT_TRUE(g0.defined() && g1.defined()) << kv.key();
      EXPECT_LE((g1 - g0).abs().max().item<double>(), 1e-6) << kv.key();
    }
    // The aux term is in the gate's gradient: coefficient 0 gives another one.
    no_aux->loss(idx, tgt).backward();
    const auto gate = "h.1.moe.gate.weight";
    EXPECT_GT((pc[gate].grad() - no_aux->named_parameters()[gate].grad()).abs().max().item<double>(), 1e-5);
  }
}

}  // namespace zt_test_gpt2_moe
