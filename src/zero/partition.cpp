#include "zero/partition.h"

#include <algorithm>

#include "zerotrain/error.h"

namespace zt::zero {

FlatLayout make_flat_layout(const std::vector<int64_t>& numels, int64_t bucket_numel, int world, int64_t align) {
  ZT_ASSERT(world >= 1 && align >= 1 && bucket_numel >= 1);
  FlatLayout L;
  L.world = world;
  const int64_t unit = world * align;
  int64_t offset = 0;
  size_t i = 0;
  while (i < numels.size()) {
    Bucket b;
    b.offset = offset;
    b.first_param = static_cast<int>(i);
    int64_t used = 0;
    while (i < numels.size() && (used == 0 || used + numels[i] <= bucket_numel)) {
      ZT_ASSERT(numels[i] > 0, "parameter ", i, " has no elements");
      L.params.push_back({offset + used, numels[i], static_cast<int>(L.buckets.size())});
      used += numels[i];
      ++i;
    }
    b.num_params = static_cast<int>(i) - b.first_param;
    b.numel = (used + unit - 1) / unit * unit;
    b.shard_numel = b.numel / world;
    L.shard_buffer_offsets.push_back(L.shard_numel);
    L.shard_numel += b.shard_numel;
    offset += b.numel;
    L.buckets.push_back(b);
  }
  L.total_numel = offset;
  return L;
}

FlatLayout make_unit_layout(const std::vector<std::vector<int64_t>>& units, int world, int64_t align) {
  ZT_ASSERT(world >= 1 && align >= 1);
  FlatLayout L;
  L.world = world;
  const int64_t unit = world * align;
  int64_t offset = 0;
  int first = 0;
  for (const auto& numels : units) {
    ZT_ASSERT(!numels.empty(), "gather unit ", L.buckets.size(), " has no parameters");
    Bucket b;
    b.offset = offset;
    b.first_param = first;
    b.num_params = static_cast<int>(numels.size());
    int64_t used = 0;
    for (int64_t n : numels) {
      ZT_ASSERT(n > 0, "parameter ", L.params.size(), " has no elements");
      L.params.push_back({offset + used, n, static_cast<int>(L.buckets.size())});
      used += n;
    }
    first += b.num_params;
    b.numel = (used + unit - 1) / unit * unit;
    b.shard_numel = b.numel / world;
    L.shard_buffer_offsets.push_back(L.shard_numel);
    L.shard_numel += b.shard_numel;
    offset += b.numel;
    L.buckets.push_back(b);
  }
  L.total_numel = offset;
  return L;
}

Range intersect(Range a, Range b) {
  Range r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

}  // namespace zt::zero
