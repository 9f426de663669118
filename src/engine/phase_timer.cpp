#include "engine/phase_timer.h"

#ifdef ZT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt {

PhaseTimer::PhaseTimer(torch::Device device) : device_(device) {}

void PhaseTimer::begin() {
#ifdef ZT_WITH_CUDA
  if (device_.is_cuda()) {
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
  }
#endif
  start_ = std::chrono::steady_clock::now();
}

PhaseStats PhaseTimer::end() {
  PhaseStats s;
#ifdef ZT_WITH_CUDA
  if (device_.is_cuda()) {
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    const auto& a = st.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    s.mem_after = a.current;
    s.mem_peak = a.peak;
  }
#endif
  if (!device_.is_cuda()) s.mem_after = s.mem_peak = cpu_bytes_;
  s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  return s;
}

}  // namespace zt
