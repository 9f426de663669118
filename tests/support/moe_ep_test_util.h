// The steps an expert-parallel MoE layer test shares with its one-process reference layer
// (test_moe_ep.cpp, test_mixtral_moe_ep.cpp): copy the reference's gate and this rank's
// experts into the ep layer; after backward, sum the reference's expert gradients over the
// ranks (each rank's tokens reach every owner); pair each local expert's gradients with the
// reference's by global expert index. The tests keep their own assertions.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "models/moe.h"
#include "zerotrain/comm.h"

namespace zt::test_support {

// ep's gate and its local experts take the reference's values (experts by global index).
inline void copy_gate_and_owned_experts(models::MoE ref, models::MoE ep) {
  torch::NoGradGuard no_grad;
  ep->gate->weight.copy_(ref->gate->weight);
  for (int64_t i = 0; i < ep->local_experts(); ++i) {
    auto src = ref->experts[static_cast<size_t>(ep->first_expert() + i)]->parameters();
    auto dst = ep->experts[static_cast<size_t>(i)]->parameters();
    for (size_t p = 0; p < src.size(); ++p) dst[p].copy_(src[p]);
  }
}

// The reference's expert gradients summed over g (every rank reduces every expert: the same
// collectives on all ranks; an expert no token reached counts as zeros).
inline void sum_reference_expert_grads(models::MoE ref, const comm::GroupPtr& g) {
  for (size_t e = 0; e < ref->experts->size(); ++e) {
    for (auto& p : ref->experts[e]->parameters()) {
      auto gsum = p.grad().defined() ? p.grad().clone() : torch::zeros_like(p);
      g->all_reduce(gsum, comm::ReduceOp::kSum);
      p.mutable_grad() = gsum;
    }
  }
}

struct LocalExpertGrad {
  int64_t expert;     // global index
  size_t param;       // index in the expert's parameters()
  torch::Tensor got;  // the ep layer's gradient (undefined if none)
  torch::Tensor want; // the reference's
};

// Every parameter of ep's local experts with the reference's gradient of the same expert.
inline std::vector<LocalExpertGrad> local_expert_grads(models::MoE ref, models::MoE ep) {
  std::vector<LocalExpertGrad> out;
  for (int64_t i = 0; i < ep->local_experts(); ++i) {
    const int64_t e = ep->first_expert() + i;
    auto refp = ref->experts[static_cast<size_t>(e)]->parameters();
    auto epp = ep->experts[static_cast<size_t>(i)]->parameters();
    for (size_t p = 0; p < refp.size(); ++p) out.push_back({e, p, epp[p].grad(), refp[p].grad()});
  }
  return out;
}

}  // namespace zt::test_support
