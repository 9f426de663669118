#include "common/phase_timer.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt {

struct DeviceSpan::Impl {
  torch::Device device{torch::kCPU};
  std::chrono::steady_clock::time_point t0, t1;
  bool stopped = false;
#ifdef ZT_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> e0, e1;
#endif
};

DeviceSpan DeviceSpan::start(torch::Device device) {
  DeviceSpan s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->device = device;
#ifdef ZT_WITH_CUDA
  if (device.is_cuda()) {
    s.impl_->e0 = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    s.impl_->e0->record(c10::cuda::getCurrentCUDAStream(device.index()));
  }
#endif
  s.impl_->t0 = std::chrono::steady_clock::now();
  return s;
}

void DeviceSpan::stop() {
  if (!impl_) return;
#ifdef ZT_WITH_CUDA
  if (impl_->device.is_cuda()) {
    impl_->e1 = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    impl_->e1->record(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
  }
#endif
  impl_->t1 = std::chrono::steady_clock::now();
  impl_->stopped = true;
}

bool DeviceSpan::ready() const {
  if (!impl_ || !impl_->stopped) return false;
#ifdef ZT_WITH_CUDA
  if (impl_->e1) return impl_->e1->query();
#endif
  return true;
}

void DeviceSpan::wait() const {
#ifdef ZT_WITH_CUDA
  if (impl_ && impl_->e1) impl_->e1->synchronize();
#endif
}

double DeviceSpan::ms() const {
  if (!impl_ || !impl_->stopped) return 0;
#ifdef ZT_WITH_CUDA
  if (impl_->e1) {
    impl_->e1->synchronize();
    return impl_->e0->elapsed_time(*impl_->e1);
  }
#endif
  return std::chrono::duration<double, std::milli>(impl_->t1 - impl_->t0).count();
}

PhaseTimer::PhaseTimer(torch::Device device) : device_(device) {}

void PhaseTimer::begin() {
#ifdef ZT_WITH_CUDA
  if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
#endif
  span_ = DeviceSpan::start(device_);
}

PendingPhase PhaseTimer::end() {
  PendingPhase p;
  span_.stop();
  p.span = span_;
  span_ = DeviceSpan();
#ifdef ZT_WITH_CUDA
  if (device_.is_cuda()) {
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    const auto& a = st.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    p.stats.mem_after = a.current;
    p.stats.mem_peak = a.peak;
  }
#endif
  if (!device_.is_cuda()) p.stats.mem_after = p.stats.mem_peak = cpu_bytes_;
  return p;
}

}  // namespace zt
