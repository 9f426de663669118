// Stand-in for the CUDA kernel of nf4.cu in builds where nvcc did not compile it (no CUDA
// compiler, or a CPU-only build): CMake defines ZT_WITH_KERNELS=1 for the whole library
// exactly when it compiles the .cu, and this file is then empty. (Kept apart from
// kernels_stub.cpp; kernels_available() is defined there.)
#include "kernels/nf4.h"

#ifndef ZT_WITH_KERNELS

#include <stdexcept>

namespace zt::kernels {

void nf4_dequantize(const Nf4DequantArgs& /*a*/, cudaStream_t /*stream*/) {
  throw std::runtime_error("zerotrain was built without its CUDA kernels");
}

}  // namespace zt::kernels

#endif  // ZT_WITH_KERNELS
