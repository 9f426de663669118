// The activation bytes a training forward (loss) of GPT2TP keeps for backward on this rank,
// counted by a wrapping CPU allocator (support/cpu_byte_counter.h): live bytes after the
// forward minus before, on a random batch (tokens from generator seed 5, the model from
// `seed`). Used by the sequence-parallel and Korthikanti checks in tests/dist. Header-only.
#pragma once
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>

#include "models/gpt2.h"
#include "models/gpt2_tp.h"
#include "support/cpu_byte_counter.h"
#include "zerotrain/comm.h"

namespace zt::test_support {

inline int64_t gpt2_tp_activation_bytes(const models::GPT2Config& cfg, const comm::GroupPtr& tp,
                                        bool sequence_parallel, int64_t batch, int64_t seq, uint64_t seed) {
  static CpuByteCounter counter;  // outlives every tensor it allocated
  torch::manual_seed(seed);
  models::GPT2TP m(cfg, tp, sequence_parallel);
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto idx = at::randint(0, cfg.vocab_size, {batch, seq + 1}, g);
  const auto x = idx.narrow(1, 0, seq).contiguous(), y = idx.narrow(1, 1, seq).contiguous();
  int64_t held = 0;
  {
    CpuByteCounter::Scope scope(counter);
    const int64_t before = counter.live();
    auto loss = m->loss(x, y);
    held = counter.live() - before;
    loss.backward();  // frees the graph inside the scope, so the counter sees it go
  }
  return held;
}

}  // namespace zt::test_support
