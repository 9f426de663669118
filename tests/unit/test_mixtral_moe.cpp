// [Mixtral Routing] (models/moe.h): the gate and the MoE layer with Mixtral's routing against
// a direct per-token reference (softmax over all experts, top-k, renormalise, weighted SwiGLU
// experts) and HF's load_balancing_loss_func, forward and gradients within 1e-6 in fp32.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "models/moe.h"
#include "zerotrain/error.h"

namespace zt_test_mixtral_moe {

using namespace zt::models;

namespace {

// Mixtral's expert (HF MixtralBlockSparseTop2MLP): w2(silu(w1 x) * w3 x), no biases.
struct MixtralTestExpertImpl : torch::nn::Module {
  MixtralTestExpertImpl(int64_t d, int64_t inter) {
    w1 = register_module("w1", torch::nn::Linear(torch::nn::LinearOptions(d, inter).bias(false)));
    w2 = register_module("w2", torch::nn::Linear(torch::nn::LinearOptions(inter, d).bias(false)));
    w3 = register_module("w3", torch::nn::Linear(torch::nn::LinearOptions(d, inter).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return w2(torch::silu(w1(x)) * w3(x)); }
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(MixtralTestExpert);

MoEOptions mixtral_test_options(int64_t d, int64_t E, int64_t k) {
  MoEOptions o;
  o.hidden = d;
  o.num_experts = E;
  o.gate.routing = GateRouting::Mixtral;
  o.gate.k = k;
  return o;
}

}  // namespace

TEST(MixtralGate, HandCheckedRouting) {
  // 3 tokens, 4 experts, top-2. Token 0: logits [2, 1, 0, -1] -> experts 0, 1 with weights
  // softmax([2, 1]) = [e/(e+1), 1/(e+1)]. Token 1: [0, 0, 3, 1] -> 2, 3. Token 2: [1, 0, 0, 5] -> 3, 0.
  const auto logits = torch::tensor({2.f, 1.f, 0.f, -1.f, 0.f, 0.f, 3.f, 1.f, 1.f, 0.f, 0.f, 5.f}).reshape({3, 4});
  GateOptions o;
  o.routing = GateRouting::Mixtral;
  o.k = 2;
  const auto r = topk_gating(logits, o);
  EXPECT_TRUE(torch::equal(r.expert_index, torch::tensor({0, 1, 2, 3, 3, 0}, torch::kLong).reshape({3, 2})));
  const double e = std::exp(1.0), e2 = std::exp(2.0), e4 = std::exp(4.0);
  const auto w = r.weights;
  EXPECT_NEAR(w[0][0].item<double>(), e / (e + 1), 1e-6);
  EXPECT_NEAR(w[0][1].item<double>(), 1 / (e + 1), 1e-6);
  EXPECT_NEAR(w[1][0].item<double>(), e2 / (e2 + 1), 1e-6);
  EXPECT_NEAR(w[2][0].item<double>(), e4 / (e4 + 1), 1e-6);
  EXPECT_TRUE(r.kept.all().item<bool>());  // dropless
  EXPECT_EQ(r.dropped_fraction, 0.0);
  // Slots: first choices first (token order), then second choices. Expert 3: token 2's first
  // choice (slot 0), token 1's second (slot 1); expert 0: token 0 first (0), token 2 second (1).
  EXPECT_TRUE(torch::equal(r.slot, torch::tensor({0, 0, 0, 1, 0, 1}, torch::kLong).reshape({3, 2})));
  EXPECT_EQ(r.kept_counts, (std::vector<int64_t>{2, 1, 1, 2}));
  EXPECT_EQ(r.capacity, 2);
  // HF load_balancing_loss_func: E * sum_{j,e} mean_t(one_hot)[j,e] * mean_t(softmax)[e].
  const auto p = torch::softmax(logits, 1).mean(0);
  const auto ce = torch::tensor({1.f, 0.f, 1.f, 1.f, 1.f, 1.f, 0.f, 1.f}).reshape({2, 4}) / 3.0;
  const double want = 4.0 * (ce * p.unsqueeze(0)).sum().item<double>();
  EXPECT_NEAR(r.aux_loss.item<double>(), want, 1e-6);
}

TEST(MixtralGate, DroplessWhenEveryTokenPicksOneExpert) {
  GateOptions o;
  o.routing = GateRouting::Mixtral;
  o.k = 2;
  auto logits = torch::zeros({9, 4});
  logits.select(1, 2).fill_(4.0);
  const auto r = topk_gating(logits, o);
  EXPECT_EQ(r.kept_counts[2], 9);  // DeepSpeed's capacity would have dropped most of these
  EXPECT_TRUE(r.kept.all().item<bool>());
}

TEST(MixtralGate, BadTopKIsAConfigError) {
  GateOptions o;
  o.routing = GateRouting::Mixtral;
  o.k = 5;
  EXPECT_THROW(topk_gating(torch::zeros({2, 4}), o), zt::ConfigError);
  const int64_t d = 4;
  EXPECT_THROW(MoE(mixtral_test_options(d, 4, 5), [] { return torch::nn::AnyModule(MixtralTestExpert(4, 3)); }),
               zt::ConfigError);
}

// The layer (sparse dispatch) against a loop over tokens: y_t = sum_j w_tj * expert_{e_tj}(x_t),
// forward and the gradients of the input, the gate and every expert weight, k = 2 and 3.
TEST(MixtralMoE, LayerEqualsPerTokenReference) {
  for (int64_t k : {1, 2, 3}) {
    SCOPED_TRACE(k);
    torch::manual_seed(7);
    const int64_t d = 6, inter = 5, E = 4, T = 11;
    MoE layer(mixtral_test_options(d, E, k), [&] { return torch::nn::AnyModule(MixtralTestExpert(d, inter)); });
    auto x = torch::randn({T, d}, torch::requires_grad());
    const auto out = layer->forward(x);
    const auto probe = torch::randn({T, d});
    const double coef = 0.02;
    ((out.output * probe).sum() + coef * out.aux_loss).backward();

    // Reference on copies of the parameters.
    auto xr = x.detach().clone().requires_grad_(true);
    auto gw = layer->gate->weight.detach().clone().requires_grad_(true);
    std::vector<std::vector<torch::Tensor>> ew(E);  // w1, w2, w3 per expert
    for (int64_t e = 0; e < E; ++e) {
      auto* ex = layer->experts->ptr<MixtralTestExpertImpl>(e).get();
      for (auto* lin : {&ex->w1, &ex->w2, &ex->w3}) ew[e].push_back((*lin)->weight.detach().clone().requires_grad_(true));
    }
    std::vector<torch::Tensor> ys;
    auto mask_sum = torch::zeros({k, E});
    auto prob_sum = torch::zeros({E});
    for (int64_t t = 0; t < T; ++t) {
      const auto xt = xr[t];
      const auto p = torch::softmax(torch::mv(gw, xt), 0);
      prob_sum = prob_sum + p;
      const auto top = p.topk(k);
      const auto v = std::get<0>(top);
      const auto idx = std::get<1>(top);
      auto y = torch::zeros({d});
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = idx[j].item<int64_t>();
        mask_sum[j][e] += 1.0;
        const auto& W = ew[e];
        const auto h = torch::silu(torch::mv(W[0], xt)) * torch::mv(W[2], xt);
        y = y + v[j] / v.sum() * torch::mv(W[1], h);
      }
      ys.push_back(y);
    }
    const auto yref = torch::stack(ys);
    const auto aux_ref = static_cast<double>(E) * (mask_sum / T * (prob_sum / T).unsqueeze(0)).sum();
    ((yref * probe).sum() + coef * aux_ref).backward();

    EXPECT_LT((out.output - yref).abs().max().item<double>(), 1e-6);
    EXPECT_NEAR(out.aux_loss.item<double>(), aux_ref.item<double>(), 1e-6);
    EXPECT_LT((x.grad() - xr.grad()).abs().max().item<double>(), 1e-6);
    EXPECT_LT((layer->gate->weight.grad() - gw.grad()).abs().max().item<double>(), 1e-6);
    for (int64_t e = 0; e < E; ++e) {
      auto* ex = layer->experts->ptr<MixtralTestExpertImpl>(e).get();
      int i = 0;
      for (auto* lin : {&ex->w1, &ex->w2, &ex->w3}) {
        const auto g = (*lin)->weight.grad();
        const auto gr = ew[e][i++].grad();
        if (!gr.defined()) {  // an expert no token chose: zero gradient
          EXPECT_TRUE(!g.defined() || g.abs().max().item<double>() == 0.0);
          continue;
        }
        ASSERT_TRUE(g.defined());
        EXPECT_LT((g - gr).abs().max().item<double>(), 1e-6) << "expert " << e << " w" << i;
      }
    }
  }
}

}  // namespace zt_test_mixtral_moe
