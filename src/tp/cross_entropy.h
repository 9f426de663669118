// Cross entropy over logits whose vocabulary is cut across the tp group (the output of a
// column-parallel LM head, or of the tied vocab-parallel embedding). See [TP Regions].
//
// Forward (Megatron's vocab_parallel_cross_entropy): every rank holds logits (N, Vl) for
// the padded vocabulary's columns [rank*Vl, (rank+1)*Vl). Columns >= vocab_size (the
// padding of a vocabulary that does not divide) are masked with -inf before anything
// else, so they take no probability and the loss equals the one over the real V columns.
// The row max is all-reduced (max), then the target's logit (held by one rank, 0 on the
// others) and the sum of exponentials are all-reduced (sum) together, as one (2, N)
// buffer: two collectives per call. loss_i = log(sum_exp_i) - (logit_i[target] - max_i).
//
// Backward needs no communication: d loss / d logits = (softmax - one_hot(target)) *
// grad / count on this rank's columns, with softmax kept from forward.
//
// Targets equal to -1 are ignored; the result is the mean over the others (0 when none),
// the same on every rank of the group. Computed in fp32 whatever the logits' dtype.
#pragma once
#include <torch/types.h>

#include "zerotrain/comm.h"

namespace zt::tp {

// logits (N, Vl) (any float dtype), targets (N) int64. Vl * group size >= vocab_size.
// Returns the scalar fp32 mean loss; differentiable in logits.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_size, const comm::GroupPtr& group);

}  // namespace zt::tp
