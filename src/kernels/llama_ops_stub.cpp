// Stand-in for the CUDA kernels of llama_ops.cu in builds where nvcc did not compile them
// (no CUDA compiler, or a CPU-only build): CMake defines ZT_WITH_KERNELS=1 for the whole
// library exactly when it compiles the .cu, and this file is then empty.
#include "kernels/llama_ops.h"

#ifndef ZT_WITH_KERNELS

#include <stdexcept>

namespace zt::kernels {

namespace {
[[noreturn]] void no_kernels() { throw std::runtime_error("zerotrain was built without its CUDA kernels"); }
}  // namespace

void rms_norm_forward(const RmsNormArgs& /*a*/, cudaStream_t /*stream*/) { no_kernels(); }
void rms_norm_backward_input(const RmsNormGradArgs& /*a*/, cudaStream_t /*stream*/) { no_kernels(); }
void rope(const RopeArgs& /*a*/, cudaStream_t /*stream*/) { no_kernels(); }
void swiglu_forward(const SwigluArgs& /*a*/, cudaStream_t /*stream*/) { no_kernels(); }
void swiglu_backward(const SwigluArgs& /*a*/, cudaStream_t /*stream*/) { no_kernels(); }
void add_scaled(const AddScaledArgs& /*a*/, cudaStream_t /*stream*/) { no_kernels(); }

}  // namespace zt::kernels

#endif  // ZT_WITH_KERNELS
