// Point-to-point messages of a Group, as the backends see them. Private to src/comm.
// See [P2P Rules] and [Stream Rules] in include/zerotrain/comm.h.
#pragma once
#include <mpi.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "zerotrain/comm.h"

namespace zt::comm {

// One op of a batch after the group checked it and gave it its sequence number.
struct P2PItem {
  bool send = true;
  at::Tensor tensor;  // contiguous, checked
  int peer = 0;       // rank in the group
  int64_t seq = 0;    // the k of "send #k to peer p": this rank's k-th send to (recv from) peer
  std::string what;   // "send #k to peer p (n x Float) on rank r of group 'g' (size s)"
};

// Posts `items` as non-blocking MPI messages on `comm` (each a 4-word header, then the
// payload, on tags derived from its sequence number) and returns the Work that completes
// when all have; `what` names the whole batch. A Work that passes `timeout` calls
// `on_timeout` with its message (the group marks itself broken), then throws it.
WorkPtr post_mpi_p2p(MPI_Comm comm, std::vector<P2PItem> items, std::string what, std::chrono::milliseconds timeout,
                     std::function<void(const std::string&)> on_timeout);

// "send #3 to peer 1 (...), recv #0 from peer 2 (...)": the first `max` items' names.
std::string describe_items(const std::vector<P2PItem>& items, size_t max = 4);

}  // namespace zt::comm
