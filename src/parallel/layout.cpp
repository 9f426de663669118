// The parallel layout: validation of the degrees and the pure group arithmetic.
// See [Rank Order] in layout.h.
#include "parallel/layout.h"

#include <cstdint>
#include <utility>

#include "zerotrain/error.h"

namespace zt::parallel {

namespace {

// The divisors of n, "1, 2 or 4", for messages.
std::string divisors(int n) {
  std::vector<int> ds;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) ds.push_back(d);
  std::string out;
  for (size_t i = 0; i < ds.size(); ++i) {
    if (i > 0) out += i + 1 == ds.size() ? " or " : ", ";
    out += std::to_string(ds[i]);
  }
  return out;
}

size_t slot(GroupKind kind) { return static_cast<size_t>(kind); }

}  // namespace

ParallelDims ParallelDims::make(int world_size, int dp, int tp, int pp, int ep) {
  const std::string factors = detail::cat("tp ", tp, " x pp ", pp, " x dp ", dp, " (ep ", ep, ")");
  ZT_CHECK_T(world_size >= 1, ConfigError, "parallel layout ", factors, ": the world size must be >= 1, got ",
             world_size);
  const std::pair<const char*, int> degrees[] = {{"dp", dp}, {"tp", tp}, {"pp", pp}, {"ep", ep}};
  for (const auto& [name, v] : degrees) {
    ZT_CHECK_T(v >= 1, ConfigError, "parallel layout ", factors, " for world size ", world_size, ": ", name, " is ", v,
               " but every degree must be at least 1 (1 = that kind of parallelism is off)");
  }
  const int64_t product = int64_t{tp} * pp * dp;
  ZT_CHECK_T(product == world_size, ConfigError, "tp ", tp, " x pp ", pp, " x dp ", dp, " = ", product,
             " != world size ", world_size,
             ": the degrees must multiply to the number of ranks; leave dp out (dp = world size / (tp x pp)) "
             "or start ", product, " ranks");
  ZT_CHECK_T(dp % ep == 0, ConfigError, "ep ", ep, " does not divide dp ", dp, " (tp ", tp, " x pp ", pp, " x dp ", dp,
             " = world size ", world_size,
             "): expert-parallel groups are cut out of the data-parallel ranks, so ep must divide dp; use ep ",
             divisors(dp));
  return ParallelDims{dp, tp, pp, ep};
}

ParallelDims ParallelDims::derive(int world_size, int tp, int pp, int ep) {
  ZT_CHECK_T(tp >= 1 && pp >= 1, ConfigError, "parallel layout for world size ", world_size, ": tp ", tp, " and pp ",
             pp, " must both be at least 1 (1 = off)");
  const int64_t model = int64_t{tp} * pp;
  ZT_CHECK_T(world_size >= 1 && world_size % model == 0, ConfigError, "tp ", tp, " x pp ", pp, " = ", model,
             " does not divide world size ", world_size,
             ": dp = world size / (tp x pp) must be a whole number; use tp and pp whose product divides ", world_size,
             " (", divisors(world_size), "), or start a multiple of ", model, " ranks");
  return make(world_size, static_cast<int>(world_size / model), tp, pp, ep);
}

std::string ParallelDims::to_string() const {
  return detail::cat("dp ", dp, " x tp ", tp, " x pp ", pp, " = ", world(), world() == 1 ? " rank" : " ranks", ", ep ",
                     ep);
}

const char* group_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::dp: return "dp";
    case GroupKind::tp: return "tp";
    case GroupKind::pp: return "pp";
    case GroupKind::ep: return "ep";
    case GroupKind::expert_dp: return "expert_dp";
    case GroupKind::model_parallel: return "model_parallel";
  }
  return "?";
}

int rank_of(const ParallelDims& d, int dp, int tp, int pp) {
  ZT_ASSERT(dp >= 0 && dp < d.dp && tp >= 0 && tp < d.tp && pp >= 0 && pp < d.pp, "coordinates (dp ", dp, ", tp ", tp,
            ", pp ", pp, ") outside ", d.to_string());
  return tp + d.tp * (dp + d.dp * pp);
}

Coords coords_of(const ParallelDims& d, int rank) {
  ZT_ASSERT(rank >= 0 && rank < d.world(), "rank ", rank, " outside ", d.to_string());
  Coords c;
  c.tp = rank % d.tp;
  c.dp = (rank / d.tp) % d.dp;
  c.pp = rank / (d.tp * d.dp);
  c.ep = c.dp % d.ep;
  c.expert_dp = c.dp / d.ep;
  return c;
}

int group_size(const ParallelDims& d, GroupKind kind) {
  switch (kind) {
    case GroupKind::dp: return d.dp;
    case GroupKind::tp: return d.tp;
    case GroupKind::pp: return d.pp;
    case GroupKind::ep: return d.ep;
    case GroupKind::expert_dp: return d.dp / d.ep;
    case GroupKind::model_parallel: return d.tp * d.pp;
  }
  return 0;
}

int group_count(const ParallelDims& d, GroupKind kind) { return d.world() / group_size(d, kind); }

// Each index orders the groups of a kind by their first member (the rank whose spanned
// coordinates are all 0): see the formula for that member in each comment.
int group_index(const ParallelDims& d, GroupKind kind, int rank) {
  const Coords c = coords_of(d, rank);
  switch (kind) {
    case GroupKind::dp: return c.tp + d.tp * c.pp;                         // first: tp + tp*dp*pp
    case GroupKind::tp: return c.dp + d.dp * c.pp;                         // first: tp*(dp + dp_size*pp)
    case GroupKind::pp: return c.tp + d.tp * c.dp;                         // first: tp + tp*dp
    case GroupKind::ep: return c.tp + d.tp * (c.expert_dp + d.dp / d.ep * c.pp);  // first: dp = ep*expert_dp
    case GroupKind::expert_dp: return c.tp + d.tp * (c.ep + d.ep * c.pp);  // first: dp = ep index
    case GroupKind::model_parallel: return c.dp;                           // first: tp*dp
  }
  return -1;
}

int rank_in_group(const ParallelDims& d, GroupKind kind, int rank) {
  const Coords c = coords_of(d, rank);
  switch (kind) {
    case GroupKind::dp: return c.dp;
    case GroupKind::tp: return c.tp;
    case GroupKind::pp: return c.pp;
    case GroupKind::ep: return c.ep;
    case GroupKind::expert_dp: return c.expert_dp;
    case GroupKind::model_parallel: return c.tp + d.tp * c.pp;
  }
  return -1;
}

std::vector<int> group_members(const ParallelDims& d, GroupKind kind, int rank) {
  const Coords c = coords_of(d, rank);
  std::vector<int> m;
  m.reserve(static_cast<size_t>(group_size(d, kind)));
  switch (kind) {
    case GroupKind::dp:
      for (int i = 0; i < d.dp; ++i) m.push_back(rank_of(d, i, c.tp, c.pp));
      break;
    case GroupKind::tp:
      for (int i = 0; i < d.tp; ++i) m.push_back(rank_of(d, c.dp, i, c.pp));
      break;
    case GroupKind::pp:
      for (int i = 0; i < d.pp; ++i) m.push_back(rank_of(d, c.dp, c.tp, i));
      break;
    case GroupKind::ep:
      for (int i = 0; i < d.ep; ++i) m.push_back(rank_of(d, c.expert_dp * d.ep + i, c.tp, c.pp));
      break;
    case GroupKind::expert_dp:
      for (int i = 0; i < d.dp / d.ep; ++i) m.push_back(rank_of(d, i * d.ep + c.ep, c.tp, c.pp));
      break;
    case GroupKind::model_parallel:
      for (int p = 0; p < d.pp; ++p)
        for (int t = 0; t < d.tp; ++t) m.push_back(rank_of(d, c.dp, t, p));
      break;
  }
  return m;
}

PipelineNeighbours pipeline_neighbours(const ParallelDims& d, int rank) {
  const Coords c = coords_of(d, rank);
  PipelineNeighbours n;
  if (c.pp > 0) n.prev = rank_of(d, c.dp, c.tp, c.pp - 1);
  if (c.pp + 1 < d.pp) n.next = rank_of(d, c.dp, c.tp, c.pp + 1);
  return n;
}

Layout make_layout(const ParallelDims& d) {
  Layout l;
  l.dims = d;
  l.ranks.resize(static_cast<size_t>(d.world()));
  for (GroupKind kind : kGroupKinds) l.groups[slot(kind)].resize(static_cast<size_t>(group_count(d, kind)));
  for (int r = 0; r < d.world(); ++r) {
    RankPlace& p = l.ranks[static_cast<size_t>(r)];
    p.coords = coords_of(d, r);
    p.neighbours = pipeline_neighbours(d, r);
    for (GroupKind kind : kGroupKinds) {
      const int g = group_index(d, kind, r);
      p.group[slot(kind)] = g;
      auto& members = l.groups[slot(kind)][static_cast<size_t>(g)];
      if (members.empty()) members = group_members(d, kind, r);
    }
  }
  return l;
}

const std::vector<int>& Layout::members(GroupKind kind, int rank) const {
  ZT_ASSERT(rank >= 0 && rank < dims.world(), "rank ", rank, " outside ", dims.to_string());
  return groups[slot(kind)][static_cast<size_t>(ranks[static_cast<size_t>(rank)].group[slot(kind)])];
}

}  // namespace zt::parallel
