// offload::host_zeros with pin on a real GPU: the buffer is page-locked at its exact size
// (not rounded up to a power of two as torch's pinned allocator does), zero-filled, and
// asynchronous copies to the device and back on a side stream carry its data exactly.
//
//   zerotrain launch -n 2 -- build/zt_gpu --gtest_filter='HostMemoryGpu*'
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "offload/host_memory.h"
#include "support/gpu_util.h"

namespace zt_test_host_memory {

namespace {

TEST(HostMemoryGpu, PinnedBufferIsExactZeroedAndCopiesAsynchronously) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto dev = zt::test_support::rank_device();
  // 3 MiB + 7 elements of bf16: not a multiple of a page nor a power of two.
  const int64_t n = (int64_t{3} << 20) + 7;
  auto h = zt::offload::host_zeros(n, at::kBFloat16, /*pin=*/true);
  ASSERT_TRUE(h.is_pinned()) << "host_zeros(pin) did not page-lock its buffer";
  EXPECT_EQ(h.numel(), n);
  EXPECT_EQ(h.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(h.is_contiguous());
  EXPECT_EQ(h.count_nonzero().item<int64_t>(), 0) << "the buffer is not zero-filled";
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, h.data_ptr()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);

  // The last element sits past the last whole page: it must be inside the registered range too.
  h.copy_(torch::arange(n, torch::kFloat).remainder(251).sub(125).to(at::kBFloat16));
  auto back = zt::offload::host_zeros(n, at::kBFloat16, true);
  ASSERT_TRUE(back.is_pinned());
  auto side = c10::cuda::getStreamFromPool(false, dev.index());
  {
    c10::cuda::CUDAStreamGuard g(side);
    auto d = h.to(dev, /*non_blocking=*/true);
    d.mul_(2);
    back.copy_(d, /*non_blocking=*/true);
  }
  side.synchronize();
  EXPECT_TRUE(torch::equal(back, h.mul(2))) << "the round trip through the GPU changed the data";

  // Unpinned: an ordinary zero-filled tensor.
  auto p = zt::offload::host_zeros(1000, at::kFloat, false);
  EXPECT_FALSE(p.is_pinned());
  EXPECT_EQ(p.count_nonzero().item<int64_t>(), 0);
}

}  // namespace

}  // namespace zt_test_host_memory
