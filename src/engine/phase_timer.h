// Times one phase (forward, backward, step) and reads its memory. CUDA: the phase ends
// with an event synchronize (like DeepSpeed's wall_clock_breakdown timers), memory is
// the caching allocator's allocated bytes (after the phase, and the peak during it).
// CPU: wall time; memory is what the caller accounts (set_cpu_bytes).
#pragma once
#include <torch/types.h>

#include <chrono>
#include <cstdint>

#include "zerotrain/engine.h"

namespace zt {

class PhaseTimer {
 public:
  explicit PhaseTimer(torch::Device device);
  void begin();
  PhaseStats end();
  void set_cpu_bytes(int64_t b) { cpu_bytes_ = b; }

 private:
  torch::Device device_;
  std::chrono::steady_clock::time_point start_;
  int64_t cpu_bytes_ = 0;
};

}  // namespace zt
