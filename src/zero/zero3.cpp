// ZeroOptimizer at stage 3: the shard group's construction (units, layout, the partition
// of the parameters) and the gatherer's shard source. The gathering itself is the
// ParamGatherer's (param_gatherer.cpp, where the life of a unit in one step is told).
//
// Memory. A rank keeps its fp32 master shard and optimizer state (12 bytes per parameter
// / N with Adam) and, from the first reduction of a step to the step, its gradient shard
// (2 / N in bf16): 14 Psi/N. The compute-dtype shard a gather sends is cast from the
// master on the fly, so the 2 Psi/N of a standing bf16 copy are not held.
#include <algorithm>

#include "zero/zero_optimizer.h"
#include "zerotrain/error.h"

namespace zt::zero {
namespace {
constexpr int64_t kUnitAlign = 64;  // elements, as the flat layout's (zero_optimizer.cpp)
}  // namespace

void ZeroOptimizer::init_stage3(std::vector<torch::Tensor>& params) {
  const int n = static_cast<int>(params.size());
  auto name_of = [&](int i) {
    return i < static_cast<int>(opt_.param_names.size()) ? opt_.param_names[i] : "parameter " + std::to_string(i);
  };
  auto deferred = [&](int i) {
    return i < static_cast<int>(opt_.deferred_shapes.size()) && !opt_.deferred_shapes[i].empty();
  };
  auto shape_of = [&](int i) { return deferred(i) ? opt_.deferred_shapes[i] : params[i].sizes().vec(); };
  std::vector<int64_t> numels(n);
  for (int i = 0; i < n; ++i) {
    int64_t k = 1;
    for (int64_t d : shape_of(i)) k *= d;
    numels[i] = k;
  }
  std::vector<DeclaredUnit> units;
  for (const auto& u : opt_.units) units.push_back({u.name, u.params});
  const UnitPlan plan = plan_units(numels, units, opt_.persistence_threshold,
                                   [&](int i) { return group_of_user(i); }, name_of);
  for (int i : plan.order) {
    params_.push_back(params[i]);
    user_index_.push_back(i);
    shapes_.push_back(shape_of(i));
  }
  L_.flat = make_unit_layout(plan.numels, world_, kUnitAlign);
  make_reducer();
  check_host_memory();  // before the host shard (offload_param cpu) is allocated

  // Partition one unit at a time: only one unit is ever full-size on the device.
  auto topt = torch::TensorOptions().device(opt_.device).dtype(opt_.dtype);
  if (opt_.param_nvme) {
    ZT_CHECK_T(opt_.offload_optimizer && opt_.offload_param, InternalError, "offload_param nvme needs offload_optimizer");
    // The shard goes to its swap file unit by unit below; no host copy of it is kept.
    init_param_nvme(L_.max_owned_numel());
  } else {
    param_shard_ = opt_.offload_param ? host_buffer(L_.flat.shard_numel) : torch::zeros({L_.flat.shard_numel}, topt);
  }
  make_gatherer(plan);
  for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
    const Bucket& B = L_.flat.buckets[b];
    auto full = torch::zeros({B.numel}, topt);
    for (int k = 0; k < B.num_params; ++k) {
      const int i = B.first_param + k;
      auto& p = params_[i];
      auto view = full.narrow(0, L_.flat.params[i].offset - B.offset, L_.flat.params[i].numel);
      if (deferred(user_index_[i])) {
        ZT_CHECK_T(opt_.deferred_init != nullptr, ConfigError, "ZeRO-3: ", name_of(user_index_[i]),
                   " is a placeholder but no EngineOptions.param_init was given");
        auto t = view.view(shapes_[i]);
        opt_.deferred_init(user_index_[i], t);
      } else {
        ZT_CHECK_T(!p.is_meta(), ConfigError, "ZeRO-3: ", name_of(user_index_[i]),
                   " is on the meta device; build it as a placeholder and pass EngineOptions.param_init");
        view.copy_(p.detach().reshape(-1));
      }
      // Frees the user's copy (host or device). The parameter gets its final dtype and
      // device with its full shape before its gradient hook is made: autograd's
      // accumulator node remembers the shape it was created with, and set_data to another
      // dtype or device would drop the node (and the hook with it).
      p.set_data(view.view(shapes_[i]));
    }
    reducer_->install_hooks(B.first_param, B.first_param + B.num_params);
    gatherer_->detach(static_cast<int>(b));
    // Every rank starts from rank 0's parameters (as DeepSpeed does at initialize).
    if (world_ > 1) group_->broadcast(full, 0);
    auto mine = full.narrow(0, static_cast<int64_t>(rank_) * B.shard_numel, B.shard_numel);
    if (param_nvme_) {
      param_nvme_write(L_.owned_begin(static_cast<int>(b)), mine.to(torch::kCPU).contiguous());
    } else {
      L_.owned_view(param_shard_, b).copy_(mine);
    }
  }
}

void ZeroOptimizer::init_frozen() {
  if (!opt_.frozen.empty()) {
    std::vector<DeclaredUnit> units;
    for (const auto& u : opt_.units) units.push_back({u.name, u.frozen});
    frozen_ = std::make_unique<FrozenShards>(opt_.frozen, opt_.frozen_names, units, opt_.persistence_threshold,
                                             group_, gatherer_options());
    opt_.frozen.clear();  // the gatherer holds the parameters
  }
  if (!opt_.frozen_storage.empty()) {
    // Byte storage (QLoRA's NF4 base): the same units and rules, uint8 end to end.
    std::vector<DeclaredUnit> units;
    for (const auto& u : opt_.units) units.push_back({u.name, u.frozen_storage});
    GathererOptions go = gatherer_options();
    go.dtype = at::kByte;
    frozen_storage_ = std::make_unique<FrozenShards>(opt_.frozen_storage, opt_.frozen_storage_names, units,
                                                     opt_.persistence_threshold, group_, go);
    opt_.frozen_storage.clear();
  }
}

std::vector<ParamGatherer*> ZeroOptimizer::frozen_gatherers() const {
  std::vector<ParamGatherer*> g;
  if (frozen_) g.push_back(&frozen_->gatherer());
  if (frozen_storage_) g.push_back(&frozen_storage_->gatherer());
  return g;
}

GathererOptions ZeroOptimizer::gatherer_options() const {
  GathererOptions go;
  go.device = opt_.device;
  go.dtype = opt_.dtype;
  go.prefetch_numel = opt_.prefetch_numel;
  go.max_live_numel = opt_.max_live_numel;
  go.max_reuse_distance = opt_.max_reuse_distance;
  return go;
}

void ZeroOptimizer::make_gatherer(const UnitPlan& plan) {
  gatherer_ = std::make_unique<ParamGatherer>(L_, params_, shapes_, plan, group_, gatherer_options());
  // The rank's shard in the compute dtype, cast from the fp32 master as it is sent: no
  // separate compute-dtype copy of the shard is kept between steps.
  gatherer_->shard_source = [this](int b) {
    const int64_t numel = L_.flat.buckets[b].shard_numel;
    torch::Tensor mine;
    if (param_nvme_) {
      // offload_param nvme: the unit's shard is read from the swap file into a staging slot
      // and uploaded from there; the slot is refilled only after that upload.
      auto [host, slot] = param_nvme_read(L_.owned_begin(b), numel);
      // (On the CPU the all-gather reads it synchronously, before the slot can be reused.)
      mine = opt_.device.is_cuda() ? host.to(opt_.device, /*non_blocking=*/true) : host;
      param_nvme_uploaded(slot);
    } else if (param_shard_.defined()) {
      // Offload: the compute-dtype shard the CPU step wrote (host memory with offload_param:
      // uploaded here, asynchronously from page-locked memory, ahead of the gather).
      mine = L_.owned_view(param_shard_, b);
      if (mine.device() != opt_.device) mine = mine.to(opt_.device, /*non_blocking=*/true);
    } else {
      auto master = L_.owned_view(state_.master, b);
      mine = opt_.dtype == at::kFloat ? master : master.to(opt_.dtype);
    }
    return mine;
  };
}

// The engine's stage-3 calls: no-ops at stages 0-2 (no gatherer). The frozen groups'
// gatherers follow the same calls, after the trained group's.
void ZeroOptimizer::begin_forward() {
  if (gatherer_) gatherer_->begin_forward();
  for (auto* g : frozen_gatherers()) g->begin_forward();
}
void ZeroOptimizer::end_forward() {
  if (gatherer_) gatherer_->end_forward();
  for (auto* g : frozen_gatherers()) g->end_forward();
}
void ZeroOptimizer::unit_pre_forward(int unit, bool recompute) {
  if (gatherer_) gatherer_->unit_pre_forward(unit, recompute);
  for (auto* g : frozen_gatherers()) g->unit_pre_forward(unit, recompute);
}
void ZeroOptimizer::unit_post_forward(int unit, bool recompute) {
  if (gatherer_) gatherer_->unit_post_forward(unit, recompute);
  for (auto* g : frozen_gatherers()) g->unit_post_forward(unit, recompute);
}
torch::Tensor ZeroOptimizer::unit_output(int unit, const torch::Tensor& y) {
  torch::Tensor out = gatherer_ ? gatherer_->unit_output(unit, y) : y;
  for (auto* g : frozen_gatherers()) out = g->unit_output(unit, out);
  return out;
}
void ZeroOptimizer::gather_all() {
  if (gatherer_) gatherer_->gather_all();
  for (auto* g : frozen_gatherers()) g->gather_all();
}
void ZeroOptimizer::release_all(bool persistent_too) {
  if (gatherer_) gatherer_->release_all(persistent_too);
  for (auto* g : frozen_gatherers()) g->release_all(persistent_too);
}

}  // namespace zt::zero
