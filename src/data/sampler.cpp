#include "zerotrain/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "zerotrain/error.h"

namespace zt::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t rank, int64_t world, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  ZT_CHECK(world > 0 && rank >= 0 && rank < world, "DistributedSampler: rank ", rank, " is not in [0, world = ",
           world, ")");
  ZT_CHECK(dataset_size > 0, "DistributedSampler: the dataset is empty");
  // Same arithmetic as PyTorch: floor when dropping the tail, ceil when padding.
  num_samples_ = drop_last ? dataset_size / world : (dataset_size + world - 1) / world;
  ZT_CHECK(num_samples_ > 0, "DistributedSampler: ", dataset_size, " samples cannot give each of ", world,
           " ranks one sample with drop_last=true (use drop_last=false or more data)");
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all(static_cast<size_t>(dataset_size_));
  if (shuffle_) {
    // at::randperm on a CPU generator seeded seed+epoch: the permutation PyTorch's sampler
    // draws for the same seed and epoch.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    auto perm = torch::randperm(dataset_size_, gen, torch::TensorOptions().dtype(torch::kLong));
    std::copy_n(perm.data_ptr<int64_t>(), dataset_size_, all.begin());
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) all[static_cast<size_t>(i)] = i;
  }
  const auto total = static_cast<size_t>(total_size());
  if (total > all.size()) {  // pad by repeating from the start (cyclically if needed)
    const size_t n = all.size();
    for (size_t i = n; i < total; ++i) all.push_back(all[i % n]);
  } else {
    all.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(world_)) mine.push_back(all[i]);
  return mine;
}

}  // namespace zt::data
