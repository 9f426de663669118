// MoE gating against hand-computed routing (DeepSpeed's top1gating/top2gating rules, see
// [Gating Rules] in src/models/moe.h) and the MoE layer against a per-token loop.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>
#include <vector>

#include "models/moe.h"
#include "zerotrain/error.h"

namespace zt_test_moe {

using namespace zt::models;

namespace {

constexpr double kTol = 1e-6;  // fp32 softmax of small logits

// Logits whose softmax over 2 experts is [0.75, 0.25] (expert 0) or [0.25, 0.75] (expert 1).
torch::Tensor two_expert_logits(const std::vector<int>& choice) {
  auto l = torch::zeros({static_cast<int64_t>(choice.size()), 2});
  for (size_t t = 0; t < choice.size(); ++t) l[static_cast<int64_t>(t)][choice[t]] = std::log(3.0);
  return l;
}

GateOptions top1_plain(double cf, int64_t min_cap) {
  GateOptions o;
  o.k = 1;
  o.capacity_factor = cf;
  o.min_capacity = min_cap;
  o.use_rts = false;
  return o;
}

// The slot of token t in expert e, or -1 when it is not dispatched there.
int64_t slot_of(const GateResult& r, int64_t t, int64_t e) {
  auto row = r.dispatch_mask[t][e];
  ZT_CHECK(row.sum().item<int64_t>() <= 1, "more than one slot");
  return row.any().item<bool>() ? row.to(torch::kLong).argmax().item<int64_t>() : -1;
}

}  // namespace

TEST(MoEGate, Capacity) {
  EXPECT_EQ(moe_capacity(10, 4, 1.0, 0), 3);  // ceil(2.5)
  EXPECT_EQ(moe_capacity(10, 4, 1.0, 4), 4);  // min_capacity wins
  EXPECT_EQ(moe_capacity(8, 4, 1.5, 1), 3);
  EXPECT_EQ(moe_capacity(8, 4, 2.0, 1), 4);
}

TEST(MoEGate, Top1DropsLateTokensInTokenOrder) {
  // Tokens 0,1,2,4 pick expert 0, tokens 3,5 expert 1; C = ceil(6/2 * 1.0) = 3.
  const auto r = top1_gating(two_expert_logits({0, 0, 0, 1, 0, 1}), top1_plain(1.0, 0));
  EXPECT_EQ(r.capacity, 3);
  EXPECT_EQ(r.combine_weights.sizes(), (std::vector<int64_t>{6, 2, 3}));
  EXPECT_EQ(slot_of(r, 0, 0), 0);
  EXPECT_EQ(slot_of(r, 1, 0), 1);
  EXPECT_EQ(slot_of(r, 2, 0), 2);
  EXPECT_EQ(slot_of(r, 4, 0), -1);  // 4th token for expert 0: dropped
  EXPECT_EQ(slot_of(r, 4, 1), -1);
  EXPECT_EQ(slot_of(r, 3, 1), 0);
  EXPECT_EQ(slot_of(r, 5, 1), 1);
  EXPECT_EQ(r.dispatch_mask.sum().item<int64_t>(), 5);
  EXPECT_NEAR(r.combine_weights[2][0][2].item<float>(), 0.75, kTol);  // the gate, not normalized
  EXPECT_NEAR(r.combine_weights[5][1][1].item<float>(), 0.75, kTol);
  EXPECT_EQ(r.combine_weights[4].abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(r.tokens_per_expert, torch::tensor({4, 2}, torch::kLong)));
  EXPECT_TRUE(torch::equal(r.kept_per_expert, torch::tensor({3, 2}, torch::kLong)));
  EXPECT_NEAR(r.dropped_fraction, 1.0 / 6.0, 1e-12);
  // aux = E * sum_e me_e ce_e: me = [3.5/6, 2.5/6], ce = [4/6, 2/6] -> 2 * 19/36.
  EXPECT_NEAR(r.aux_loss.item<float>(), 38.0 / 36.0, 1e-6);
}

TEST(MoEGate, Top1MinCapacityAndDropless) {
  const auto l = two_expert_logits({0, 0, 0, 1, 0, 1});
  const auto a = top1_gating(l, top1_plain(1.0, 4));
  EXPECT_EQ(a.capacity, 4);
  EXPECT_EQ(a.dropped_fraction, 0.0);
  EXPECT_EQ(slot_of(a, 4, 0), 3);
  auto o = top1_plain(0.1, 0);
  o.drop_tokens = false;  // C = most tokens on one expert = 4
  const auto b = top1_gating(l, o);
  EXPECT_EQ(b.capacity, 4);
  EXPECT_EQ(b.dropped_fraction, 0.0);
  EXPECT_EQ(slot_of(b, 4, 0), 3);
  EXPECT_NEAR(b.aux_loss.item<float>(), 38.0 / 36.0, 1e-6);  // aux counts before drops either way
}

namespace {
// t0 [2,1,0]: 1st e0, 2nd e1;  t1 [1,2,0]: 1st e1, 2nd e0;
// t2 [2,0,1]: 1st e0, 2nd e2;  t3 [0,1,2]: 1st e2, 2nd e1.
torch::Tensor top2_logits() {
  return torch::tensor({2.f, 1.f, 0.f, 1.f, 2.f, 0.f, 2.f, 0.f, 1.f, 0.f, 1.f, 2.f}).reshape({4, 3});
}
GateOptions top2_plain(double cf, bool drop) {
  GateOptions o;
  o.k = 2;
  o.capacity_factor = cf;
  o.min_capacity = 0;
  o.drop_tokens = drop;
  o.second_expert_sampling = false;
  return o;
}
}  // namespace

TEST(MoEGate, Top2SecondChoicesComeAfterAllFirstChoices) {
  // C = ceil(4/3 * 2 * 0.5) = 2. Slots: e0: t0 0, t2 1 (firsts), t1 2 (second: drops);
  // e1: t1 0 (first), t0 1, t3 2 (seconds: t3 drops); e2: t3 0 (first), t2 1 (second).
  const auto r = top2_gating(top2_logits(), top2_plain(0.5, true));
  EXPECT_EQ(r.capacity, 2);
  EXPECT_EQ(slot_of(r, 0, 0), 0);
  EXPECT_EQ(slot_of(r, 2, 0), 1);
  EXPECT_EQ(slot_of(r, 1, 0), -1);
  EXPECT_EQ(slot_of(r, 1, 1), 0);
  EXPECT_EQ(slot_of(r, 0, 1), 1);  // token 0's second choice after token 1's first choice
  EXPECT_EQ(slot_of(r, 3, 1), -1);
  EXPECT_EQ(slot_of(r, 3, 2), 0);
  EXPECT_EQ(slot_of(r, 2, 2), 1);
  EXPECT_TRUE(torch::equal(r.tokens_per_expert, torch::tensor({3, 3, 2}, torch::kLong)));
  EXPECT_TRUE(torch::equal(r.kept_per_expert, torch::tensor({2, 2, 2}, torch::kLong)));
  EXPECT_NEAR(r.dropped_fraction, 0.25, 1e-12);
  // Normalized over the kept pair: e^2/(e^2+e^1) = e/(e+1); a lone first choice gets 1.
  const double w = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(r.combine_weights[0][0][0].item<float>(), w, kTol);
  EXPECT_NEAR(r.combine_weights[0][1][1].item<float>(), 1 - w, kTol);
  EXPECT_NEAR(r.combine_weights[2][0][1].item<float>(), w, kTol);
  EXPECT_NEAR(r.combine_weights[2][2][1].item<float>(), 1 - w, kTol);
  EXPECT_NEAR(r.combine_weights[1][1][0].item<float>(), 1.0, kTol);
  EXPECT_NEAR(r.combine_weights[3][2][0].item<float>(), 1.0, kTol);
  EXPECT_NEAR(r.combine_weights.sum().item<float>(), 4.0, 1e-5);
  // aux = E * sum_e me_e ce_e, ce from first choices only = [2/4, 1/4, 1/4].
  const double z = std::exp(2.0) + std::exp(1.0) + 1.0;
  const double hi = std::exp(2.0) / z, mid = std::exp(1.0) / z, lo = 1.0 / z;
  const double me0 = (hi + mid + hi + lo) / 4, me1 = (mid + hi + lo + mid) / 4, me2 = (lo + lo + mid + hi) / 4;
  EXPECT_NEAR(r.aux_loss.item<float>(), 3 * (me0 * 0.5 + me1 * 0.25 + me2 * 0.25), 1e-6);
}

TEST(MoEGate, Top2Dropless) {
  const auto r = top2_gating(top2_logits(), top2_plain(0.01, false));
  EXPECT_EQ(r.capacity, 3);  // most assignments on one expert
  EXPECT_EQ(r.dropped_fraction, 0.0);
  EXPECT_EQ(r.dispatch_mask.sum().item<int64_t>(), 8);
  EXPECT_EQ(slot_of(r, 1, 0), 2);
  EXPECT_EQ(slot_of(r, 3, 1), 2);
  const double w = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(r.combine_weights[1][1][0].item<float>(), w, kTol);
  EXPECT_NEAR(r.combine_weights[1][0][2].item<float>(), 1 - w, kTol);
}

TEST(MoEGate, RandomTokenSelectionIsSeededAndKeepsTokenOrderSlots) {
  auto o = top1_plain(1.0, 0);
  o.use_rts = true;
  const auto l = two_expert_logits({0, 0, 0, 0, 0, 0, 1, 1});  // C = 4, expert 0 has 6
  std::set<std::vector<int64_t>> kept_sets;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    auto g1 = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto g2 = at::make_generator<at::CPUGeneratorImpl>(seed);
    const auto a = top1_gating(l, o, g1), b = top1_gating(l, o, g2);
    EXPECT_TRUE(torch::equal(a.dispatch_mask, b.dispatch_mask));
    EXPECT_EQ(a.kept_per_expert[0].item<int64_t>(), 4);
    std::vector<int64_t> kept;
    int64_t next_slot = 0;
    for (int64_t t = 0; t < 6; ++t) {
      const auto s = slot_of(a, t, 0);
      if (s < 0) continue;
      EXPECT_EQ(s, next_slot++);  // kept tokens take slots in token order
      kept.push_back(t);
    }
    kept_sets.insert(kept);
  }
  EXPECT_GT(kept_sets.size(), 1u);  // the choice is random, not the first C
}

TEST(MoEGate, RSampleIsSeededAndKeepsSoftmaxGates) {
  auto o = top1_plain(4.0, 0);
  o.noisy_gate_policy = NoisyGatePolicy::RSample;
  const auto l = torch::zeros({64, 4});  // without noise every token would pick expert 0
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(7), g2 = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto a = top1_gating(l, o, g1), b = top1_gating(l, o, g2);
  EXPECT_TRUE(torch::equal(a.combine_weights, b.combine_weights));
  EXPECT_GT(a.tokens_per_expert.min().item<int64_t>(), 0);
  EXPECT_NEAR(a.combine_weights.sum().item<float>(), 64 * 0.25, 1e-4);  // gates are softmax(logits)
  const auto c = top1_gating(l, top1_plain(4.0, 0));
  EXPECT_EQ(c.tokens_per_expert[0].item<int64_t>(), 64);
}

TEST(MoEGate, SecondExpertSamplingIsSeeded) {
  auto o = top2_plain(8.0, true);
  o.second_expert_sampling = true;
  auto l = torch::zeros({64, 4});
  l.select(1, 0).fill_(1.0);  // first choice e0 always; second is a tie among e1..e3
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(3), g2 = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto a = top2_gating(l, o, g1), b = top2_gating(l, o, g2);
  EXPECT_TRUE(torch::equal(a.dispatch_mask, b.dispatch_mask));
  EXPECT_EQ(a.tokens_per_expert[0].item<int64_t>(), 64);
  EXPECT_GT(a.tokens_per_expert[1].item<int64_t>(), 0);
  EXPECT_GT(a.tokens_per_expert[3].item<int64_t>(), 0);
}

TEST(MoEGate, JitterIsSeededAndBounded) {
  const auto x = torch::ones({1000});
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(5), g2 = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto a = multiplicative_jitter(x, 1e-2, g1), b = multiplicative_jitter(x, 1e-2, g2);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_LE(a.max().item<float>(), 1.01f);
  EXPECT_GE(a.min().item<float>(), 0.99f);
  EXPECT_GT((a - 1).abs().max().item<float>(), 1e-3f);
}

TEST(MoEGate, BadOptionsAreConfigErrors) {
  auto o = top2_plain(1.0, true);
  o.noisy_gate_policy = NoisyGatePolicy::RSample;
  EXPECT_THROW(top2_gating(top2_logits(), o), zt::ConfigError);
  o = top2_plain(1.0, true);
  o.k = 3;
  EXPECT_THROW(topk_gating(top2_logits(), o), zt::ConfigError);
  EXPECT_THROW(top2_gating(torch::zeros({4, 1}), top2_plain(1.0, true)), zt::ConfigError);
  EXPECT_THROW(parse_noisy_gate_policy("gaussian"), zt::ConfigError);
  EXPECT_EQ(parse_noisy_gate_policy("RSample"), NoisyGatePolicy::RSample);
}

namespace {

// d -> 2d -> ReLU -> d (AnyModule cannot hold a Sequential).
struct TwoLayerImpl : torch::nn::Module {
  explicit TwoLayerImpl(int64_t d)
      : fc1(register_module("fc1", torch::nn::Linear(d, 2 * d))),
        fc2(register_module("fc2", torch::nn::Linear(2 * d, d))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoLayer);

ExpertFactory mlp_expert(int64_t d) {
  return [d] { return torch::nn::AnyModule(TwoLayer(d)); };
}

// The layer's routing written as a loop over tokens: top-k choices from the logits,
// slots counted in token order (second choices after all firsts), drops at C, weights
// normalized over the kept choices for k=2.
torch::Tensor reference_forward(MoEImpl& m, const torch::Tensor& x, double cf) {
  const auto flat = x.reshape({-1, m.opt_.hidden});
  const int64_t S = flat.size(0), E = m.opt_.num_experts, k = m.opt_.gate.k;
  const auto probs = torch::softmax(torch::matmul(flat, m.gate->weight.t()), 1);
  const int64_t C = m.opt_.gate.drop_tokens
                        ? moe_capacity(S, E, k * cf, m.opt_.gate.min_capacity)
                        : S;  // dropless: everything fits
  std::vector<int64_t> first(static_cast<size_t>(S)), second(static_cast<size_t>(S));
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  std::vector<bool> keep1(static_cast<size_t>(S)), keep2(static_cast<size_t>(S), false);
  for (int64_t t = 0; t < S; ++t) {
    auto p = probs[t].clone();
    first[t] = p.argmax().item<int64_t>();
    keep1[t] = count[first[t]]++ < C;
    p[first[t]] = -1;
    second[t] = p.argmax().item<int64_t>();
  }
  if (k == 2)
    for (int64_t t = 0; t < S; ++t) keep2[t] = count[second[t]]++ < C;
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < S; ++t) {
    const auto xt = flat[t].unsqueeze(0);
    double w1 = keep1[t] ? probs[t][first[t]].item<double>() : 0.0;
    double w2 = keep2[t] ? probs[t][second[t]].item<double>() : 0.0;
    if (k == 2 && (w1 + w2) > 0) {
      const double s = w1 + w2;
      w1 /= s;
      w2 /= s;
    }
    auto y = torch::zeros_like(xt);
    if (w1 != 0) y = y + w1 * m.expert_fns[first[t]].forward(xt);
    if (w2 != 0) y = y + w2 * m.expert_fns[second[t]].forward(xt);
    rows.push_back(y);
  }
  auto y = torch::cat(rows).reshape(x.sizes());
  if (m.opt_.use_residual) {
    const auto c = torch::softmax(m.coefficient(x), -1);
    y = y * c.narrow(-1, 0, 1) + m.mlp.forward(x) * c.narrow(-1, 1, 1);
  }
  return y;
}

}  // namespace

TEST(MoELayer, EqualsPerTokenLoop) {
  torch::manual_seed(0);
  for (int64_t k : {1, 2}) {
    for (bool drop : {true, false}) {
      for (bool residual : {false, true}) {
        MoEOptions o;
        o.hidden = 8;
        o.num_experts = 4;
        o.gate.k = k;
        o.gate.use_rts = false;
        o.gate.second_expert_sampling = false;
        o.gate.drop_tokens = drop;
        o.gate.min_capacity = 0;
        o.eval_capacity_factor = 0.5;  // low enough that tokens drop
        o.use_residual = residual;
        MoE m(o, mlp_expert(8));
        m->eval();
        torch::NoGradGuard ng;
        const auto x = torch::randn({3, 10, 8});
        const auto out = m->forward(x);
        SCOPED_TRACE("k=" + std::to_string(k) + " drop=" + std::to_string(drop) +
                     " residual=" + std::to_string(residual));
        EXPECT_EQ(out.output.sizes(), x.sizes());
        if (drop) EXPECT_GT(out.gate.dropped_fraction, 0.0);
        else EXPECT_EQ(out.gate.dropped_fraction, 0.0);
        const auto ref = reference_forward(*m, x, 0.5);
        EXPECT_TRUE(torch::allclose(out.output, ref, 1e-5, 1e-5))
            << "max diff " << (out.output - ref).abs().max().item<float>();
      }
    }
  }
}

TEST(MoELayer, GradientsReachGateExpertsAndCoefficient) {
  torch::manual_seed(1);
  MoEOptions o;
  o.hidden = 8;
  o.num_experts = 4;
  o.gate.k = 2;
  o.gate.capacity_factor = 2.0;
  o.use_residual = true;
  MoE m(o, mlp_expert(8));
  m->train();
  m->set_generator(at::make_generator<at::CPUGeneratorImpl>(11));
  const auto x = torch::randn({32, 8});
  const auto out = m->forward(x);
  (out.output.pow(2).sum() + out.aux_loss).backward();
  EXPECT_GT(m->gate->weight.grad().abs().sum().item<float>(), 0.0f);
  for (int64_t e = 0; e < 4; ++e) {
    if (out.gate.kept_per_expert[e].item<int64_t>() == 0) continue;
    for (const auto& p : m->experts[e]->parameters())
      EXPECT_GT(p.grad().abs().sum().item<float>(), 0.0f) << "expert " << e;
  }
  EXPECT_GT(m->coefficient->weight.grad().abs().sum().item<float>(), 0.0f);
  // The aux loss alone also trains the gate (through me).
  m->zero_grad();
  m->forward(x).aux_loss.backward();
  EXPECT_GT(m->gate->weight.grad().abs().sum().item<float>(), 0.0f);
}

TEST(MoELayer, JitterIsSeededAndTrainingOnly) {
  torch::manual_seed(2);
  MoEOptions o;
  o.hidden = 8;
  o.num_experts = 4;
  o.gate.noisy_gate_policy = NoisyGatePolicy::Jitter;
  o.gate.use_rts = false;
  o.gate.capacity_factor = 4.0;
  o.eval_capacity_factor = 4.0;
  MoE m(o, mlp_expert(8));
  const auto x = torch::randn({64, 8});
  torch::NoGradGuard ng;
  m->train();
  m->set_generator(at::make_generator<at::CPUGeneratorImpl>(9));
  const auto a = m->forward(x).output;
  m->set_generator(at::make_generator<at::CPUGeneratorImpl>(9));
  const auto b = m->forward(x).output;
  EXPECT_TRUE(torch::equal(a, b));
  m->eval();
  const auto c = m->forward(x).output, d = m->forward(x).output;
  EXPECT_TRUE(torch::equal(c, d));
  EXPECT_FALSE(torch::equal(a, c));  // the jitter moved the gate values
}

TEST(MoELayer, ParameterNames) {
  MoEOptions o;
  o.hidden = 4;
  o.num_experts = 2;
  o.use_residual = true;
  MoE m(o, [] { return torch::nn::AnyModule(torch::nn::Linear(4, 4)); });
  std::set<std::string> names;
  for (const auto& p : m->named_parameters()) names.insert(p.key());
  EXPECT_EQ(names, (std::set<std::string>{"gate.weight", "experts.0.weight", "experts.0.bias", "experts.1.weight",
                                          "experts.1.bias", "mlp.weight", "mlp.bias", "coefficient.weight",
                                          "coefficient.bias"}));
  o.gate.k = 2;
  o.gate.noisy_gate_policy = NoisyGatePolicy::RSample;
  EXPECT_THROW(MoE(o, [] { return torch::nn::AnyModule(torch::nn::Linear(4, 4)); }), zt::ConfigError);
}

}  // namespace zt_test_moe
