#include "zero/grad_norm.h"

#include "zerotrain/error.h"

namespace zt::zero {

torch::Tensor combine_norm_sq(const std::vector<torch::Tensor>& partials, const comm::GroupPtr& model_parallel) {
  ZT_ASSERT(!partials.empty(), "no partial gradient norm to combine");
  torch::Tensor sq = partials[0];
  for (size_t k = 1; k < partials.size(); ++k) sq = sq + partials[k];
  if (model_parallel && model_parallel->size() > 1) model_parallel->all_reduce(sq, comm::ReduceOp::kSum);
  return sq;
}

torch::Tensor combine_norm_sq(const torch::Tensor& sq, torch::Tensor split_sq, const comm::GroupPtr& split_over,
                              const comm::GroupPtr& model_parallel) {
  if (split_over && split_over->size() > 1) split_over->all_reduce(split_sq, comm::ReduceOp::kSum);
  return combine_norm_sq({sq, split_sq}, model_parallel);
}

}  // namespace zt::zero
