#include "kernels/aten.h"

#include <stdexcept>
#include <string>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace zt::kernels {

bool dtype_supported(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

bool runs_on(const at::Tensor& t) { return kernels_available() && t.is_cuda() && dtype_supported(t.scalar_type()); }

DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kF32;
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    default: throw std::invalid_argument(std::string("zerotrain's kernels take fp32, bf16 or fp16, not ") + c10::toString(t));
  }
}

cudaStream_t current_stream(c10::Device device) {
#ifdef ZT_WITH_CUDA
  return at::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
  return nullptr;
#endif
}

}  // namespace zt::kernels
