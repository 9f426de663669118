// Collectives of zt::comm::Group on CPU tensors (the MPI backend), checked exactly.
// Every rank runs every test (tests/support/dist_main.cpp); `zerotrain launch -n N --
// zt_dist` runs them at N = 1, 2 and 4 (ctest: dist_np1, dist_np2, dist_np4).
//
// Inputs are rank-dependent and chosen so every value, every partial sum and every
// average is exactly representable in the dtype under test, so results compare with
// at::equal (no tolerance). A check that fails never skips a collective: every rank
// issues the same collectives in the same order whatever the results, so one wrong
// value fails a test instead of hanging the suite.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "support/comm_test_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::comm {
namespace test_collectives {
namespace {

using zt::test_support::same;
using zt::test_support::comm_error;

// A desynchronized test should fail in seconds, not hang for the default 600 s.
constexpr std::chrono::seconds kTestTimeout{60};

GroupPtr world() {
  GroupPtr g = world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(kTestTimeout);
  return g;
}

bool is_float16(at::ScalarType dt) { return dt == at::kBFloat16 || dt == at::kHalf; }

// base(i), as doubles: distinct along the tensor, and small enough that (r+1)*base(i)
// for r < 4, sums over up to 4 ranks (x10) and averages (x2.5) stay exact in `dt`.
// 16-bit floats: m * 2^e with m in 1..16 (bf16 has 8 mantissa bits: 16*10 = 160 < 256).
at::Tensor base(int64_t n, at::ScalarType dt, int64_t offset = 0) {
  at::Tensor i = at::arange(offset, offset + n, at::kLong);
  if (is_float16(dt)) {
    at::Tensor m = i.remainder(16) + 1;
    at::Tensor e = i.div(16, "floor").remainder(8);
    return (m * at::pow(2, e)).to(at::kDouble);
  }
  return (i + 1).to(at::kDouble);
}

// (r+1)*base(i) in dtype `dt`: rank r's input for element i.
at::Tensor rank_values(int r, int64_t n, at::ScalarType dt, int64_t offset = 0) {
  return (base(n, dt, offset) * (r + 1)).to(dt);
}

// sum over ranks 0..n-1 of (r+1) = n(n+1)/2.
double triangle(int n) { return n * (n + 1) / 2.0; }

// Expected result of reducing (r+1)*b over ranks 0..n-1 with `op`, in dtype `dt`.
at::Tensor reduced(const at::Tensor& b, int n, ReduceOp op, at::ScalarType dt) {
  switch (op) {
    case ReduceOp::kSum: return (b * triangle(n)).to(dt);
    case ReduceOp::kMax: return (b * n).to(dt);
    case ReduceOp::kMin: return b.to(dt);
    case ReduceOp::kAvg:
      // Integers average by floor division (the values are positive).
      if (!at::isFloatingType(dt)) return (b * triangle(n)).to(dt).div(n, "floor");
      return (b * (triangle(n) / n)).to(dt);
  }
  return {};
}

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

class Collectives : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    g_ = world();
    me_ = g_->rank();
    n_ = g_->size();
  }
  at::ScalarType dt() const { return GetParam(); }
  GroupPtr g_;
  int me_ = 0, n_ = 1;
};

TEST_P(Collectives, AllReduceEveryOp) {
  constexpr int64_t kN = 1001;  // divisible by neither 2 nor 4
  for (ReduceOp op : kOps) {
    SCOPED_TRACE(reduce_op_name(op));
    at::Tensor t = rank_values(me_, kN, dt());
    int64_t seq = g_->sequence();
    WorkPtr w = g_->all_reduce(t, op);
    ASSERT_NE(w, nullptr);
    EXPECT_TRUE(w->completed());  // async=false returns a finished work
    EXPECT_EQ(g_->sequence(), seq + 1);
    EXPECT_TRUE(same(t, reduced(base(kN, dt()), n_, op, dt())));
  }
}

TEST_P(Collectives, ReduceScatterOddTotal) {
  constexpr int64_t kShard = 7;  // total 7*n: odd at n = 1
  for (ReduceOp op : kOps) {
    SCOPED_TRACE(reduce_op_name(op));
    at::Tensor in = rank_values(me_, kShard * n_, dt());
    at::Tensor out = at::full({kShard}, -1, in.options());
    g_->reduce_scatter(out, in, op);
    EXPECT_TRUE(same(out, reduced(base(kShard, dt(), me_ * kShard), n_, op, dt())));
    EXPECT_TRUE(same(in, rank_values(me_, kShard * n_, dt()))) << "input must be left unchanged";
  }
}

TEST_P(Collectives, AllGather) {
  for (int64_t shard : {int64_t{7}, int64_t{1}, int64_t{1001}}) {
    SCOPED_TRACE(shard);
    // Rank r contributes (r+1)*base over its own slot of the output.
    at::Tensor in = rank_values(me_, shard, dt(), me_ * shard);
    at::Tensor out = at::full({shard * n_}, -1, in.options());
    g_->all_gather(out, in);
    std::vector<at::Tensor> parts;
    for (int r = 0; r < n_; ++r) parts.push_back(rank_values(r, shard, dt(), r * shard));
    EXPECT_TRUE(same(out, at::cat(parts)));
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  constexpr int64_t kN = 1001;
  for (int root = 0; root < n_; ++root) {
    SCOPED_TRACE(root);
    at::Tensor t = me_ == root ? rank_values(root, kN, dt()) : at::full({kN}, -1, at::TensorOptions(dt()));
    g_->broadcast(t, root);
    EXPECT_TRUE(same(t, rank_values(root, kN, dt())));
  }
}

// In place, as ZeRO uses them: the reduce_scatter output is this rank's slot of its
// input, the all_gather input is this rank's slot of its output.
TEST_P(Collectives, InPlaceReduceScatterAndAllGather) {
  constexpr int64_t kShard = 7;
  at::Tensor buf = rank_values(me_, kShard * n_, dt());
  at::Tensor slot = buf.narrow(0, me_ * kShard, kShard);
  g_->reduce_scatter(slot, buf, ReduceOp::kSum);
  EXPECT_TRUE(same(slot, reduced(base(kShard, dt(), me_ * kShard), n_, ReduceOp::kSum, dt())));

  at::Tensor full = at::full({kShard * n_}, -1, buf.options());
  at::Tensor mine = full.narrow(0, me_ * kShard, kShard);
  mine.copy_(rank_values(me_, kShard, dt(), me_ * kShard));
  g_->all_gather(full, mine);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n_; ++r) parts.push_back(rank_values(r, kShard, dt(), r * kShard));
  EXPECT_TRUE(same(full, at::cat(parts)));

  // Overlapping, but not this rank's slot: refused (MPI would read what it writes).
  if (n_ > 1) {
    at::Tensor wrong_slot = full.narrow(0, ((me_ + 1) % n_) * kShard, kShard);
    std::string m = comm_error([&] { g_->all_gather(full, wrong_slot); });
    EXPECT_NE(m.find("overlaps"), std::string::npos) << m;
  }
}

TEST_P(Collectives, AllToAll) {
  constexpr int64_t kChunk = 5;
  // Rank r sends (r+1)*base(p*c .. p*c+c) to rank p; so rank me receives
  // (p+1)*base(me*c ..) from each rank p, in rank order.
  at::Tensor in = rank_values(me_, kChunk * n_, dt());
  at::Tensor out = at::full({kChunk * n_}, -1, in.options());
  g_->all_to_all(out, in);
  std::vector<at::Tensor> parts;
  for (int p = 0; p < n_; ++p) parts.push_back(rank_values(p, kChunk, dt(), me_ * kChunk));
  EXPECT_TRUE(same(out, at::cat(parts)));
}

// Uneven splits: rank r sends count(r, p) = (r + 2p + 1) % 3 elements to rank p (some
// zero), valued 16r + 4p + i; rank me receives count(p, me) of 16p + 4me + i from each p,
// in rank order (Group::all_to_all_v; the MoE layer's exchange, [Sparse Dispatch]).
TEST_P(Collectives, AllToAllUnevenSplits) {
  auto count = [](int r, int p) -> int64_t { return (r + 2 * p + 1) % 3; };
  auto chunk = [&](int r, int p) { return (at::arange(count(r, p), at::kDouble) + 16 * r + 4 * p).to(dt()); };
  std::vector<at::Tensor> send, want;
  std::vector<int64_t> sc, rc;
  for (int p = 0; p < n_; ++p) {
    send.push_back(chunk(me_, p));
    sc.push_back(count(me_, p));
    want.push_back(chunk(p, me_));
    rc.push_back(count(p, me_));
  }
  at::Tensor in = at::cat(send), expect = at::cat(want);
  at::Tensor out = at::full({expect.numel()}, -1, in.options());
  const int64_t seq = g_->sequence();
  g_->all_to_all_v(out, in, sc, rc);
  EXPECT_EQ(g_->sequence(), seq + 1);
  EXPECT_TRUE(same(out, expect));
  // Counts that do not sum to the tensors' sizes are refused before anything is posted.
  std::vector<int64_t> bad = sc;
  bad[0] += 1;
  const std::string m = comm_error([&] { g_->all_to_all_v(out, in, bad, rc); });
  EXPECT_NE(m.find("all_to_all_v"), std::string::npos) << m;
  EXPECT_NE(m.find("sum to"), std::string::npos) << m;
  EXPECT_EQ(g_->sequence(), seq + 1);
}

// Several collectives in flight at once, waited out of order. MPI requires the same
// issue order on every rank (which holds), not the same wait order.
TEST_P(Collectives, AsyncInFlightTogether) {
  constexpr int64_t kN = 1001, kShard = 7;
  at::Tensor sum = rank_values(me_, kN, dt());
  at::Tensor avg = rank_values(me_, kN, dt());
  at::Tensor rs_in = rank_values(me_, kShard * n_, dt());
  at::Tensor rs_out = at::full({kShard}, -1, rs_in.options());
  at::Tensor ag_in = rank_values(me_, kShard, dt(), me_ * kShard);
  at::Tensor ag_out = at::full({kShard * n_}, -1, ag_in.options());
  at::Tensor bc = me_ == n_ - 1 ? rank_values(n_ - 1, kN, dt()) : at::full({kN}, -1, sum.options());

  int64_t seq = g_->sequence();
  std::vector<WorkPtr> works = {
      g_->all_reduce(sum, ReduceOp::kSum, /*async=*/true),
      g_->all_reduce(avg, ReduceOp::kAvg, /*async=*/true),
      g_->reduce_scatter(rs_out, rs_in, ReduceOp::kMax, /*async=*/true),
      g_->all_gather(ag_out, ag_in, /*async=*/true),
      g_->broadcast(bc, n_ - 1, /*async=*/true),
  };
  EXPECT_EQ(g_->sequence(), seq + 5);
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (auto& w : works) {
    EXPECT_TRUE(w->completed());
    w->wait();  // waiting twice is harmless
  }
  EXPECT_TRUE(same(sum, reduced(base(kN, dt()), n_, ReduceOp::kSum, dt())));
  EXPECT_TRUE(same(avg, reduced(base(kN, dt()), n_, ReduceOp::kAvg, dt())));
  EXPECT_TRUE(same(rs_out, reduced(base(kShard, dt(), me_ * kShard), n_, ReduceOp::kMax, dt())));
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n_; ++r) parts.push_back(rank_values(r, kShard, dt(), r * kShard));
  EXPECT_TRUE(same(ag_out, at::cat(parts)));
  EXPECT_TRUE(same(bc, rank_values(n_ - 1, kN, dt())));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Collectives, ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf, at::kLong),
                         [](const ::testing::TestParamInfo<at::ScalarType>& p) {
                           return std::string(c10::toString(p.param));
                         });

// A work dropped without waiting is completed by its destructor: the result is there
// and the buffers it used were not freed under MPI.
TEST(CollectivesAsync, DroppedWorkCompletes) {
  GroupPtr g = world();
  at::Tensor t = rank_values(g->rank(), 1001, at::kFloat);
  g->all_reduce(t, ReduceOp::kAvg, /*async=*/true).reset();
  EXPECT_TRUE(same(t, reduced(base(1001, at::kFloat), g->size(), ReduceOp::kAvg, at::kFloat)));

  // The caller drops its only reference to the input: the work keeps it alive.
  at::Tensor out = at::zeros({3 * g->size()}, at::kLong);
  WorkPtr w;
  {
    at::Tensor in = at::full({3}, g->rank() + 1, at::kLong);
    w = g->all_gather(out, in, /*async=*/true);
  }
  w->wait();
  EXPECT_TRUE(same(out, (at::arange(g->size(), at::kLong) + 1).repeat_interleave(3)));
}

// completed() never blocks, and turns true once every rank has joined.
TEST(CollectivesAsync, CompletedPollsWithoutBlocking) {
  GroupPtr g = world();
  at::Tensor t = at::full({16}, g->rank() + 1, at::kLong);
  if (g->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto start = std::chrono::steady_clock::now();
  WorkPtr w = g->all_reduce(t, ReduceOp::kSum, /*async=*/true);
  while (!w->completed()) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  w->synchronize();
  EXPECT_TRUE(same(t, at::full({16}, static_cast<int64_t>(triangle(g->size())), at::kLong)));
}

// Nobody leaves a barrier before the last rank has entered it.
TEST(Barrier, WaitsForTheLastRank) {
  GroupPtr g = world();
  g->barrier();
  constexpr auto kDelay = std::chrono::milliseconds(400);
  auto start = std::chrono::steady_clock::now();
  if (g->rank() == g->size() - 1) std::this_thread::sleep_for(kDelay);
  g->barrier();
  auto waited = std::chrono::steady_clock::now() - start;
  // Every rank waited (about) as long as the late one slept; 100 ms of slack for clocks.
  EXPECT_GE(waited, kDelay - std::chrono::milliseconds(100));
}

TEST(Split, EvenAndOddRanks) {
  GroupPtr g = world();
  const int me = g->rank(), n = g->size();
  GroupPtr sub = g->split(me % 2, me);
  ASSERT_NE(sub, nullptr);                   // every rank gets a group (same on all ranks)
  const int members = (n - me % 2 + 1) / 2;  // ranks of my parity below n
  EXPECT_EQ(sub->size(), members);
  EXPECT_EQ(sub->rank(), me / 2);
  EXPECT_EQ(sub->name(), "world/" + std::to_string(me % 2));

  // all_reduce of (world rank + 1) over my parity class.
  at::Tensor t = at::full({1001}, me + 1, at::kLong);
  sub->all_reduce(t, ReduceOp::kSum);
  int64_t expect = 0;
  for (int r = me % 2; r < n; r += 2) expect += r + 1;
  EXPECT_TRUE(same(t, at::full({1001}, expect, at::kLong)));

  // all_gather of world ranks: the sub-group is ordered by key (= world rank).
  at::Tensor out = at::full({2 * members}, -1, at::kFloat);
  sub->all_gather(out, at::full({2}, me, at::kFloat));
  at::Tensor want = (at::arange(members, at::kFloat) * 2 + me % 2).repeat_interleave(2);
  EXPECT_TRUE(same(out, want));

  // reduce_scatter inside the sub-group, bf16.
  at::Tensor rs_in = rank_values(me, 7 * members, at::kBFloat16);
  at::Tensor rs_out = at::empty({7}, rs_in.options());
  sub->reduce_scatter(rs_out, rs_in, ReduceOp::kSum);
  double factor = 0;
  for (int r = me % 2; r < n; r += 2) factor += r + 1;
  EXPECT_TRUE(same(rs_out, (base(7, at::kBFloat16, sub->rank() * 7) * factor).to(at::kBFloat16)));

  // The parent still works alongside its sub-group.
  at::Tensor w = at::ones({3}, at::kLong);
  g->all_reduce(w, ReduceOp::kSum);
  EXPECT_TRUE(same(w, at::full({3}, n, at::kLong)));
}

TEST(Split, KeyOrdersRanks) {
  GroupPtr g = world();
  const int me = g->rank(), n = g->size();
  GroupPtr rev = g->split(0, n - me);  // reversed order
  ASSERT_NE(rev, nullptr);
  EXPECT_EQ(rev->rank(), n - 1 - me);
  at::Tensor out = at::full({n}, -1, at::kLong);
  rev->all_gather(out, at::full({1}, me, at::kLong));
  EXPECT_TRUE(same(out, at::arange(n - 1, -1, -1, at::kLong)));
  // Broadcast from sub-group root 0 = the last world rank.
  at::Tensor b = at::full({5}, me, at::kFloat);
  rev->broadcast(b, 0);
  EXPECT_TRUE(same(b, at::full({5}, n - 1, at::kFloat)));
}

TEST(Split, OnlyRankZero) {
  GroupPtr g = world();
  GroupPtr solo = g->split(g->rank() == 0 ? 0 : -1, 0);
  if (g->rank() != 0) {
    EXPECT_EQ(solo, nullptr) << "a rank passing color < 0 must get no group";
  } else {
    ASSERT_NE(solo, nullptr);
    EXPECT_EQ(solo->size(), 1);
    EXPECT_EQ(solo->rank(), 0);
    at::Tensor t = rank_values(0, 1001, at::kHalf);
    solo->all_reduce(t, ReduceOp::kSum);
    EXPECT_TRUE(same(t, rank_values(0, 1001, at::kHalf)));
    at::Tensor out = at::empty({7}, at::kFloat);
    solo->all_gather(out, at::arange(7, at::kFloat));
    EXPECT_TRUE(same(out, at::arange(7, at::kFloat)));
    solo->barrier();
  }
  // World collectives still line up after a split that left ranks out.
  at::Tensor t = at::full({4}, 1.0, at::kFloat);
  g->all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(same(t, at::full({4}, static_cast<double>(g->size()), at::kFloat)));
}

TEST(Split, NestedAndTimeoutInherited) {
  GroupPtr g = world();
  const auto saved = g->timeout();
  g->set_timeout(std::chrono::milliseconds(45000));
  GroupPtr all = g->split(7, g->rank());
  g->set_timeout(saved);
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->timeout(), std::chrono::milliseconds(45000)) << "a sub-group starts with its parent's timeout";
  EXPECT_EQ(all->size(), g->size());
  GroupPtr inner = all->split(0, 0);  // equal keys: ordered by rank
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(inner->rank(), g->rank());
  EXPECT_EQ(inner->name(), "world/7/0");
  at::Tensor t = at::full({3}, g->rank(), at::kLong);
  inner->all_reduce(t, ReduceOp::kMax);
  EXPECT_TRUE(same(t, at::full({3}, g->size() - 1, at::kLong)));
}

// Misuse is reported as CommError before anything is sent, the same way on every rank,
// so the group stays usable and in step.
TEST(Errors, MismatchedSizesAndBadArguments) {
  GroupPtr g = world();
  const int n = g->size();
  const int64_t seq = g->sequence();
  std::string m;

  at::Tensor out = at::empty({7}, at::kFloat);
  at::Tensor bad_in = at::empty({7 * n + 1}, at::kFloat);
  m = comm_error([&] { g->reduce_scatter(out, bad_in); });
  EXPECT_NE(m.find("reduce_scatter"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(7 * n + 1)), std::string::npos) << "names the wrong size: " << m;

  at::Tensor bad_out = at::empty({7 * n + 3}, at::kFloat);
  m = comm_error([&] { g->all_gather(bad_out, out); });
  EXPECT_NE(m.find("all_gather"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(7 * n + 3)), std::string::npos) << m;

  at::Tensor a2a_in = at::empty({4 * n}, at::kFloat), a2a_out = at::empty({4 * n + 1}, at::kFloat);
  m = comm_error([&] { g->all_to_all(a2a_out, a2a_in); });
  EXPECT_NE(m.find("all_to_all"), std::string::npos) << m;

  at::Tensor t = at::zeros({4}, at::kFloat);
  m = comm_error([&] { g->broadcast(t, n); });
  EXPECT_NE(m.find("root " + std::to_string(n)), std::string::npos) << m;
  m = comm_error([&] { g->broadcast(t, -1); });
  EXPECT_NE(m.find("root -1"), std::string::npos) << m;

  at::Tensor gather_out = at::empty({2 * n}, at::kFloat);
  m = comm_error([&] { g->all_gather(gather_out, at::empty({2}, at::kDouble)); });
  EXPECT_NE(m.find("dtype"), std::string::npos) << m;

  at::Tensor strided = at::zeros({8, 8}, at::kFloat).t();
  m = comm_error([&] { g->all_reduce(strided); });
  EXPECT_NE(m.find("contiguous"), std::string::npos) << m;

  at::Tensor undefined;
  m = comm_error([&] { g->all_reduce(undefined); });
  EXPECT_NE(m.find("defined"), std::string::npos) << m;

  at::Tensor complex = at::zeros({4}, at::kComplexFloat);
  m = comm_error([&] { g->all_reduce(complex); });
  EXPECT_NE(m.find("not supported"), std::string::npos) << m;

  at::Tensor flags = at::zeros({4}, at::kBool);
  m = comm_error([&] { g->all_reduce(flags, ReduceOp::kSum); });
  EXPECT_NE(m.find("bool"), std::string::npos) << m;

  // MPI counts are int: a larger tensor must be refused, not silently truncated. The
  // tensor is never read (the check comes first), so it can point at a small buffer.
  std::vector<uint8_t> small(16);
  at::Tensor huge = at::from_blob(small.data(), {(int64_t{1} << 31) + 1}, at::kByte);
  m = comm_error([&] { g->all_reduce(huge, ReduceOp::kMax); });
  EXPECT_NE(m.find("2147483649"), std::string::npos) << m;

  EXPECT_EQ(g->sequence(), seq) << "a refused call must not count as issued";

  // Still usable and in step.
  at::Tensor ok = at::full({3}, g->rank() + 1, at::kLong);
  g->all_reduce(ok, ReduceOp::kMax);
  EXPECT_TRUE(same(ok, at::full({3}, n, at::kLong)));
}

TEST(RankInfo, MatchesTheWorldGroup) {
  GroupPtr g = world();
  RankInfo info = discover_rank();
  EXPECT_EQ(info.rank, g->rank());
  EXPECT_EQ(info.world_size, g->size());
  if (std::getenv("ZT_LAUNCHER") != nullptr) {
    EXPECT_EQ(info.source, "zerotrain");
    EXPECT_EQ(info.local_rank, g->rank());  // one node
    EXPECT_EQ(info.local_world_size, g->size());
  }
}

}  // namespace
}  // namespace test_collectives
}  // namespace zt::comm
