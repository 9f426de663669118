// Helpers shared by the GPU tests (tests/gpu): this rank's device, the kernel dtype of an
// ATen dtype, element bits, the spacing of bf16/fp16, and a tolerance check that names its
// first offender. Header-only.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/fused_adam.h"

namespace zt::test_support {

#ifdef ZT_WITH_CUDA
// This rank's GPU, cuda:(LOCAL_RANK mod devices) (cuda:0 outside `zerotrain launch`), made
// the thread's current device as the engine makes it for its rank. Needs a CUDA device.
inline at::Device rank_device() {
  const char* lr = std::getenv("LOCAL_RANK");
  const int n = std::max(1, static_cast<int>(at::cuda::device_count()));
  const at::Device d(at::kCUDA, static_cast<c10::DeviceIndex>((lr ? std::atoi(lr) : 0) % n));
  c10::cuda::set_device(d.index());
  return d;
}

// Why the multi-GPU communication tests must skip on this node ("" = run): no CUDA device,
// or fewer GPUs than local ranks. The same answer on every rank of a node, so no rank
// issues a collective alone.
inline std::string nccl_skip_reason() {
  if (!at::cuda::is_available()) return "no CUDA device";
  const char* lw = std::getenv("LOCAL_WORLD_SIZE");
  const int local_world = lw ? std::atoi(lw) : 1;
  if (at::cuda::device_count() < local_world) {
    return "need one GPU per local rank: " + std::to_string(local_world) + " ranks, " +
           std::to_string(at::cuda::device_count()) + " GPUs";
  }
  return "";
}

// Base fixture of the kernel tests: skipped without zerotrain's kernels (no nvcc at build
// time) or without a GPU; runs on this rank's device.
class KernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::kernels_available()) GTEST_SKIP() << "zerotrain was built without its CUDA kernels (no nvcc)";
    if (!at::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    dev_ = rank_device();
  }
  at::TensorOptions on(at::ScalarType dt) const { return at::TensorOptions(dt).device(dev_); }
  cudaStream_t stream() const { return at::cuda::getCurrentCUDAStream(dev_.index()).stream(); }

  at::Device dev_{at::kCPU};
};
#endif  // ZT_WITH_CUDA

inline kernels::DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kernels::DType::kF32;
    case at::kBFloat16: return kernels::DType::kBF16;
    case at::kHalf: return kernels::DType::kF16;
    default: throw std::invalid_argument(std::string("no kernel dtype for ") + c10::toString(t));
  }
}

inline std::string name(at::ScalarType t) { return c10::toString(t); }

// The bits of a tensor (4- or 2-byte elements).
inline at::Tensor bits(const at::Tensor& t) {
  return t.contiguous().view(t.element_size() == 4 ? at::kInt : at::kShort);
}

// Spacing of dtype `dt` (bf16 or fp16) at the fp64 values r (already representable in dt).
inline at::Tensor ulp_of(const at::Tensor& r, at::ScalarType dt) {
  const double mant = dt == at::kBFloat16 ? 7 : 10;     // explicit mantissa bits
  const double emin = dt == at::kBFloat16 ? -126 : -14;  // smallest normal exponent
  return at::exp2(at::floor(at::log2(r.abs())).clamp_min(emin) - mant);
}

// |actual - expected| <= tol everywhere (fp64, any shape; NaN is never within); names the
// count of `what` off, the first offender's index and the largest error/tolerance ratio.
inline ::testing::AssertionResult within(const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& tol,
                                         const char* what) {
  const at::Tensor err = (actual - expected).abs();
  const at::Tensor bad = at::logical_not(err <= tol).nonzero();
  if (bad.size(0) == 0) return ::testing::AssertionSuccess();
  const at::Tensor first = bad[0];
  std::string index;
  at::Tensor a = actual, e = expected, t = tol;
  for (int64_t d = 0; d < first.numel(); ++d) {
    const int64_t k = first[d].item<int64_t>();
    index += (d ? ", " : "") + std::to_string(k);
    a = a[k];
    e = e[k];
    t = t[k];
  }
  const double worst = (err / tol).nan_to_num(INFINITY).max().item<double>();
  return ::testing::AssertionFailure() << bad.size(0) << " of " << actual.numel() << " " << what << " off; first at ["
                                       << index << "]: got " << a.item<double>() << ", expected " << e.item<double>()
                                       << " +- " << t.item<double>() << "; worst error/tolerance " << worst;
}

}  // namespace zt::test_support
