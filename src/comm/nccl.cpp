// NCCL backend. See [Stream Rules] in include/zerotrain/comm.h.
#ifdef ZT_WITH_CUDA
#include "comm/nccl.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "zerotrain/error.h"

namespace zt::comm {
namespace {

#define ZT_NCCL_CHECK(call, what)                                                                         \
  do {                                                                                                    \
    ncclResult_t _r = (call);                                                                             \
    if (_r != ncclSuccess && _r != ncclInProgress)                                                        \
      throw CommError(::zt::detail::cat(what, " failed in NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ".",       \
                                        NCCL_PATCH, ": ", ncclGetErrorString(_r), " (", ncclGetLastError(nullptr), \
                                        ") at ", __FILE__, ":", __LINE__));                               \
  } while (0)

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kChar: return ncclInt8;
    case at::kByte:
    case at::kBool: return ncclUint8;
    default: throw CommError(detail::cat("dtype ", c10::toString(t), " is not supported by the NCCL backend"));
  }
}
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

// The communicator handle, shared by NcclCommImpl and its works: a Work may outlive the
// Group, and after ncclCommAbort (which frees the communicator) nobody may touch the
// handle again, ncclCommDestroy included.
struct NcclHandle {
  explicit NcclHandle(ncclComm_t c) : comm(c) {}
  ~NcclHandle() {
    if (comm != nullptr && !aborted) ncclCommDestroy(comm);
  }
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;
  ncclComm_t comm;
  std::atomic<bool> aborted{false};
};

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclHandle> h, int device, std::string what, std::chrono::milliseconds timeout)
      : h_(std::move(h)), device_(device), what_(std::move(what)), timeout_(timeout) {}
  at::cuda::CUDAEvent& done() { return done_; }
  void wait() override {
    c10::cuda::CUDAGuard g(device_);
    done_.block(at::cuda::getCurrentCUDAStream(device_));
  }
  bool completed() override { return done_.query(); }
  void synchronize() override {
    auto start = std::chrono::steady_clock::now();
    while (!done_.query()) {
      ZT_CHECK_T(!h_->aborted, CommError, what_, ": the NCCL communicator was aborted after an earlier timeout");
      ncclResult_t async_err = ncclSuccess;
      ncclCommGetAsyncError(h_->comm, &async_err);
      if (async_err != ncclSuccess && async_err != ncclInProgress) {
        note_comm_failure();
        throw CommError(detail::cat(what_, " failed asynchronously in NCCL: ", ncclGetErrorString(async_err)));
      }
      if (std::chrono::steady_clock::now() - start > timeout_) {
        if (!h_->aborted.exchange(true)) ncclCommAbort(h_->comm);
        note_comm_failure();
        throw CommError(detail::cat(what_, " timed out after ", timeout_.count() / 1000.0,
                                    " s: a peer rank did not join this collective; the NCCL communicator was "
                                    "aborted. Raise the limit with ZT_COMM_TIMEOUT=<seconds> if a rank is just slow."));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  std::shared_ptr<NcclHandle> h_;
  int device_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  at::cuda::CUDAEvent done_{cudaEventDisableTiming};
};

class NcclCommImpl : public NcclComm {
 public:
  NcclCommImpl(ncclComm_t c, int device, std::chrono::milliseconds timeout)
      : h_(std::make_shared<NcclHandle>(c)), comm_(c), device_(device), timeout_(timeout),
        stream_(c10::cuda::getStreamFromPool(true, device)) {}
  int device() const override { return device_; }
  bool aborted() const override { return h_->aborted; }
  void set_timeout(std::chrono::milliseconds t) override { timeout_ = t; }

  // Orders the comm stream after the caller's stream, runs `launch`, records done.
  template <typename Launch>
  WorkPtr run(const std::string& what, const std::vector<at::Tensor>& tensors, bool async, Launch launch) {
    ZT_CHECK_T(!h_->aborted, CommError, what, ": the NCCL communicator was aborted after an earlier timeout");
    c10::cuda::CUDAGuard g(device_);
    auto cur = at::cuda::getCurrentCUDAStream(device_);
    at::cuda::CUDAEvent ready(cudaEventDisableTiming);
    ready.record(cur);
    ready.block(stream_);
    ZT_NCCL_CHECK(launch(stream_.stream()), what);
    auto w = std::make_shared<NcclWork>(h_, device_, what, timeout_);
    w->done().record(stream_);
    for (const auto& t : tensors) t.record_stream(stream_);
    if (!async) w->wait();
    return w;
  }

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op, bool async, const std::string& what) override {
    return run(what, {t}, async, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.scalar_type()), nccl_op(op), comm_, s);
    });
  }
  WorkPtr reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op, bool async,
                         const std::string& what) override {
    return run(what, {out, in}, async, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in.scalar_type()), nccl_op(op),
                               comm_, s);
    });
  }
  WorkPtr all_gather(at::Tensor& out, const at::Tensor& in, bool async, const std::string& what) override {
    return run(what, {out, in}, async, [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in.scalar_type()), comm_, s);
    });
  }
  WorkPtr broadcast(at::Tensor& t, int root, bool async, const std::string& what) override {
    return run(what, {t}, async, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.scalar_type()), root, comm_, s);
    });
  }
  WorkPtr all_to_all(at::Tensor& out, const at::Tensor& in, bool async, const std::string& what) override {
    return run(what, {out, in}, async, [&](cudaStream_t s) -> ncclResult_t {
      int n = 0;
      ncclCommCount(comm_, &n);
      size_t chunk = in.numel() / n;
      size_t bytes = chunk * in.element_size();
      auto dt = nccl_type(in.scalar_type());
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (int p = 0; p < n; ++p) {
        ncclSend(static_cast<const char*>(in.data_ptr()) + p * bytes, chunk, dt, p, comm_, s);
        ncclRecv(static_cast<char*>(out.data_ptr()) + p * bytes, chunk, dt, p, comm_, s);
      }
      return ncclGroupEnd();
    });
  }
  WorkPtr all_to_all_v(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& recv_counts, bool async, const std::string& what) override {
    return run(what, {out, in}, async, [&](cudaStream_t s) -> ncclResult_t {
      const auto dt = nccl_type(in.scalar_type());
      const size_t esize = in.element_size();
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      size_t send_off = 0, recv_off = 0;
      for (size_t p = 0; p < send_counts.size(); ++p) {
        const auto ns = static_cast<size_t>(send_counts[p]), nr = static_cast<size_t>(recv_counts[p]);
        if (ns > 0) ncclSend(static_cast<const char*>(in.data_ptr()) + send_off * esize, ns, dt, static_cast<int>(p), comm_, s);
        if (nr > 0) ncclRecv(static_cast<char*>(out.data_ptr()) + recv_off * esize, nr, dt, static_cast<int>(p), comm_, s);
        send_off += ns;
        recv_off += nr;
      }
      return ncclGroupEnd();
    });
  }
  // Bytes on the wire (ncclUint8): any dtype travels, and a send and its recv agree on
  // the count when their sizes in bytes agree ([P2P Rules]: NCCL cannot check dtypes).
  WorkPtr p2p(const std::vector<P2PItem>& items, bool async, const std::string& what) override {
    std::vector<at::Tensor> tensors;
    tensors.reserve(items.size());
    for (const P2PItem& it : items) tensors.push_back(it.tensor);
    return run(what, tensors, async, [&](cudaStream_t s) -> ncclResult_t {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (const P2PItem& it : items) {
        const size_t bytes = it.tensor.nbytes();
        r = it.send ? ncclSend(it.tensor.const_data_ptr(), bytes, ncclUint8, it.peer, comm_, s)
                    : ncclRecv(it.tensor.data_ptr(), bytes, ncclUint8, it.peer, comm_, s);
        if (r != ncclSuccess && r != ncclInProgress) {
          ncclGroupEnd();
          return r;
        }
      }
      return ncclGroupEnd();
    });
  }

 private:
  std::shared_ptr<NcclHandle> h_;
  ncclComm_t comm_;  // == h_->comm, valid while !h_->aborted
  int device_;
  std::chrono::milliseconds timeout_;
  c10::cuda::CUDAStream stream_;
};

}  // namespace

std::unique_ptr<NcclComm> NcclComm::create(MPI_Comm mpi_comm, int rank, int size, int device,
                                           const std::string& what, std::chrono::milliseconds timeout) {
  // NVLink multicast (NVLS) stays off: it can take a shared host's GPUs out of service.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  // Heap-allocated: if the broadcast times out, MPI may still write it later (leaked then).
  auto id = std::make_unique<ncclUniqueId>();
  if (rank == 0) ZT_NCCL_CHECK(ncclGetUniqueId(id.get()), "ncclGetUniqueId for " + what);
  // Non-blocking MPI calls polled against the deadline: a peer that never issues its
  // first CUDA collective must give a CommError, not a hang (blocking MPI calls and
  // ncclCommInitRank have no timeout). The barrier makes sure every rank holds the id
  // before any rank enters the blocking ncclCommInitRank (the root's broadcast may
  // complete before the others have joined).
  auto start = std::chrono::steady_clock::now();
  auto wait_for = [&](MPI_Request req, const char* step) {
    for (int done = 0; !done;) {
      int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      ZT_CHECK_T(rc == MPI_SUCCESS, CommError, step, " for ", what, " failed in MPI (code ", rc, ")");
      if (done) break;
      if (std::chrono::steady_clock::now() - start > timeout) {
        (void)id.release();  // intentional leak, see above
        note_comm_failure();
        throw CommError(detail::cat(what, " timed out after ", timeout.count() / 1000.0,
                                    " s while setting up NCCL (", step, "): a peer rank did not join its first CUDA "
                                    "collective (it exited, hung, or issued a different collective). Raise the limit "
                                    "with ZT_COMM_TIMEOUT=<seconds> if a rank is just slow."));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  };
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Ibcast(id.get(), sizeof(ncclUniqueId), MPI_BYTE, 0, mpi_comm, &req);
  ZT_CHECK_T(rc == MPI_SUCCESS, CommError, "broadcast of the NCCL unique id for ", what, " failed");
  wait_for(req, "broadcast of the NCCL unique id");
  rc = MPI_Ibarrier(mpi_comm, &req);
  ZT_CHECK_T(rc == MPI_SUCCESS, CommError, "barrier before ncclCommInitRank for ", what, " failed");
  wait_for(req, "barrier before ncclCommInitRank");
  c10::cuda::CUDAGuard g(device);
  ncclComm_t comm = nullptr;
  ZT_NCCL_CHECK(ncclCommInitRank(&comm, size, *id, rank),
                detail::cat("ncclCommInitRank for ", what, " (rank ", rank, " of ", size, ", cuda:", device, ")"));
  return std::make_unique<NcclCommImpl>(comm, device, timeout);
}

}  // namespace zt::comm
#endif  // ZT_WITH_CUDA
