// CIFAR-10 in its binary distribution (cifar-10-binary.tar.gz -> cifar-10-batches-bin/):
// data_batch_1.bin .. data_batch_5.bin (train, 10000 records each) and test_batch.bin.
// A record is 1 label byte (0..9) followed by 3072 pixel bytes, channel-major (CHW,
// 3x32x32). Images are normalised like DeepSpeed's tutorial: (x/255 - 0.5) / 0.5.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "zerotrain/data/dataset.h"

namespace zt::data {

class Cifar10Dataset : public Dataset {
 public:
  static constexpr int64_t kImageBytes = 3 * 32 * 32;
  static constexpr int64_t kRecordBytes = 1 + kImageBytes;
  static constexpr int64_t kClasses = 10;

  // `dir` holds the .bin files (or a cifar-10-batches-bin/ subfolder that does). Throws
  // naming the file when one is missing, is not a whole number of records, or holds a
  // label outside 0..9.
  Cifar10Dataset(const std::string& dir, bool train);
  explicit Cifar10Dataset(const std::vector<std::string>& files);

  int64_t size() const override { return labels_.size(0); }
  Example get(int64_t index) const override;  // x (3, 32, 32) float normalised, y () int64

  const torch::Tensor& images() const { return images_; }  // (N, 3, 32, 32) uint8
  const torch::Tensor& labels() const { return labels_; }  // (N) int64

 private:
  void load(const std::vector<std::string>& files);

  torch::Tensor images_;
  torch::Tensor labels_;
};

}  // namespace zt::data
