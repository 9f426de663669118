// FrozenShards (frozen_shards.h): the partition of the frozen parameters at stage 3.
#include "zero/frozen_shards.h"

#include "zerotrain/error.h"

namespace zt::zero {

FrozenShards::FrozenShards(std::vector<torch::Tensor> params, const std::vector<std::string>& names,
                           const std::vector<DeclaredUnit>& units, int64_t persistence_threshold,
                           comm::GroupPtr group, GathererOptions options) {
  torch::NoGradGuard no_grad;
  const int n = static_cast<int>(params.size());
  auto name_of = [&](int i) { return i < static_cast<int>(names.size()) ? names[i] : "frozen parameter " + std::to_string(i); };
  std::vector<int64_t> numels(n);
  for (int i = 0; i < n; ++i) {
    ZT_CHECK_T(!params[i].is_meta(), ConfigError, "ZeRO-3: the frozen parameter ", name_of(i),
               " is on the meta device; a frozen base is built with its values");
    numels[i] = params[i].numel();
  }
  const UnitPlan plan = plan_units(numels, units, persistence_threshold, [](int) { return 0; }, name_of);
  for (int i : plan.order) {
    params_.push_back(params[i]);
    shapes_.push_back(params[i].sizes().vec());
  }
  const int world = group->size();
  L_.rank = group->rank();
  L_.owns_all = false;
  L_.flat = make_unit_layout(plan.numels, world, /*align=*/64);
  options.release_after_backward = true;
  auto topt = torch::TensorOptions().device(options.device).dtype(options.dtype);
  shard_ = torch::zeros({L_.flat.shard_numel}, topt);
  gatherer_ = std::make_unique<ParamGatherer>(L_, params_, shapes_, plan, group, options);
  gatherer_->shard_source = [this](int b) { return L_.owned_view(shard_, b); };
  // One unit at a time on the device: the whole base never is.
  for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
    const Bucket& B = L_.flat.buckets[b];
    auto full = torch::zeros({B.numel}, topt);
    for (int k = 0; k < B.num_params; ++k) {
      const int i = B.first_param + k;
      full.narrow(0, L_.flat.params[i].offset - B.offset, L_.flat.params[i].numel)
          .copy_(params_[i].detach().reshape(-1));
    }
    gatherer_->detach(static_cast<int>(b));  // frees the user's copy
    if (world > 1) group->broadcast(full, 0);
    L_.owned_view(shard_, b).copy_(full.narrow(0, static_cast<int64_t>(L_.rank) * B.shard_numel, B.shard_numel));
  }
}

}  // namespace zt::zero
