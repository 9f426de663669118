// offload::host_zeros on a machine without a GPU: unpinned it is an ordinary zero-filled
// tensor; asked to pin (a CUDA build, no device), the registration fails and the buffer stays
// pageable, zero-filled and usable, rather than failing the run. The pinned path on a GPU is
// checked in tests/gpu/test_host_memory.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "offload/host_memory.h"

namespace zt_test_host_memory {

namespace {

TEST(HostMemory, ZeroFilledOfTheRequestedSizeAndDtype) {
  for (bool pin : {false, true}) {
    if (pin && torch::cuda::is_available()) continue;  // the GPU test covers it
    const int64_t n = (int64_t{1} << 20) + 3;
    auto t = zt::offload::host_zeros(n, at::kFloat, pin);
    EXPECT_EQ(t.numel(), n) << "pin " << pin;
    EXPECT_EQ(t.scalar_type(), at::kFloat);
    EXPECT_TRUE(t.device().is_cpu());
    EXPECT_FALSE(t.is_pinned()) << "pin " << pin << " without a GPU cannot be page-locked";
    EXPECT_EQ(t.count_nonzero().item<int64_t>(), 0) << "pin " << pin;
    t.fill_(2.5f);  // writable to its last element
    EXPECT_EQ(t[n - 1].item<float>(), 2.5f);
  }
}

}  // namespace

}  // namespace zt_test_host_memory
