#include "zero/step_overlap.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <optional>
#include <tuple>

#include "zerotrain/error.h"

namespace zt::zero {

std::vector<StepSegment> plan_step_segments(const FlatLayout& layout, const std::vector<int>& slot_of, int num_units) {
  ZT_ASSERT(slot_of.size() == layout.params.size(), "plan_step_segments: ", slot_of.size(), " slots for ",
            layout.params.size(), " parameters");
  std::vector<StepSegment> segs;
  for (int b = 0; b < static_cast<int>(layout.buckets.size()); ++b) {
    const Bucket& B = layout.buckets[static_cast<size_t>(b)];
    std::vector<StepSegment> in_bucket;
    for (int li = B.first_param; li < B.first_param + B.num_params; ++li) {
      const ParamSlot& P = layout.params[static_cast<size_t>(li)];
      const int slot = slot_of[static_cast<size_t>(li)];
      ZT_ASSERT(slot >= 0 && slot <= num_units, "plan_step_segments: slot ", slot, " of ", num_units, " units");
      in_bucket.push_back({b, P.offset - B.offset, P.numel, slot});
    }
    std::sort(in_bucket.begin(), in_bucket.end(), [](const StepSegment& x, const StepSegment& y) { return x.at < y.at; });
    int64_t end = 0;
    for (const auto& sg : in_bucket) {
      ZT_ASSERT(sg.at >= end, "plan_step_segments: parameters overlap in bucket ", b);
      if (sg.at > end) segs.push_back({b, end, sg.at - end, num_units + 1});
      segs.push_back(sg);
      end = sg.at + sg.len;
    }
    if (end < B.numel) segs.push_back({b, end, B.numel - end, num_units + 1});
  }
  std::sort(segs.begin(), segs.end(), [](const StepSegment& x, const StepSegment& y) {
    return std::tie(x.slot, x.bucket, x.at) < std::tie(y.slot, y.bucket, y.at);
  });
  // Neighbours of one slot in one bucket: one launch (the kernel is elementwise).
  std::vector<StepSegment> merged;
  for (const auto& sg : segs) {
    if (!merged.empty() && merged.back().slot == sg.slot && merged.back().bucket == sg.bucket &&
        merged.back().at + merged.back().len == sg.at) {
      merged.back().len += sg.len;
    } else {
      merged.push_back(sg);
    }
  }
  return merged;
}

// See [Step Overlap] in step_overlap.h.
struct StepOverlap::Impl {
#ifdef ZT_WITH_CUDA
  c10::DeviceIndex device = 0;
  cudaStream_t raw = nullptr;
  std::optional<c10::cuda::CUDAStream> side;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> slots;  // per slot, re-recorded every step
  at::cuda::CUDAEvent last;
  c10::cuda::CUDAStream main() const { return c10::cuda::getCurrentCUDAStream(device); }
#endif
};

StepOverlap::StepOverlap(torch::Device device, int num_units) : impl_(std::make_unique<Impl>()), num_units_(num_units) {
  ZT_ASSERT(num_units >= 0, "step overlap: ", num_units, " units");
  waited_.assign(static_cast<size_t>(num_slots()), 0);
#ifdef ZT_WITH_CUDA
  ZT_ASSERT(device.is_cuda(), "step overlap on ", device.str());
  impl_->device = device.index() < 0 ? c10::cuda::current_device() : device.index();
  c10::cuda::CUDAGuard guard(impl_->device);
  int least = 0, greatest = 0;
  C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  priority_ = least;  // numerically greatest = lowest priority
  // Non-blocking: a blocking stream would synchronize with the legacy default stream,
  // which is the compute stream unless the caller set another.
  C10_CUDA_CHECK(cudaStreamCreateWithPriority(&impl_->raw, cudaStreamNonBlocking, least));
  impl_->side = c10::cuda::getStreamFromExternal(impl_->raw, impl_->device);
  for (int s = 0; s < num_slots(); ++s) impl_->slots.push_back(std::make_unique<at::cuda::CUDAEvent>());
#else
  (void)device;
  ZT_ASSERT(false, "step overlap needs a CUDA build");
#endif
}

StepOverlap::~StepOverlap() {
#ifdef ZT_WITH_CUDA
  if (impl_ && impl_->raw != nullptr) {
    // The host waits: nothing may still run on a stream that is destroyed.
    cudaStreamSynchronize(impl_->raw);
    cudaStreamDestroy(impl_->raw);
  }
#endif
}

void StepOverlap::side_waits_main() {
#ifdef ZT_WITH_CUDA
  at::cuda::CUDAEvent ready;
  ready.record(impl_->main());
  ready.block(*impl_->side);
#endif
}

void StepOverlap::begin_step() {
  side_waits_main();
  std::fill(waited_.begin(), waited_.end(), 0);
}

void StepOverlap::on_side(const std::function<void()>& fn) {
#ifdef ZT_WITH_CUDA
  c10::cuda::CUDAStreamGuard guard(*impl_->side);
  fn();
#else
  fn();
#endif
}

void StepOverlap::use(const torch::Tensor& t) {
#ifdef ZT_WITH_CUDA
  if (t.defined() && t.is_cuda()) t.record_stream(*impl_->side);
#else
  (void)t;
#endif
}

void StepOverlap::end_slot(int slot) {
  ZT_ASSERT(slot >= 0 && slot < num_slots(), "step overlap: slot ", slot);
#ifdef ZT_WITH_CUDA
  impl_->slots[static_cast<size_t>(slot)]->record(*impl_->side);
#endif
}

void StepOverlap::end_step() {
#ifdef ZT_WITH_CUDA
  impl_->last.record(*impl_->side);
#endif
  in_flight_ = true;
}

void StepOverlap::wait_slot(int slot) {
  if (!in_flight_ || waited_[static_cast<size_t>(slot)]) return;
  waited_[static_cast<size_t>(slot)] = 1;
#ifdef ZT_WITH_CUDA
  impl_->slots[static_cast<size_t>(slot)]->block(impl_->main());
#endif
}

void StepOverlap::wait_first() { wait_slot(0); }

void StepOverlap::wait_unit(int unit) {
  if (unit < 0 || unit >= num_units_) return;
  if (in_flight_ && !waited_[static_cast<size_t>(1 + unit)]) ++unit_waits_;
  wait_slot(1 + unit);
}

void StepOverlap::fence() {
  if (!in_flight_) return;
#ifdef ZT_WITH_CUDA
  impl_->last.block(impl_->main());
#endif
  in_flight_ = false;
}

}  // namespace zt::zero
