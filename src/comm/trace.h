// [Comm Trace] A debug record of the operations this process issues on its Groups, in
// issue order: one entry per collective, barrier and point-to-point batch. Private to
// src (tests and diagnosis): off by default, one relaxed atomic load per operation then.
//
// Under NCCL, ranks must issue the operations of different communicators in a consistent
// order (a rank that blocks, or a kernel that waits, for an operation its peer has not
// issued deadlocks where MPI would not). Two data-parallel replicas of one pipeline stage
// run the same program and create their groups in the same order, so their traces --
// groups numbered by first appearance -- must be identical; the pipeline's CPU test compares them
// (tests/dist/test_pipeline_comm_order.cpp, issue 25).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zt::comm {

struct TraceEntry {
  std::string group;  // the Group's name (not unique: split groups of two kinds can share one)
  int64_t group_id = 0;  // the Group's number in this process's creation order (unique)
  std::string op;     // "all_reduce", "reduce_scatter", ..., "barrier", "p2p[s1,r0]" (sends to / receives from peer)
  int64_t bytes = 0;  // the input's bytes (a p2p batch: the sum over its ops)
  bool cuda = false;
};

// Starts recording (clearing what was recorded) or stops it. Any thread.
void trace_enable(bool on);
// The entries recorded since trace_enable(true), in issue order; clears them.
std::vector<TraceEntry> trace_take();

}  // namespace zt::comm
