// The row splits of zerotrain's two-pass column reductions (column_sum.cu and
// layer_norm_grad.cu): pass 1 sums S row ranges of every column tile into an fp32
// workspace of S x cols (x 2 for LayerNorm's two outputs), pass 2 adds the S partials.
// Plain C++ (no CUDA): the workspace sizes in the public headers and the stubs use it too.
#pragma once
#include <algorithm>
#include <cstdint>

namespace zt::kernels {

inline constexpr int64_t kReductionMaxSplits = 128;       // S <= this
inline constexpr int64_t kReductionMinRowsPerSplit = 64;  // S <= ceil(rows / this)

// The most row splits a reduction uses for `rows` rows on any device (0 when rows <= 0).
inline int64_t reduction_max_splits(int64_t rows) {
  if (rows <= 0) return 0;
  return std::min(kReductionMaxSplits, (rows + kReductionMinRowsPerSplit - 1) / kReductionMinRowsPerSplit);
}

struct RowSplits {
  int64_t splits = 0;          // 0 when rows <= 0: pass 2 alone writes the zeros
  int64_t rows_per_split = 0;
};

// Enough splits that tiles x splits blocks reach `target_blocks` (the device's multiprocessors
// times the blocks wanted on each), at least 1, at most reduction_max_splits(rows), and no
// empty trailing split.
inline RowSplits plan_row_splits(int64_t rows, int64_t tiles, int64_t target_blocks) {
  RowSplits r;
  if (rows <= 0) return r;
  r.splits = std::clamp<int64_t>((target_blocks + tiles - 1) / tiles, 1, reduction_max_splits(rows));
  r.rows_per_split = (rows + r.splits - 1) / r.splits;
  r.splits = (rows + r.rows_per_split - 1) / r.rows_per_split;
  return r;
}

}  // namespace zt::kernels
