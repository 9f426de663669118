// The CUDA copy streams of ZeRO-Offload (CpuAdamStep::streams_), shared by the CPU path
// (step_cpu_adam.cpp) and the NVMe path (step_nvme.cpp). Internal.
#pragma once
#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>

namespace zt::zero {

struct CopyStreams {
  c10::cuda::CUDAStream d2h;  // gradients to the host during backward
  c10::cuda::CUDAStream h2d;  // updated compute-dtype shards to the device during the step
};
inline CopyStreams* copy_streams(const std::shared_ptr<void>& s) { return static_cast<CopyStreams*>(s.get()); }

// The end of an offloaded step: the compute stream of `device` (all-gather, next forward)
// waits for the uploads on h2d; the host does not.
inline void compute_waits_for_uploads(const CopyStreams& cs, c10::DeviceIndex device) {
  at::cuda::CUDAEvent done;
  done.record(cs.h2d);
  done.block(c10::cuda::getCurrentCUDAStream(device));
}

}  // namespace zt::zero
#endif
