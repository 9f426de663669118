// zt::parallel::Topology on real ranks (CPU, MPI): the named groups built with
// Group::split hold exactly the expected world ranks, in order.
//
// For each world size the suite runs at (1, 2, 4), a table of named layouts whose product
// is that world size: every rank builds every group kind in the same order (the splits
// are collective, see [Topology Groups]), all-gathers its world rank within each group and
// compares the result with the expected member list -- written out by hand for
// dp 2 x tp 2, dp 2 x pp 2 and dp 2 x tp 2 with ep 2 (4 ranks), from the pure layout
// (tested on its own in tests/unit/test_layout.cpp) for the rest. An all-reduce over each
// group checks that its communicator works. Checks never skip a collective.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "parallel/topology.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::parallel {
namespace test_topology {
namespace {

using Groups = std::vector<std::vector<int>>;

comm::GroupPtr world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(60));
  return g;
}

// Hand-written expectations: per kind (kGroupKinds order), every group of that kind.
struct Literal {
  const char* name;
  ParallelDims dims;
  std::array<Groups, kNumGroupKinds> groups;
};

const Literal kLiterals[] = {
    // rank = tp + 2 * dp
    {"dp2_tp2",
     ParallelDims{2, 2, 1, 1},
     {Groups{{0, 2}, {1, 3}},           // dp
      Groups{{0, 1}, {2, 3}},           // tp
      Groups{{0}, {1}, {2}, {3}},       // pp
      Groups{{0}, {1}, {2}, {3}},       // ep
      Groups{{0, 2}, {1, 3}},           // expert_dp
      Groups{{0, 1}, {2, 3}}}},         // model_parallel
    // rank = dp + 2 * pp
    {"dp2_pp2",
     ParallelDims{2, 1, 2, 1},
     {Groups{{0, 1}, {2, 3}},           // dp
      Groups{{0}, {1}, {2}, {3}},       // tp
      Groups{{0, 2}, {1, 3}},           // pp
      Groups{{0}, {1}, {2}, {3}},       // ep
      Groups{{0, 1}, {2, 3}},           // expert_dp
      Groups{{0, 2}, {1, 3}}}},         // model_parallel
    // rank = tp + 2 * dp; the two dp ranks of a tp slice form one ep group
    {"dp2_tp2_ep2",
     ParallelDims{2, 2, 1, 2},
     {Groups{{0, 2}, {1, 3}},           // dp
      Groups{{0, 1}, {2, 3}},           // tp
      Groups{{0}, {1}, {2}, {3}},       // pp
      Groups{{0, 2}, {1, 3}},           // ep
      Groups{{0}, {1}, {2}, {3}},       // expert_dp
      Groups{{0, 1}, {2, 3}}}},         // model_parallel
};

const std::vector<int>& containing(const Groups& groups, int rank) {
  for (const auto& g : groups)
    for (int r : g)
      if (r == rank) return g;
  static const std::vector<int> none;
  return none;
}

std::vector<int> gather_world_ranks(const comm::GroupPtr& g, int world_rank) {
  at::Tensor mine = at::full({1}, world_rank, at::kLong);
  at::Tensor all = at::empty({g->size()}, at::kLong);
  g->all_gather(all, mine);
  std::vector<int> out;
  for (int64_t i = 0; i < all.numel(); ++i) out.push_back(static_cast<int>(all[i].item<int64_t>()));
  return out;
}

// Builds every kind of `dims` on the world and checks each against `expected(kind)`.
template <typename Expected>
void check_topology(const ParallelDims& dims, Expected expected) {
  SCOPED_TRACE(dims.to_string());
  comm::GroupPtr w = world();
  Topology topo(w, dims);
  const int me = w->rank();
  EXPECT_EQ(topo.coords(), coords_of(dims, me));
  for (GroupKind kind : kGroupKinds) {
    SCOPED_TRACE(group_name(kind));
    EXPECT_FALSE(topo.built(kind));
    comm::GroupPtr g = topo.group(kind);  // collective over the world on first use
    ASSERT_NE(g, nullptr);
    const std::vector<int> want = expected(kind);
    EXPECT_EQ(topo.members(kind), want);
    EXPECT_EQ(g->size(), static_cast<int>(want.size()));
    const std::vector<int> got = gather_world_ranks(g, me);
    EXPECT_EQ(got, want) << "rank " << me;
    EXPECT_LT(g->rank(), static_cast<int>(got.size()));
    if (g->rank() < static_cast<int>(got.size())) {
      EXPECT_EQ(got[static_cast<size_t>(g->rank())], me);
    }
    at::Tensor sum = at::full({1}, me, at::kLong);
    g->all_reduce(sum);
    EXPECT_EQ(sum.item<int64_t>(), std::accumulate(want.begin(), want.end(), int64_t{0}));
    if (g->size() == w->size()) {
      EXPECT_EQ(g.get(), w.get()) << "a group of the whole world is the world";
    }
    EXPECT_EQ(topo.group(kind).get(), g.get()) << "cached";
    if (kind == GroupKind::pp) {
      const int i = g->rank();
      const PipelineNeighbours n = topo.pipeline_neighbours();
      EXPECT_EQ(n.prev, i > 0 ? got[static_cast<size_t>(i - 1)] : -1);
      EXPECT_EQ(n.next, i + 1 < g->size() ? got[static_cast<size_t>(i + 1)] : -1);
    }
  }
}

TEST(Topology, HandWrittenLayoutsAtFourRanks) {
  const int n = world()->size();
  if (n != 4) GTEST_SKIP() << "the hand-written layouts need 4 ranks (this run has " << n
                           << "); Topology.AllShapesOfThisWorld covers " << n;
  for (const Literal& lit : kLiterals) {
    SCOPED_TRACE(lit.name);
    const ParallelDims dims = ParallelDims::make(4, lit.dims.dp, lit.dims.tp, lit.dims.pp, lit.dims.ep);
    const int me = world()->rank();
    check_topology(dims, [&](GroupKind k) { return containing(lit.groups[static_cast<size_t>(k)], me); });
  }
}

TEST(Topology, AllShapesOfThisWorld) {
  // Every (tp, pp, ep) with tp * pp dividing the world size and ep dividing dp.
  const int n = world()->size();
  const int me = world()->rank();
  int shapes = 0;
  for (int tp = 1; tp <= n; ++tp) {
    for (int pp = 1; pp <= n; ++pp) {
      if (n % (tp * pp) != 0) continue;
      for (int ep = 1; ep <= n / (tp * pp); ++ep) {
        if ((n / (tp * pp)) % ep != 0) continue;
        const ParallelDims dims = ParallelDims::derive(n, tp, pp, ep);
        check_topology(dims, [&](GroupKind k) { return group_members(dims, k, me); });
        ++shapes;
      }
    }
  }
  EXPECT_EQ(shapes, n == 1 ? 1 : n == 2 ? 4 : 10) << "layouts of " << n << " ranks";
}

TEST(Topology, DescribeAndWrongWorld) {
  comm::GroupPtr w = world();
  const int n = w->size();
  Topology topo(w, ParallelDims::derive(n, 1, 1));
  const std::string d = topo.describe();
  EXPECT_NE(d.find("dp " + std::to_string(n) + " x tp 1 x pp 1"), std::string::npos) << d;
  EXPECT_NE(d.find("rank " + std::to_string(w->rank()) + ": dp " + std::to_string(w->rank()) + ", tp 0, pp 0"),
            std::string::npos)
      << d;
  try {
    Topology bad(w, ParallelDims::derive(n + 1, 1, 1));
    ADD_FAILURE() << "a layout of " << n + 1 << " ranks on " << n;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(n + 1) + " ranks but group 'world' has " +
                                         std::to_string(n)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace test_topology
}  // namespace zt::parallel
