// The dense (one-hot) MoE dispatch that src/models/moe.cpp used before the sparse path
// ([Sparse Dispatch] in src/models/moe.h), kept verbatim as a test reference: DeepSpeed's
// [T, E, C] combine weights and dispatch mask, dispatched with einsum("sec,sm->ecm") and
// combined with einsum("sec,ecm->sm"). Tests compare the layer against it (outputs, aux
// loss, gradients) and count what each keeps for backward. Also turns a sparse GateResult
// into the dense [T, E, C] tensors, for the gate tests. Header-only; not in the library.
#pragma once
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>

#include "models/moe.h"

namespace zt::test_support {

struct DenseGate {
  torch::Tensor combine_weights;  // [T, E, C] fp32, differentiable
  torch::Tensor dispatch_mask;    // [T, E, C] bool
  torch::Tensor aux_loss;
  int64_t capacity = 0;
};

// combine[t, e, c] / dispatch[t, e, c] of a sparse routing (kept assignments only).
inline torch::Tensor moe_dense_combine(const models::GateResult& r) {
  const int64_t T = r.expert_index.size(0), E = r.tokens_per_expert.size(0);
  const auto tok = torch::arange(T, torch::kLong).unsqueeze(1).expand_as(r.expert_index);
  const auto keep = r.kept;
  auto out = torch::zeros({T, E, r.capacity}, r.weights.options());
  return out.index_put({tok.masked_select(keep), r.expert_index.masked_select(keep), r.slot.masked_select(keep)},
                       r.weights.masked_select(keep));
}
inline torch::Tensor moe_dense_dispatch(const models::GateResult& r) {
  const int64_t T = r.expert_index.size(0), E = r.tokens_per_expert.size(0);
  const auto tok = torch::arange(T, torch::kLong).unsqueeze(1).expand_as(r.expert_index);
  const auto keep = r.kept;
  auto out = torch::zeros({T, E, r.capacity}, torch::kBool);
  return out.index_put({tok.masked_select(keep), r.expert_index.masked_select(keep), r.slot.masked_select(keep)},
                       torch::ones({}, torch::kBool));
}

namespace moe_dense_detail {

inline int64_t agree_capacity(int64_t c, const models::GateOptions& opt) {
  if (!opt.ep_group || opt.ep_group->size() == 1) return c;
  auto t = torch::full({1}, c, torch::kLong);
  opt.ep_group->all_reduce(t, comm::ReduceOp::kMax);
  return t.item<int64_t>();
}

inline torch::Tensor slot_one_hot(const torch::Tensor& loc_s, int64_t capacity) {
  return torch::one_hot(loc_s, capacity).unsqueeze(1);
}

inline DenseGate top1(const torch::Tensor& logits, const models::GateOptions& opt, std::optional<torch::Generator> gen) {
  using models::NoisyGatePolicy;
  const auto lg = logits.to(torch::kFloat);
  const int64_t T = lg.size(0), E = lg.size(1);
  const auto gates = torch::softmax(lg, 1);
  const auto choice = opt.noisy_gate_policy == NoisyGatePolicy::RSample
                          ? lg.detach() + models::gumbel_sample(lg.sizes(), lg.options(), gen)
                          : gates.detach();
  auto mask1 = torch::one_hot(choice.argmax(1), E);
  const auto routed = mask1.sum(0);
  DenseGate r;
  r.capacity = agree_capacity(opt.drop_tokens ? models::moe_capacity(T, E, opt.capacity_factor, opt.min_capacity)
                                              : routed.max().item<int64_t>(),
                              opt);
  const auto me = gates.mean(0);
  const auto ce = mask1.to(torch::kFloat).mean(0);
  r.aux_loss = (me * ce).sum() * static_cast<double>(E);
  if (opt.drop_tokens && r.capacity < T) {
    const auto prio = opt.use_rts ? mask1.to(torch::kFloat) * torch::rand({T, E}, gen, lg.options())
                                  : mask1.to(torch::kFloat) * torch::arange(T, 0, -1, lg.options()).unsqueeze(1);
    const auto top = std::get<1>(prio.topk(r.capacity, 0));
    mask1 = mask1 * torch::zeros_like(mask1).scatter_(0, top, 1);
  }
  const auto loc_s = ((mask1.cumsum(0) - 1) * mask1).sum(1);
  const auto oh = slot_one_hot(loc_s, r.capacity);
  r.combine_weights = (gates * mask1.to(torch::kFloat)).unsqueeze(2) * oh.to(torch::kFloat);
  r.dispatch_mask = (mask1.unsqueeze(2) * oh).to(torch::kBool);
  return r;
}

inline DenseGate top2(const torch::Tensor& logits, const models::GateOptions& opt, std::optional<torch::Generator> gen) {
  const auto lg = logits.to(torch::kFloat);
  const int64_t T = lg.size(0), E = lg.size(1);
  const auto gates = torch::softmax(lg, 1);
  auto mask1 = torch::one_hot(gates.detach().argmax(1), E);
  auto lg2 = lg.detach();
  if (opt.second_expert_sampling) lg2 = lg2 + models::gumbel_sample(lg.sizes(), lg.options(), gen);
  auto mask2 = torch::one_hot(
      lg2.masked_fill(mask1.to(torch::kBool), -std::numeric_limits<float>::infinity()).argmax(1), E);
  const auto loc1 = mask1.cumsum(0) - 1;
  const auto loc2 = mask2.cumsum(0) - 1 + mask1.sum(0, /*keepdim=*/true);
  const auto me = gates.mean(0);
  const auto ce = mask1.to(torch::kFloat).mean(0);
  DenseGate r;
  r.aux_loss = (me * ce).mean() * static_cast<double>(E * E);
  const auto routed = (mask1 + mask2).sum(0);
  if (opt.drop_tokens) {
    r.capacity = agree_capacity(models::moe_capacity(T, E, 2.0 * opt.capacity_factor, opt.min_capacity), opt);
    mask1 = mask1 * loc1.lt(r.capacity);
    mask2 = mask2 * loc2.lt(r.capacity);
  } else {
    r.capacity = agree_capacity(routed.max().item<int64_t>(), opt);
  }
  const auto loc1_s = (loc1 * mask1).sum(1);
  const auto loc2_s = (loc2 * mask2).sum(1);
  const auto m1f = mask1.to(torch::kFloat), m2f = mask2.to(torch::kFloat);
  auto g1 = (gates * m1f).sum(1);
  auto g2 = (gates * m2f).sum(1);
  const auto denom = (g1 + g2).clamp_min(std::numeric_limits<float>::epsilon());
  g1 = g1 / denom;
  g2 = g2 / denom;
  const auto oh1 = slot_one_hot(loc1_s, r.capacity), oh2 = slot_one_hot(loc2_s, r.capacity);
  r.combine_weights = (g1.unsqueeze(1) * m1f).unsqueeze(2) * oh1.to(torch::kFloat) +
                      (g2.unsqueeze(1) * m2f).unsqueeze(2) * oh2.to(torch::kFloat);
  r.dispatch_mask = (mask1.unsqueeze(2) * oh1 + mask2.unsqueeze(2) * oh2).to(torch::kBool);
  return r;
}

}  // namespace moe_dense_detail

inline DenseGate moe_dense_gating(const torch::Tensor& logits, const models::GateOptions& opt,
                                  std::optional<torch::Generator> gen = std::nullopt) {
  return opt.k == 1 ? moe_dense_detail::top1(logits, opt, gen) : moe_dense_detail::top2(logits, opt, gen);
}

struct DenseMoEOutput {
  torch::Tensor output, aux_loss;
  int64_t capacity = 0;
};

// The old MoEImpl::forward with m's parameters (every expert of m, or at ep > 1 m's local
// experts and m's ep group): the dense gate, einsum dispatch, the equal-chunk all-to-alls,
// einsum combine. `gen` plays the layer's generator (noise, random token selection).
inline DenseMoEOutput moe_dense_forward(models::MoEImpl& m, const torch::Tensor& x,
                                        std::optional<torch::Generator> gen = std::nullopt) {
  using models::NoisyGatePolicy;
  const auto& opt = m.opt_;
  const auto flat = x.reshape({-1, opt.hidden});
  models::GateOptions g = opt.gate;
  auto gin = flat.to(torch::kFloat);
  if (!m.is_training()) {
    g.capacity_factor = opt.eval_capacity_factor;
    g.noisy_gate_policy = NoisyGatePolicy::None;
  } else if (g.noisy_gate_policy == NoisyGatePolicy::Jitter) {
    gin = models::multiplicative_jitter(gin, 1e-2, gen);
  }
  const auto logits = torch::nn::functional::linear(gin, m.gate->weight.to(torch::kFloat));
  const DenseGate gr = moe_dense_gating(logits, g, gen);
  const auto dispatched = torch::einsum("sec,sm->ecm", {gr.dispatch_mask.to(x.dtype()), flat});
  std::vector<torch::Tensor> outs;
  torch::Tensor expert_out;
  const int P = opt.ep_group ? opt.ep_group->size() : 1;
  if (P == 1) {
    for (size_t e = 0; e < m.expert_fns.size(); ++e)
      outs.push_back(m.expert_fns[e].forward(dispatched[static_cast<int64_t>(e)]));
    expert_out = torch::stack(outs);
  } else {
    const int64_t El = m.local_experts(), C = gr.capacity, d = opt.hidden;
    const auto received = models::all_to_all_dim0(dispatched, opt.ep_group).view({P, El, C, d});
    for (int64_t i = 0; i < El; ++i) {
      const auto slots = received.select(1, i).reshape({P * C, d});
      outs.push_back(m.expert_fns[static_cast<size_t>(i)].forward(slots).view({P, C, d}));
    }
    const auto local = torch::stack(outs, 1).reshape({P * El, C, d});
    expert_out = models::all_to_all_dim0(local, opt.ep_group);
  }
  auto y = torch::einsum("sec,ecm->sm", {gr.combine_weights.to(x.dtype()), expert_out}).reshape(x.sizes());
  if (opt.use_residual) {
    const auto mlp_out = m.mlp.forward(x);
    const auto coef = torch::softmax(m.coefficient(x), -1);
    y = y * coef.narrow(-1, 0, 1) + mlp_out * coef.narrow(-1, 1, 1);
  }
  return {y, gr.aux_loss, gr.capacity};
}

}  // namespace zt::test_support
