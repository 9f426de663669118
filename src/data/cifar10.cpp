#include "zerotrain/data/cifar10.h"

#include <filesystem>
#include <fstream>

#include "zerotrain/error.h"

namespace zt::data {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> cifar_files(const std::string& dir, bool train) {
  fs::path base(dir);
  const char* probe = train ? "data_batch_1.bin" : "test_batch.bin";
  if (!fs::exists(base / probe) && fs::is_directory(base / "cifar-10-batches-bin")) base /= "cifar-10-batches-bin";
  std::vector<std::string> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) files.push_back((base / ("data_batch_" + std::to_string(i) + ".bin")).string());
  } else {
    files.push_back((base / "test_batch.bin").string());
  }
  return files;
}

}  // namespace

Cifar10Dataset::Cifar10Dataset(const std::string& dir, bool train) { load(cifar_files(dir, train)); }

Cifar10Dataset::Cifar10Dataset(const std::vector<std::string>& files) { load(files); }

void Cifar10Dataset::load(const std::vector<std::string>& files) {
  ZT_CHECK(!files.empty(), "Cifar10Dataset: no files given");
  std::vector<torch::Tensor> records;
  for (const auto& f : files) {
    std::error_code ec;
    const auto bytes = fs::file_size(f, ec);
    ZT_CHECK(!ec, "Cifar10Dataset: cannot read '", f, "': ", ec.message(),
             " (expected the CIFAR-10 binary version: cifar-10-binary.tar.gz)");
    ZT_CHECK(bytes > 0 && bytes % kRecordBytes == 0, "Cifar10Dataset: '", f, "' has ", bytes,
             " bytes, not a whole number of ", kRecordBytes,
             "-byte records (truncated, or not the CIFAR-10 binary version?)");
    const int64_t n = static_cast<int64_t>(bytes) / kRecordBytes;
    auto raw = torch::empty({n, kRecordBytes}, torch::kUInt8);  // (n, 1 + 3072)
    std::ifstream in(f, std::ios::binary);
    in.read(static_cast<char*>(raw.data_ptr()), static_cast<std::streamsize>(bytes));
    ZT_CHECK(static_cast<uint64_t>(in.gcount()) == bytes, "Cifar10Dataset: short read of '", f, "'");
    auto max_label = raw.select(1, 0).max().item<int64_t>();
    ZT_CHECK(max_label < kClasses, "Cifar10Dataset: '", f, "' holds label ", max_label,
             " (CIFAR-10 labels are 0..9: is this CIFAR-100?)");
    records.push_back(raw);
  }
  auto all = torch::cat(records, 0);                                          // (N, 3073)
  labels_ = all.select(1, 0).to(torch::kLong);                                 // (N)
  images_ = all.narrow(1, 1, kImageBytes).contiguous().view({-1, 3, 32, 32});  // (N, 3, 32, 32)
}

Example Cifar10Dataset::get(int64_t index) const {
  ZT_CHECK(index >= 0 && index < size(), "Cifar10Dataset: index ", index, " out of range [0, ", size(), ")");
  auto x = images_[index].to(torch::kFloat).div_(255.0).sub_(0.5).div_(0.5);  // (3, 32, 32) in [-1, 1]
  return {x, labels_[index]};
}

}  // namespace zt::data
