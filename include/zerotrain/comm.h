// zerotrain communication: rank discovery and Group, a set of ranks that runs
// collectives on flat tensors. CPU tensors go through MPI, CUDA tensors through NCCL.
//
// [Stream Rules] (referenced from the engine and the NCCL backend)
//  * Every Group owns one CUDA "comm stream" per device. A collective on CUDA tensors
//    records an event on the caller's current stream, makes the comm stream wait on it,
//    and enqueues the NCCL call on the comm stream: the host never waits.
//  * The returned Work holds a "done" event recorded on the comm stream after the call.
//    Work::wait() makes the caller's *current* stream wait on that event (no host
//    sync); Work::synchronize() blocks the host, with the group's timeout.
//  * Tensors handed to an asynchronous collective are marked with record_stream on the
//    comm stream, so the caching allocator does not reuse them before the collective
//    ends, even if the caller drops its reference.
//  * CPU (MPI) collectives use non-blocking MPI calls; Work::wait() polls them with the
//    group's timeout. MPI only progresses while a rank is inside MPI, so CPU overlap is
//    correctness-only.
//
// Timeouts: every blocking wait has a deadline (Group timeout, default 600 s, env
// ZT_COMM_TIMEOUT in seconds). A missed deadline throws CommError naming the
// collective, the group, the rank and the sequence number; the group is then broken
// and every later call on it throws at once.
//
// [P2P Rules] (point-to-point messages: send, recv, batch_isend_irecv)
//  * Messages between two ranks match in issue order: the k-th send from rank A to rank B
//    pairs with the k-th recv on B from A (as NCCL does; there are no tags). k is the
//    op's sequence number, named in errors as "send #k to peer B" / "recv #k from peer A"
//    and counted per peer and direction by p2p_count(); sequence() counts collectives only.
//  * A send and its recv must have the same element count and dtype. On CPU (MPI) every
//    message carries a small header and a mismatch is a CommError naming both sides;
//    NCCL cannot check it (a mismatch is a program bug: wrong data or a timeout).
//  * batch_isend_irecv posts all its ops at once and returns one Work that completes
//    when all have, so a rank can send and receive in any order without deadlock
//    (a ring or an exchange in one batch). On CUDA the batch is one ncclGroupStart/End
//    on the comm stream and follows [Stream Rules].
//  * The deadlines are the collectives': a CPU Work::wait() or a CUDA synchronize() that
//    passes the group's timeout names the pending ops (op, k, peer, rank, group) and
//    breaks the group. A small CPU send may complete before its peer posts the recv (MPI
//    buffers it); a recv, or a large send, waits for the peer.
//  * The group's NCCL communicator is set up by its first CUDA call of any kind, which is
//    collective: every rank of the group must make one.
//  * Sending to oneself works inside a batch (post the recv with the send); a blocking
//    send or recv to oneself could never complete and is refused.
#pragma once
#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace zt::comm {

// Where this process sits, read from the environment of `zerotrain launch`, torchrun,
// OpenMPI's mpirun or Slurm's srun (first match wins, in that order).
struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string source = "single";  // "zerotrain", "torchrun", "openmpi", "slurm", "single"
};
RankInfo discover_rank();

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

// A pending collective. Call wait() before reading the result: on CUDA, dropping a Work
// unwaited only keeps the buffers alive (record_stream), it does not order the caller's
// stream after the collective. A CPU Work dropped unwaited completes in its destructor.
class Work {
 public:
  virtual ~Work() = default;
  // CUDA: current stream waits on the collective (no host block). CPU: blocks with the
  // group's timeout. Throws CommError on timeout or backend failure.
  virtual void wait() = 0;
  // Blocks the host until the collective has finished (with the group's timeout).
  virtual void synchronize() = 0;
  // True once the collective has finished; never blocks.
  virtual bool completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// One message of a batch (Group::batch_isend_irecv): send `tensor` to, or receive it
// from, rank `peer` of the group. See [P2P Rules].
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  at::Tensor tensor;  // contiguous; a recv writes into it
  int peer = 0;       // rank in the group
};
inline P2POp isend(const at::Tensor& t, int peer) { return {P2POp::Kind::kSend, t, peer}; }
inline P2POp irecv(const at::Tensor& t, int peer) { return {P2POp::Kind::kRecv, t, peer}; }

// Point-to-point messages this rank has issued to and from one peer (see [P2P Rules]).
struct P2PCount {
  int64_t sent = 0;      // sends to the peer; the next one is "send #sent"
  int64_t received = 0;  // recvs from the peer
};

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds t) = 0;

  // All collectives operate on contiguous tensors of one dtype, all on CPU or all on
  // the same CUDA device; `async=false` waits (see Work::wait) before returning.
  // In place: every rank ends with op(all ranks' t).
  virtual WorkPtr all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::kSum, bool async = false) = 0;
  // input has size()*output.numel() elements; rank r receives op over ranks of
  // input[r*n : (r+1)*n].
  virtual WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                 ReduceOp op = ReduceOp::kSum, bool async = false) = 0;
  // output has size()*input.numel() elements; output[r*n:(r+1)*n] = rank r's input.
  virtual WorkPtr all_gather(at::Tensor& output, const at::Tensor& input, bool async = false) = 0;
  virtual WorkPtr broadcast(at::Tensor& t, int root, bool async = false) = 0;
  // input and output have size()*n elements; output[r*n:(r+1)*n] = rank r's input[me*n:...].
  virtual WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input, bool async = false) = 0;
  // Uneven all-to-all: input is size() chunks in rank order, send_counts[r] elements for
  // rank r; output gets size() chunks in rank order, recv_counts[r] elements from rank r.
  // recv_counts[r] must equal rank r's send_counts[me] (exchange the counts first, e.g. by
  // all_to_all of one int64 per rank); each vector sums to its tensor's numel. A zero count
  // sends nothing (on NCCL no send/recv is posted for that peer).
  virtual WorkPtr all_to_all_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& recv_counts, bool async = false) = 0;
  virtual void barrier() = 0;

  // Collective over this group: ranks passing the same color form a sub-group, ordered
  // by key (then by rank). A rank passing color < 0 gets nullptr.
  virtual std::shared_ptr<Group> split(int color, int key) = 0;

  // Number of collectives issued on this group (for diagnosis; not point-to-point).
  virtual int64_t sequence() const = 0;

  // Point-to-point messages ([P2P Rules]). Tensors are contiguous, any dtype whose
  // element is 1, 2, 4 or 8 bytes on CPU (any dtype on CUDA: NCCL moves bytes), all of a batch on
  // CPU or all on the group's CUDA device. Blocking like a collective with async=false:
  // on CPU they return once done (or throw at the timeout); on CUDA the current stream
  // waits (call synchronize() on the result for a host-side deadline).
  virtual WorkPtr send(const at::Tensor& t, int peer) = 0;
  virtual WorkPtr recv(at::Tensor& t, int peer) = 0;
  // Posts every op at once; the Work completes when all have. wait() throws the first
  // failure (a size/dtype mismatch after all ops finished, or a timeout). An empty list
  // gives a finished Work. Recv buffers must not overlap any other buffer of the batch.
  virtual WorkPtr batch_isend_irecv(const std::vector<P2POp>& ops) = 0;
  virtual P2PCount p2p_count(int peer) const = 0;
};
using GroupPtr = std::shared_ptr<Group>;

// The group of all ranks. Initializes MPI on first use (thread level MULTIPLE where
// available). With world size 1 and no launcher it works without mpirun.
GroupPtr world_group();
// Ends MPI cleanly if nothing failed (call at the end of main; skipped after errors).
void finalize();

// A failure that some rank hit, as every rank of the group agreed on it.
struct RankFailure {
  int rank = 0;         // the lowest failing rank
  std::string message;  // its error message
};
// Call on every rank of g with this rank's error ("" = none). Every rank gets the lowest
// failing rank and its message, or nullopt when no rank failed: the way to make a local
// failure collective, so that no rank goes on into a collective a failed rank never joins.
// Costs an all-reduce (plus two broadcasts after a failure); nothing at world 1.
std::optional<RankFailure> lowest_failure(const GroupPtr& g, const std::string& error);

}  // namespace zt::comm
