// FrozenShards: ZeRO stage 3's shard group of the parameters that train nothing (a LoRA
// or QLoRA base, any frozen layer). They are partitioned over the data-parallel group and
// gathered per unit just in time by a ParamGatherer of their own, exactly like the trained
// parameters, but they have no gradient, no fp32 master and no optimizer state: a rank
// keeps its compute-dtype shard, Psi_frozen x 2 / N bytes in bf16 (DeepSpeed's ZeRO-3
// partitions frozen parameters the same way).
//
// [Frozen Units]
//  * Units are the model's gather units (the frozen members of each), plus "root" and
//    "persistent" as for the trained group (param_gatherer.h); the engine drives both
//    gatherers with the same unit hooks, so a unit's frozen and trained parameters are
//    gathered together.
//  * Release. A trained unit is released when its gradients are reduced; a frozen unit has
//    none to tell. Its weights are needed in backward only by the operations that carry the
//    gradient to the unit's input, so the unit is released when the backward reaches the
//    unit before it: that unit's pre-backward node runs only once its output's gradient,
//    the input gradient of this unit, is complete (GathererOptions::release_after_backward).
//    The first unit, the root and anything prefetched but unused go at the end of backward;
//    the persistent unit stays.
//  * Every rank starts from rank 0's values (as for the trained parameters).
//  * Frozen byte storage that is not a parameter (EngineOptions::frozen_storage: QLoRA's NF4
//    base, [NF4 At ZeRO-3] in src/lora/qlora.h) forms a second FrozenShards of dtype uint8
//    with the same units and rules: the bytes are partitioned and gathered as they are.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "zero/param_gatherer.h"
#include "zero/shard_layout.h"
#include "zerotrain/comm.h"

namespace zt::zero {

class FrozenShards {
 public:
  // params: the frozen parameters (whole, on any device); units: their members of the
  // model's gather units (indices into params), in forward order. On return every
  // parameter points at the gatherer's empty tensor until its unit is gathered.
  FrozenShards(std::vector<torch::Tensor> params, const std::vector<std::string>& names,
               const std::vector<DeclaredUnit>& units, int64_t persistence_threshold, comm::GroupPtr group,
               GathererOptions options);
  FrozenShards(const FrozenShards&) = delete;
  FrozenShards& operator=(const FrozenShards&) = delete;

  ParamGatherer& gatherer() { return *gatherer_; }
  // This rank's shard (compute dtype, on the device).
  int64_t shard_bytes() const { return static_cast<int64_t>(shard_.nbytes()); }

 private:
  ShardLayout L_;
  std::vector<torch::Tensor> params_;          // layout order
  std::vector<std::vector<int64_t>> shapes_;   // layout order
  torch::Tensor shard_;
  std::unique_ptr<ParamGatherer> gatherer_;
};

}  // namespace zt::zero
