// Collectives of zt::comm::Group on CUDA tensors (the NCCL backend), checked exactly,
// plus the [Stream Rules] of include/zerotrain/comm.h. Rank r uses cuda:LOCAL_RANK.
//
//   zerotrain launch -n 2 -- build/zt_gpu
//
// Without a GPU (or with fewer GPUs than local ranks) every test is skipped. Inputs are
// chosen as in tests/dist/test_collectives.cpp: every value, partial sum and average is
// exact in the dtype, so results compare with at::equal. The one exception is stated
// where it applies (NCCL averages floats by pre-multiplying with 1/n, exact only when n
// is a power of two). Every rank issues the same collectives whatever the results, so
// a wrong value fails a test instead of hanging the suite.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "support/comm_test_util.h"
#include "zerotrain/comm.h"
#include "support/gpu_util.h"
#include "zerotrain/error.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt::comm {
namespace test_nccl_collectives {
namespace {

using zt::test_support::same;
using zt::test_support::comm_error;

#ifndef ZT_WITH_CUDA
TEST(Nccl, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA/NCCL (ZT_WITH_CUDA off)"; }
#else

using zt::test_support::nccl_skip_reason;

constexpr std::chrono::seconds kTestTimeout{60};

bool is_float16(at::ScalarType dt) { return dt == at::kBFloat16 || dt == at::kHalf; }

// See tests/dist/test_collectives.cpp: exact in every dtype for up to 4 ranks.
at::Tensor base(int64_t n, at::ScalarType dt, int64_t offset = 0) {
  at::Tensor i = at::arange(offset, offset + n, at::kLong);
  if (is_float16(dt)) return ((i.remainder(16) + 1) * at::pow(2, i.div(16, "floor").remainder(8))).to(at::kDouble);
  return (i + 1).to(at::kDouble);
}
double triangle(int n) { return n * (n + 1) / 2.0; }
bool power_of_two(int n) { return (n & (n - 1)) == 0; }

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = nccl_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    g_ = world_group();
    if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g_->set_timeout(kTestTimeout);
    me_ = g_->rank();
    n_ = g_->size();
    dev_ = zt::test_support::rank_device();
  }
  at::TensorOptions on(at::ScalarType dt) const { return at::TensorOptions(dt).device(dev_); }
  at::Tensor cuda_values(int r, int64_t n, at::ScalarType dt, int64_t offset = 0) const {
    return (base(n, dt, offset) * (r + 1)).to(on(dt));
  }
  // Expected reduction of (r+1)*b over all ranks, on the CPU.
  at::Tensor reduced(const at::Tensor& b, ReduceOp op, at::ScalarType dt) const {
    switch (op) {
      case ReduceOp::kSum: return (b * triangle(n_)).to(dt);
      case ReduceOp::kMax: return (b * n_).to(dt);
      case ReduceOp::kMin: return b.to(dt);
      case ReduceOp::kAvg:
        if (!at::isFloatingType(dt)) return (b * triangle(n_)).to(dt).div(n_, "floor");
        return (b * (triangle(n_) / n_)).to(dt);
    }
    return {};
  }
  GroupPtr g_;
  int me_ = 0, n_ = 1;
  at::Device dev_{at::kCUDA, 0};
};

const at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16, at::kHalf, at::kLong};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

TEST_F(Nccl, AllReduceEveryOpAndDtype) {
  constexpr int64_t kN = 1001;
  for (at::ScalarType dt : kDtypes) {
    for (ReduceOp op : kOps) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " " + reduce_op_name(op));
      at::Tensor t = cuda_values(me_, kN, dt);
      int64_t seq = g_->sequence();
      g_->all_reduce(t, op);
      EXPECT_EQ(g_->sequence(), seq + 1) << "CUDA collectives count too";
      at::Tensor want = reduced(base(kN, dt), op, dt);
      if (op == ReduceOp::kAvg && at::isFloatingType(dt) && !power_of_two(n_)) {
        // NCCL averages floats as sum(x * (1/n)): one rounding of 1/n per element.
        EXPECT_TRUE(at::allclose(t.cpu().to(at::kDouble), want.to(at::kDouble), 1e-2, 0)) << "tolerance 1e-2";
      } else {
        EXPECT_TRUE(same(t, want));
      }
    }
  }
}

TEST_F(Nccl, ReduceScatterAllGatherBroadcastAllToAll) {
  constexpr int64_t kShard = 7, kChunk = 5, kN = 1001;
  for (at::ScalarType dt : kDtypes) {
    SCOPED_TRACE(c10::toString(dt));
    // reduce_scatter: 7 per rank.
    at::Tensor in = cuda_values(me_, kShard * n_, dt);
    at::Tensor out = at::full({kShard}, -1, on(dt));
    g_->reduce_scatter(out, in, ReduceOp::kSum);
    EXPECT_TRUE(same(out, reduced(base(kShard, dt, me_ * kShard), ReduceOp::kSum, dt)));
    g_->reduce_scatter(out, in, ReduceOp::kMax);
    EXPECT_TRUE(same(out, reduced(base(kShard, dt, me_ * kShard), ReduceOp::kMax, dt)));

    // all_gather: rank r fills slot r.
    at::Tensor mine = cuda_values(me_, kShard, dt, me_ * kShard);
    at::Tensor all = at::full({kShard * n_}, -1, on(dt));
    g_->all_gather(all, mine);
    std::vector<at::Tensor> parts;
    for (int r = 0; r < n_; ++r) parts.push_back((base(kShard, dt, r * kShard) * (r + 1)).to(dt));
    EXPECT_TRUE(same(all, at::cat(parts)));

    // broadcast from each root.
    for (int root = 0; root < n_; ++root) {
      at::Tensor t = me_ == root ? cuda_values(root, kN, dt) : at::full({kN}, -1, on(dt));
      g_->broadcast(t, root);
      EXPECT_TRUE(same(t, (base(kN, dt) * (root + 1)).to(dt))) << "root " << root;
    }

    // all_to_all: rank p receives (r+1)*base(p*c..) from each rank r.
    at::Tensor a2a_in = cuda_values(me_, kChunk * n_, dt);
    at::Tensor a2a_out = at::full({kChunk * n_}, -1, on(dt));
    g_->all_to_all(a2a_out, a2a_in);
    parts.clear();
    for (int r = 0; r < n_; ++r) parts.push_back((base(kChunk, dt, me_ * kChunk) * (r + 1)).to(dt));
    EXPECT_TRUE(same(a2a_out, at::cat(parts)));

    // all_to_all_v: rank r sends count(r, p) = (r + 2p + 1) % 3 elements (some zero) valued
    // 16r + 4p + i to rank p.
    auto count = [](int r, int p) -> int64_t { return (r + 2 * p + 1) % 3; };
    auto chunk = [&](int r, int p) { return (at::arange(count(r, p), at::kDouble) + 16 * r + 4 * p).to(dt); };
    std::vector<at::Tensor> send, want;
    std::vector<int64_t> sc, rc;
    for (int p = 0; p < n_; ++p) {
      send.push_back(chunk(me_, p));
      sc.push_back(count(me_, p));
      want.push_back(chunk(p, me_));
      rc.push_back(count(p, me_));
    }
    at::Tensor v_in = at::cat(send).to(dev_), v_want = at::cat(want);
    at::Tensor v_out = at::full({v_want.numel()}, -1, on(dt));
    g_->all_to_all_v(v_out, v_in, sc, rc);
    EXPECT_TRUE(same(v_out, v_want));
  }
}

// [Stream Rules]: the collective runs after work already queued on the caller's current
// stream, and Work::wait() orders later work on the current stream after it. Here the
// input is produced by a kernel queued behind a ~50 ms spin on a non-default current
// stream; if the comm stream did not wait for it, NCCL would read the -1 placeholder.
TEST_F(Nccl, AsyncOrderedAfterProducerOnCurrentStream) {
  constexpr int64_t kN = 1 << 18;  // sums of (r+1)*(i+1) stay exact in fp32 up to 10 ranks
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, dev_.index());
  c10::cuda::CUDAStreamGuard guard(side);
  at::Tensor src = cuda_values(me_, kN, at::kFloat);
  at::Tensor t = at::full({kN}, -1, on(at::kFloat));
  at::Tensor t2 = at::full({kN}, -1, on(at::kFloat));
  side.synchronize();

  at::cuda::sleep(int64_t{100} * 1000 * 1000);  // ~50 ms at ~2 GHz, on `side`
  t.copy_(src);                                 // the producer kernel, behind the spin
  t2.copy_(src);
  WorkPtr w1 = g_->all_reduce(t, ReduceOp::kSum, /*async=*/true);
  WorkPtr w2 = g_->all_reduce(t2, ReduceOp::kMax, /*async=*/true);
  EXPECT_FALSE(w1->completed()) << "the host must not have waited for the spin";
  w2->wait();
  w1->wait();
  at::Tensor sum = t * 1;  // consumers on the current stream, after wait()
  at::Tensor max = t2 * 1;
  EXPECT_TRUE(same(sum, reduced(base(kN, at::kFloat), ReduceOp::kSum, at::kFloat)));
  EXPECT_TRUE(same(max, reduced(base(kN, at::kFloat), ReduceOp::kMax, at::kFloat)));
  w1->synchronize();
  EXPECT_TRUE(w1->completed());
}

// Work::wait() blocks the *stream*, not the host: the last rank joins 300 ms late, the
// others' wait() returns at once, and a copy queued after it still sees the result.
TEST_F(Nccl, WaitOrdersTheCurrentStreamWithoutBlockingTheHost) {
  constexpr int64_t kN = 4096;
  at::Tensor warm = at::ones({1}, on(at::kFloat));
  g_->all_reduce(warm);  // the communicator exists before the timed part
  at::Tensor t = cuda_values(me_, kN, at::kLong);
  g_->barrier();
  if (me_ == n_ - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto start = std::chrono::steady_clock::now();
  WorkPtr w = g_->all_reduce(t, ReduceOp::kSum, /*async=*/true);
  w->wait();
  auto host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (me_ != n_ - 1 && n_ > 1) EXPECT_LT(host_ms, 150.0) << "wait() must not block the host";
  EXPECT_TRUE(same(t, reduced(base(kN, at::kLong), ReduceOp::kSum, at::kLong)));
  w->synchronize();
  EXPECT_TRUE(w->completed());
}

// Inputs handed to an async collective stay alive even if the caller drops them: the
// allocator must not hand their memory to the next allocation on the current stream
// (record_stream on the comm stream). The comm stream is held up by an all_reduce that
// the last rank joins 300 ms late; the gather queued behind it reads its input only
// after that, while the current stream runs on and fills new tensors of the same size.
TEST_F(Nccl, DroppedAsyncInputIsNotReused) {
  constexpr int64_t kShard = 1 << 18;
  at::Tensor out = at::full({kShard * n_}, -1, on(at::kFloat));
  at::Tensor held = at::ones({16}, on(at::kFloat));
  g_->all_reduce(held);  // the communicator exists: the late rank delays only what follows
  g_->barrier();
  if (me_ == n_ - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  WorkPtr hold = g_->all_reduce(held, ReduceOp::kSum, /*async=*/true);
  WorkPtr w;
  {
    at::Tensor in = cuda_values(me_, kShard, at::kFloat, me_ * kShard);
    w = g_->all_gather(out, in, /*async=*/true);
  }
  std::vector<at::Tensor> scribble;
  for (int k = 0; k < 4; ++k) scribble.push_back(at::full({kShard}, -7, on(at::kFloat)));
  hold->wait();
  w->wait();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n_; ++r) parts.push_back((base(kShard, at::kFloat, r * kShard) * (r + 1)).to(at::kFloat));
  EXPECT_TRUE(same(out, at::cat(parts)));
  EXPECT_TRUE(same(held, at::full({16}, static_cast<double>(n_) * n_, at::kFloat)));
}

TEST_F(Nccl, ManyAsyncInFlight) {
  constexpr int64_t kN = 1001;
  std::vector<at::Tensor> ts;
  std::vector<WorkPtr> ws;
  for (int k = 0; k < 8; ++k) {
    ts.push_back(cuda_values(me_, kN, at::kBFloat16));
    ws.push_back(g_->all_reduce(ts.back(), k % 2 ? ReduceOp::kMax : ReduceOp::kSum, /*async=*/true));
  }
  for (auto it = ws.rbegin(); it != ws.rend(); ++it) (*it)->synchronize();
  for (int k = 0; k < 8; ++k) {
    EXPECT_TRUE(ws[k]->completed());
    EXPECT_TRUE(same(ts[k], reduced(base(kN, at::kBFloat16), k % 2 ? ReduceOp::kMax : ReduceOp::kSum, at::kBFloat16)))
        << "collective " << k;
  }
}

TEST_F(Nccl, CpuAndCudaOnOneGroup) {
  at::Tensor c = at::full({9}, me_ + 1, at::kLong);
  at::Tensor d = at::full({9}, me_ + 1, on(at::kLong));
  WorkPtr cuda_work = g_->all_reduce(d, ReduceOp::kSum, /*async=*/true);
  g_->all_reduce(c, ReduceOp::kSum);
  g_->barrier();
  cuda_work->wait();  // without it, reading d on the current stream would race the comm stream
  EXPECT_TRUE(same(c, at::full({9}, static_cast<int64_t>(triangle(n_)), at::kLong)));
  EXPECT_TRUE(same(d, at::full({9}, static_cast<int64_t>(triangle(n_)), at::kLong)));
}

TEST_F(Nccl, SubGroups) {
  // Even/odd ranks: a second NCCL communicator per sub-group.
  GroupPtr parity = g_->split(me_ % 2, me_);
  ASSERT_NE(parity, nullptr);
  at::Tensor t = at::full({1001}, me_ + 1, on(at::kFloat));
  parity->all_reduce(t, ReduceOp::kSum);
  double expect = 0;
  for (int r = me_ % 2; r < n_; r += 2) expect += r + 1;
  EXPECT_TRUE(same(t, at::full({1001}, expect, at::kFloat)));

  // Only rank 0.
  GroupPtr solo = g_->split(me_ == 0 ? 0 : -1, 0);
  if (me_ == 0) {
    ASSERT_NE(solo, nullptr);
    at::Tensor s = cuda_values(0, 1001, at::kHalf);
    solo->all_reduce(s, ReduceOp::kSum);
    EXPECT_TRUE(same(s, (base(1001, at::kHalf)).to(at::kHalf)));
  } else {
    EXPECT_EQ(solo, nullptr);
  }
  // The world communicator still lines up.
  at::Tensor w = at::ones({5}, on(at::kLong));
  g_->all_reduce(w, ReduceOp::kSum);
  EXPECT_TRUE(same(w, at::full({5}, n_, at::kLong)));
}

TEST_F(Nccl, MisuseIsACommError) {
  at::Tensor first = at::ones({4}, on(at::kFloat));
  g_->all_reduce(first);  // makes sure the communicator exists on dev_
  at::Tensor cpu = at::empty({4 * n_}, at::kFloat);
  try {
    g_->all_gather(cpu, first);
    ADD_FAILURE() << "CPU output with a CUDA input must throw";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("different devices"), std::string::npos) << e.what();
  }
  if (at::cuda::device_count() >= 2) {
    at::Device other(at::kCUDA, static_cast<c10::DeviceIndex>((dev_.index() + 1) % at::cuda::device_count()));
    at::Tensor elsewhere = at::ones({4}, at::TensorOptions(at::kFloat).device(other));
    try {
      g_->all_reduce(elsewhere);
      ADD_FAILURE() << "a tensor on another GPU than the group's must throw";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("was created on"), std::string::npos) << e.what();
    }
  }
  at::Tensor bad_in = at::empty({7 * n_ + 1}, on(at::kFloat)), out = at::empty({7}, on(at::kFloat));
  try {
    g_->reduce_scatter(out, bad_in);
    ADD_FAILURE() << "mismatched reduce_scatter sizes must throw";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter"), std::string::npos) << e.what();
  }
}

// Timeouts on CUDA collectives (setup of NCCL, and Work::synchronize) abort a
// communicator, which leaves peers in states only process exit cleans up: they are
// tested with separate processes, tests/progs/missing_peer.cpp (modes cuda-setup and
// cuda-sync), from tests/unit/test_launch.cpp.
// Tears the world group down (its NCCL communicator included) before main returns: left
// to static destruction, ncclCommDestroy would run after the CUDA runtime has unloaded.
class FinalizeComm : public ::testing::Environment {
 public:
  void TearDown() override { finalize(); }
};
[[maybe_unused]] ::testing::Environment* const kFinalizeComm =
    ::testing::AddGlobalTestEnvironment(new FinalizeComm);  // gtest owns it
#endif  // ZT_WITH_CUDA

}  // namespace
}  // namespace test_nccl_collectives
}  // namespace zt::comm
