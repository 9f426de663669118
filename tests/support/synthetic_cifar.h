// A learnable synthetic data set in the CIFAR-10 binary format, for the CIFAR MoE tests
// (tests/unit/test_cifar_moe.cpp, tests/dist/test_cifar_moe.cpp). Header-only.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace zt::test_support {

// data_batch_1..5.bin and test_batch.bin in `dir`, `per_file` records each: label ~ U{0..9},
// pixels = clamp(round(128 + mean[label] + N(0, 30)), 0, 255), mean[label] a fixed
// (3, 32, 32) image per class with std 60 (so the classes are learnable). The same bytes for
// the same `seed` (every rank that calls it with one seed writes identical files).
inline void write_synthetic_cifar(const std::string& dir, int64_t per_file, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto means = torch::randn({10, 3, 32, 32}, g) * 60.0;
  auto write = [&](const std::string& name) {
    const auto labels = torch::randint(0, 10, {per_file}, g);
    const auto images = (128.0 + means.index_select(0, labels) + torch::randn({per_file, 3, 32, 32}, g) * 30.0)
                            .round().clamp(0, 255).to(torch::kUInt8).reshape({per_file, 3072});
    const auto records = torch::cat({labels.to(torch::kUInt8).unsqueeze(1), images}, 1).contiguous();
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(static_cast<const char*>(records.data_ptr()), static_cast<std::streamsize>(records.numel()));
  };
  for (int f = 1; f <= 5; ++f) write("data_batch_" + std::to_string(f) + ".bin");
  write("test_batch.bin");
}

}  // namespace zt::test_support
