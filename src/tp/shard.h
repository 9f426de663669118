// Cutting full (unsplit) weights into tensor-parallel slices and joining them back: how a
// tp model is built from the same weights as its tp 1 twin (and how its trained weights
// are compared with, or exported as, the full ones).
//
// [TP Slices]
//  * A split parameter is cut along one dimension `dim` into `size` equal slices, rank r
//    holding slice r (tp-rank order, as the mappings of [TP Regions] assume).
//  * `blocks` > 1: the dimension is that many equal blocks stacked (GPT-2's c_attn: q, k,
//    v along rows); each block is cut on its own and rank r holds slice r of every block,
//    concatenated in block order (so a rank's rows are its heads' q, then k, then v).
//  * `padded` > 0: before cutting, the dimension is padded with zeros up to `padded`
//    (a vocabulary that does not divide by tp); joining drops the padding again.
//  * A dimension that does not divide is a ConfigError naming it and the tp size.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "zerotrain/comm.h"

namespace zt::tp {

struct SplitSpec {
  int64_t dim = -1;    // < 0: replicated (not split)
  int64_t blocks = 1;  // equal blocks along dim, each cut on its own
  int64_t padded = 0;  // full size of dim after zero padding; 0 = none
  bool split() const { return dim >= 0; }
};

// Rank r's slice of `full` (a contiguous copy; `full` itself when not split).
torch::Tensor cut(const torch::Tensor& full, const SplitSpec& spec, int rank, int size);
// The full tensor from every rank's slice (in rank order); `full_size` is the size of dim
// before padding.
torch::Tensor join(const std::vector<torch::Tensor>& slices, const SplitSpec& spec, int64_t full_size);
// join() of the slices all-gathered over `group` (collective over it).
torch::Tensor gather_full(const torch::Tensor& slice, const SplitSpec& spec, int64_t full_size,
                          const comm::GroupPtr& group);

}  // namespace zt::tp
