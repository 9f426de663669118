// Helpers the pipeline and tensor-parallel tests (tests/dist/test_pipeline*.cpp,
// test_tensor_parallel.cpp, test_tp_zero3.cpp) share: the world group with the tests'
// timeout, groups of consecutive ranks, token micro-batches from one seed, the tensor-parallel
// tests' global batch, and the mean of the data-parallel ranks' losses. Header-only; inline in
// namespace zt::test_support.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <utility>

#include "zerotrain/comm.h"

namespace zt::test_support {

// The world group; its collectives' timeout is 120 s unless ZT_COMM_TIMEOUT sets one.
inline comm::GroupPtr pipe_test_world() {
  comm::GroupPtr g = comm::world_group();
  if (std::getenv("ZT_COMM_TIMEOUT") == nullptr) g->set_timeout(std::chrono::seconds(120));
  return g;
}

// The ranks of one copy of a case: groups of `n` consecutive world ranks (collective).
inline comm::GroupPtr consecutive_ranks(int n) {
  auto w = pipe_test_world();
  return w->split(w->rank() / n, w->rank() % n);
}

// A (micro, seq) micro-batch of token ids below `vocab` from generator seed `seed`: ids are
// the first seq tokens of a (micro, seq + 1) draw, targets the last seq (the next token);
// `ignore_first` (e.g. -100) replaces each sample's first target when set.
inline std::pair<torch::Tensor, torch::Tensor> seeded_tokens(uint64_t seed, int64_t micro, int64_t seq, int64_t vocab,
                                                             std::optional<int64_t> ignore_first = std::nullopt) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto s = torch::randint(0, vocab, {micro, seq + 1}, gen, torch::kLong);
  auto targets = s.narrow(1, 1, seq).contiguous();
  if (ignore_first) targets.select(1, 0).fill_(*ignore_first);
  return {s.narrow(1, 0, seq).contiguous(), targets};
}

// The tensor-parallel tests' global batch (`global` rows of seq tokens, seed 1000, the same
// every step): the first three targets of the first sample of every micro-batch of `micro`
// rows are `ignore`, so every dp rank counts as many targets and the mean of the dp ranks'
// means is the global batch's mean.
inline std::pair<torch::Tensor, torch::Tensor> tp_global_batch(int64_t global, int64_t micro, int64_t seq,
                                                               int64_t vocab, int64_t ignore) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(1000);
  auto idx = at::randint(0, vocab, {global, seq + 1}, g);
  auto x = idx.narrow(1, 0, seq).contiguous();
  auto y = idx.narrow(1, 1, seq).contiguous();
  for (int64_t i = 0; i < global; i += micro) y.index_put_({i, torch::indexing::Slice(0, 3)}, ignore);
  return {x, y};
}

// The global batch's loss from each dp rank's loss over its equal-sized micro-batch: the
// dp ranks' mean (collective over `dp`).
inline double dp_mean_loss(const comm::GroupPtr& dp, double loss) {
  auto l = torch::tensor({loss}, torch::kDouble);
  dp->all_reduce(l, comm::ReduceOp::kAvg);
  return l.item<double>();
}

}  // namespace zt::test_support
