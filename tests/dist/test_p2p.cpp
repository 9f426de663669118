// Point-to-point messages of zt::comm::Group on CPU tensors (the MPI backend), checked
// exactly; see [P2P Rules] in include/zerotrain/comm.h. Run at 1, 2 and 4 ranks by ctest
// (dist_np1, dist_np2, dist_np4); a test that needs more ranks, or an even number, says
// so and skips on every rank alike. A peer that never joins (a timeout) is tested with
// separate processes: tests/progs/missing_peer.cpp, modes p2p-recv and p2p-batch, from
// tests/unit/test_launch.cpp.
//
// Payloads are a function of (sender, receiver, message index) and exact in every dtype,
// so a message delivered to the wrong recv, out of order, or partially fails at.equal.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "support/comm_test_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::comm {
namespace test_p2p {
namespace {

using zt::test_support::same;
using zt::test_support::comm_error;
using zt::test_support::payload;

constexpr std::chrono::seconds kTestTimeout{60};

GroupPtr world() {
  GroupPtr g = world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(kTestTimeout);
  return g;
}

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

class P2PRing : public ::testing::TestWithParam<at::ScalarType> {};

// Every rank sends to the next and receives from the previous, in one batch (at 1 rank
// the ring is a send to oneself, which a batch allows).
TEST_P(P2PRing, BatchedRingPass) {
  GroupPtr g = world();
  const int me = g->rank(), n = g->size(), next = (me + 1) % n, prev = (me + n - 1) % n;
  const at::ScalarType dt = GetParam();
  for (int64_t len : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{1} << 17}) {  // 2^17: past the eager limit
    SCOPED_TRACE(len);
    const P2PCount before_next = g->p2p_count(next), before_prev = g->p2p_count(prev);
    const int64_t seq = g->sequence();
    at::Tensor out = payload(me, next, 0, len, dt);
    at::Tensor in = at::full({len}, 7, at::TensorOptions(dt));
    WorkPtr w = g->batch_isend_irecv({irecv(in, prev), isend(out, next)});
    w->wait();
    EXPECT_TRUE(w->completed());
    EXPECT_TRUE(same(in, payload(prev, me, 0, len, dt)));
    EXPECT_TRUE(same(out, payload(me, next, 0, len, dt))) << "a send leaves its tensor unchanged";
    EXPECT_EQ(g->p2p_count(next).sent, before_next.sent + 1);
    EXPECT_EQ(g->p2p_count(prev).received, before_prev.received + 1);
    EXPECT_EQ(g->sequence(), seq) << "sequence() counts collectives only";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, P2PRing, ::testing::Values(at::kFloat, at::kBFloat16, at::kLong, at::kBool),
                         [](const ::testing::TestParamInfo<at::ScalarType>& p) {
                           return std::string(c10::toString(p.param));
                         });

// The same ring with blocking send/recv: even ranks send first, odd ranks receive first.
// Odd ranks receive late (after a sleep), so a large send really waits for its peer.
TEST(P2P, BlockingRingPass) {
  GroupPtr g = world();
  const int me = g->rank(), n = g->size(), next = (me + 1) % n, prev = (me + n - 1) % n;
  if (n < 2 || n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks >= 2 (world " << n << ")";
  constexpr int64_t kN = int64_t{1} << 17;
  at::Tensor out = payload(me, next, 0, kN, at::kFloat);
  at::Tensor in = at::zeros({kN}, at::kFloat);
  if (me % 2 == 0) {
    WorkPtr w = g->send(out, next);
    EXPECT_TRUE(w->completed()) << "a blocking send returns a finished work";
    g->recv(in, prev);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    g->recv(in, prev);
    g->send(out, next);
  }
  EXPECT_TRUE(same(in, payload(prev, me, 0, kN, at::kFloat)));
}

// Pairs (0,1), (2,3): each sends its tensor to its partner and receives the partner's,
// batched, then blocking (lower rank sends first), then two rounds in one batch.
TEST(P2P, PairwiseExchange) {
  GroupPtr g = world();
  const int me = g->rank(), n = g->size(), peer = me ^ 1;
  if (n % 2 != 0) GTEST_SKIP() << "pairs need an even number of ranks (world " << n << ")";
  for (at::ScalarType dt : {at::kHalf, at::kDouble, at::kChar}) {
    SCOPED_TRACE(c10::toString(dt));
    at::Tensor mine = payload(me, peer, 0, 333, dt), theirs = at::empty({333}, mine.options());
    g->batch_isend_irecv({isend(mine, peer), irecv(theirs, peer)})->wait();
    EXPECT_TRUE(same(theirs, payload(peer, me, 0, 333, dt)));

    at::Tensor again = at::empty({333}, mine.options());
    if (me < peer) {
      g->send(mine, peer);
      g->recv(again, peer);
    } else {
      g->recv(again, peer);
      g->send(mine, peer);
    }
    EXPECT_TRUE(same(again, payload(peer, me, 0, 333, dt)));
  }
  // Two messages each way in one batch: they match in issue order.
  at::Tensor a = payload(me, peer, 0, 50, at::kInt), b = payload(me, peer, 1, 70, at::kInt);
  at::Tensor ra = at::empty({50}, at::kInt), rb = at::empty({70}, at::kInt);
  g->batch_isend_irecv({irecv(ra, peer), isend(a, peer), irecv(rb, peer), isend(b, peer)})->wait();
  EXPECT_TRUE(same(ra, payload(peer, me, 0, 50, at::kInt)));
  EXPECT_TRUE(same(rb, payload(peer, me, 1, 70, at::kInt)));
}

// Dozens of messages in flight at once: every rank sends kinds.size() messages of
// different sizes and dtypes to every rank (itself included), split over two batches in
// flight together and waited in reverse order. The first batch lists its ops by message,
// sends before receives; the second by peer in reverse, receives first; the receivers
// visit peers in another order than the senders. Messages of one pair still match in
// issue order ([P2P Rules]).
TEST(P2P, ManyMessagesInFlight) {
  GroupPtr g = world();
  const int me = g->rank(), n = g->size();
  const std::vector<std::pair<int64_t, at::ScalarType>> kinds = {
      {1, at::kFloat}, {4097, at::kBFloat16}, {0, at::kLong}, {70000, at::kFloat},
      {17, at::kChar}, {1000, at::kHalf},     {3, at::kBool}, {5000, at::kDouble},
  };
  const int kPerPeer = static_cast<int>(kinds.size()), kHalfway = kPerPeer / 2;
  auto at_ = [&](int peer, int m) { return static_cast<size_t>(peer * kPerPeer + m); };
  std::vector<at::Tensor> sent(n * kPerPeer), got(n * kPerPeer);
  for (int k = 0; k < n; ++k) {
    for (int m = 0; m < kPerPeer; ++m) {
      sent[at_(k, m)] = payload(me, k, m, kinds[m].first, kinds[m].second);
      got[at_(k, m)] = at::full({kinds[m].first}, 1, at::TensorOptions(kinds[m].second));
    }
  }
  std::vector<P2POp> first, second;
  for (int m = 0; m < kHalfway; ++m) {
    for (int k = 0; k < n; ++k) first.push_back(isend(sent[at_(k, m)], k));
    for (int k = n - 1; k >= 0; --k) first.push_back(irecv(got[at_(k, m)], k));
  }
  for (int k = n - 1; k >= 0; --k) {
    for (int m = kHalfway; m < kPerPeer; ++m) second.push_back(irecv(got[at_((me + k) % n, m)], (me + k) % n));
    for (int m = kHalfway; m < kPerPeer; ++m) second.push_back(isend(sent[at_(k, m)], k));
  }
  EXPECT_GE(first.size() + second.size(), size_t{16});
  const P2PCount before = g->p2p_count(me);
  WorkPtr w1 = g->batch_isend_irecv(first);
  WorkPtr w2 = g->batch_isend_irecv(second);
  w2->wait();
  w1->wait();
  for (int from = 0; from < n; ++from) {
    for (int m = 0; m < kPerPeer; ++m) {
      SCOPED_TRACE("from " + std::to_string(from) + ", message " + std::to_string(m));
      EXPECT_TRUE(same(got[at_(from, m)], payload(from, me, m, kinds[m].first, kinds[m].second)));
    }
  }
  EXPECT_EQ(g->p2p_count(me).sent, before.sent + kPerPeer);
  EXPECT_EQ(g->p2p_count(me).received, before.received + kPerPeer);
}

// A batch dropped without waiting completes in its destructor (the buffers stay valid).
TEST(P2P, DroppedBatchCompletes) {
  GroupPtr g = world();
  const int me = g->rank(), n = g->size(), next = (me + 1) % n, prev = (me + n - 1) % n;
  at::Tensor in = at::zeros({2049}, at::kFloat);
  {
    at::Tensor out = payload(me, next, 0, 2049, at::kFloat);
    g->batch_isend_irecv({isend(out, next), irecv(in, prev)}).reset();
  }
  EXPECT_TRUE(same(in, payload(prev, me, 0, 2049, at::kFloat)));
}

// A send and its recv that disagree on size or dtype: the receiver gets a CommError
// naming both sides (not MPI_ERR_TRUNCATE, not a partial buffer); the sender completes;
// the group stays usable and in step. Rank 0 sends, rank 1 receives, the rest wait.
TEST(P2P, SizeAndDtypeMismatchNamed) {
  GroupPtr g = world();
  const int me = g->rank();
  if (g->size() < 2) GTEST_SKIP() << "needs 2 ranks (world " << g->size() << ")";
  struct Case {
    const char* name;
    int64_t send_n;
    at::ScalarType send_dt;
    int64_t recv_n;
    at::ScalarType recv_dt;
    const char* expect;  // in the message: the sender's side
  };
  const std::vector<Case> cases = {
      {"shorter send", 10, at::kFloat, 12, at::kFloat, "10 x Float"},
      {"longer send (truncation)", 1001, at::kFloat, 7, at::kFloat, "1001 x Float"},
      {"longer send past the eager limit", 200000, at::kFloat, 10, at::kFloat, "200000 x Float"},
      {"same bytes, other dtype", 8, at::kFloat, 8, at::kInt, "8 x Float"},
      {"same count, other width", 16, at::kHalf, 16, at::kFloat, "16 x Half"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (me == 0) {
      g->send(payload(0, 1, 0, c.send_n, c.send_dt), 1);
    } else if (me == 1) {
      const int64_t k = g->p2p_count(0).received;
      at::Tensor buf = at::zeros({c.recv_n}, at::TensorOptions(c.recv_dt));
      std::string m = comm_error([&] { g->recv(buf, 0); });
      EXPECT_TRUE(has(m, "recv #" + std::to_string(k) + " from peer 0")) << m;
      EXPECT_TRUE(has(m, "rank 1 of group 'world'")) << m;
      EXPECT_TRUE(has(m, c.expect)) << "names the sender's side: " << m;
      EXPECT_TRUE(has(m, std::to_string(c.recv_n) + " x " + c10::toString(c.recv_dt))) << "and this side: " << m;
      EXPECT_FALSE(has(m, "TRUNCATE") || has(m, "truncated")) << m;
    }
    g->barrier();
  }
  // The mismatch of one op of a batch: the other ops complete, wait() throws.
  if (me == 0) {
    g->batch_isend_irecv({isend(payload(0, 1, 0, 5, at::kLong), 1), isend(payload(0, 1, 1, 9, at::kLong), 1)})->wait();
  } else if (me == 1) {
    at::Tensor a = at::zeros({6}, at::kLong), b = at::zeros({9}, at::kLong);
    WorkPtr w = g->batch_isend_irecv({irecv(a, 0), irecv(b, 0)});
    std::string m = comm_error([&] { w->wait(); });
    EXPECT_TRUE(has(m, "5 x Long")) << m;
    EXPECT_TRUE(w->completed());
    EXPECT_TRUE(same(b, payload(0, 1, 1, 9, at::kLong))) << "the matching op of the batch completed";
  }
  at::Tensor ok = at::full({3}, me + 1, at::kLong);
  g->all_reduce(ok, ReduceOp::kMax);
  EXPECT_TRUE(same(ok, at::full({3}, g->size(), at::kLong)));
  // Point-to-point still works after the mismatches.
  const int next = (me + 1) % g->size(), prev = (me + g->size() - 1) % g->size();
  at::Tensor in = at::zeros({11}, at::kFloat);
  g->batch_isend_irecv({isend(payload(me, next, 2, 11, at::kFloat), next), irecv(in, prev)})->wait();
  EXPECT_TRUE(same(in, payload(prev, me, 2, 11, at::kFloat)));
}

// Misuse is a CommError before anything is sent or counted, the same on every rank.
TEST(P2P, BadArgumentsNamed) {
  GroupPtr g = world();
  const int me = g->rank(), n = g->size();
  const P2PCount before = g->p2p_count(0);
  at::Tensor t = at::zeros({8}, at::kFloat);
  std::string m;

  m = comm_error([&] { g->send(t, n); });
  EXPECT_TRUE(has(m, "send: peer " + std::to_string(n) + " is not a rank of group 'world'")) << m;
  m = comm_error([&] { g->recv(t, -1); });
  EXPECT_TRUE(has(m, "recv: peer -1")) << m;
  m = comm_error([&] { g->batch_isend_irecv({isend(t, 0), irecv(at::zeros({8}), n + 3)}); });
  EXPECT_TRUE(has(m, "op 1 (irecv): peer " + std::to_string(n + 3))) << m;

  at::Tensor strided = at::zeros({8, 8}, at::kFloat).t();
  m = comm_error([&] { g->batch_isend_irecv({isend(strided, (me + 1) % n)}); });
  EXPECT_TRUE(has(m, "contiguous")) << m;
  at::Tensor undefined;
  m = comm_error([&] { g->batch_isend_irecv({irecv(undefined, (me + 1) % n)}); });
  EXPECT_TRUE(has(m, "defined")) << m;

  m = comm_error([&] { g->send(t, me); });
  EXPECT_TRUE(has(m, "itself")) << m;
  EXPECT_TRUE(has(m, "batch_isend_irecv")) << "says how to send to oneself: " << m;
  m = comm_error([&] { g->recv(t, me); });
  EXPECT_TRUE(has(m, "itself")) << m;

  at::Tensor complex = at::zeros({4}, at::kComplexDouble);  // 16-byte elements
  m = comm_error([&] { g->batch_isend_irecv({isend(complex, 0)}); });
  EXPECT_TRUE(has(m, "not supported")) << m;

  at::Tensor buf = at::zeros({16}, at::kFloat);
  m = comm_error([&] { g->batch_isend_irecv({irecv(buf.narrow(0, 0, 8), 0), irecv(buf.narrow(0, 4, 8), 0)}); });
  EXPECT_TRUE(has(m, "overlaps the buffer of op 1")) << m;
  m = comm_error([&] { g->batch_isend_irecv({isend(buf.narrow(0, 0, 8), 0), irecv(buf.narrow(0, 4, 8), 0)}); });
  EXPECT_TRUE(has(m, "overlaps")) << m;

  m = comm_error([&] { g->p2p_count(n); });
  EXPECT_TRUE(has(m, "p2p_count")) << m;

  const P2PCount after = g->p2p_count(0);
  EXPECT_EQ(after.sent, before.sent) << "a refused call must not count";
  EXPECT_EQ(after.received, before.received);

  // An empty batch is a finished work; sends from the same buffer may overlap.
  EXPECT_TRUE(g->batch_isend_irecv({})->completed());
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  at::Tensor x = payload(me, next, 0, 10, at::kFloat), r1 = at::zeros({10}), r2 = at::zeros({10});
  g->batch_isend_irecv({isend(x, next), isend(x, next), irecv(r1, prev), irecv(r2, prev)})->wait();
  EXPECT_TRUE(same(r1, payload(prev, me, 0, 10, at::kFloat)));
  EXPECT_TRUE(same(r2, payload(prev, me, 0, 10, at::kFloat)));
}

}  // namespace
}  // namespace test_p2p
}  // namespace zt::comm
