// zt::parallel::Topology: the named process groups of a (dp, tp, pp, ep) layout, made
// from a parent comm::Group with Group::split. The layout itself (who is in which group)
// is the pure data of parallel/layout.h; see [Rank Order] there.
//
// [Topology Groups]
//  * group(kind) builds the group of that kind on its first call and caches it. The
//    first call for a kind is COLLECTIVE over the parent: every rank must ask for the
//    same kinds in the same order (as any collective), or the split hangs until the
//    parent's timeout and throws CommError. Later calls return the cached group.
//  * Each group is split with color = its group index and key = this rank's index in it
//    (layout.h), so group(kind)->rank() is this rank's coordinate along that kind and the
//    members are in ascending parent rank.
//  * A kind whose group is the whole parent (dp when tp = pp = 1, model_parallel when
//    dp = 1) is the parent itself: no second communicator for the same ranks.
//  * Groups are comm::Groups: CPU tensors go through the group's MPI communicator, CUDA
//    tensors through its own NCCL communicator, created by the comm layer on the first
//    CUDA collective of that group (see [Stream Rules] in zerotrain/comm.h).
//  * comm names split groups "<parent>/<color>" (e.g. "world/3"); the kind of a group is
//    group_name(kind) ("dp", "tp", ...), and describe() prints both.
#pragma once

#include <array>
#include <string>

#include "parallel/layout.h"
#include "zerotrain/comm.h"

namespace zt {
struct Config;
}

namespace zt::parallel {

// The degrees a resolved Config asks for (tensor_parallel.autotp_size, pipeline.stages,
// expert_parallel.autoep_size; dp = the rest) over `world_size` ranks. Validated.
ParallelDims dims_of(const Config& config, int world_size);

class Topology {
 public:
  // `parent` must have dims.world() ranks (ConfigError otherwise); its rank is the world
  // rank of the layout. Makes no group yet.
  Topology(comm::GroupPtr parent, const ParallelDims& dims);

  const ParallelDims& dims() const { return dims_; }
  const comm::GroupPtr& parent() const { return parent_; }
  int rank() const { return rank_; }
  const Coords& coords() const { return coords_; }
  // Members (parent ranks, ascending) of this rank's group of `kind`; no communication.
  std::vector<int> members(GroupKind kind) const { return group_members(dims_, kind, rank_); }
  // This rank's previous / next pipeline stage (parent ranks; -1 at the ends).
  PipelineNeighbours pipeline_neighbours() const { return parallel::pipeline_neighbours(dims_, rank_); }

  // This rank's group of `kind`. Collective over the parent on the first call for a kind:
  // see [Topology Groups].
  comm::GroupPtr group(GroupKind kind);
  comm::GroupPtr dp() { return group(GroupKind::dp); }
  comm::GroupPtr tp() { return group(GroupKind::tp); }
  comm::GroupPtr pp() { return group(GroupKind::pp); }
  comm::GroupPtr ep() { return group(GroupKind::ep); }
  comm::GroupPtr expert_dp() { return group(GroupKind::expert_dp); }
  comm::GroupPtr model_parallel() { return group(GroupKind::model_parallel); }
  // Whether group(kind) has been built (no communication).
  bool built(GroupKind kind) const { return groups_[static_cast<size_t>(kind)] != nullptr; }

  // One line: every degree and this rank's coordinates, e.g.
  // "topology: dp 2 x tp 2 x pp 1 = 4 ranks, ep 1 (rank = tp + 2*(dp + 2*pp)); rank 3: dp 1, tp 1, pp 0, ep 0,
  //  expert_dp 1; pipeline prev -, next -".
  std::string describe() const;

 private:
  comm::GroupPtr parent_;
  ParallelDims dims_;
  int rank_ = 0;
  Coords coords_;
  std::array<comm::GroupPtr, kNumGroupKinds> groups_{};
};

}  // namespace zt::parallel
