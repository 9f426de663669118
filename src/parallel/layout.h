// The parallel layout as data: the degrees (dp, tp, pp, ep), where each world rank sits,
// and the members of every named group. Pure functions of the degrees: no communication,
// so the layout of 1 024 ranks is tested without starting them (tests/unit/test_layout.cpp).
// parallel/topology.h builds the communicators of these groups over a comm::Group.
//
// [Rank Order] (Megatron-LM's; referenced from topology.h, the config layer and
// docs/parallel.md)
//  * A world rank has coordinates (dp, tp, pp); tp varies fastest, then dp, then pp:
//        rank = tp_rank + tp * (dp_rank + dp * pp_rank)
//    so the tp ranks of one model shard are consecutive (one host's NVLink domain when
//    tp <= GPUs per host), the dp replicas of one stage are strided by tp, and each
//    pipeline stage is one contiguous block of dp * tp ranks.
//  * Expert groups are carved out of dp (DeepSpeed's "E + D" order,
//    deepspeed/utils/groups.py `_create_expert_and_data_parallel`): within one (pp, tp)
//    slice the dp ranks 0..dp-1 are cut into dp/ep expert-parallel (ep) groups of ep
//    CONSECUTIVE dp ranks; the expert-data-parallel (expert_dp) group of a rank holds
//    the dp ranks with the same index inside their ep group (dp_rank mod ep), dp/ep of
//    them. So ep_rank = dp_rank % ep and expert_dp_rank = dp_rank / ep.
//  * The model-parallel group is the tp x pp ranks of one dp index: together they hold
//    one replica of the model (global gradient norm, overflow flag).
//  * Members of every group are listed in ascending world rank, which is also the order
//    of the coordinate the group spans (a rank's index in its dp group is its dp_rank,
//    in its model_parallel group pp_rank * tp + tp_rank). Groups of one kind are indexed
//    in ascending order of their first member.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace zt::parallel {

// The parallel degrees. Build with make() or derive(), which validate once: every
// degree >= 1, dp * tp * pp == world size, ep divides dp. A default ParallelDims is
// one rank.
struct ParallelDims {
  int dp = 1;  ///< data-parallel replicas (ZeRO shards over them)
  int tp = 1;  ///< tensor-parallel ranks per layer
  int pp = 1;  ///< pipeline stages
  int ep = 1;  ///< expert-parallel ranks, carved out of dp (see [Rank Order])

  int world() const { return dp * tp * pp; }
  // Throws zt::ConfigError naming every factor, the product, the world size and the fix.
  static ParallelDims make(int world_size, int dp, int tp, int pp, int ep = 1);
  // dp = world_size / (tp * pp); ConfigError when tp * pp does not divide world_size.
  static ParallelDims derive(int world_size, int tp, int pp, int ep = 1);
  // "dp 2 x tp 2 x pp 1 = 4 ranks, ep 1".
  std::string to_string() const;
  bool operator==(const ParallelDims&) const = default;
};

// Where one world rank sits. See [Rank Order].
struct Coords {
  int dp = 0, tp = 0, pp = 0;
  int ep = 0;         ///< index inside its ep group = dp % ep_size
  int expert_dp = 0;  ///< index inside its expert_dp group = dp / ep_size
  bool operator==(const Coords&) const = default;
};

enum class GroupKind { dp, tp, pp, ep, expert_dp, model_parallel };
inline constexpr std::array<GroupKind, 6> kGroupKinds = {GroupKind::dp, GroupKind::tp,        GroupKind::pp,
                                                         GroupKind::ep, GroupKind::expert_dp, GroupKind::model_parallel};
inline constexpr size_t kNumGroupKinds = kGroupKinds.size();
// "dp", "tp", "pp", "ep", "expert_dp", "model_parallel".
const char* group_name(GroupKind kind);

// The world ranks next to a rank in its pipeline (pp group); -1 at the first (prev) and
// last (next) stage: the pipeline is a line, not a ring.
struct PipelineNeighbours {
  int prev = -1;
  int next = -1;
  bool operator==(const PipelineNeighbours&) const = default;
};

// rank = tp + dims.tp * (dp + dims.dp * pp). Coordinates must be in range (asserted).
int rank_of(const ParallelDims& dims, int dp, int tp, int pp);
Coords coords_of(const ParallelDims& dims, int rank);
// Ranks in each group of `kind`, and how many groups of that kind there are.
int group_size(const ParallelDims& dims, GroupKind kind);
int group_count(const ParallelDims& dims, GroupKind kind);
// Which group of `kind` holds `rank` (0 .. group_count-1, in order of first member):
// the color of Group::split.
int group_index(const ParallelDims& dims, GroupKind kind, int rank);
// `rank`'s index in that group (the key of Group::split).
int rank_in_group(const ParallelDims& dims, GroupKind kind, int rank);
// Members of the group of `kind` that holds `rank`, ascending.
std::vector<int> group_members(const ParallelDims& dims, GroupKind kind, int rank);
PipelineNeighbours pipeline_neighbours(const ParallelDims& dims, int rank);

// The whole layout at once: every group of every kind and every rank's place.
struct RankPlace {
  Coords coords;
  std::array<int, kNumGroupKinds> group{};  ///< group index per kind (kGroupKinds order)
  PipelineNeighbours neighbours;
};
struct Layout {
  ParallelDims dims;
  /// groups[kind][i]: members of group i of that kind, ascending.
  std::array<std::vector<std::vector<int>>, kNumGroupKinds> groups;
  /// ranks[r]: where world rank r sits.
  std::vector<RankPlace> ranks;
  const std::vector<int>& members(GroupKind kind, int rank) const;
};
Layout make_layout(const ParallelDims& dims);

}  // namespace zt::parallel
