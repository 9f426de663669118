// ParamGatherer (param_gatherer.h): ZeRO stage 3's parameters partitioned, gathered per unit
// just in time.
//
// Units. Every managed parameter belongs to one bucket of the flat layout, and at stage 3
// a bucket is a gather unit: a transformer block (or any group the user declares), the
// "root" unit (parameters in no declared unit: embeddings, final norm), and the
// "persistent" unit (parameters under stage3_param_persistence_threshold elements). A
// unit is gathered with one all-gather of its shards into a fresh buffer, and its
// gradients leave with one reduce-scatter, as soon as the last of them is ready.
//
// Life of a block unit in one step:
//   forward   unit_pre_forward: gather (or wait for the prefetch), prefetch the next units
//             of the recorded trace; unit_post_forward: release unless it is reused within
//             stage3_max_reuse_distance elements and stage3_max_live_parameters allows.
//   backward  the autograd node unit_output inserted after the unit runs first: gather
//             again, prefetch the units before it; a recomputed (checkpointed) block finds
//             it gathered; when its last gradient arrives: reduce-scatter, release.
//   step      the fp32 shard is updated in place; nothing is all-gathered.
// The root and persistent units are gathered at the start of forward; the root unit is
// released with its gradients (the tied embedding's arrive last), the persistent one after
// the step only (its copy is stale then).
//
// Memory. A rank keeps its fp32 master shard and optimizer state (12 bytes per parameter
// / N with Adam) and, from the first reduction of a step to the step, its gradient shard
// (2 / N in bf16): 14 Psi/N. The compute-dtype shard a gather sends is cast from the
// master on the fly, so the 2 Psi/N of a standing bf16 copy are not held.
//
// Diagnosis. Every gather carries a tag (unit, sequence number) gathered from all ranks
// alongside the data. On the CPU it is checked before the data moves; on the GPU the tags
// are checked at the end of forward and of backward (no host sync per gather). Ranks that
// disagree on the sequence get an error naming the gather, the units and the ranks.
#include "zero/param_gatherer.h"

#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/custom_function.h>
#ifdef ZT_WITH_CUDA
#include <ATen/native/cuda/Resize.h>
#endif

#include <algorithm>

#include "zerotrain/error.h"

namespace zt::zero {
namespace {
// Gives a storage `bytes` bytes (0 frees them). Every tensor that views the storage stays
// valid as an object and sees the new bytes: autograd keeps views of a unit's weights
// (e.g. the transposed weight a matmul saves for backward), and only freeing the bytes
// under them releases the memory in forward; gathering into the same storage before the
// unit's backward makes those saved views correct again.
void resize_storage(const torch::Tensor& t, size_t bytes) {
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  if (st->nbytes() == bytes) return;
#ifdef ZT_WITH_CUDA
  if (t.is_cuda()) {
    at::native::resize_bytes_cuda(st, bytes);
    return;
  }
#endif
  at::native::resize_bytes_cpu(st, bytes);
}

// Identity in forward; in backward, gathers the unit before autograd enters it.
struct PreBackward : public torch::autograd::Function<PreBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t self,
                               int64_t bucket) {
    ctx->saved_data["self"] = self;
    ctx->saved_data["bucket"] = bucket;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* z = reinterpret_cast<ParamGatherer*>(ctx->saved_data["self"].toInt());
    z->on_pre_backward(static_cast<int>(ctx->saved_data["bucket"].toInt()));
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

UnitPlan plan_units(const std::vector<int64_t>& numels, const std::vector<DeclaredUnit>& units,
                    int64_t persistence_threshold, const std::function<int(int)>& group_of,
                    const std::function<std::string(int)>& name_of) {
  const int n = static_cast<int>(numels.size());
  // Unit of every parameter: declared units first, the rest is root; small ones persist.
  std::vector<int> unit_of(n, -1);
  for (size_t u = 0; u < units.size(); ++u) {
    for (int i : units[u].params) {
      ZT_CHECK_T(i >= 0 && i < n, ConfigError, "ZeRO-3 unit '", units[u].name, "' names parameter ", i,
                 " but there are ", n, " managed parameters");
      ZT_CHECK_T(unit_of[i] < 0, ConfigError, "ZeRO-3: ", name_of(i), " is in two units ('",
                 units[unit_of[i]].name, "' and '", units[u].name, "')");
      unit_of[i] = static_cast<int>(u);
    }
  }
  std::vector<std::vector<int>> members(units.size());
  std::vector<int> root, persistent;
  for (int i = 0; i < n; ++i) {
    if (numels[i] < persistence_threshold) {
      persistent.push_back(i);
    } else if (unit_of[i] < 0) {
      root.push_back(i);
    } else {
      members[unit_of[i]].push_back(i);
    }
  }
  // Buckets: root, declared units in forward order, persistent.
  UnitPlan plan;
  auto add_unit = [&](const std::vector<int>& idx, const std::string& name, UnitKind kind) {
    if (idx.empty()) return -1;
    // Parameter groups: each group's parameters contiguous in the unit (see [Group Runs]).
    std::vector<int> order = idx;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return group_of(a) < group_of(b); });
    std::vector<int64_t> sizes;
    for (int i : order) {
      plan.order.push_back(i);
      sizes.push_back(numels[i]);
    }
    plan.numels.push_back(sizes);
    plan.names.push_back(name);
    plan.kinds.push_back(kind);
    return static_cast<int>(plan.names.size()) - 1;
  };
  add_unit(root, "root", UnitKind::kRoot);
  for (size_t u = 0; u < units.size(); ++u) plan.unit_bucket.push_back(add_unit(members[u], units[u].name, UnitKind::kBlock));
  add_unit(persistent, "persistent", UnitKind::kPersistent);
  return plan;
}

ParamGatherer::ParamGatherer(const ShardLayout& layout, std::vector<torch::Tensor> params,
                             std::vector<std::vector<int64_t>> shapes, const UnitPlan& plan, comm::GroupPtr group,
                             GathererOptions options)
    : L_(layout), params_(std::move(params)), shapes_(std::move(shapes)), group_(std::move(group)), opt_(options) {
  ZT_ASSERT(params_.size() == L_.flat.params.size() && shapes_.size() == params_.size(), "gatherer parameters");
  ZT_ASSERT(plan.names.size() == L_.flat.buckets.size(), "one unit per bucket");
  rank_ = group_->rank();
  world_ = group_->size();
  for (size_t b = 0; b < plan.names.size(); ++b) {
    UnitState st;
    st.name = plan.names[b];
    st.kind = plan.kinds[b];
    units_.push_back(st);
    if (st.kind == UnitKind::kRoot) root_ = static_cast<int>(b);
    if (st.kind == UnitKind::kPersistent) persistent_ = static_cast<int>(b);
  }
  unit_bucket_ = plan.unit_bucket;
  for (const auto& B : L_.flat.buckets) z3_.max_unit_numel = std::max(z3_.max_unit_numel, B.numel);
  empty_ = torch::empty({0}, torch::TensorOptions().device(opt_.device).dtype(opt_.dtype));
}

void ParamGatherer::detach(int b) {
  const Bucket& B = L_.flat.buckets[b];
  for (int k = 0; k < B.num_params; ++k) params_[B.first_param + k].set_data(empty_);
}

void ParamGatherer::on_reduced(int b) {
  if (units_[b].kind != UnitKind::kPersistent) release(b);
}

void ParamGatherer::end_backward() {
  bwd_unit_ = -1;
  if (!hold_all_) release_all(/*persistent_too=*/false);  // units gathered (prefetched) but never used
  check_tags();
}

void ParamGatherer::reset_counters() {
  z3_.gathers = z3_.prefetched = z3_.releases = 0;
  z3_.peak_live_numel = z3_.live_numel;
}

std::string ParamGatherer::unit_label(int b) const {
  if (b < 0 || b >= static_cast<int>(units_.size())) return "unknown unit " + std::to_string(b);
  return "unit " + std::to_string(b) + " '" + units_[b].name + "'";
}

void ParamGatherer::gather(int b, bool prefetch) {
  UnitState& U = units_[b];
  if (U.live) return;  // gathered or in flight
  const Bucket& B = L_.flat.buckets[b];
  torch::NoGradGuard no_grad;
  const int64_t seq = gather_seq_++;
  if (world_ > 1) {
    auto mine = torch::tensor({static_cast<int64_t>(b), seq}, torch::TensorOptions().dtype(at::kLong));
    if (opt_.device.is_cuda()) mine = mine.to(opt_.device, /*non_blocking=*/true);
    auto tags = torch::empty({world_ * 2}, mine.options());
    auto w = group_->all_gather(tags, mine, /*async=*/!opt_.device.is_cpu());
    tag_checks_.push_back({b, seq, tags});
    // On the CPU the check costs nothing: do it before the data moves, so ranks that
    // disagree stop here instead of issuing collectives of different sizes.
    if (opt_.device.is_cpu()) check_tags();
  }
  // One buffer per unit for the whole run; between gathers its storage holds no bytes.
  if (!U.full.defined()) {
    U.full = torch::empty({B.numel}, torch::TensorOptions().device(opt_.device).dtype(opt_.dtype));
  } else {
    resize_storage(U.full, static_cast<size_t>(B.numel) * U.full.element_size());
  }
  U.live = true;
  // The rank's shard in the compute dtype, cast from the fp32 master as it is sent: no
  // separate compute-dtype copy of the shard is kept between steps.
  torch::Tensor mine = shard_source(b);
  U.work = world_ > 1 ? group_->all_gather(U.full, mine, /*async=*/true) : nullptr;
  if (world_ == 1) U.full.copy_(mine);
  U.prefetched = prefetch;
  ++z3_.gathers;
  if (prefetch) ++z3_.prefetched;
  z3_.live_numel += B.numel;
  if (U.kind == UnitKind::kBlock) block_live_numel_ += B.numel;
  z3_.peak_live_numel = std::max(z3_.peak_live_numel, z3_.live_numel);
}

void ParamGatherer::ensure_gathered(int b) {
  UnitState& U = units_[b];
  if (!U.live) gather(b, /*prefetch=*/false);
  if (U.work) {
    U.work->wait();  // the compute stream waits; the host does not (CUDA)
    U.work.reset();
  }
  if (U.attached) return;
  const Bucket& B = L_.flat.buckets[b];
  for (int k = 0; k < B.num_params; ++k) {
    const int i = B.first_param + k;
    params_[i].set_data(U.full.narrow(0, L_.flat.params[i].offset - B.offset, L_.flat.params[i].numel).view(shapes_[i]));
  }
  U.attached = true;
}

void ParamGatherer::release(int b) {
  UnitState& U = units_[b];
  if (!U.live || hold_all_) return;
  if (U.work) {
    U.work->wait();  // a prefetch nobody used: finish it before the buffer goes back
    U.work.reset();
  }
  const Bucket& B = L_.flat.buckets[b];
  for (int k = 0; k < B.num_params; ++k) params_[B.first_param + k].set_data(empty_);
  resize_storage(U.full, 0);
  U.live = false;
  U.prefetched = false;
  U.attached = false;
  z3_.live_numel -= B.numel;
  if (U.kind == UnitKind::kBlock) block_live_numel_ -= B.numel;
  ++z3_.releases;
}

void ParamGatherer::release_all(bool persistent_too) {
  hold_all_ = false;
  for (size_t b = 0; b < units_.size(); ++b) {
    if (persistent_too || units_[b].kind != UnitKind::kPersistent) release(static_cast<int>(b));
  }
}

void ParamGatherer::gather_all() {
  for (size_t b = 0; b < units_.size(); ++b) gather(static_cast<int>(b), false);
  for (size_t b = 0; b < units_.size(); ++b) ensure_gathered(static_cast<int>(b));
  check_tags();
  hold_all_ = true;
}

void ParamGatherer::prefetch_after(const std::vector<int>& order, int64_t pos, int dir) {
  // Units following position `pos` of `order` (in direction dir), up to
  // stage3_prefetch_bucket_size elements, never beyond stage3_max_live_parameters.
  // Units already gathered or in flight count against the window, so it never grows
  // beyond stage3_prefetch_bucket_size elements ahead of the running unit -- except the
  // next unit, which a positive bucket always takes: DeepSpeed's prefetch loop adds
  // parameters while the elements in flight are below the bucket, so its smallest bucket
  // still prefetches what comes next, and a unit (a whole decoder layer of an 8B model,
  // 218M elements) larger than the bucket would otherwise never be prefetched. 0 prefetches
  // nothing.
  int64_t budget = opt_.prefetch_numel;
  for (int64_t k = pos + dir; k >= 0 && k < static_cast<int64_t>(order.size()); k += dir) {
    const int b = order[k];
    const int64_t n = L_.flat.buckets[b].numel;
    const bool next = k == pos + dir && budget > 0;
    if (n > budget && !next) break;
    budget -= n;
    if (units_[b].live) continue;
    if (block_live_numel_ + n > opt_.max_live_numel) break;
    gather(b, /*prefetch=*/true);
  }
}

void ParamGatherer::begin_forward() {
  rec_.clear();
  bwd_unit_ = -1;
  if (root_ >= 0) gather(root_, false);
  if (persistent_ >= 0) gather(persistent_, false);
  if (trace_valid_) prefetch_after(trace_, -1, +1);
  if (root_ >= 0) ensure_gathered(root_);
  if (persistent_ >= 0) ensure_gathered(persistent_);
}

void ParamGatherer::end_forward() {
  // The recorded order becomes the trace the next forwards prefetch from.
  if (!trace_valid_ || rec_ != trace_) {
    trace_ = rec_;
    trace_valid_ = !rec_.empty();
  }
  bwd_pos_ = static_cast<int64_t>(rec_.size());
  if (!torch::GradMode::is_enabled() && !hold_all_) release_all(/*persistent_too=*/false);  // no backward follows
  check_tags();
}

void ParamGatherer::unit_pre_forward(int unit, bool recompute) {
  ZT_CHECK_T(unit >= 0 && unit < num_units(), InternalError, "ZeRO-3 unit ", unit, " does not exist (", num_units(),
             " units)");
  const int b = unit_bucket_[unit];
  if (b < 0) return;
  if (recompute) {
    ensure_gathered(b);
    return;
  }
  const int64_t pos = static_cast<int64_t>(rec_.size());
  rec_.push_back(b);
  const bool on_trace = trace_valid_ && pos < static_cast<int64_t>(trace_.size()) && trace_[pos] == b;
  if (trace_valid_ && !on_trace) trace_valid_ = false;  // the order changed: stop prefetching
  ensure_gathered(b);
  if (trace_valid_) prefetch_after(trace_, pos, +1);
}

void ParamGatherer::unit_post_forward(int unit, bool recompute) {
  if (recompute) return;
  const int b = unit_bucket_[unit];
  if (b < 0) return;
  if (!torch::GradMode::is_enabled()) {
    release(b);
    return;
  }
  // Next use of this unit: its own backward, after the rest of forward and the backward
  // of every unit after it. Keep it when that is within the reuse distance and the live
  // budget allows; without a trace the distance is unknown: release.
  bool keep = false;
  if (trace_valid_) {
    const int64_t pos = static_cast<int64_t>(rec_.size()) - 1;
    int64_t distance = 0;
    for (size_t k = static_cast<size_t>(pos) + 1; k < trace_.size(); ++k) distance += 2 * L_.flat.buckets[trace_[k]].numel;
    keep = distance <= opt_.max_reuse_distance && block_live_numel_ <= opt_.max_live_numel;
  }
  if (!keep) release(b);
}

torch::Tensor ParamGatherer::unit_output(int unit, const torch::Tensor& y) {
  if (!torch::GradMode::is_enabled() || !y.requires_grad()) return y;
  const int b = unit_bucket_[unit];
  if (b < 0) return y;
  return PreBackward::apply(y, reinterpret_cast<int64_t>(this), static_cast<int64_t>(b));
}

void ParamGatherer::on_pre_backward(int b) {
  // Where this unit ran in forward (the latest occurrence not yet back-propagated).
  int64_t pos = -1;
  for (int64_t k = std::min<int64_t>(bwd_pos_, static_cast<int64_t>(rec_.size())) - 1; k >= 0; --k) {
    if (rec_[k] == b) {
      pos = k;
      break;
    }
  }
  // [Frozen Units]: this node runs once the unit's output gradient is complete, so the
  // backward of the unit after it (in forward order) no longer needs its weights.
  if (opt_.release_after_backward) {
    if (bwd_unit_ >= 0 && bwd_unit_ != b && units_[bwd_unit_].kind == UnitKind::kBlock) release(bwd_unit_);
    bwd_unit_ = b;
  }
  ensure_gathered(b);
  if (pos >= 0) {
    bwd_pos_ = pos;
    prefetch_after(rec_, pos, -1);
  }
}

void ParamGatherer::check_tags() {
  if (tag_checks_.empty()) return;
  std::vector<torch::Tensor> ts;
  for (auto& t : tag_checks_) ts.push_back(t.tags);
  // One copy for all pending checks (on the GPU this is the only host sync they cost).
  auto host = torch::stack(ts).to(torch::kCPU).contiguous();  // (checks, world*2)
  auto acc = host.accessor<int64_t, 2>();
  std::vector<TagCheck> checks = std::move(tag_checks_);
  tag_checks_.clear();
  for (size_t c = 0; c < checks.size(); ++c) {
    bool ok = true;
    for (int r = 0; r < world_; ++r) {
      ok = ok && acc[c][2 * r] == checks[c].bucket && acc[c][2 * r + 1] == checks[c].seq;
    }
    if (ok) continue;
    std::string who;
    for (int r = 0; r < world_; ++r) {
      who += detail::cat("\n  rank ", r, ": gather #", acc[c][2 * r + 1], " of ",
                         unit_label(static_cast<int>(acc[c][2 * r])));
    }
    throw TrainingError(detail::cat(
        "ZeRO-3: ranks disagree on the sequence of parameter gathers at gather #", checks[c].seq,
        " (this is rank ", rank_, ", which gathered ", unit_label(checks[c].bucket), "):", who,
        "\nEvery rank must run the same units in the same order in each forward and backward. A branch that "
        "depends on the data (or the rank) changes that order; take the same branch on every rank, or give "
        "the parameters of the optional path to a unit that is always run."));
  }
}

}  // namespace zt::zero
