// Partition math (src/zero/partition.h): layouts every rank must agree on.
#include <gtest/gtest.h>

#include "zero/partition.h"
#include "zerotrain/error.h"

namespace zt_test_partition {

namespace {
using zt::zero::FlatLayout;

// Invariants of any layout: buckets tile the buffer, are padded to world*align and split
// evenly; parameters lie inside their bucket without overlapping.
void check_layout(const FlatLayout& L, int world, int64_t align) {
  int64_t offset = 0, shard = 0;
  for (size_t b = 0; b < L.buckets.size(); ++b) {
    const auto& B = L.buckets[b];
    EXPECT_EQ(B.offset, offset);
    EXPECT_EQ(B.numel % (world * align), 0);
    EXPECT_EQ(B.shard_numel * world, B.numel);
    EXPECT_EQ(L.shard_buffer_offsets[b], shard);
    int64_t end = B.offset;
    for (int k = 0; k < B.num_params; ++k) {
      const auto& p = L.params[B.first_param + k];
      EXPECT_EQ(p.bucket, static_cast<int>(b));
      EXPECT_EQ(p.offset, end);
      end += p.numel;
    }
    EXPECT_LE(end, B.offset + B.numel);
    EXPECT_LT(B.offset + B.numel - end, world * align);  // padding below one alignment unit
    offset += B.numel;
    shard += B.shard_numel;
  }
  EXPECT_EQ(L.total_numel, offset);
  EXPECT_EQ(L.shard_numel, shard);
}

TEST(Partition, FlatLayoutGroupsParametersIntoBuckets) {
  auto L = zt::zero::make_flat_layout({100, 50, 300, 7, 7}, 120, 4, 8);
  check_layout(L, 4, 8);
  // {100}, {50}, {300}, {7, 7}: a parameter never straddles buckets; one larger than the
  // bucket size gets a bucket of its own.
  ASSERT_EQ(L.buckets.size(), 4u);
  EXPECT_EQ(L.buckets[0].num_params, 1);
  EXPECT_EQ(L.buckets[2].num_params, 1);
  EXPECT_EQ(L.buckets[2].numel, 320);
  EXPECT_EQ(L.buckets[3].num_params, 2);
}

TEST(Partition, UnitLayoutMakesOneBucketPerUnit) {
  for (int world : {1, 2, 3, 4}) {
    auto L = zt::zero::make_unit_layout({{10, 20}, {5}, {1000, 1, 1}}, world, 64);
    check_layout(L, world, 64);
    ASSERT_EQ(L.buckets.size(), 3u);
    EXPECT_EQ(L.buckets[0].num_params, 2);
    EXPECT_EQ(L.buckets[1].num_params, 1);
    EXPECT_EQ(L.buckets[2].num_params, 3);
    EXPECT_EQ(L.buckets[2].numel, (1002 + 64 * world - 1) / (64 * world) * (64 * world));
  }
  EXPECT_THROW(zt::zero::make_unit_layout({{10}, {}}, 2, 64), zt::InternalError);
}

}  // namespace

}  // namespace zt_test_partition
