// lowest_failure: a rank's local error made collective (see zerotrain/comm.h).
#include <ATen/ATen.h>

#include <cstring>

#include "zerotrain/comm.h"

namespace zt::comm {

std::optional<RankFailure> lowest_failure(const GroupPtr& g, const std::string& error) {
  if (g->size() == 1) {
    if (error.empty()) return std::nullopt;
    return RankFailure{0, error};
  }
  auto flag = at::full({1}, error.empty() ? g->size() : g->rank(), at::kLong);
  g->all_reduce(flag, ReduceOp::kMin);
  const int root = static_cast<int>(flag.item<int64_t>());
  if (root == g->size()) return std::nullopt;
  auto len = at::full({1}, static_cast<int64_t>(error.size()), at::kLong);
  g->broadcast(len, root);
  auto bytes = at::zeros({len.item<int64_t>()}, at::kByte);
  if (g->rank() == root) std::memcpy(bytes.data_ptr(), error.data(), error.size());
  g->broadcast(bytes, root);
  return RankFailure{root, std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()))};
}

}  // namespace zt::comm
