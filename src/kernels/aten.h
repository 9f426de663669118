// The ATen side of zerotrain's CUDA kernels: whether a tensor can go to them, the
// kernels' dtype for an ATen dtype, and the stream they run on (the current one).
#pragma once
#include <ATen/ATen.h>

#include "kernels/fused_adam.h"  // DType, cudaStream_t, kernels_available

namespace zt::kernels {

// fp32, bf16 and fp16: the dtypes every kernel takes.
bool dtype_supported(at::ScalarType t);
// A build with the kernels, a CUDA tensor, a supported dtype.
bool runs_on(const at::Tensor& t);
// kF32 / kBF16 / kF16; throws std::invalid_argument for any other dtype.
DType dtype_of(at::ScalarType t);
// The current CUDA stream of `device` (nullptr in a build without CUDA).
cudaStream_t current_stream(c10::Device device);

}  // namespace zt::kernels
