// The parallel layout (src/parallel/layout.h) as pure data: no ranks are started.
//  * Layout1024: dp 16 x tp 8 x pp 8, ep 4 -- every group of every kind checked against an
//    independent definition (two ranks share a group iff the coordinates the kind does
//    not span are equal), plus sizes, order, coordinates, neighbours and hand-written
//    groups.
//  * Small layouts compared with literal member lists.
//  * Validation errors: each names the factors, the product, the world size and the fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "zerotrain/error.h"

namespace zt::parallel {
namespace test_layout {
namespace {

using Groups = std::vector<std::vector<int>>;

size_t slot(GroupKind k) { return static_cast<size_t>(k); }

// The independent definition: the coordinates that stay fixed inside a group of `kind`.
std::vector<int> fixed_coords(const ParallelDims& d, GroupKind kind, const Coords& c) {
  switch (kind) {
    case GroupKind::dp: return {c.tp, c.pp};
    case GroupKind::tp: return {c.dp, c.pp};
    case GroupKind::pp: return {c.dp, c.tp};
    case GroupKind::ep: return {c.tp, c.pp, c.dp / d.ep};
    case GroupKind::expert_dp: return {c.tp, c.pp, c.dp % d.ep};
    case GroupKind::model_parallel: return {c.dp};
  }
  return {};
}

// Coordinates decoded by hand from rank = tp + TP*(dp + DP*pp), for the round trip.
Coords decode(const ParallelDims& d, int r) {
  Coords c;
  c.tp = r % d.tp;
  c.dp = r / d.tp % d.dp;
  c.pp = r / d.tp / d.dp;
  c.ep = c.dp % d.ep;
  c.expert_dp = c.dp / d.ep;
  return c;
}

void check_layout(const ParallelDims& d) {
  SCOPED_TRACE(d.to_string());
  const Layout l = make_layout(d);
  const int n = d.world();
  ASSERT_EQ(static_cast<int>(l.ranks.size()), n);
  std::vector<Coords> coords(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    coords[static_cast<size_t>(r)] = decode(d, r);
    const Coords& c = l.ranks[static_cast<size_t>(r)].coords;
    EXPECT_EQ(c, coords[static_cast<size_t>(r)]) << "rank " << r;
    EXPECT_EQ(coords_of(d, r), c);
    EXPECT_EQ(rank_of(d, c.dp, c.tp, c.pp), r);
  }
  for (GroupKind kind : kGroupKinds) {
    SCOPED_TRACE(group_name(kind));
    const Groups& groups = l.groups[slot(kind)];
    ASSERT_EQ(static_cast<int>(groups.size()), group_count(d, kind));
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& m = groups[g];
      ASSERT_EQ(static_cast<int>(m.size()), group_size(d, kind)) << "group " << g;
      EXPECT_TRUE(std::is_sorted(m.begin(), m.end()) && std::adjacent_find(m.begin(), m.end()) == m.end())
          << "group " << g << " is not strictly ascending";
      if (g > 0) {
        EXPECT_LT(groups[g - 1].front(), m.front()) << "groups are ordered by first member";
      }
      for (size_t i = 0; i < m.size(); ++i) {
        const int r = m[i];
        ASSERT_TRUE(r >= 0 && r < n);
        ++seen[static_cast<size_t>(r)];
        EXPECT_EQ(group_index(d, kind, r), static_cast<int>(g)) << "rank " << r;
        EXPECT_EQ(rank_in_group(d, kind, r), static_cast<int>(i)) << "rank " << r;
        EXPECT_EQ(l.ranks[static_cast<size_t>(r)].group[slot(kind)], static_cast<int>(g));
      }
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << "rank " << r << " in one group";
    // Independent definition: r and s share a group iff their fixed coordinates match.
    std::vector<std::vector<int>> keys;
    for (int r = 0; r < n; ++r) keys.push_back(fixed_coords(d, kind, coords[static_cast<size_t>(r)]));
    for (int r = 0; r < n; ++r) {
      std::vector<int> expected;
      for (int s = 0; s < n; ++s)
        if (keys[static_cast<size_t>(s)] == keys[static_cast<size_t>(r)]) expected.push_back(s);
      ASSERT_EQ(l.members(kind, r), expected) << "rank " << r;
      if (r % 97 == 0) {
        EXPECT_EQ(group_members(d, kind, r), expected) << "rank " << r;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    const Coords& c = coords[static_cast<size_t>(r)];
    const PipelineNeighbours p = l.ranks[static_cast<size_t>(r)].neighbours;
    EXPECT_EQ(p.prev, c.pp > 0 ? r - d.tp * d.dp : -1) << "rank " << r;
    EXPECT_EQ(p.next, c.pp + 1 < d.pp ? r + d.tp * d.dp : -1) << "rank " << r;
    EXPECT_EQ(pipeline_neighbours(d, r), p);
  }
}

Groups of(const ParallelDims& d, GroupKind kind) { return make_layout(d).groups[slot(kind)]; }

std::vector<int> range(int from, int to, int step = 1) {
  std::vector<int> v;
  for (int i = from; i < to; i += step) v.push_back(i);
  return v;
}

TEST(Layout, Layout1024) {
  const ParallelDims d = ParallelDims::make(1024, 16, 8, 8, 4);
  check_layout(d);
  const Layout l = make_layout(d);
  EXPECT_EQ(l.groups[slot(GroupKind::dp)].size(), 64u);
  EXPECT_EQ(l.groups[slot(GroupKind::tp)].size(), 128u);
  EXPECT_EQ(l.groups[slot(GroupKind::pp)].size(), 128u);
  EXPECT_EQ(l.groups[slot(GroupKind::ep)].size(), 256u);
  EXPECT_EQ(l.groups[slot(GroupKind::expert_dp)].size(), 256u);
  EXPECT_EQ(l.groups[slot(GroupKind::model_parallel)].size(), 16u);

  // Rank 0, by hand.
  EXPECT_EQ(l.members(GroupKind::tp, 0), range(0, 8));
  EXPECT_EQ(l.members(GroupKind::dp, 0), range(0, 128, 8));
  EXPECT_EQ(l.members(GroupKind::pp, 0), range(0, 1024, 128));
  EXPECT_EQ(l.members(GroupKind::ep, 0), (std::vector<int>{0, 8, 16, 24}));
  EXPECT_EQ(l.members(GroupKind::expert_dp, 0), (std::vector<int>{0, 32, 64, 96}));
  std::vector<int> mp0;
  for (int p = 0; p < 8; ++p)
    for (int t = 0; t < 8; ++t) mp0.push_back(128 * p + t);
  EXPECT_EQ(l.members(GroupKind::model_parallel, 0), mp0);
  EXPECT_EQ(l.ranks[0].neighbours, (PipelineNeighbours{-1, 128}));

  // Rank 1000 = 0 + 8 * (13 + 16 * 7): tp 0, dp 13, pp 7, ep 13 % 4 = 1, expert_dp 3.
  EXPECT_EQ(coords_of(d, 1000), (Coords{13, 0, 7, 1, 3}));
  EXPECT_EQ(l.members(GroupKind::tp, 1000), range(1000, 1008));
  EXPECT_EQ(l.members(GroupKind::dp, 1000), range(896, 1024, 8));
  EXPECT_EQ(l.members(GroupKind::pp, 1000), (std::vector<int>{104, 232, 360, 488, 616, 744, 872, 1000}));
  EXPECT_EQ(l.members(GroupKind::ep, 1000), (std::vector<int>{992, 1000, 1008, 1016}));
  EXPECT_EQ(l.members(GroupKind::expert_dp, 1000), (std::vector<int>{904, 936, 968, 1000}));
  std::vector<int> mp13;
  for (int p = 0; p < 8; ++p)
    for (int t = 0; t < 8; ++t) mp13.push_back(t + 8 * (13 + 16 * p));
  EXPECT_EQ(l.members(GroupKind::model_parallel, 1000), mp13);
  EXPECT_EQ(l.ranks[1000].neighbours, (PipelineNeighbours{872, -1}));
  EXPECT_EQ(rank_in_group(d, GroupKind::model_parallel, 1000), 7 * 8 + 0);
}

TEST(Layout, ManyShapesMatchTheIndependentDefinition) {
  const ParallelDims shapes[] = {
      ParallelDims::make(1, 1, 1, 1),     ParallelDims::make(2, 2, 1, 1, 2), ParallelDims::make(6, 1, 2, 3),
      ParallelDims::make(12, 6, 2, 1, 3), ParallelDims::make(24, 4, 3, 2, 2), ParallelDims::make(16, 16, 1, 1, 8),
      ParallelDims::make(8, 1, 1, 8),
  };
  for (const auto& d : shapes) check_layout(d);
}

TEST(Layout, Dp2Tp2) {
  const auto d = ParallelDims::make(4, 2, 2, 1);
  EXPECT_EQ(of(d, GroupKind::tp), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(of(d, GroupKind::dp), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(of(d, GroupKind::pp), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(of(d, GroupKind::ep), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(of(d, GroupKind::expert_dp), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(of(d, GroupKind::model_parallel), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(coords_of(d, 1), (Coords{0, 1, 0, 0, 0}));
  EXPECT_EQ(coords_of(d, 2), (Coords{1, 0, 0, 0, 1}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(pipeline_neighbours(d, r), (PipelineNeighbours{-1, -1}));
}

TEST(Layout, Dp2Pp2) {
  const auto d = ParallelDims::make(4, 2, 1, 2);
  EXPECT_EQ(of(d, GroupKind::dp), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(of(d, GroupKind::pp), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(of(d, GroupKind::tp), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(of(d, GroupKind::model_parallel), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(pipeline_neighbours(d, 0), (PipelineNeighbours{-1, 2}));
  EXPECT_EQ(pipeline_neighbours(d, 1), (PipelineNeighbours{-1, 3}));
  EXPECT_EQ(pipeline_neighbours(d, 2), (PipelineNeighbours{0, -1}));
  EXPECT_EQ(pipeline_neighbours(d, 3), (PipelineNeighbours{1, -1}));
}

TEST(Layout, Dp4Ep2) {
  const auto d = ParallelDims::make(4, 4, 1, 1, 2);
  EXPECT_EQ(of(d, GroupKind::dp), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(of(d, GroupKind::ep), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(of(d, GroupKind::expert_dp), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(coords_of(d, 3), (Coords{3, 0, 0, 1, 1}));
}

TEST(Layout, Dp2Tp2Pp2Ep2) {
  // rank = tp + 2 * (dp + 2 * pp)
  const auto d = ParallelDims::make(8, 2, 2, 2, 2);
  EXPECT_EQ(of(d, GroupKind::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(of(d, GroupKind::dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(of(d, GroupKind::pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(of(d, GroupKind::ep), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(of(d, GroupKind::expert_dp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(of(d, GroupKind::model_parallel), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(pipeline_neighbours(d, 3), (PipelineNeighbours{-1, 7}));
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(Layout, ValidationErrorsNameEveryFactorAndTheFix) {
  std::string e = error_of([] { ParallelDims::make(4, 1, 2, 3); });
  EXPECT_NE(e.find("tp 2 x pp 3 x dp 1 = 6 != world size 4"), std::string::npos) << e;
  EXPECT_NE(e.find("start 6 ranks"), std::string::npos) << e;
  e = error_of([] { ParallelDims::make(4, 0, 2, 1); });
  EXPECT_NE(e.find("dp is 0 but every degree must be at least 1"), std::string::npos) << e;
  e = error_of([] { ParallelDims::make(4, 4, 1, 1, 0); });
  EXPECT_NE(e.find("ep is 0"), std::string::npos) << e;
  e = error_of([] { ParallelDims::make(8, 4, 2, 1, 3); });
  EXPECT_NE(e.find("ep 3 does not divide dp 4 (tp 2 x pp 1 x dp 4 = world size 8)"), std::string::npos) << e;
  EXPECT_NE(e.find("use ep 1, 2 or 4"), std::string::npos) << e;
  e = error_of([] { ParallelDims::derive(4, 3, 1); });
  EXPECT_NE(e.find("tp 3 x pp 1 = 3 does not divide world size 4"), std::string::npos) << e;
  EXPECT_NE(e.find("(1, 2 or 4)"), std::string::npos) << e;
  e = error_of([] { ParallelDims::derive(4, 1, 0); });
  EXPECT_NE(e.find("pp 0 must both be at least 1"), std::string::npos) << e;
  EXPECT_EQ(ParallelDims::derive(16, 2, 2, 2), (ParallelDims{4, 2, 2, 2}));
  EXPECT_EQ(ParallelDims::derive(3, 1, 1).to_string(), "dp 3 x tp 1 x pp 1 = 3 ranks, ep 1");
}

}  // namespace
}  // namespace test_layout
}  // namespace zt::parallel
