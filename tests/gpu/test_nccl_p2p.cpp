// Point-to-point messages of zt::comm::Group on CUDA tensors (the NCCL backend), checked
// exactly; see [P2P Rules] and [Stream Rules] in include/zerotrain/comm.h. Rank r uses
// cuda:LOCAL_RANK.
//
//   zerotrain launch -n 2 -- build/zt_gpu --gtest_filter='NcclP2P*'
//
// Without a GPU (or with fewer GPUs than local ranks) every test is skipped. A peer that
// never posts its op is tested with separate processes (tests/progs/missing_peer.cpp,
// mode cuda-p2p, from tests/unit/test_launch.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "support/gpu_util.h"
#include "support/comm_test_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt::comm {
namespace test_nccl_p2p {
namespace {

using zt::test_support::same;
using zt::test_support::comm_error;
using zt::test_support::payload;

#ifndef ZT_WITH_CUDA
TEST(NcclP2P, NeedsACudaBuild) { GTEST_SKIP() << "zerotrain was built without CUDA/NCCL (ZT_WITH_CUDA off)"; }
#else

using zt::test_support::nccl_skip_reason;

constexpr std::chrono::seconds kTestTimeout{60};

class NcclP2P : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = nccl_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    g_ = world_group();
    if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g_->set_timeout(kTestTimeout);
    me_ = g_->rank();
    n_ = g_->size();
    next_ = (me_ + 1) % n_;
    prev_ = (me_ + n_ - 1) % n_;
    dev_ = zt::test_support::rank_device();
  }
  at::Tensor cuda(const at::Tensor& cpu) const { return cpu.to(dev_); }
  at::Tensor cuda_full(int64_t n, double v, at::ScalarType dt) const {
    return at::full({n}, v, at::TensorOptions(dt).device(dev_));
  }
  GroupPtr g_;
  int me_ = 0, n_ = 1, next_ = 0, prev_ = 0;
  at::Device dev_{at::kCUDA, 0};
};

// A ring in one batch (one ncclGroupStart/End); at 1 rank a send to oneself.
TEST_F(NcclP2P, BatchedRingPass) {
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    for (int64_t len : {int64_t{1}, int64_t{1001}, int64_t{1} << 20}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " x " + std::to_string(len));
      at::Tensor out = cuda(payload(me_, next_, 0, len, dt));
      at::Tensor in = cuda_full(len, -1, dt);
      WorkPtr w = g_->batch_isend_irecv({isend(out, next_), irecv(in, prev_)});
      w->wait();  // the current stream waits; the comparison below reads on it
      EXPECT_TRUE(same(in, payload(prev_, me_, 0, len, dt)));
      w->synchronize();
      EXPECT_TRUE(w->completed());
    }
  }
}

// Blocking send/recv, pairwise (lower rank first), and a batched exchange of several
// messages each way that match in issue order.
TEST_F(NcclP2P, PairwiseExchange) {
  if (n_ % 2 != 0) GTEST_SKIP() << "pairs need an even number of ranks (world " << n_ << ")";
  const int peer = me_ ^ 1;
  at::Tensor mine = cuda(payload(me_, peer, 0, 4097, at::kFloat));
  at::Tensor theirs = cuda_full(4097, -1, at::kFloat);
  if (me_ < peer) {
    g_->send(mine, peer);
    g_->recv(theirs, peer);
  } else {
    g_->recv(theirs, peer);
    g_->send(mine, peer);
  }
  EXPECT_TRUE(same(theirs, payload(peer, me_, 0, 4097, at::kFloat)));

  std::vector<at::Tensor> outs, ins;
  std::vector<P2POp> ops;
  for (int m = 0; m < 12; ++m) {
    const at::ScalarType dt = m % 3 == 0 ? at::kBFloat16 : m % 3 == 1 ? at::kLong : at::kFloat;
    const int64_t len = 100 * (m + 1) + m;
    outs.push_back(cuda(payload(me_, peer, m, len, dt)));
    ins.push_back(cuda_full(len, -1, dt));
    ops.push_back(isend(outs.back(), peer));
    ops.push_back(irecv(ins.back(), peer));
  }
  g_->batch_isend_irecv(ops)->wait();
  for (int m = 0; m < 12; ++m) {
    SCOPED_TRACE(m);
    const at::ScalarType dt = m % 3 == 0 ? at::kBFloat16 : m % 3 == 1 ? at::kLong : at::kFloat;
    EXPECT_TRUE(same(ins[m], payload(peer, me_, m, 100 * (m + 1) + m, dt)));
  }
}

// [Stream Rules]: the send reads a tensor produced behind a ~50 ms spin on the current
// stream (the comm stream must wait for it), and the host does not block.
TEST_F(NcclP2P, OrderedAfterProducerOnCurrentStream) {
  constexpr int64_t kN = 1 << 18;
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, dev_.index());
  c10::cuda::CUDAStreamGuard guard(side);
  at::Tensor src = cuda(payload(me_, next_, 0, kN, at::kFloat));
  at::Tensor out = cuda_full(kN, -1, at::kFloat), in = cuda_full(kN, -1, at::kFloat);
  side.synchronize();
  at::cuda::sleep(int64_t{100} * 1000 * 1000);
  out.copy_(src);
  WorkPtr w = g_->batch_isend_irecv({isend(out, next_), irecv(in, prev_)});
  EXPECT_FALSE(w->completed()) << "the host must not have waited for the spin";
  w->wait();
  EXPECT_TRUE(same(in * 1, payload(prev_, me_, 0, kN, at::kFloat)));
}

// Misuse is a CommError before anything is sent.
TEST_F(NcclP2P, MisuseIsACommError) {
  at::Tensor d = cuda_full(4, 0, at::kFloat);
  at::Tensor c = at::zeros({4}, at::kFloat);
  try {
    g_->batch_isend_irecv({isend(d, next_), irecv(c, prev_)});
    ADD_FAILURE() << "a batch mixing CPU and CUDA tensors must throw";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("all on CPU or all on one CUDA device"), std::string::npos) << e.what();
  }
  try {
    g_->send(d, n_);
    ADD_FAILURE() << "a peer out of range must throw";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a rank"), std::string::npos) << e.what();
  }
}

// The world group is finalized by the environment of tests/gpu/test_nccl_collectives.cpp.
#endif  // ZT_WITH_CUDA

}  // namespace
}  // namespace test_nccl_p2p
}  // namespace zt::comm
