// A swap file's owner with one CUDA event per staging buffer, shared by the NVMe step
// backend (step_nvme.cpp: the optimizer state) and ZeroOptimizer's parameter file
// (zero_offload_nvme.cpp, offload_param nvme). Internal.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "log/log.h"
#include "zero/agree.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::zero {

// A swap file's owner (the optimizer state, or the parameter file) and one CUDA event per
// staging buffer: the last upload from it, which the reuse fence waits for.
template <class State>
struct SwapWithEvents {
#ifdef ZT_WITH_CUDA
  std::vector<at::cuda::CUDAEvent> uploaded;
#endif
  // After the events: its destructor runs the reuse fence, which waits on them.
  std::unique_ptr<State> state;
};

// Creates a swap file's owner with make() on every rank (agree: one rank's failure stops
// all) with the rank's device current, so that cudaHostRegister of its buffers lands in
// this rank's context; then sets its reuse fence to wait for the buffer's last upload.
template <class S, class Make>
std::shared_ptr<S> make_swap(const comm::GroupPtr& g, c10::Device device, Make make) {
  auto s = std::make_shared<S>();
  agree<Error>(g, [&] {
#ifdef ZT_WITH_CUDA
    std::optional<c10::cuda::CUDAGuard> guard;
    if (device.is_cuda()) guard.emplace(device);
#endif
    s->state = make();
  });
#ifdef ZT_WITH_CUDA
  if (device.is_cuda()) {
    s->uploaded.resize(static_cast<size_t>(s->state->num_buffers()));
    S* raw = s.get();
    s->state->set_reuse_fence([raw](int k) { raw->uploaded[k].synchronize(); });
  }
#else
  (void)device;
#endif
  return s;
}

// aio's lines: held while the swap file is created, then printed (see NvmeStep), then
// printed as they come (e.g. a swap file that cannot be removed at the end).
struct SwapLogSink {
  int rank = 0;
  bool hold = true;
  std::vector<std::string> held;
  // Info, or warn for a rank's fallback (other ranks' info lines are not printed).
  void print(const std::string& line, log::Level level = log::Level::kWarn) const { log::write(level, line); }
};

}  // namespace zt::zero
