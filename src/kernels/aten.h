// The ATen side of zerotrain's CUDA kernels: whether a tensor can go to them, the
// kernels' dtype for an ATen dtype, and the stream they run on (the current one).
#pragma once
#include <ATen/ATen.h>

#include <utility>

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

// A norm's weight and bias gradients by layer_norm_param_grads (kernels/layer_norm_grad.h) from
// dL/dy `g` and the rows `x2` (N, C, contiguous, one dtype the kernels take, on CUDA) with their
// fp32 per-row `mean` and `rstd`: those asked for (C, x2's dtype), the others undefined. GPT-2's
// LayerNorm backward and, with a zero mean, the Llama RMSNorm's weight gradient.
std::pair<at::Tensor, at::Tensor> norm_param_grads(const at::Tensor& g, const at::Tensor& x2, const at::Tensor& mean,
                                                   const at::Tensor& rstd, bool need_w, bool need_b);

}  // namespace zt::kernels
