// Helpers of the offload set-up shared by the step backends (step_cpu_adam.cpp,
// step_nvme.cpp) and ZeroOptimizer (zero_optimizer.cpp, zero_offload_nvme.cpp): one
// decision on every rank, and byte counts for messages.
#pragma once
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::zero {

// Runs fn on every rank of g. When any rank threw, every rank throws: a failing rank its
// own exception, the others an E naming the lowest failing rank and its message, so no
// rank goes on into a collective that a failed rank never joins.
template <class E>
void agree(const comm::GroupPtr& g, const std::function<void()>& fn) {
  std::string err;
  std::exception_ptr mine;
  try {
    fn();
  } catch (const std::exception& e) {
    mine = std::current_exception();
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  const auto failure = comm::lowest_failure(g, err);
  if (failure && !mine) throw E(detail::cat("rank ", failure->rank, " failed: ", failure->message));
  if (mine) std::rethrow_exception(mine);
}

// "1.50 GiB", "12.0 MiB", "3.0 KiB".
inline std::string bytes_text(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  } else if (b >= 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  }
  return buf;
}

}  // namespace zt::zero
