// MoE gating against hand-computed routing (DeepSpeed's top1gating/top2gating rules, see
// [Gating Rules] in src/models/moe.h) and the MoE layer against a per-token loop.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>
#include <vector>

#include "models/moe.h"
#include "support/cpu_byte_counter.h"
#include "support/moe_dense_reference.h"
#include "zerotrain/error.h"

namespace zt_test_moe {

using namespace zt::models;
using zt::test_support::moe_dense_combine;
using zt::test_support::moe_dense_dispatch;

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
  auto row = moe_dense_dispatch(r)[t][e];
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
  EXPECT_EQ(moe_dense_combine(r).sizes(), (std::vector<int64_t>{6, 2, 3}));
  EXPECT_EQ(slot_of(r, 0, 0), 0);
  EXPECT_EQ(slot_of(r, 1, 0), 1);
  EXPECT_EQ(slot_of(r, 2, 0), 2);
  EXPECT_EQ(slot_of(r, 4, 0), -1);  // 4th token for expert 0: dropped
  EXPECT_EQ(slot_of(r, 4, 1), -1);
  EXPECT_EQ(slot_of(r, 3, 1), 0);
  EXPECT_EQ(slot_of(r, 5, 1), 1);
  EXPECT_EQ(moe_dense_dispatch(r).sum().item<int64_t>(), 5);
  EXPECT_NEAR(moe_dense_combine(r)[2][0][2].item<float>(), 0.75, kTol);  // the gate, not normalized
  EXPECT_NEAR(moe_dense_combine(r)[5][1][1].item<float>(), 0.75, kTol);
  EXPECT_EQ(moe_dense_combine(r)[4].abs().sum().item<float>(), 0.0f);
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
  EXPECT_NEAR(moe_dense_combine(r)[0][0][0].item<float>(), w, kTol);
  EXPECT_NEAR(moe_dense_combine(r)[0][1][1].item<float>(), 1 - w, kTol);
  EXPECT_NEAR(moe_dense_combine(r)[2][0][1].item<float>(), w, kTol);
  EXPECT_NEAR(moe_dense_combine(r)[2][2][1].item<float>(), 1 - w, kTol);
  EXPECT_NEAR(moe_dense_combine(r)[1][1][0].item<float>(), 1.0, kTol);
  EXPECT_NEAR(moe_dense_combine(r)[3][2][0].item<float>(), 1.0, kTol);
  EXPECT_NEAR(moe_dense_combine(r).sum().item<float>(), 4.0, 1e-5);
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
  EXPECT_EQ(moe_dense_dispatch(r).sum().item<int64_t>(), 8);
  EXPECT_EQ(slot_of(r, 1, 0), 2);
  EXPECT_EQ(slot_of(r, 3, 1), 2);
  const double w = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(moe_dense_combine(r)[1][1][0].item<float>(), w, kTol);
  EXPECT_NEAR(moe_dense_combine(r)[1][0][2].item<float>(), 1 - w, kTol);
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
    EXPECT_TRUE(torch::equal(moe_dense_dispatch(a), moe_dense_dispatch(b)));
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
  EXPECT_TRUE(torch::equal(moe_dense_combine(a), moe_dense_combine(b)));
  EXPECT_GT(a.tokens_per_expert.min().item<int64_t>(), 0);
  EXPECT_NEAR(moe_dense_combine(a).sum().item<float>(), 64 * 0.25, 1e-4);  // gates are softmax(logits)
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
  EXPECT_TRUE(torch::equal(moe_dense_dispatch(a), moe_dense_dispatch(b)));
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


// [Sparse Dispatch] against the dense one-hot path it replaced (tests/support/
// moe_dense_reference.h, the old code verbatim).
namespace {

struct SparseCase {
  const char* name;
  int64_t k;
  bool drop;       // capacity factor 1.0 with drops, or dropless
  bool noise;      // top-1: random token selection + RSample; top-2: jitter + 2nd-expert sampling
  bool residual;
};

MoEOptions sparse_case_options(const SparseCase& c) {
  MoEOptions o;
  o.hidden = 8;
  o.num_experts = 4;
  o.gate.k = c.k;
  o.gate.capacity_factor = 1.0;
  o.gate.min_capacity = 0;
  o.gate.drop_tokens = c.drop;
  o.gate.use_rts = c.noise && c.k == 1;
  o.gate.second_expert_sampling = c.noise && c.k == 2;
  o.gate.noisy_gate_policy = !c.noise ? NoisyGatePolicy::None
                             : c.k == 1 ? NoisyGatePolicy::RSample
                                        : NoisyGatePolicy::Jitter;
  o.use_residual = c.residual;
  return o;
}

double sparse_max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const auto da = a.defined() ? a : torch::zeros_like(b), db = b.defined() ? b : torch::zeros_like(a);
  return (da - db).abs().max().item<double>();
}

}  // namespace

// Same gate decisions: the sparse routing, densified, is the dense gate's [T, E, C]
// tensors exactly (same tokens dropped, same slots, same weights), for random logits.
TEST(MoESparse, GateEqualsTheDenseGate) {
  for (int64_t k : {1, 2})
    for (bool drop : {true, false})
      for (bool rts : {false, true}) {
        GateOptions o;
        o.k = k;
        o.capacity_factor = 0.75;
        o.min_capacity = 0;
        o.drop_tokens = drop;
        o.use_rts = rts;
        o.second_expert_sampling = rts;
        auto lg = torch::randn({40, 5}, at::make_generator<at::CPUGeneratorImpl>(21));
        lg.select(1, 2).add_(1.0);  // one popular expert, so drops happen
        auto g1 = at::make_generator<at::CPUGeneratorImpl>(4), g2 = at::make_generator<at::CPUGeneratorImpl>(4);
        const auto s = topk_gating(lg, o, g1);
        const auto d = zt::test_support::moe_dense_gating(lg, o, g2);
        SCOPED_TRACE("k=" + std::to_string(k) + " drop=" + std::to_string(drop) + " rts=" + std::to_string(rts));
        ASSERT_EQ(s.capacity, d.capacity);
        if (drop) EXPECT_GT(s.dropped_fraction, 0.0);
        EXPECT_TRUE(torch::equal(moe_dense_dispatch(s), d.dispatch_mask));
        EXPECT_TRUE(torch::equal(moe_dense_combine(s), d.combine_weights));
        EXPECT_TRUE(torch::equal(s.aux_loss, d.aux_loss));
      }
}

// The layer against the dense layer with the same parameters and generator: output, aux
// loss, and the gradients of the input, the gate and every expert (and the PR-MoE parts)
// within 1e-6 (fp32; the only differences are summation order: the dense combine is a GEMM
// over E x C slots, mostly zeros). Training mode, capacity factor 1.0 (C = ceil(T/E) top-1,
// 2 ceil(T/E) top-2, tokens drop) and dropless.
TEST(MoESparse, LayerEqualsTheDensePath) {
  const SparseCase cases[] = {
      {"top1 cf1", 1, true, false, false},   {"top1 dropless", 1, false, false, false},
      {"top2 cf1", 2, true, false, false},   {"top2 dropless", 2, false, false, false},
      {"top1 cf1 rts+rsample", 1, true, true, false}, {"top2 cf1 jitter+sampling", 2, true, true, true},
      {"top2 dropless pr-moe", 2, false, false, true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    torch::manual_seed(3);
    MoE m(sparse_case_options(c), mlp_expert(8));
    m->train();
    auto gx = at::make_generator<at::CPUGeneratorImpl>(8);
    auto x = torch::randn({4, 12, 8}, gx);
    x.select(2, 0).add_(1.5);  // skews the gate: uneven counts, an expert may get none
    const auto w = torch::randn({4, 12, 8}, gx);
    auto run = [&](bool sparse, double& aux, double& dropped) {
      m->zero_grad();
      auto xi = x.clone().requires_grad_(true);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
      torch::Tensor y, a;
      if (sparse) {
        m->set_generator(gen);
        const auto out = m->forward(xi);
        y = out.output;
        a = out.aux_loss;
        dropped = out.gate.dropped_fraction;
      } else {
        const auto out = zt::test_support::moe_dense_forward(*m, xi, gen);
        y = out.output;
        a = out.aux_loss;
      }
      ((y * w).sum() + a).backward();
      aux = a.item<double>();
      std::vector<torch::Tensor> got{y.detach(), xi.grad()};
      for (const auto& p : m->parameters()) got.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
      return got;
    };
    double aux_s = 0, aux_d = 0, dropped = 0, unused = 0;
    const auto s = run(true, aux_s, dropped);
    const auto d = run(false, aux_d, unused);
    if (c.drop) EXPECT_GT(dropped, 0.0);
    else EXPECT_EQ(dropped, 0.0);
    EXPECT_NEAR(aux_s, aux_d, 1e-6);
    ASSERT_EQ(s.size(), d.size());
    const auto names = m->named_parameters();
    for (size_t i = 0; i < s.size(); ++i) {
      const std::string what = i == 0 ? "output" : i == 1 ? "input grad" : names[i - 2].key() + " grad";
      ASSERT_TRUE(s[i].defined() || d[i].defined()) << what;
      EXPECT_LE(sparse_max_diff(s[i], d[i]), 1e-6) << what;
      if (i >= 2) EXPECT_TRUE(s[i].defined()) << what << ": every expert gets a gradient, as in the dense path";
    }
  }
}

// What the forward keeps for backward (live CPU bytes after forward minus before; the
// graph is freed by backward), dropless top-2, T = 2048 tokens, E = 8, d = 16: the dense
// path keeps [T, E, C] tensors (C = the most assignments on one expert, >= T k / E), the
// sparse one O(N d + T E) with N = T k kept assignments. Bound for the sparse path
// (fp32, TwoLayer experts d -> 2d -> d):
//   experts:  N (d + 2d) 4            fc1's input slice, ReLU's output (fc2 reuses it)
//   combine:  N (d + 1) 4 + 3 N 8     gathered expert rows and weights; token/row indices
//   gate:     2 T E 4 + 4 T k 8       logits/softmax; [T, k] expert, slot, kept, index
//   output:   T d 4                   the layer's output (alive while measured)
// times 1.5 for the small tensors the formula leaves out (kept flags, counts, the loss).
// Measured: C 636, sparse 1.84 MB (bound 2.33 MB), dense 95.3 MB.
TEST(MoESparse, SavedBytesAreProportionalToAssignments) {
  static zt::test_support::CpuByteCounter counter;
  const int64_t T = 2048, E = 8, d = 16, k = 2, N = T * k;
  MoEOptions o;
  o.hidden = d;
  o.num_experts = E;
  o.gate.k = k;
  o.gate.drop_tokens = false;
  o.gate.second_expert_sampling = false;
  torch::manual_seed(5);
  MoE m(o, mlp_expert(d));
  const auto x = torch::randn({T, d}, at::make_generator<at::CPUGeneratorImpl>(6)).requires_grad_(true);
  int64_t C = 0;
  auto held = [&](bool sparse) {
    int64_t bytes = 0;
    {
      zt::test_support::CpuByteCounter::Scope scope(counter);
      const int64_t before = counter.live();
      torch::Tensor y;
      if (sparse) {
        auto out = m->forward(x);
        C = out.gate.capacity;
        y = out.output.sum() + out.aux_loss;
      } else {
        auto out = zt::test_support::moe_dense_forward(*m, x);
        y = out.output.sum() + out.aux_loss;
      }
      bytes = counter.live() - before;
      y.backward();
    }
    return bytes;
  };
  const int64_t sparse = held(true), dense = held(false);
  const double bound = 1.5 * static_cast<double>(N * 3 * d * 4 + N * (d + 1) * 4 + 3 * N * 8 + 2 * T * E * 4 + 4 * T * k * 8 + T * d * 4);
  const double dense_floor = 2.0 * static_cast<double>(T * E * C) * 4;  // dispatch + combine, fp32
  RecordProperty("sparse_bytes", std::to_string(sparse));
  RecordProperty("dense_bytes", std::to_string(dense));
  std::printf("[ saved    ] C %lld: sparse %lld bytes (bound %.0f), dense %lld bytes (2 T E C 4 = %.0f)\n",
              static_cast<long long>(C), static_cast<long long>(sparse), bound, static_cast<long long>(dense),
              dense_floor);
  EXPECT_GE(C, T * k / E);
  EXPECT_LE(static_cast<double>(sparse), bound);
  EXPECT_GE(static_cast<double>(dense), dense_floor);  // the dense path would fail the bound
  EXPECT_GT(static_cast<double>(dense), bound);
}

}  // namespace zt_test_moe
