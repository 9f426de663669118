// DistributedSampler with PyTorch's semantics (torch.utils.data.DistributedSampler):
// each epoch the index list is permuted with a generator seeded by seed + epoch (when
// shuffling), then either padded by repeating its head (drop_last=false) or truncated
// (drop_last=true) to a multiple of world, and rank r takes positions r, r+world, ...
// Every rank gets the same number of samples; without padding the slices are disjoint.
#pragma once
#include <cstdint>
#include <vector>

namespace zt::data {

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t rank, int64_t world, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);

  // Reshuffles: call before each epoch (the Loader does) or every epoch repeats order.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  std::vector<int64_t> indices() const;  // this rank's indices for epoch(); length num_samples()
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * world_; }
  int64_t dataset_size() const { return dataset_size_; }
  int64_t rank() const { return rank_; }
  int64_t world() const { return world_; }

 private:
  int64_t dataset_size_, rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace zt::data
