// Ranks that must agree on a description -- the resolved config, the model's parameter
// shapes, the data settings -- check it before their first collective, so a rank started
// differently is named instead of ending in a mismatched collective (MPI_ERR_TRUNCATE,
// a hang) or, worse, in a run that trains with mixed hyperparameters.
//
// [Rank Consensus]
//  * Each rank describes itself as ordered records "key = value". One all-reduce of a
//    64-bit digest (min and max) decides whether all agree: the cost when they do.
//  * On a difference rank 0's records are broadcast; every rank compares its own with
//    them and reports the first key that differs (or that one side lacks). The lowest
//    rank that differs is named on every rank, with its value and rank 0's
//    (comm::lowest_failure), and every rank throws ConfigError: none goes on alone.
#pragma once
#include <string>
#include <vector>

#include "zerotrain/comm.h"

namespace zt::comm {

// Collective over g. `what` names the description ("config", "model"), `fix` says what to
// do ("start every rank with the same config file and flags").
void require_consensus(const GroupPtr& g, const std::vector<std::string>& records, const std::string& what,
                       const std::string& fix);

// The 64-bit FNV-1a digest of the records (each followed by a newline).
uint64_t records_digest(const std::vector<std::string>& records);

// The first difference between two record lists: "key: A here, B on rank 0" style text
// from `mine` and `reference`, or "" when they are equal. Keys are what precedes " = ".
std::string first_difference(const std::vector<std::string>& mine, const std::vector<std::string>& reference);

}  // namespace zt::comm
