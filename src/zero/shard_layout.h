// ShardLayout: one rank's view of a shard group's FlatLayout (src/zero/partition.h) --
// which elements it owns and the tensor views every ZeRO part takes of the flat, shard
// and owned buffers. Part (a) of "ZeRO as parts" (docs/zero-parts.md). Plain data and
// arithmetic: no state beyond the layout, no communication, no allocation.
//
// Buffers (Ψ = the layout's total_numel, N = world):
//   flat   (Ψ)    every element of every bucket, e.g. the compute-dtype parameters
//   shard  (Ψ/N)  rank r's shard of every bucket, concatenated (shard_buffer_offsets)
//   owned         what this rank updates: the flat buffer when it owns everything
//                 (stage 0: every rank updates all elements), else the shard buffer
#pragma once
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <functional>

#include "zero/partition.h"

namespace zt::zero {

struct ShardLayout {
  FlatLayout flat;
  int rank = 0;
  bool owns_all = true;  // stage 0: this rank owns (updates) every element

  int num_buckets() const { return static_cast<int>(flat.buckets.size()); }
  // Elements of the owned buffer.
  int64_t owned_numel() const { return owns_all ? flat.total_numel : flat.shard_numel; }
  // Bucket b's owned part: its first element in the owned buffer, its size, and its
  // range in flat coordinates.
  int64_t owned_begin(int b) const { return owns_all ? flat.buckets[b].offset : flat.shard_buffer_offsets[b]; }
  int64_t owned_bucket_numel(int b) const {
    return owns_all ? flat.buckets[b].numel : flat.buckets[b].shard_numel;
  }
  Range owned_flat_range(int b) const {
    const Bucket& B = flat.buckets[b];
    const int64_t lo = owns_all ? B.offset : B.shard_offset(rank);
    return {lo, lo + owned_bucket_numel(b)};
  }
  // The largest bucket's owned part (at least 1).
  int64_t max_owned_numel() const {
    int64_t m = 1;
    for (int b = 0; b < num_buckets(); ++b) m = std::max(m, owned_bucket_numel(b));
    return m;
  }

  // Views (no copies) of bucket b: all of it in a flat buffer; this rank's shard inside
  // a flat buffer; its owned part inside an owned buffer; its owned part inside a flat
  // buffer (the bucket at stage 0, the shard otherwise).
  torch::Tensor bucket_view(const torch::Tensor& t, int b) const {
    const Bucket& B = flat.buckets[b];
    return t.narrow(0, B.offset, B.numel);
  }
  torch::Tensor shard_view(const torch::Tensor& t, int b) const {
    const Bucket& B = flat.buckets[b];
    return t.narrow(0, B.shard_offset(rank), B.shard_numel);
  }
  torch::Tensor owned_view(const torch::Tensor& owned, int b) const {
    return owned.narrow(0, owned_begin(b), owned_bucket_numel(b));
  }
  torch::Tensor owned_in_flat(const torch::Tensor& t, int b) const {
    return owns_all ? bucket_view(t, b) : shard_view(t, b);
  }
  // Parameter i's elements (layout index) in a flat buffer.
  torch::Tensor param_view(const torch::Tensor& t, int i) const {
    return t.narrow(0, flat.params[i].offset, flat.params[i].numel);
  }

  // The buckets' parts of owned elements [begin, begin + n): fn(bucket, offset in the
  // range, offset in the bucket's owned part, length), in bucket order.
  void owned_pieces(int64_t begin, int64_t n,
                    const std::function<void(int b, int64_t at, int64_t in_bucket, int64_t len)>& fn) const {
    for (int b = 0; b < num_buckets(); ++b) {
      const int64_t ob = owned_begin(b);
      const Range r = intersect({begin, begin + n}, {ob, ob + owned_bucket_numel(b)});
      if (r.size() > 0) fn(b, r.begin - begin, r.begin - ob, r.size());
    }
  }
};

}  // namespace zt::zero
