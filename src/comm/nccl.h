// NCCL communicator of one Group on one CUDA device. Private to src/comm.
// See [Stream Rules] in include/zerotrain/comm.h.
#pragma once
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/p2p.h"
#include "zerotrain/comm.h"

namespace zt::comm {

class NcclComm {
 public:
  virtual ~NcclComm() = default;
#ifdef ZT_WITH_CUDA
  // Collective over `mpi_comm`: rank 0 makes the NCCL unique id, MPI broadcasts it
  // (within `timeout`: a peer that never gets here gives CommError, not a hang).
  // `what` names the collective that needs the communicator, for error messages.
  static std::unique_ptr<NcclComm> create(MPI_Comm mpi_comm, int rank, int size, int device,
                                          const std::string& what, std::chrono::milliseconds timeout);
#endif
  virtual int device() const = 0;
  // True once a timed-out Work::synchronize() aborted the communicator; it then refuses
  // new collectives.
  virtual bool aborted() const = 0;
  virtual void set_timeout(std::chrono::milliseconds t) = 0;
  virtual WorkPtr all_reduce(at::Tensor& t, ReduceOp op, bool async, const std::string& what) = 0;
  virtual WorkPtr reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op, bool async,
                                 const std::string& what) = 0;
  virtual WorkPtr all_gather(at::Tensor& out, const at::Tensor& in, bool async, const std::string& what) = 0;
  virtual WorkPtr broadcast(at::Tensor& t, int root, bool async, const std::string& what) = 0;
  virtual WorkPtr all_to_all(at::Tensor& out, const at::Tensor& in, bool async, const std::string& what) = 0;
  // Uneven splits in elements (Group::all_to_all_v); zero counts post nothing.
  virtual WorkPtr all_to_all_v(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& recv_counts, bool async, const std::string& what) = 0;
  // Point-to-point messages ([P2P Rules]): every item's ncclSend/ncclRecv in one
  // ncclGroupStart/End on the comm stream.
  virtual WorkPtr p2p(const std::vector<P2PItem>& items, bool async, const std::string& what) = 0;
};

// Records that a collective failed, so finalize() skips MPI_Finalize (it would wait for
// peers that may be gone). Defined in group.cpp.
void note_comm_failure();
// True once some collective or message failed (see note_comm_failure).
bool comm_failed();

}  // namespace zt::comm
