// MPI backend of point-to-point messages. See [P2P Rules] in include/zerotrain/comm.h.
//
// Each message is two non-blocking MPI messages: a header {numel, dtype, element size,
// sequence number} and the payload. The receiver posts both receives at once (no extra
// round trip) and checks the header when both have landed, so a send and a recv that
// disagree on size or dtype give a CommError naming both sides instead of MPI's
// truncation error or a silently partial buffer.
#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <thread>

#include "comm/nccl.h"  // note_comm_failure, comm_failed
#include "comm/p2p.h"
#include "zerotrain/error.h"

namespace zt::comm {
namespace {

constexpr int kHeaderWords = 4;  // numel, dtype, element size, sender's sequence number
using Header = std::array<int64_t, kHeaderWords>;

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

// The payload moves as elements of its size (the header carries the dtype).
MPI_Datatype element_type(size_t bytes) {
  switch (bytes) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
    default: break;
  }
  ZT_ASSERT(false, "element size ", bytes, " passed the group's p2p checks");
  return MPI_DATATYPE_NULL;
}

// Message k of a pair travels on tags 2*(k mod m) (header) and 2*(k mod m)+1 (payload),
// m = (MPI_TAG_UB+1)/2: the two parts of one message match by sequence number whatever
// order the receiver posts them in, and the messages of one pair never match each other's
// parts (unless 2^30 of them are in flight at once with OpenMPI's bound).
int64_t tag_window(MPI_Comm comm) {
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag);
  const int64_t top = flag && ub != nullptr ? *ub : 32767;  // the standard's minimum
  return (top + 1) / 2;
}

std::string dtype_name(int64_t code) {
  if (code >= 0 && code < static_cast<int64_t>(at::ScalarType::NumOptions)) {
    return c10::toString(static_cast<at::ScalarType>(code));
  }
  return detail::cat("dtype code ", code);
}

class MpiP2PWork : public Work {
 public:
  struct Op {
    P2PItem item;
    Header header{};
    std::array<MPI_Request, 2> req{MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // header, payload
    std::array<bool, 2> done{false, false};
    int payload_error = MPI_SUCCESS;  // a recv's payload failed in MPI (e.g. truncated)
  };

  MpiP2PWork(std::vector<P2PItem> items, std::string what, std::chrono::milliseconds timeout,
             std::function<void(const std::string&)> on_timeout)
      : ops_(items.size()), what_(std::move(what)), timeout_(timeout), on_timeout_(std::move(on_timeout)) {
    for (size_t i = 0; i < items.size(); ++i) ops_[i].item = std::move(items[i]);
  }
  ~MpiP2PWork() override {
    // Dropped unwaited: complete here so MPI never writes into freed buffers (errors are
    // swallowed: a destructor must not throw). After a failure, waiting could take the
    // whole timeout; the buffers are leaked instead.
    if (done_) return;
    if (!comm_failed()) {
      try {
        wait();
        return;
      } catch (...) {
      }
    }
    abandon();
  }

  // Posts every op's two messages; ops_ is never resized afterwards (MPI holds pointers).
  void post(MPI_Comm comm) {
    const int64_t window = tag_window(comm);
    for (Op& op : ops_) {
      const at::Tensor& t = op.item.tensor;
      const int tag = static_cast<int>(2 * (op.item.seq % window));
      const int count = static_cast<int>(t.numel());  // <= INT_MAX, checked by the group
      MPI_Datatype et = element_type(t.element_size());
      int rc = MPI_SUCCESS;
      if (op.item.send) {
        op.header = {t.numel(), static_cast<int64_t>(t.scalar_type()), static_cast<int64_t>(t.element_size()),
                     op.item.seq};
        rc = MPI_Isend(op.header.data(), kHeaderWords, MPI_INT64_T, op.item.peer, tag, comm, &op.req[0]);
        if (rc == MPI_SUCCESS) rc = MPI_Isend(t.const_data_ptr(), count, et, op.item.peer, tag + 1, comm, &op.req[1]);
      } else {
        op.header = {-1, -1, -1, -1};
        rc = MPI_Irecv(op.header.data(), kHeaderWords, MPI_INT64_T, op.item.peer, tag, comm, &op.req[0]);
        if (rc == MPI_SUCCESS) rc = MPI_Irecv(t.data_ptr(), count, et, op.item.peer, tag + 1, comm, &op.req[1]);
      }
      if (rc != MPI_SUCCESS) fail(op, rc);
    }
  }

  bool completed() override {
    if (done_) return true;
    bool all = true;
    for (Op& op : ops_) {
      for (int part = 0; part < 2; ++part) {
        if (op.done[part]) continue;
        int flag = 0;
        MPI_Status status;
        int rc = MPI_Test(&op.req[part], &flag, &status);
        if (rc != MPI_SUCCESS && !op.item.send && part == 1) {
          // A recv's payload that does not fit (MPI_ERR_TRUNCATE) completes with an
          // error: named from the header in finish().
          op.payload_error = rc;
          flag = 1;
        } else if (rc != MPI_SUCCESS) {
          fail(op, rc);
        }
        if (flag) {
          op.done[part] = true;
        } else {
          all = false;
        }
      }
    }
    if (all) finish();
    return done_;
  }

  void wait() override {
    if (!done_) {
      const auto start = std::chrono::steady_clock::now();
      const auto deadline = start + timeout_;
      int spins = 0;
      while (!completed()) {
        const auto now = std::chrono::steady_clock::now();
        if (now > deadline) {
          std::string msg = detail::cat(
              what_, " timed out after ",
              std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count() / 1000.0,
              " s; still pending: ", pending(),
              ". The peer did not post the matching op (it exited, hung, or sends/receives in a different "
              "order). Check the other ranks' logs; raise the limit with ZT_COMM_TIMEOUT=<seconds> if a rank is "
              "just slow.");
          if (on_timeout_) on_timeout_(msg);
          abandon();
          throw CommError(msg);
        }
        if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 ? 1000 : 50));
      }
    }
    if (!error_.empty()) throw CommError(error_);
  }
  void synchronize() override { wait(); }

 private:
  // The ops not yet complete, by name.
  std::string pending() const {
    std::vector<P2PItem> left;
    for (const Op& op : ops_) {
      if (!op.done[0] || !op.done[1]) left.push_back(op.item);
    }
    return describe_items(left, 8);
  }

  // Checks every recv's header against its buffer; releases the tensors.
  void finish() {
    for (Op& op : ops_) {
      if (op.item.send || !error_.empty()) continue;
      const at::Tensor& t = op.item.tensor;
      const Header& h = op.header;
      if (h[0] != t.numel() || h[1] != static_cast<int64_t>(t.scalar_type())) {
        error_ = detail::cat(op.item.what, ": the matching send (peer ", op.item.peer, "'s send #", h[3],
                             " to this rank) has ", h[0], " x ", dtype_name(h[1]), ", this recv expects ", t.numel(),
                             " x ", t.scalar_type(),
                             ". A send and its recv must have the same element count and dtype; the recv buffer is "
                             "undefined now (the group stays usable).");
      } else if (op.payload_error != MPI_SUCCESS) {
        error_ = detail::cat(op.item.what, " failed in MPI: ", mpi_error_text(op.payload_error));
        note_comm_failure();
      }
    }
    done_ = true;
    for (Op& op : ops_) op.item.tensor = at::Tensor();
  }

  // An MPI call failed: the work cannot complete. Leaks the buffers (MPI may still own
  // some of them) and throws.
  [[noreturn]] void fail(const Op& op, int rc) {
    std::string msg = detail::cat(op.item.what, " failed in MPI: ", mpi_error_text(rc));
    note_comm_failure();
    abandon();
    throw CommError(msg);
  }

  // Gives up on the pending requests: MPI may still write into the buffers, so they are
  // kept alive forever (an intentional leak, as for a timed-out collective).
  void abandon() {
    done_ = true;
    new std::vector<Op>(std::move(ops_));  // NOLINT: intentional leak, see above
  }

  std::vector<Op> ops_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::function<void(const std::string&)> on_timeout_;
  bool done_ = false;
  std::string error_;  // the first size/dtype mismatch, thrown by wait()
};

}  // namespace

std::string describe_items(const std::vector<P2PItem>& items, size_t max) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < max; ++i) {
    const P2PItem& it = items[i];
    if (i > 0) s += ", ";
    s += detail::cat(it.send ? "send #" : "recv #", it.seq, it.send ? " to peer " : " from peer ", it.peer, " (",
                     it.tensor.numel(), " x ", it.tensor.scalar_type(), ")");
  }
  if (items.size() > max) s += detail::cat(" and ", items.size() - max, " more");
  return s;
}

WorkPtr post_mpi_p2p(MPI_Comm comm, std::vector<P2PItem> items, std::string what, std::chrono::milliseconds timeout,
                     std::function<void(const std::string&)> on_timeout) {
  auto w = std::make_shared<MpiP2PWork>(std::move(items), std::move(what), timeout, std::move(on_timeout));
  w->post(comm);
  return w;
}

}  // namespace zt::comm
