// Combining partial gradient norms (docs/zero-parts.md). One number carries both the
// overflow check and the clipping norm: the sum of squares of the gradients, inf/NaN
// exactly when some gradient is. Each shard group contributes its partial sum (already
// summed over its own communicator where its gradients are sharded); the partials of all
// shard groups of this rank are added, then summed over the model-parallel group (tensor
// x pipeline ranks), whose ranks hold disjoint parameters. The result is the same on every
// rank of the model, so every rank takes the same overflow and clipping decision.
#pragma once
#include <torch/types.h>

#include <vector>

#include "zerotrain/comm.h"

namespace zt::zero {

// partials: 1-element fp64 tensors on one device (at least one). model_parallel: null or
// a group of size 1 adds nothing (no operation is issued at all with one partial and no
// model-parallel group); otherwise one blocking all-reduce (sum) of the 1-element sum.
torch::Tensor combine_norm_sq(const std::vector<torch::Tensor>& partials, const comm::GroupPtr& model_parallel);

// The same with a shard group whose parameters differ between the ranks of `split_over`
// (experts over the ep group, [Expert Groups] in zero_optimizer.h): its partial `split_sq`
// is summed over split_over first (one blocking 1-element all-reduce), so each of those
// parameters counts once; then as above.
torch::Tensor combine_norm_sq(const torch::Tensor& sq, torch::Tensor split_sq, const comm::GroupPtr& split_over,
                              const comm::GroupPtr& model_parallel);

}  // namespace zt::zero
