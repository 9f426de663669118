// Partition math: pure functions from parameter sizes, world size and bucket size to
// the flat layout every rank agrees on. No tensors, no communication.
//
// Layout. Parameters are laid out in the order given (the engine passes them in reverse
// registration order, the order their gradients become ready in backward) and grouped
// into buckets of at least `bucket_numel` elements (a parameter is never split across
// buckets). Each bucket is padded to a multiple of world * align elements and split into
// `world` equal, contiguous shards: rank r owns shard r of every bucket. A bucket is the
// unit of gradient reduction (all-reduce / reduce-scatter) and of the post-step
// all-gather, so every collective is one contiguous, equally split buffer.
#pragma once
#include <cstdint>
#include <vector>

namespace zt::zero {

struct ParamSlot {
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
  int bucket = 0;
};

struct Bucket {
  int64_t offset = 0;       // first element in the flat buffer
  int64_t numel = 0;        // padded size, a multiple of world * align
  int64_t shard_numel = 0;  // numel / world
  int first_param = 0;      // params [first_param, first_param + num_params) live here
  int num_params = 0;
  // Start of rank r's shard in the flat buffer.
  int64_t shard_offset(int rank) const { return offset + rank * shard_numel; }
};

struct FlatLayout {
  std::vector<ParamSlot> params;  // in layout order
  std::vector<Bucket> buckets;
  int64_t total_numel = 0;        // padded, = sum of bucket numel
  int64_t shard_numel = 0;        // per rank, = sum of bucket shard_numel
  int world = 1;
  // Where bucket b's shard starts inside a rank's contiguous shard buffer.
  std::vector<int64_t> shard_buffer_offsets;
};

// numels: element count of each parameter in layout order (each > 0). bucket_numel >= 1,
// world >= 1, align >= 1. Throws zt::InternalError on invalid input.
FlatLayout make_flat_layout(const std::vector<int64_t>& numels, int64_t bucket_numel, int world, int64_t align);

// ZeRO-3 layout: each group of parameters (a gather unit) is one bucket, whatever its
// size, so a unit is gathered and reduced with one collective. numels[u] lists unit u's
// parameter sizes; every unit has at least one parameter.
FlatLayout make_unit_layout(const std::vector<std::vector<int64_t>>& units, int world, int64_t align);

// The part of [begin, end) that lies in [lo, hi), as {begin, end} (empty: begin == end).
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};
Range intersect(Range a, Range b);

}  // namespace zt::zero
