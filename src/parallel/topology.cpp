// Topology: named groups of the parallel layout, built lazily with Group::split.
// See [Topology Groups] in topology.h and [Rank Order] in layout.h.
#include "parallel/topology.h"

#include <utility>

#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt::parallel {

ParallelDims dims_of(const Config& c, int world_size) {
  return ParallelDims::derive(world_size, c.tp_size(), c.pp_size(), c.ep_size());
}

Topology::Topology(comm::GroupPtr parent, const ParallelDims& dims) : parent_(std::move(parent)), dims_(dims) {
  ZT_ASSERT(parent_ != nullptr);
  ZT_CHECK_T(parent_->size() == dims_.world(), ConfigError, "parallel layout ", dims_.to_string(), " needs ",
             dims_.world(), " ranks but group '", parent_->name(), "' has ", parent_->size(),
             ": start that many ranks or change the degrees");
  rank_ = parent_->rank();
  coords_ = coords_of(dims_, rank_);
}

comm::GroupPtr Topology::group(GroupKind kind) {
  comm::GroupPtr& g = groups_[static_cast<size_t>(kind)];
  if (g) return g;
  if (group_size(dims_, kind) == dims_.world()) {
    g = parent_;  // the whole parent: reuse it (see [Topology Groups])
  } else {
    g = parent_->split(group_index(dims_, kind, rank_), rank_in_group(dims_, kind, rank_));
  }
  ZT_ASSERT(g && g->size() == group_size(dims_, kind) && g->rank() == rank_in_group(dims_, kind, rank_), "split for ",
            group_name(kind), " gave rank ", g ? g->rank() : -1, " of ", g ? g->size() : -1);
  return g;
}

std::string Topology::describe() const {
  auto rank_or_dash = [](int r) { return r < 0 ? std::string("-") : std::to_string(r); };
  const PipelineNeighbours n = pipeline_neighbours();
  return detail::cat("topology: ", dims_.to_string(), " (rank = tp + ", dims_.tp, "*(dp + ", dims_.dp,
                     "*pp)); rank ", rank_, ": dp ", coords_.dp, ", tp ", coords_.tp, ", pp ", coords_.pp, ", ep ",
                     coords_.ep, ", expert_dp ", coords_.expert_dp, "; pipeline prev ", rank_or_dash(n.prev),
                     ", next ", rank_or_dash(n.next));
}

}  // namespace zt::parallel
