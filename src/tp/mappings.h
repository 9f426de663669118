// Megatron-style tensor-parallel communication as autograd functions over a comm::Group
// (the tp group of parallel/topology.h). Each forward collective has its conjugate in
// backward, so a layer written with them gets exact gradients without knowing about ranks.
//
// [TP Regions] (referenced from tp/layers.h, tp/cross_entropy.h and models/gpt2_tp.h)
//  * A "region" is the part of the graph where each tp rank holds a different slice of a
//    tensor (heads of attention, columns of the MLP, a slice of the vocabulary, or with
//    sequence parallelism a slice of the sequence). Entering and leaving a region is one
//    of the mappings below; inside, the ranks compute without talking.
//      copy_to_region        fwd identity            bwd all-reduce (sum)
//      reduce_from_region    fwd all-reduce (sum)    bwd identity
//      gather_from_region    fwd all-gather (dim)    bwd keep own slice (dim)
//      scatter_to_region     fwd keep own slice      bwd all-gather
//      gather_from_sequence  fwd all-gather (dim)    bwd reduce-scatter (grad_is_partial) or keep own slice
//      reduce_scatter_to_sequence fwd reduce-scatter (dim)  bwd all-gather
//  * Slices are equal and in tp-rank order: rank r holds [r*n, (r+1)*n) of the gathered
//    dimension. A dimension that does not divide by the group size is a ConfigError
//    naming the dimension and both sizes.
//  * Every tp rank must run the same graph: the collectives in backward are issued by the
//    autograd engine in its (deterministic) order, the same on every rank, as the
//    collectives of forward are. A rank that skips a region hangs its peers until the
//    group's timeout (CommError).
//  * A group of size 1 (or null) makes every mapping the identity: no communication.
//  * A replicated parameter used inside a sequence-parallel region (LayerNorm, the bias
//    of a row-parallel layer) sees only this rank's slice of the sequence, so its
//    gradient is partial: pass it through copy_to_region where it is used and its
//    gradient is summed over the group in backward (Megatron all-reduces these gradients
//    after backward instead; the sum is the same).
//  * Tensors may be CPU (MPI) or CUDA (NCCL); the collectives are synchronous on the host
//    for CPU and stream-ordered on CUDA (see [Stream Rules] in zerotrain/comm.h).
#pragma once
#include <torch/types.h>

#include "zerotrain/comm.h"

namespace zt::tp {

// Whether g has more than one rank.
inline bool active(const comm::GroupPtr& g) { return g && g->size() > 1; }

torch::Tensor copy_to_region(const torch::Tensor& x, const comm::GroupPtr& g);
torch::Tensor reduce_from_region(const torch::Tensor& x, const comm::GroupPtr& g);
// Along `dim` (negative counts from the end; the last dimension for the column layers).
torch::Tensor gather_from_region(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim = -1);
torch::Tensor scatter_to_region(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim = -1);
// Sequence parallelism. grad_is_partial: the gathered tensor feeds a layer whose ranks
// each produce a partial input gradient (a column-parallel layer), so backward sums them
// (reduce-scatter); false: every rank's gradient is already the full one (keep own slice).
torch::Tensor gather_from_sequence(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim,
                                   bool grad_is_partial = true);
torch::Tensor reduce_scatter_to_sequence(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim);

// Plain (non-autograd) helpers, also used by the model's cut/join of full weights.
// This rank's slice of x along dim (contiguous copy).
torch::Tensor own_slice(const torch::Tensor& x, int64_t dim, int rank, int size);
// All-gather x along dim (every rank passes the same shape).
torch::Tensor all_gather_dim(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim);

}  // namespace zt::tp
