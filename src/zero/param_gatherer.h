// ParamGatherer: part (c) of "ZeRO as parts" (docs/zero-parts.md), the stage-3 parameter
// gatherer of one shard group over its communicator. See param_gatherer.cpp for the life
// of a unit in one step. It owns the gather units (one bucket of the layout each), their
// gathered buffers, the forward trace it prefetches from, and the tag checks; it knows
// nothing of gradients or optimizer state: where this rank's shard comes from is the
// owner's shard_source, and the owner releases a unit when its gradients are out.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zero/shard_layout.h"
#include "zerotrain/comm.h"

namespace zt::zero {

// Stage 3 counters of one optimizer step.
struct Zero3Stats {
  int64_t gathers = 0;            // unit all-gathers issued
  int64_t prefetched = 0;         // of those, issued before the unit was needed
  int64_t releases = 0;
  int64_t live_numel = 0;         // gathered elements right now
  int64_t peak_live_numel = 0;    // most gathered elements at once (in flight included)
  int64_t max_unit_numel = 0;     // largest unit (the "plus one unit" of the bound)
};

enum class UnitKind { kBlock, kRoot, kPersistent };

// Which parameters form which unit, in layout order: a pure function of the parameters'
// sizes, the declared units and the persistence threshold (see plan_units).
struct UnitPlan {
  std::vector<int> order;                    // layout index -> user index
  std::vector<std::vector<int64_t>> numels;  // per bucket (unit): its parameters' sizes
  std::vector<std::string> names;            // per bucket
  std::vector<UnitKind> kinds;               // per bucket
  std::vector<int> unit_bucket;              // declared unit -> bucket, -1 when all its parameters persist
};

// Units in forward order (user indices); parameters in none form the "root" unit;
// parameters under persistence_threshold elements form the "persistent" unit. Buckets:
// root, declared units in order, persistent (each only when not empty); within a bucket
// the parameters are stably sorted by group_of (each parameter group contiguous, see
// [Group Runs]). name_of names a parameter in errors (a unit that names a parameter twice
// or out of range is a ConfigError).
struct DeclaredUnit {
  std::string name;
  std::vector<int> params;
};
UnitPlan plan_units(const std::vector<int64_t>& numels, const std::vector<DeclaredUnit>& units,
                    int64_t persistence_threshold, const std::function<int(int)>& group_of,
                    const std::function<std::string(int)>& name_of);

struct GathererOptions {
  torch::Device device = torch::kCPU;
  at::ScalarType dtype = at::kFloat;           // compute dtype of the gathered parameters
  int64_t prefetch_numel = 50000000;           // stage3_prefetch_bucket_size
  int64_t max_live_numel = 1000000000;         // stage3_max_live_parameters
  int64_t max_reuse_distance = 1000000000;     // stage3_max_reuse_distance
  // A shard group without gradients (frozen_shards.h): a block unit is released when the
  // backward reaches the unit before it, not when its gradients are reduced.
  bool release_after_backward = false;
};

class ParamGatherer {
 public:
  // layout: the shard group's (outlives the gatherer), one bucket per unit of `plan`;
  // params: its parameters in layout order; shapes: their full shapes.
  ParamGatherer(const ShardLayout& layout, std::vector<torch::Tensor> params, std::vector<std::vector<int64_t>> shapes,
                const UnitPlan& plan, comm::GroupPtr group, GathererOptions options);
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // This rank's shard of bucket b in the compute dtype, on the device (or a host tensor
  // the device copy is issued from): what gather(b) all-gathers. Called once per gather,
  // after the unit's buffer exists and before its all-gather is issued.
  std::function<torch::Tensor(int b)> shard_source;

  // What released parameters point at (an empty tensor of the compute dtype).
  const torch::Tensor& empty() const { return empty_; }
  // Points bucket b's parameters at `empty()` (construction: after they were partitioned).
  void detach(int b);

  // The engine's calls (see ZeroOptimizer): forward begin/end, the unit hooks models call,
  // the autograd node before a unit's backward, gather/release of everything.
  void begin_forward();
  void end_forward();
  void unit_pre_forward(int unit, bool recompute);
  void unit_post_forward(int unit, bool recompute);
  torch::Tensor unit_output(int unit, const torch::Tensor& y);
  void on_pre_backward(int bucket);
  void gather_all();
  void release_all(bool persistent_too);
  // Bucket b's gradients are reduced: its full parameters are no longer needed (the
  // persistent unit stays until the step).
  void on_reduced(int b);
  // End of backward: release what was gathered (prefetched) but never used; check tags.
  void end_backward();

  int num_units() const { return static_cast<int>(unit_bucket_.size()); }
  const Zero3Stats& stats() const { return z3_; }
  void reset_counters();

 private:
  struct UnitState {
    std::string name;
    UnitKind kind = UnitKind::kBlock;
    torch::Tensor full;        // gathered buffer (numel of the bucket); its storage is empty when released
    bool live = false;         // `full` holds (or is receiving) the unit's parameters
    comm::WorkPtr work;        // pending all-gather into `full`
    bool prefetched = false;
    bool attached = false;     // the parameters point into `full`
  };
  struct TagCheck {
    int bucket;
    int64_t seq;
    torch::Tensor tags;        // (world, 2) int64: what every rank gathered as gather #seq
  };
  void gather(int b, bool prefetch);
  void ensure_gathered(int b);
  void release(int b);
  void prefetch_after(const std::vector<int>& order, int64_t pos, int dir);
  void check_tags();
  std::string unit_label(int b) const;

  const ShardLayout& L_;
  std::vector<torch::Tensor> params_;        // layout order
  std::vector<std::vector<int64_t>> shapes_; // layout index -> full shape
  comm::GroupPtr group_;
  GathererOptions opt_;
  int rank_ = 0, world_ = 1;
  torch::Tensor empty_;                  // what released parameters point at
  std::vector<UnitState> units_;         // per bucket
  std::vector<int> unit_bucket_;         // engine unit id -> bucket, -1 when all persistent
  int root_ = -1, persistent_ = -1;      // buckets of the root / persistent units
  std::vector<int> trace_;               // forward order of block units (last complete forward)
  bool trace_valid_ = false;
  bool hold_all_ = false;                // gather_all(): nothing is released until release_all()
  std::vector<int> rec_;                 // this forward's order
  int64_t bwd_pos_ = 0;
  int bwd_unit_ = -1;                    // release_after_backward: the unit whose backward runs
  int64_t gather_seq_ = 0;
  // Gathered elements of block units: what stage3_max_live_parameters bounds. The root and
  // persistent units are live through the whole forward and backward, so counting them
  // would let a large root (an 8B Llama's embed_tokens + lm_head: 1.05e9 elements, above
  // the 1e9 default) stop every prefetch and every keep.
  int64_t block_live_numel_ = 0;
  std::vector<TagCheck> tag_checks_;
  Zero3Stats z3_;
};

}  // namespace zt::zero
