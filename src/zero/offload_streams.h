// The CUDA copy streams of ZeRO-Offload (ZeroOptimizer::streams_), shared by the CPU path
// (zero_offload.cpp) and the NVMe path (zero_offload_nvme.cpp). Internal.
#pragma once
#ifdef ZT_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include <memory>

namespace zt::zero {

struct CopyStreams {
  c10::cuda::CUDAStream d2h;  // gradients to the host during backward
  c10::cuda::CUDAStream h2d;  // updated compute-dtype shards to the device during the step
};
inline CopyStreams* copy_streams(const std::shared_ptr<void>& s) { return static_cast<CopyStreams*>(s.get()); }

}  // namespace zt::zero
#endif
