// Expert parallelism of the MoE layer ([Expert Parallel] in src/models/moe.h) on real
// ranks (CPU, MPI; run at world 1, 2 and 4 by ctest). The ep group is the world: rank r
// holds experts r*E_l .. (r+1)*E_l - 1 and its own tokens. Against the one-process layer
// with all experts (the same weights) on the same tokens:
//  * each rank's output and aux loss are the reference's on its tokens;
//  * the input and gate gradients are the reference's on that rank;
//  * an expert's gradient on its owner is the reference's summed over every rank's tokens.
// Top-1 and top-2, with drops (capacity factor 1) and without (drop_tokens false: the
// capacity is agreed across ranks). At world 1 the same code path runs without
// communication (ep size 1). Tolerance: 1e-6 absolute (fp32; the expert GEMMs see the
// slots of all ranks in one batch instead of one rank's).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>

#include "models/moe.h"
#include "support/moe_dense_reference.h"
#include "support/moe_ep_test_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace test_moe_ep {
namespace {

comm::GroupPtr world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

struct TwoLayerImpl : torch::nn::Module {
  explicit TwoLayerImpl(int64_t d)
      : fc1(register_module("fc1", torch::nn::Linear(d, 2 * d))),
        fc2(register_module("fc2", torch::nn::Linear(2 * d, d))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoLayer);

constexpr int64_t kHidden = 8;

MoEOptions options(int64_t experts, int64_t k, bool drop, comm::GroupPtr ep) {
  MoEOptions o;
  o.hidden = kHidden;
  o.num_experts = experts;
  o.gate.k = k;
  o.gate.capacity_factor = 1.0;
  o.gate.min_capacity = 1;
  o.gate.drop_tokens = drop;
  o.gate.use_rts = false;
  o.gate.second_expert_sampling = false;
  o.ep_group = std::move(ep);
  return o;
}

MoE make(const MoEOptions& o) {
  return MoE(o, [] { return torch::nn::AnyModule(TwoLayer(kHidden)); });
}

::testing::AssertionResult close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  if (a.sizes() != b.sizes()) return ::testing::AssertionFailure() << what << ": shapes " << a.sizes() << " vs " << b.sizes();
  const double d = (a - b).abs().max().item<double>();
  if (d <= 1e-6) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max difference " << d;
}

TEST(MoEExpertParallel, EqualsTheOneProcessLayer) {
  auto g = world();
  const int P = g->size(), r = g->rank();
  const int64_t E = 2 * P;
  for (int64_t k : {1, 2}) {
    for (bool drop : {true, false}) {
      const std::string tag = "k=" + std::to_string(k) + (drop ? " drop" : " no-drop") + " P=" + std::to_string(P);
      torch::manual_seed(11);
      MoE ref = make(options(E, k, drop, nullptr));
      MoE ep = make(options(E, k, drop, g));
      ASSERT_EQ(ep->local_experts(), E / P);
      ASSERT_EQ(ep->first_expert(), E / P * r);
      zt::test_support::copy_gate_and_owned_experts(ref, ep);
      // This rank's tokens (uneven routing on purpose: rank-dependent seed) and the
      // weights of its loss.
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + r);
      auto x = torch::randn({2, 6, kHidden}, gen);
      auto w = torch::randn({2, 6, kHidden}, gen);
      auto x_ref = x.clone().requires_grad_(true), x_ep = x.clone().requires_grad_(true);
      auto out_ref = ref->forward(x_ref);
      auto out_ep = ep->forward(x_ep);
      EXPECT_TRUE(close(out_ep.output, out_ref.output, tag + " output"));
      EXPECT_TRUE(close(out_ep.aux_loss, out_ref.aux_loss, tag + " aux loss"));
      ((out_ref.output * w).sum() + out_ref.aux_loss).backward();
      ((out_ep.output * w).sum() + out_ep.aux_loss).backward();
      EXPECT_TRUE(close(x_ep.grad(), x_ref.grad(), tag + " input gradient"));
      EXPECT_TRUE(close(ep->gate->weight.grad(), ref->gate->weight.grad(), tag + " gate gradient"));
      // The reference's expert gradients summed over every rank's tokens.
      ASSERT_EQ(ref->experts->size(), static_cast<size_t>(E));
      zt::test_support::sum_reference_expert_grads(ref, g);
      for (const auto& eg : zt::test_support::local_expert_grads(ref, ep)) {
        ASSERT_TRUE(eg.got.defined()) << tag << " expert " << eg.expert;
        EXPECT_TRUE(close(eg.got, eg.want, tag + " expert " + std::to_string(eg.expert) + " param " + std::to_string(eg.param)));
      }
      if (!drop) EXPECT_EQ(out_ep.gate.dropped_fraction, 0.0) << tag;
    }
  }
}

// [Sparse Dispatch] at ep > 1 against the dense path it replaced (the old einsum dispatch
// and combine around the same all-to-alls, tests/support/moe_dense_reference.h) with the
// same module on every rank: output, aux loss, input, gate and local expert gradients
// within 1e-6. Top-1 and top-2, capacity factor 1.0 with drops and dropless; rank-dependent
// skewed tokens so the counts per expert differ by rank (some experts get none).
TEST(MoEExpertParallel, SparseEqualsTheDenseExchange) {
  auto g = world();
  const int P = g->size(), r = g->rank();
  const int64_t E = 2 * P;
  for (int64_t k : {1, 2}) {
    for (bool drop : {true, false}) {
      const std::string tag = "k=" + std::to_string(k) + (drop ? " drop" : " no-drop") + " P=" + std::to_string(P);
      torch::manual_seed(12);
      MoE ep = make(options(E, k, drop, g));
      auto gen = at::make_generator<at::CPUGeneratorImpl>(200 + r);
      auto x = torch::randn({3, 5, kHidden}, gen);
      x.select(2, r % kHidden).add_(2.0);
      const auto w = torch::randn({3, 5, kHidden}, gen);
      auto run = [&](bool sparse, double& dropped) {
        ep->zero_grad();
        auto xi = x.clone().requires_grad_(true);
        torch::Tensor y, aux;
        if (sparse) {
          auto out = ep->forward(xi);
          y = out.output;
          aux = out.aux_loss;
          dropped = out.gate.dropped_fraction;
        } else {
          auto out = zt::test_support::moe_dense_forward(*ep, xi);
          y = out.output;
          aux = out.aux_loss;
        }
        ((y * w).sum() + aux).backward();
        std::vector<torch::Tensor> got{y.detach(), aux.detach(), xi.grad()};
        for (const auto& p : ep->parameters()) got.push_back(p.grad().clone());
        return got;
      };
      double dropped = 0, unused = 0;
      const auto s = run(true, dropped);
      const auto d = run(false, unused);
      // Drops on some rank (the capacity is agreed, the counts are per rank).
      auto any_drop = torch::full({1}, dropped, torch::kDouble);
      g->all_reduce(any_drop, comm::ReduceOp::kMax);
      // (Top-2 over 2 experts, world 1, sends every token to both: C = 2 ceil(T/2) never drops.)
      if (drop && !(k == 2 && E == 2)) EXPECT_GT(any_drop.item<double>(), 0.0) << tag;
      else EXPECT_EQ(dropped, 0.0) << tag;
      ASSERT_EQ(s.size(), d.size());
      for (size_t i = 0; i < s.size(); ++i)
        EXPECT_TRUE(close(s[i], d[i], tag + " tensor " + std::to_string(i) + " (output, aux, input grad, params)"));
    }
  }
}

// all_to_all_rows with a rank that sends no rows (rank 0 sends none; every other rank r
// sends one row [r, p, 0] to each rank p), forward and backward (the gradient goes back with
// the splits swapped). A 0-row input once lost its width (the MoEEngine rows at 4 ranks).
TEST(MoEExpertParallel, RowExchangeWithARankThatSendsNothing) {
  auto g = world();
  const int P = g->size(), r = g->rank();
  std::vector<int64_t> send(static_cast<size_t>(P), r == 0 ? 0 : 1), recv(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) recv[static_cast<size_t>(p)] = p == 0 ? 0 : 1;
  auto x = torch::zeros({r == 0 ? 0 : P, 3});
  for (int p = 0; r != 0 && p < P; ++p) x[p] = torch::tensor({static_cast<float>(r), static_cast<float>(p), 0.f});
  x.requires_grad_(true);
  const auto y = all_to_all_rows(x, g, send, recv);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{P - 1, 3}));
  for (int p = 1; p < P; ++p)
    EXPECT_TRUE(torch::equal(y[p - 1].detach(), torch::tensor({static_cast<float>(p), static_cast<float>(r), 0.f})));
  (y * (r + 1)).sum().backward();  // each received row's gradient is (receiver + 1)
  for (int p = 0; r != 0 && p < P; ++p)
    EXPECT_TRUE(torch::equal(x.grad()[p], torch::full({3}, static_cast<float>(p + 1)))) << "row for rank " << p;
}

TEST(MoEExpertParallel, ExpertsThatDoNotDivideAreNamed) {
  auto g = world();
  if (g->size() < 2) GTEST_SKIP() << "needs 2 ranks (an ep size > 1)";
  try {
    make(options(2 * g->size() + 1, 1, true, g));
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide by the expert-parallel size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace test_moe_ep
}  // namespace zt::models
