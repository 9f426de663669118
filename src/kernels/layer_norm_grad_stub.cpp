// Stand-in for the CUDA kernel of layer_norm_grad.cu in builds where nvcc did not compile
// it (no CUDA compiler, or a CPU-only build): CMake defines ZT_WITH_KERNELS=1 for the whole
// library exactly when it compiles the .cu, and this file is then empty. (Kept apart from
// kernels_stub.cpp; kernels_available() is defined there.)
#include "kernels/layer_norm_grad.h"

#ifndef ZT_WITH_KERNELS

#include <stdexcept>

namespace zt::kernels {

// layer_norm_param_grad_workspace_floats() is inline in layer_norm_grad.h (plain host
// math): no stand-in.
void layer_norm_param_grads(const LayerNormParamGradArgs& /*a*/, cudaStream_t /*stream*/) {
  throw std::runtime_error("zerotrain was built without its CUDA kernels");
}

}  // namespace zt::kernels

#endif  // ZT_WITH_KERNELS
