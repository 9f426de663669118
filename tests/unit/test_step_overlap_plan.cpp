// [Step Overlap] (src/zero/step_overlap.h): the launch order of the side-stream step,
// plan_step_segments. Pure arithmetic over the flat layout, so checked on the CPU: every
// element of every bucket exactly once, each in its parameter's slot (padding last), the
// slots in forward order, neighbours merged. The stream side is tests/gpu/test_step_overlap_gpu.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "zero/partition.h"
#include "zero/step_overlap.h"

namespace zt::zero {
namespace {

struct PlanCase {
  std::vector<int64_t> numels;  // layout order
  std::vector<int> slot_of;     // layout index -> slot (0: no unit, 1 + u: unit u)
  int num_units;
  int64_t bucket_numel;
};

TEST(StepOverlapPlan, EveryElementOnceInItsSlotInForwardOrder) {
  const std::vector<PlanCase> cases = {
      // Reverse registration order as the engine lays it out: head/norm (no unit), units 2,
      // 1, 0 (two parameters each), the embedding (no unit); several buckets.
      {{100, 7, 30, 30, 50, 50, 64, 64, 200}, {0, 0, 3, 3, 2, 2, 1, 1, 0}, 3, 120},
      {{100, 7, 30, 30, 50, 50, 64, 64, 200}, {0, 0, 3, 3, 2, 2, 1, 1, 0}, 3, 1 << 20},  // one bucket
      {{5}, {1}, 1, 1},                                                                  // one tiny unit
      {{33, 65, 17}, {0, 0, 0}, 2, 40},  // units without parameters (a LoRA layer without adapters)
  };
  for (const auto& c : cases) {
    const FlatLayout L = make_flat_layout(c.numels, c.bucket_numel, /*world=*/1, /*align=*/64);
    const auto segs = plan_step_segments(L, c.slot_of, c.num_units);
    // The slot each element must be in.
    std::vector<int> want(static_cast<size_t>(L.total_numel), c.num_units + 1);
    for (size_t i = 0; i < L.params.size(); ++i) {
      for (int64_t e = 0; e < L.params[i].numel; ++e) want[static_cast<size_t>(L.params[i].offset + e)] = c.slot_of[i];
    }
    std::vector<int> seen(static_cast<size_t>(L.total_numel), 0);
    int last_slot = 0;
    for (size_t k = 0; k < segs.size(); ++k) {
      const auto& s = segs[k];
      ASSERT_GE(s.slot, last_slot) << "segment " << k << ": slots out of forward order";
      last_slot = s.slot;
      ASSERT_GE(s.at, 0);
      ASSERT_GT(s.len, 0);
      const Bucket& B = L.buckets[static_cast<size_t>(s.bucket)];
      ASSERT_LE(s.at + s.len, B.numel) << "segment " << k << " leaves bucket " << s.bucket;
      for (int64_t e = 0; e < s.len; ++e) {
        const auto flat = static_cast<size_t>(B.offset + s.at + e);
        ++seen[flat];
        ASSERT_EQ(want[flat], s.slot) << "element " << flat << " in the wrong slot";
      }
      if (k > 0) {
        const auto& p = segs[k - 1];
        EXPECT_FALSE(p.slot == s.slot && p.bucket == s.bucket && p.at + p.len == s.at)
            << "segments " << k - 1 << " and " << k << " should be one launch";
      }
    }
    for (size_t e = 0; e < seen.size(); ++e) ASSERT_EQ(seen[e], 1) << "element " << e;
  }
}

TEST(StepOverlapPlan, RejectsASlotBeyondTheUnits) {
  const FlatLayout L = make_flat_layout({10, 10}, 100, 1, 64);
  EXPECT_THROW(plan_step_segments(L, {0, 3}, 2), InternalError);
  EXPECT_THROW(plan_step_segments(L, {0}, 2), InternalError);
}

}  // namespace
}  // namespace zt::zero
