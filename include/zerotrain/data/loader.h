// Loader: batches from a Dataset in DistributedSampler order, assembled ahead of use on
// a background thread.
//
// [Loader Streams] On a CUDA device the thread stacks each batch into pinned host memory
// and copies it to the device with non_blocking=true on a dedicated copy stream, then
// records an event there. next() makes the caller's current stream wait on that event
// (no host sync) and records the batch tensors on the caller's stream, so the caching
// allocator does not hand their memory back to the copy stream while still in use.
// Pinned buffers are released right after the copy is queued: PyTorch's host allocator
// keeps them until the copy's event has completed. On the CPU next() returns the
// stacked tensors as they are.
//
// Position: the loader walks epochs forever; within an epoch, batch k holds the rank's
// sampler indices [k*B, (k+1)*B). state() is the position of the next batch next() will
// return, so a checkpoint that stores it and calls set_state() on resume continues with
// exactly the batches an uninterrupted run would have seen.
#pragma once
#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "zerotrain/data/dataset.h"
#include "zerotrain/data/sampler.h"

namespace zt::data {

struct LoaderOptions {
  int64_t prefetch = 2;          // batches assembled ahead of next(); >= 1
  bool drop_last_batch = true;   // drop an epoch's final partial batch (fixed shapes)
  bool pin_memory = true;        // pinned host staging when the device is CUDA
};

// One batch: x, y and, when the dataset gives Example::pos, pos (B, T); each (B, ...).
struct Batch {
  torch::Tensor x, y, pos;  // pos undefined when the dataset has none
};

struct LoaderState {
  int64_t epoch = 0;  // epoch of the next batch
  int64_t batch = 0;  // its index within the epoch, in [0, batches_per_epoch)
  bool operator==(const LoaderState&) const = default;
};

class Loader {
 public:
  // `device`: where batches are delivered ("cuda" means the current CUDA device).
  Loader(std::shared_ptr<const Dataset> dataset, DistributedSampler sampler, int64_t micro_batch,
         torch::Device device = torch::kCPU, LoaderOptions options = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch (x, y), each (B, ...) stacked from the examples, on the device,
  // ready to use on the caller's current stream (see [Loader Streams]). Blocks until
  // the background thread has it; rethrows the thread's error (naming the index).
  std::pair<torch::Tensor, torch::Tensor> next();
  // As next(), with the position ids too (undefined when the dataset has none).
  Batch next_batch();

  // Epoch of the batch next() last returned (state().epoch before the first call).
  int64_t epoch() const { return last_epoch_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  LoaderState state() const { return pos_; }
  // Moves to `s` (e.g. from a checkpoint): discards prefetched batches.
  void set_state(const LoaderState& s);

 private:
  struct Item;
  void start();
  void stop();
  void produce();
  void advance(LoaderState& pos) const;
  void fill_batch(Item& item, std::vector<int64_t>& epoch_indices, int64_t& indices_epoch);

  std::shared_ptr<const Dataset> dataset_;
  DistributedSampler sampler_;  // owned by the producer thread while it runs
  int64_t micro_batch_;
  torch::Device device_;
  LoaderOptions options_;
  int64_t batches_per_epoch_;

  LoaderState pos_;           // next batch next() returns (consumer side)
  int64_t last_epoch_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Item>> queue_;  // in position order
  bool stop_ = false;
  bool failed_ = false;
  std::thread thread_;
  std::optional<c10::Stream> copy_stream_;  // the CUDA copy stream when device_ is CUDA
};

}  // namespace zt::data
