// Group: MPI for CPU tensors, NCCL (src/comm/nccl.cpp) for CUDA tensors.
// See [Stream Rules] in include/zerotrain/comm.h.
#include <mpi.h>

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <thread>

#include "comm/nccl.h"
#include "comm/p2p.h"
#include "comm/trace.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::comm {
namespace {

std::atomic<bool> g_failed{false};  // a collective failed: skip MPI_Finalize (it would hang)

// [Comm Trace] (comm/trace.h)
std::atomic<bool> g_trace_on{false};
std::mutex g_trace_mu;
std::vector<TraceEntry> g_trace;
std::atomic<int64_t> g_next_group_id{0};
void trace_op(const std::string& group, int64_t id, std::string op, int64_t bytes, bool cuda) {
  if (!g_trace_on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lk(g_trace_mu);
  g_trace.push_back({group, id, std::move(op), bytes, cuda});
}

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}
#define ZT_MPI_CHECK(call, what)                                                                  \
  do {                                                                                            \
    int _rc = (call);                                                                             \
    if (_rc != MPI_SUCCESS) {                                                                     \
      g_failed = true;                                                                            \
      throw CommError(::zt::detail::cat(what, " failed in MPI: ", mpi_error_string(_rc), " (",    \
                                        __FILE__, ":", __LINE__, ")"));                           \
    }                                                                                             \
  } while (0)

// --- 16-bit float reductions: MPI has no bf16/fp16 types, so they travel as uint16 with
// user-defined operators (accumulating pairwise in fp32, like a ring would).
template <typename T, int kOp>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    float r = kOp == 0 ? x + y : kOp == 1 ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = static_cast<T>(r);
  }
}
struct MpiOps {
  MPI_Op bf16[3];
  MPI_Op f16[3];
};
MpiOps& mpi_ops() {
  static MpiOps ops = [] {
    MpiOps o{};
    MPI_Op_create(&reduce16<c10::BFloat16, 0>, 1, &o.bf16[0]);
    MPI_Op_create(&reduce16<c10::BFloat16, 1>, 1, &o.bf16[1]);
    MPI_Op_create(&reduce16<c10::BFloat16, 2>, 1, &o.bf16[2]);
    MPI_Op_create(&reduce16<c10::Half, 0>, 1, &o.f16[0]);
    MPI_Op_create(&reduce16<c10::Half, 1>, 1, &o.f16[1]);
    MPI_Op_create(&reduce16<c10::Half, 2>, 1, &o.f16[2]);
    return o;
  }();
  return ops;
}

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_UINT8_T;
    case at::kHalf:
    case at::kBFloat16: return MPI_UINT16_T;
    default: throw CommError(detail::cat("dtype ", c10::toString(t), " is not supported by the MPI backend"));
  }
}
MPI_Op mpi_op(ReduceOp op, at::ScalarType t) {
  int idx = op == ReduceOp::kMax ? 1 : op == ReduceOp::kMin ? 2 : 0;  // avg = sum then divide
  if (t == at::kBFloat16) return mpi_ops().bf16[idx];
  if (t == at::kHalf) return mpi_ops().f16[idx];
  ZT_CHECK_T(t != at::kBool || op == ReduceOp::kMax || op == ReduceOp::kMin, CommError,
             "bool tensors reduce with max or min only");
  return idx == 1 ? MPI_MAX : idx == 2 ? MPI_MIN : MPI_SUM;
}

class GroupImpl;

// A non-blocking MPI collective. Keeps its tensors alive until completion.
class MpiWork : public Work {
 public:
  // on_finish runs once the request completed (e.g. divide for avg, copy out of a temp).
  MpiWork(GroupImpl* g, std::string what, std::vector<at::Tensor> keep, std::function<void()> on_finish)
      : group_(g), what_(std::move(what)), keep_(std::move(keep)), on_finish_(std::move(on_finish)) {}
  ~MpiWork() override;
  MPI_Request* request() { return &req_; }
  void wait() override;
  void synchronize() override { wait(); }
  bool completed() override;

 private:
  void finish();
  GroupImpl* group_;
  std::string what_;
  std::vector<at::Tensor> keep_;
  std::function<void()> on_finish_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool done_ = false;
};

class GroupImpl : public Group, public std::enable_shared_from_this<GroupImpl> {
 public:
  GroupImpl(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)), id_(g_next_group_id++) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    p2p_.resize(size_);
    const char* t = std::getenv("ZT_COMM_TIMEOUT");
    timeout_ = std::chrono::milliseconds(static_cast<int64_t>((t ? std::atof(t) : 600.0) * 1000));
  }
  ~GroupImpl() override {
    nccl_.reset();
    if (!g_failed && comm_ != MPI_COMM_NULL) {
      int fin = 0;
      MPI_Finalized(&fin);
      if (!fin) MPI_Comm_free(&comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) override {
    timeout_ = t;
    if (nccl_) nccl_->set_timeout(t);
  }
  int64_t sequence() const override { return seq_; }

  // Describes a collective for error messages.
  std::string describe(const std::string& coll, const at::Tensor& t) const {
    return detail::cat(coll, " #", seq_, " (", t.numel(), " x ", c10::toString(t.scalar_type()), ") on rank ", rank_,
                       " of group '", name_, "' (size ", size_, ")");
  }
  void check_usable(const std::string& what) const {
    ZT_CHECK_T(broken_.empty(), CommError, what, ": group '", name_, "' is unusable after an earlier failure: ", broken_);
    ZT_CHECK_T(!nccl_ || !nccl_->aborted(), CommError, what, ": group '", name_,
               "' is unusable: its NCCL communicator was aborted after an earlier timeout");
  }
  void mark_broken(const std::string& why) {
    broken_ = why;
    g_failed = true;
  }

  static bool overlaps(const at::Tensor& a, const at::Tensor& b) {
    auto a0 = static_cast<const char*>(a.data_ptr()), b0 = static_cast<const char*>(b.data_ptr());
    return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
  }
  std::function<void()> avg_divider(ReduceOp op, at::Tensor t) const {
    if (op != ReduceOp::kAvg) return {};
    int n = size_;
    return [t, n]() mutable {
      if (at::isFloatingType(t.scalar_type())) t.div_(n);
      else t.div_(n, "floor");
    };
  }

  void check_tensors(const char* coll, std::initializer_list<const at::Tensor*> ts) {
    const at::Tensor& first = **ts.begin();
    for (const at::Tensor* t : ts) {
      ZT_CHECK_T(t->defined() && t->is_contiguous(), CommError, coll, ": tensors must be defined and contiguous");
      ZT_CHECK_T(t->device() == first.device(), CommError, coll, ": tensors on different devices (", t->device(),
                 " vs ", first.device(), ")");
      ZT_CHECK_T(t->scalar_type() == first.scalar_type(), CommError, coll, ": tensors of different dtypes");
      // MPI counts are int: a larger count would be silently truncated.
      ZT_CHECK_T(t->is_cuda() || t->numel() <= std::numeric_limits<int>::max(), CommError, coll, ": CPU tensor of ",
                 t->numel(), " elements is over MPI's limit of ", std::numeric_limits<int>::max(),
                 " per call; split it into chunks");
    }
  }

  NcclComm& nccl(const at::Tensor& t, const std::string& what) {
#ifdef ZT_WITH_CUDA
    if (!nccl_) {
      try {
        nccl_ = NcclComm::create(comm_, rank_, size_, t.device().index(), what, timeout_);
      } catch (const CommError& e) {
        mark_broken(e.what());
        throw;
      }
    }
    ZT_CHECK_T(nccl_->device() == t.device().index(), CommError, "group '", name_, "' was created on cuda:",
               nccl_->device(), " but got a tensor on ", t.device());
    return *nccl_;
#else
    throw CommError("CUDA tensor given to a zerotrain build without CUDA/NCCL");
#endif
  }

  // Wraps an NCCL collective: checks, counts and runs `launch(comm, what)`.
  template <typename Launch>
  WorkPtr nccl_collective(const char* coll, const at::Tensor& shape_of, Launch launch) {
    std::string what = describe(coll, shape_of);
    check_usable(what);
    NcclComm& c = nccl(shape_of, what);
    ++seq_;
    trace_op(name_, id_, coll, static_cast<int64_t>(shape_of.nbytes()), true);
    return launch(c, what);
  }

  // Wraps an MPI collective: issues `post(request)` and returns the work.
  template <typename Post>
  WorkPtr mpi_collective(const char* coll, const at::Tensor& shape_of, std::vector<at::Tensor> keep,
                         std::function<void()> on_finish, bool async, Post post) {
    std::string what = describe(coll, shape_of);
    check_usable(what);
    ++seq_;
    trace_op(name_, id_, coll, static_cast<int64_t>(shape_of.nbytes()), false);
    auto w = std::make_shared<MpiWork>(this, what, std::move(keep), std::move(on_finish));
    ZT_MPI_CHECK(post(w->request()), what);
    if (!async) w->wait();
    return w;
  }

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op, bool async) override {
    check_tensors("all_reduce", {&t});
    if (t.is_cuda()) {
      return nccl_collective("all_reduce", t, [&](NcclComm& c, const std::string& w) {
        return c.all_reduce(t, op, async, w);
      });
    }
    MPI_Datatype dt = mpi_type(t.scalar_type());
    MPI_Op mop = mpi_op(op, t.scalar_type());
    return mpi_collective("all_reduce", t, {t}, avg_divider(op, t), async, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), dt, mop, comm_, r);
    });
  }
  WorkPtr reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op, bool async) override {
    check_tensors("reduce_scatter", {&out, &in});
    ZT_CHECK_T(in.numel() == out.numel() * size_, CommError, "reduce_scatter: input has ", in.numel(),
               " elements, expected output (", out.numel(), ") x group size (", size_, ")");
    if (out.is_cuda()) {
      return nccl_collective("reduce_scatter", in, [&](NcclComm& c, const std::string& w) {
        return c.reduce_scatter(out, in, op, async, w);
      });
    }
    MPI_Datatype dt = mpi_type(in.scalar_type());
    MPI_Op mop = mpi_op(op, in.scalar_type());
    // MPI forbids overlapping send/receive buffers (its in-place form puts the result at
    // the start, not at this rank's offset): reduce into a temporary, then copy.
    at::Tensor dst = overlaps(out, in) ? at::empty_like(out) : out;
    std::function<void()> avg = avg_divider(op, dst);
    std::function<void()> finish = [avg, dst, out]() mutable {
      if (avg) avg();
      if (!dst.is_same(out)) out.copy_(dst);
    };
    return mpi_collective("reduce_scatter", in, {out, in, dst}, finish, async, [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in.data_ptr(), dst.data_ptr(), static_cast<int>(out.numel()), dt, mop, comm_, r);
    });
  }
  WorkPtr all_gather(at::Tensor& out, const at::Tensor& in, bool async) override {
    check_tensors("all_gather", {&out, &in});
    ZT_CHECK_T(out.numel() == in.numel() * size_, CommError, "all_gather: output has ", out.numel(),
               " elements, expected input (", in.numel(), ") x group size (", size_, ")");
    if (out.is_cuda()) {
      return nccl_collective("all_gather", in, [&](NcclComm& c, const std::string& w) {
        return c.all_gather(out, in, async, w);
      });
    }
    MPI_Datatype dt = mpi_type(in.scalar_type());
    // In place (input is this rank's slot of output) maps to MPI_IN_PLACE.
    const bool in_place = in.data_ptr() == static_cast<char*>(out.data_ptr()) + rank_ * in.numel() * in.element_size();
    ZT_CHECK_T(in_place || !overlaps(out, in), CommError,
               "all_gather: input overlaps output but is not this rank's slot of it");
    return mpi_collective("all_gather", in, {out, in}, {}, async, [&](MPI_Request* r) {
      int n = static_cast<int>(in.numel());
      return MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data_ptr(), n, dt, out.data_ptr(), n, dt, comm_, r);
    });
  }
  WorkPtr broadcast(at::Tensor& t, int root, bool async) override {
    check_tensors("broadcast", {&t});
    ZT_CHECK_T(root >= 0 && root < size_, CommError, "broadcast: root ", root, " is not a rank of group '", name_,
               "' (size ", size_, ")");
    if (t.is_cuda()) {
      return nccl_collective("broadcast", t, [&](NcclComm& c, const std::string& w) {
        return c.broadcast(t, root, async, w);
      });
    }
    MPI_Datatype dt = mpi_type(t.scalar_type());
    return mpi_collective("broadcast", t, {t}, {}, async, [&](MPI_Request* r) {
      return MPI_Ibcast(t.data_ptr(), static_cast<int>(t.numel()), dt, root, comm_, r);
    });
  }
  WorkPtr all_to_all(at::Tensor& out, const at::Tensor& in, bool async) override {
    check_tensors("all_to_all", {&out, &in});
    ZT_CHECK_T(out.numel() == in.numel() && in.numel() % size_ == 0, CommError, "all_to_all: input (", in.numel(),
               ") and output (", out.numel(), ") must have the same size, divisible by the group size ", size_);
    if (out.is_cuda()) {
      return nccl_collective("all_to_all", in, [&](NcclComm& c, const std::string& w) {
        return c.all_to_all(out, in, async, w);
      });
    }
    MPI_Datatype dt = mpi_type(in.scalar_type());
    return mpi_collective("all_to_all", in, {out, in}, {}, async, [&](MPI_Request* r) {
      int n = static_cast<int>(in.numel() / size_);
      return MPI_Ialltoall(in.data_ptr(), n, dt, out.data_ptr(), n, dt, comm_, r);
    });
  }
  WorkPtr all_to_all_v(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& recv_counts, bool async) override {
    check_tensors("all_to_all_v", {&out, &in});
    auto total = [](const std::vector<int64_t>& c) {
      int64_t s = 0;
      for (int64_t n : c) s += n < 0 ? std::numeric_limits<int64_t>::min() / 4 : n;
      return s;
    };
    ZT_CHECK_T(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_,
               CommError, "all_to_all_v: ", send_counts.size(), " send and ", recv_counts.size(),
               " receive counts for a group of ", size_, " ranks (one per rank)");
    ZT_CHECK_T(total(send_counts) == in.numel() && total(recv_counts) == out.numel(), CommError,
               "all_to_all_v: send counts sum to ", total(send_counts), " for an input of ", in.numel(),
               " elements, receive counts to ", total(recv_counts), " for an output of ", out.numel(),
               " (counts must be >= 0 and sum to the tensors' sizes)");
    if (out.is_cuda()) {
      return nccl_collective("all_to_all_v", in, [&](NcclComm& c, const std::string& w) {
        return c.all_to_all_v(out, in, send_counts, recv_counts, async, w);
      });
    }
    // MPI counts and displacements are int (check_tensors bounds numel, so both fit).
    std::vector<int> sc(size_), rc(size_), sd(size_), rd(size_);
    for (int p = 0, so = 0, ro = 0; p < size_; ++p) {
      sc[p] = static_cast<int>(send_counts[p]);
      rc[p] = static_cast<int>(recv_counts[p]);
      sd[p] = so;
      rd[p] = ro;
      so += sc[p];
      ro += rc[p];
    }
    MPI_Datatype dt = mpi_type(in.scalar_type());
    // The count vectors must live until the request completes: the work keeps them.
    auto counts = std::make_shared<std::vector<std::vector<int>>>(
        std::vector<std::vector<int>>{std::move(sc), std::move(sd), std::move(rc), std::move(rd)});
    return mpi_collective("all_to_all_v", in, {out, in}, [counts] {}, async, [&](MPI_Request* r) {
      auto& v = *counts;
      return MPI_Ialltoallv(in.data_ptr(), v[0].data(), v[1].data(), dt, out.data_ptr(), v[2].data(), v[3].data(), dt,
                            comm_, r);
    });
  }
  void barrier() override {
    at::Tensor none = at::empty({0});
    std::string what = describe("barrier", none);
    check_usable(what);
    ++seq_;
    trace_op(name_, id_, "barrier", 0, false);
    auto w = std::make_shared<MpiWork>(this, what, std::vector<at::Tensor>{}, std::function<void()>{});
    ZT_MPI_CHECK(MPI_Ibarrier(comm_, w->request()), what);
    w->wait();
  }
  // --- point-to-point messages ([P2P Rules])
  WorkPtr send(const at::Tensor& t, int peer) override { return p2p("send", {isend(t, peer)}, /*blocking=*/true); }
  WorkPtr recv(at::Tensor& t, int peer) override { return p2p("recv", {irecv(t, peer)}, /*blocking=*/true); }
  WorkPtr batch_isend_irecv(const std::vector<P2POp>& ops) override {
    return p2p("batch_isend_irecv", ops, /*blocking=*/false);
  }
  P2PCount p2p_count(int peer) const override {
    ZT_CHECK_T(peer >= 0 && peer < size_, CommError, "p2p_count: peer ", peer, " is not a rank of group '", name_,
               "' (size ", size_, ")");
    return p2p_[peer];
  }

  // Checks every op before anything is sent or counted (a refused call leaves the group
  // usable and the sequence numbers unchanged).
  void check_p2p(const char* call, const std::vector<P2POp>& ops, bool blocking) const {
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      const bool send = op.kind == P2POp::Kind::kSend;
      const std::string who = blocking ? std::string(call) : detail::cat(call, " op ", i, " (", send ? "isend" : "irecv", ")");
      ZT_CHECK_T(op.peer >= 0 && op.peer < size_, CommError, who, ": peer ", op.peer, " is not a rank of group '", name_,
                 "' (size ", size_, ", ranks 0..", size_ - 1, ")");
      ZT_CHECK_T(!blocking || op.peer != rank_, CommError, who, ": rank ", rank_, " of group '", name_,
                 "' names itself as the peer; a blocking ", call,
                 " to oneself can never complete: post the isend and the irecv together in one batch_isend_irecv");
      const at::Tensor& t = op.tensor;
      ZT_CHECK_T(t.defined() && t.is_contiguous(), CommError, who,
                 ": tensors must be defined and contiguous (send t.contiguous(); receive into a contiguous buffer, "
                 "then copy)");
      ZT_CHECK_T(t.device() == ops[0].tensor.device(), CommError, who, ": tensor on ", t.device(), " but op 0's is on ",
                 ops[0].tensor.device(), "; a batch is all on CPU or all on one CUDA device");
      if (!t.is_cuda()) {
        const size_t es = t.element_size();
        ZT_CHECK_T(es == 1 || es == 2 || es == 4 || es == 8, CommError, who, ": dtype ", c10::toString(t.scalar_type()),
                   " is not supported by the MPI backend (elements of 1, 2, 4 or 8 bytes)");
        ZT_CHECK_T(t.numel() <= std::numeric_limits<int>::max(), CommError, who, ": CPU tensor of ", t.numel(),
                   " elements is over MPI's limit of ", std::numeric_limits<int>::max(), " per call; split it into chunks");
      }
      if (send || t.numel() == 0) continue;
      for (size_t j = 0; j < ops.size(); ++j) {
        const at::Tensor& o = ops[j].tensor;
        ZT_CHECK_T(j == i || !o.defined() || o.numel() == 0 || !overlaps(t, o), CommError, who,
                   ": its buffer overlaps the buffer of op ", j,
                   "; a recv buffer must not overlap any other buffer of the batch");
      }
    }
  }

  WorkPtr p2p(const char* call, const std::vector<P2POp>& ops, bool blocking) {
    const std::string where = detail::cat(" on rank ", rank_, " of group '", name_, "' (size ", size_, ")");
    check_usable(detail::cat(call, where));
    check_p2p(call, ops, blocking);
    const bool cuda = !ops.empty() && ops[0].tensor.is_cuda();
    // Sequence numbers as they will be if the call goes out (counted only then).
    std::vector<P2PCount> next = p2p_;
    std::vector<P2PItem> items;
    items.reserve(ops.size());
    for (const P2POp& op : ops) {
      P2PItem it;
      it.send = op.kind == P2POp::Kind::kSend;
      it.tensor = op.tensor;
      it.peer = op.peer;
      it.seq = it.send ? next[op.peer].sent++ : next[op.peer].received++;
      items.push_back(std::move(it));
    }
    for (P2PItem& it : items) it.what = describe_items({it}) + where;
    const std::string what =
        blocking ? items[0].what : detail::cat(call, " of ", items.size(), " ops [", describe_items(items), "]", where);
    if (g_trace_on.load(std::memory_order_relaxed)) {
      std::string op = "p2p[";
      int64_t bytes = 0;
      for (const P2PItem& it : items) {
        op += detail::cat(op.size() > 4 ? "," : "", it.send ? "s" : "r", it.peer);
        bytes += static_cast<int64_t>(it.tensor.nbytes());
      }
      trace_op(name_, id_, op + "]", bytes, cuda);
    }
    if (cuda) {
      NcclComm& c = nccl(ops[0].tensor, what);
      p2p_ = std::move(next);
      return c.p2p(items, /*async=*/!blocking, what);
    }
    p2p_ = std::move(next);
    std::weak_ptr<GroupImpl> self = weak_from_this();
    WorkPtr w = post_mpi_p2p(comm_, std::move(items), what, timeout_, [self](const std::string& why) {
      if (auto g = self.lock()) g->mark_broken(why);
      else note_comm_failure();
    });
    if (blocking) w->wait();
    return w;
  }

  std::shared_ptr<Group> split(int color, int key) override {
    check_usable("split");
    MPI_Comm sub = MPI_COMM_NULL;
    ZT_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "split of group '" + name_ + "'");
    if (sub == MPI_COMM_NULL) return nullptr;
    auto g = std::make_shared<GroupImpl>(sub, detail::cat(name_, "/", color));
    g->timeout_ = timeout_;  // the parent's, which may have been set after ZT_COMM_TIMEOUT was read
    return g;
  }

 private:
  MPI_Comm comm_;
  std::string name_;
  int64_t id_;  // [Comm Trace]: this process's groups numbered in creation order
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_{600000};
  int64_t seq_ = 0;
  std::string broken_;
  std::unique_ptr<NcclComm> nccl_;
  std::vector<P2PCount> p2p_;  // per peer rank: messages issued to and from it
  friend class MpiWork;
};

MpiWork::~MpiWork() {
  // A work dropped unwaited is completed here, so its buffers stay valid until MPI is
  // done with them (errors are swallowed: a destructor must not throw).
  if (!done_ && req_ != MPI_REQUEST_NULL && !g_failed) {
    try {
      wait();
    } catch (...) {
    }
  }
}

bool MpiWork::completed() {
  if (done_) return true;
  int flag = 0;
  ZT_MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), what_);
  if (flag) finish();
  return done_;
}

void MpiWork::wait() {
  if (done_) return;
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + group_->timeout_;
  int spins = 0;
  while (!completed()) {
    auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      std::string msg = detail::cat(
          what_, " timed out after ", std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count() / 1000.0,
          " s: a peer rank did not join this collective (it exited, hung, or issued a different collective). "
          "Check the other ranks' logs; raise the limit with ZT_COMM_TIMEOUT=<seconds> if a rank is just slow.");
      group_->mark_broken(msg);
      done_ = true;  // abandoned: MPI still owns the buffers, keep them alive forever
      new std::vector<at::Tensor>(std::move(keep_));  // intentional leak, see above
      throw CommError(msg);
    }
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 ? 1000 : 50));
  }
}

void MpiWork::finish() {
  done_ = true;
  if (on_finish_) on_finish_();
  on_finish_ = nullptr;
  keep_.clear();
}

std::once_flag g_init_once;
GroupPtr g_world;

}  // namespace

void note_comm_failure() { g_failed = true; }

void trace_enable(bool on) {
  std::lock_guard<std::mutex> lk(g_trace_mu);
  g_trace.clear();
  g_trace_on = on;
}

std::vector<TraceEntry> trace_take() {
  std::lock_guard<std::mutex> lk(g_trace_mu);
  std::vector<TraceEntry> out;
  out.swap(g_trace);
  return out;
}
bool comm_failed() { return g_failed; }

GroupPtr world_group() {
  std::call_once(g_init_once, [] {
    RankInfo info = discover_rank();
    ZT_CHECK_T(info.source != "torchrun" || info.world_size == 1, CommError,
               "this process was started by torchrun with WORLD_SIZE=", info.world_size,
               ", but zerotrain's CPU collectives and rendezvous run over MPI: start the ranks with "
               "`zerotrain launch -n N -- PROGRAM`, mpirun or srun instead");
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      // Open MPI's shared-memory single-copy path (CMA) mishandles a message longer than the
      // posted receive: the receiver's heap is corrupted instead of MPI_ERR_TRUNCATE being
      // returned, so a size mismatch could not be named (P2P.SizeAndDtypeMismatchNamed under a
      // plain mpirun). `zerotrain launch` sets this too; here it also covers mpirun/srun. A
      // value the user set is kept.
      setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
      setenv("OMPI_MCA_btl_sm_single_copy_mechanism", "none", 0);
      int provided = 0;
      ZT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm dup = MPI_COMM_NULL;
    ZT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
    int size = 0, rank = 0;
    MPI_Comm_size(dup, &size);
    MPI_Comm_rank(dup, &rank);
    ZT_CHECK_T(size == info.world_size && rank == info.rank, CommError, "the ", info.source,
               " environment says rank ", info.rank, " of ", info.world_size, " but MPI says rank ", rank, " of ",
               size, ": start multi-rank runs with `zerotrain launch -n N`, mpirun or srun");
    mpi_ops();
    log::set_rank(rank);  // [Log Lines]: the rank each line shows and filters on
    g_world = std::make_shared<GroupImpl>(dup, "world");
  });
  return g_world;
}

void finalize() {
  if (g_failed) return;  // MPI_Finalize waits for peers that may be gone
  g_world.reset();
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (inited && !fin) MPI_Finalize();
}

}  // namespace zt::comm
