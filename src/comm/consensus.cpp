// require_consensus: see [Rank Consensus] in comm/consensus.h.
#include "comm/consensus.h"

#include <ATen/ATen.h>

#include <cstring>
#include <map>

#include "zerotrain/error.h"

namespace zt::comm {

uint64_t records_digest(const std::vector<std::string>& records) {
  uint64_t h = 14695981039346656037ull;
  auto add = [&h](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  for (const auto& r : records) {
    for (unsigned char c : r) add(c);
    add('\n');
  }
  return h;
}

namespace {

std::pair<std::string, std::string> split_record(const std::string& r) {
  const auto at = r.find(" = ");
  if (at == std::string::npos) return {r, ""};
  return {r.substr(0, at), r.substr(at + 3)};
}

std::string join(const std::vector<std::string>& records) {
  std::string s;
  for (const auto& r : records) {
    s += r;
    s += '\n';
  }
  return s;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin < s.size()) {
    const auto end = s.find('\n', begin);
    out.push_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

}  // namespace

std::string first_difference(const std::vector<std::string>& mine, const std::vector<std::string>& reference) {
  std::map<std::string, std::string> ref;
  std::vector<std::string> ref_keys;
  for (const auto& r : reference) {
    auto [k, v] = split_record(r);
    if (ref.emplace(k, v).second) ref_keys.push_back(k);
  }
  std::map<std::string, bool> seen;
  for (const auto& r : mine) {
    auto [k, v] = split_record(r);
    seen[k] = true;
    auto it = ref.find(k);
    if (it == ref.end()) return detail::cat(k, ": ", v, " here, not set on rank 0");
    if (it->second != v) return detail::cat(k, ": ", v, " here, ", it->second, " on rank 0");
  }
  for (const auto& k : ref_keys) {
    if (!seen.count(k)) return detail::cat(k, ": not set here, ", ref[k], " on rank 0");
  }
  return mine == reference ? std::string() : std::string("the same keys in another order than on rank 0");
}

void require_consensus(const GroupPtr& g, const std::vector<std::string>& records, const std::string& what,
                       const std::string& fix) {
  if (g->size() == 1) return;
  const uint64_t d = records_digest(records);
  // min and max of the digest in one all-reduce: (d, -d) reduced with min. The digest is
  // split into two 32-bit halves so that every value is exact in an int64.
  const int64_t hi = static_cast<int64_t>(d >> 32), lo = static_cast<int64_t>(d & 0xffffffffull);
  auto t = at::tensor({hi, lo, -hi, -lo}, at::kLong);
  g->all_reduce(t, ReduceOp::kMin);
  auto v = t.accessor<int64_t, 1>();
  if (v[0] == -v[2] && v[1] == -v[3]) return;  // every rank has the same digest
  // Rank 0's records to every rank.
  std::string text = g->rank() == 0 ? join(records) : std::string();
  auto len = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  g->broadcast(len, 0);
  auto bytes = at::zeros({len.item<int64_t>()}, at::kByte);
  if (g->rank() == 0) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  g->broadcast(bytes, 0);
  const std::string ref(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
  const std::string diff = first_difference(records, split_lines(ref));
  const auto failure = lowest_failure(g, diff);
  ZT_CHECK_T(!failure, ConfigError, "rank ", failure->rank, " of ", g->size(), " (", g->name(), ") disagrees with rank 0 on the ",
             what, " -- ", failure->message, ": ", fix);
  // Digests differ but no rank found a difference (a digest collision is not possible
  // with equal records): the records are equal up to order on some rank.
  ZT_CHECK_T(false, InternalError, "the ", what, " digests differ across ranks but the records agree");
}

}  // namespace zt::comm
