// Times one phase (forward, backward, step) and reads its memory without stopping the
// CPU. CUDA: a phase is a DeviceSpan (two timing events on the compute stream, read once
// they have completed); memory is the caching allocator's allocated bytes (after the
// phase, and the peak during it), which the allocator keeps on the CPU's timeline and
// needs no synchronization. CPU: wall time; memory is what the caller accounts
// (set_cpu_bytes).
#pragma once
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>

#include "zerotrain/report.h"

namespace zt {

// A stretch of work on the current stream of `device`, measured where it runs: CUDA
// records an event at start() and at stop() and ms() reads the elapsed time between
// them (waiting for the stop event if the GPU has not reached it yet); on the CPU it is
// the wall time between the two calls. Copies share the same events.
class DeviceSpan {
 public:
  DeviceSpan() = default;
  static DeviceSpan start(torch::Device device);
  void stop();
  bool valid() const { return impl_ != nullptr; }
  // Whether ms() can answer without waiting.
  bool ready() const;
  double ms() const;
  // Blocks until the GPU reached stop() (no-op on the CPU).
  void wait() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// One phase as recorded: memory is known at once, time once the span completes.
struct PendingPhase {
  PhaseStats stats;  // ms filled by resolve()
  DeviceSpan span;
  PhaseStats resolve() const {
    PhaseStats s = stats;
    if (span.valid()) s.ms = span.ms();
    return s;
  }
};

class PhaseTimer {
 public:
  explicit PhaseTimer(torch::Device device);
  void begin();
  PendingPhase end();
  void set_cpu_bytes(int64_t b) { cpu_bytes_ = b; }

 private:
  torch::Device device_;
  DeviceSpan span_;
  int64_t cpu_bytes_ = 0;
};

}  // namespace zt
