// The MoE variant of the CIFAR-10 tutorial net ([CIFAR MoE] in
// include/zerotrain/models/cifar_moe_net.h, docs/moe.md#the-cifar-10-moe-example): its
// layers and names, the PR-MoE pyramid, the loss with the aux term, and the refusals.
// Training through the engine at ep 1 / ep 2 is tests/dist/test_cifar_moe.cpp;
// CifarMoEExample.* runs examples/cifar10.cpp under `zerotrain launch -n 2`.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/fs.h"
#include "support/run_shell.h"
#include "support/synthetic_cifar.h"

#include "zerotrain/error.h"
#include "zerotrain/models/cifar_moe_net.h"
#include "zerotrain/models/cifar_net.h"

namespace zt_test_cifar_moe {

using zt::models::CifarMoENet;
using zt::models::CifarMoENetImpl;
using zt::models::CifarMoEOptions;

namespace {

std::string cifar_moe_error(const CifarMoEOptions& o, int ep) {
  try {
    zt::models::check_cifar_moe_options(o, ep);
  } catch (const zt::ConfigError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The "loss: X" values of the example's progress lines.
std::vector<double> cifar_moe_printed_losses(const std::string& out) {
  std::vector<double> v;
  for (size_t at = out.find("] loss: "); at != std::string::npos; at = out.find("] loss: ", at + 1))
    v.push_back(std::atof(out.c_str() + at + 8));
  return v;
}

int64_t cifar_moe_numel(const CifarMoENet& net) {
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  return n;
}

}  // namespace

TEST(CifarMoENet, PyramidBuildsTwoMoELayersOfTwoAndFourExperts) {
  for (const bool residual : {false, true}) {
    torch::manual_seed(0);
    CifarMoEOptions o;
    o.num_experts = {2, 4};
    o.use_residual = residual;
    CifarMoENet net(o);
    ASSERT_EQ(net->moe_layers(), 2u);
    EXPECT_EQ(net->local_experts(0), 2);
    EXPECT_EQ(net->local_experts(1), 4);
    EXPECT_EQ(net->first_expert(1), 0);
    const auto p = net->named_parameters();
    EXPECT_EQ(p["moe_layer_list.0.gate.weight"].sizes(), torch::IntArrayRef({2, 84}));
    EXPECT_EQ(p["moe_layer_list.1.gate.weight"].sizes(), torch::IntArrayRef({4, 84}));
    EXPECT_EQ(p["moe_layer_list.0.experts.1.weight"].sizes(), torch::IntArrayRef({84, 84}));
    EXPECT_EQ(p["moe_layer_list.1.experts.3.bias"].sizes(), torch::IntArrayRef({84}));
    EXPECT_FALSE(p.contains("moe_layer_list.0.experts.2.weight"));
    EXPECT_FALSE(p.contains("moe_layer_list.2.gate.weight"));
    EXPECT_FALSE(p.contains("fc3.weight"));  // fc3 became the MoE layers
    EXPECT_EQ(p["fc4.weight"].sizes(), torch::IntArrayRef({10, 84}));
    EXPECT_EQ(p.contains("moe_layer_list.1.mlp.weight"), residual);
    EXPECT_EQ(p.contains("moe_layer_list.0.coefficient.weight"), residual);
    // The plain net's 62,006 (fc4 is fc3's size) + per layer the gate (E x 84) and E experts
    // of 84 x 84 + 84; PR-MoE adds the mlp (84 x 84 + 84) and the coefficient (2 x 84 + 2).
    const int64_t experts = (2 * 84 + 2 * 7140) + (4 * 84 + 4 * 7140);
    EXPECT_EQ(cifar_moe_numel(net), 62006 + experts + (residual ? 2 * (7140 + 170) : 0));
    // Experts only: the gate, the residual mlp and the coefficient are dense.
    for (const auto& kv : p)
      EXPECT_EQ(CifarMoENetImpl::is_expert(kv.key()), has(kv.key(), ".experts.")) << kv.key();
    EXPECT_FALSE(CifarMoENetImpl::is_expert("moe_layer_list.0.mlp.weight"));
    EXPECT_EQ(net->global_param_name("moe_layer_list.1.experts.3.weight"), "moe_layer_list.1.experts.3.weight");
    // FLOPs: top-1 uses one expert per layer; the gates; PR-MoE's mlp and coefficient.
    const double macs = 651720.0 + (84.0 * 2 + 84.0 * 84) + (84.0 * 4 + 84.0 * 84) +
                        (residual ? 2 * (84.0 * 84 + 84.0 * 2) : 0.0);
    EXPECT_DOUBLE_EQ(net->flops_per_token(1), 6.0 * macs);
  }
}

TEST(CifarMoENet, LossIsCrossEntropyPlusTheAuxLossesAndReachesEveryExpert) {
  torch::manual_seed(1);
  CifarMoEOptions o;
  o.num_experts = {2, 4};
  o.top_k = 2;
  o.min_capacity = 64;  // nothing drops: every expert sees tokens at this batch
  o.noisy_gate_policy = "Jitter";
  o.use_residual = true;
  o.aux_loss_coef = 0.5;
  CifarMoENet net(o);
  auto x = torch::randn({32, 3, 32, 32});
  auto y = torch::randint(0, 10, {32});
  net->set_generator(at::make_generator<at::CPUGeneratorImpl>(7));
  auto loss = net->loss(x, y);
  const double aux = net->last_aux_loss().item<double>();
  EXPECT_GT(aux, 0.0);
  net->set_generator(at::make_generator<at::CPUGeneratorImpl>(7));  // the same jitter again
  auto logits = net->forward(x);
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({32, 10}));
  const double ce = torch::nn::functional::cross_entropy(logits, y).item<double>();
  EXPECT_NEAR(loss.item<double>(), ce + 0.5 * aux, 1e-6);
  EXPECT_EQ(net->last_dropped_fraction(), 0.0);
  loss.backward();
  for (const auto& kv : net->named_parameters()) {
    ASSERT_TRUE(kv.value().grad().defined()) << kv.key();
    EXPECT_GT(kv.value().grad().abs().sum().item<double>(), 0.0) << kv.key();
  }
  // aux_loss_coef 0 is the tutorial's loss (it drops the aux losses).
  o.aux_loss_coef = 0.0;
  torch::manual_seed(1);
  CifarMoENet plain(o);
  plain->set_generator(at::make_generator<at::CPUGeneratorImpl>(7));
  EXPECT_NEAR(plain->loss(x, y).item<double>(), ce, 1e-6);
}

TEST(CifarMoENet, BadOptionsNameTheFlag) {
  CifarMoEOptions o;
  o.num_experts = {2, 4};
  EXPECT_EQ(cifar_moe_error(o, 2), "");
  const std::string e = cifar_moe_error(o, 4);  // 2 experts over ep 4
  EXPECT_TRUE(has(e, "--num-experts entry 0 (2 experts)") && has(e, "--ep 4")) << e;
  o.num_experts = {4, 6};
  const std::string e2 = cifar_moe_error(o, 4);
  EXPECT_TRUE(has(e2, "--num-experts entry 1 (6 experts)")) << e2;
  o.num_experts = {};
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "--num-experts"));
  o.num_experts = {0};
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "--num-experts entry 0 is 0"));
  o.num_experts = {2};
  o.top_k = 3;
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "--top-k must be 1 or 2"));
  o.top_k = 2;
  o.noisy_gate_policy = "RSample";
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "RSample applies to --top-k 1"));
  o.noisy_gate_policy = "Gaussian";
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "Gaussian"));
  o.noisy_gate_policy = "None";
  o.num_experts = {1};
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "--top-k 2 needs >= 2 experts"));
  o = CifarMoEOptions{};
  o.min_capacity = -1;
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "--min-capacity"));
  o = CifarMoEOptions{};
  o.capacity_factor = 0;
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "--capacity-factor"));
  o = CifarMoEOptions{};
  o.aux_loss_coef = -1;
  EXPECT_TRUE(has(cifar_moe_error(o, 1), "--moe-aux-coef"));
  // The constructor checks the same (ep 1 here; ep > 1 in tests/dist/test_cifar_moe.cpp).
  o = CifarMoEOptions{};
  o.top_k = 5;
  EXPECT_THROW(CifarMoENet{o}, zt::ConfigError);
}

// examples/cifar10.cpp --moe under `zerotrain launch -n 2` on a synthetic CIFAR-10 (5 x 48
// records), fp32, Adam lr 3e-3, 30 steps of 16 images per rank, the tutorial's PR-MoE pyramid
// (--num-experts 2 4 --mlp-type residual --top-k 1 --noisy-gate-policy RSample): at --ep 2
// the printed losses (rank 0's, mean of 5 steps, 3 decimals) equal those without --ep on the
// same 2 ranks to the printed digit, and fall (below 0.7 x steps 1-5's); bad flags are named before any step.
TEST(CifarMoEExample, TrainsWithLaunchAtEpTwoLikeEpOne) {
  const std::string bin = std::string(ZT_BINARY_DIR) + "/example_cifar10";
  ASSERT_EQ(::access(bin.c_str(), X_OK), 0) << bin << " is missing: build the example_cifar10 target";
  const std::string dir = std::string(ZT_BINARY_DIR) + "/cifar_moe_example_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  zt::test_support::write_synthetic_cifar(dir, 48, 31415);
  const std::string cfg = dir + "/ds.json";
  std::ofstream(cfg) << R"({"train_batch_size": 32, "gradient_clipping": 1.0,
      "optimizer": {"type": "Adam", "params": {"lr": 3e-3, "betas": [0.8, 0.999], "eps": 1e-8}}})";
  const std::string launch = std::string(ZT_BINARY_DIR) + "/zerotrain launch -n 2 -- " + bin + " " + dir + " " + cfg;
  const std::string moe = " --moe --num-experts 2 4 --mlp-type residual --top-k 1 --noisy-gate-policy RSample"
                          " --moe-param-group --steps 30 --log-interval 5";
  const auto one = zt::test_support::run_shell(launch + moe);
  ASSERT_EQ(one.code, 0) << one.output;
  const auto two = zt::test_support::run_shell(launch + moe + " --ep 2");
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_TRUE(has(two.output, "MoE: experts per layer [2 4] over ep 2, top-1, residual (PR-MoE)")) << two.output;
  EXPECT_TRUE(has(two.output, "accuracy on 48 test images")) << two.output;
  const auto l1 = cifar_moe_printed_losses(one.output), l2 = cifar_moe_printed_losses(two.output);
  ASSERT_EQ(l1.size(), 6u) << one.output;
  ASSERT_EQ(l2.size(), 6u) << two.output;
  for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l2[i], l1[i], 1.5e-3) << "steps " << 5 * i + 1 << "-" << 5 * i + 5;
  EXPECT_LT(l2.back(), 0.7 * l2.front()) << two.output;
  std::printf("[cifar-moe example] launch -n 2 --ep 2: loss %.3f (steps 1-5) -> %.3f (steps 26-30)\n", l2.front(),
              l2.back());
  // Refused before the first step, naming the flag.
  struct Bad {
    std::string flags, says;
  };
  const Bad bad[] = {
      {" --moe --num-experts 2 3 --ep 2 --moe-param-group", "--num-experts entry 1 (3 experts) does not divide by"},
      {" --moe --num-experts 2 4 --ep 2", "--ep 2 needs --moe-param-group"},
      {" --num-experts 2 4", "--num-experts configures the MoE variant: add --moe"},
      {" --moe --mlp-type pyramid", "--mlp-type takes standard or residual"},
      {" --moe --num-experts 2 --ep 4 --moe-param-group", "--num-experts entry 0 (2 experts)"},
  };
  for (const auto& b : bad) {
    const auto r = zt::test_support::run_shell(launch + b.flags + " --steps 2 --log-interval 1");
    EXPECT_NE(r.code, 0) << b.flags << "\n" << r.output;
    EXPECT_TRUE(has(r.output, b.says)) << b.flags << "\n" << r.output;
    EXPECT_FALSE(has(r.output, "] loss: ")) << b.flags << ": a step ran\n" << r.output;
  }
  zt::ckpt::remove_tree(dir);
}

}  // namespace zt_test_cifar_moe
