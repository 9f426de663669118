// Stand-ins for the CUDA kernels of fused_adam.cu, softmax_xent.cu and column_sum.cu in builds where
// nvcc did not compile them (no CUDA compiler, or a CPU-only build): CMake defines ZT_WITH_KERNELS=1 for the
// whole library exactly when it compiles the .cu, and this file is then empty.
#include "kernels/column_sum.h"
#include "kernels/fused_adam.h"
#include "kernels/softmax_xent.h"

#ifndef ZT_WITH_KERNELS

#include <stdexcept>

namespace zt::kernels {

bool kernels_available() { return false; }

void fused_adam(const AdamArgs& /*a*/, cudaStream_t /*stream*/) {
  throw std::runtime_error("zerotrain was built without its CUDA kernels");
}

void softmax_xent(const SoftmaxXentArgs& /*a*/, cudaStream_t /*stream*/) {
  throw std::runtime_error("zerotrain was built without its CUDA kernels");
}

// column_sum_workspace_floats() is inline in column_sum.h (plain host math): no stand-in.
void column_sum(const ColumnSumArgs& /*a*/, cudaStream_t /*stream*/) {
  throw std::runtime_error("zerotrain was built without its CUDA kernels");
}

}  // namespace zt::kernels

#endif  // ZT_WITH_KERNELS
