#include "zerotrain/data/loader.h"

#include "zerotrain/error.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt::data {

struct Loader::Item {
  LoaderState pos;
  torch::Tensor x, y, positions;  // positions: undefined when the dataset has none
  std::exception_ptr error;
#ifdef ZT_WITH_CUDA
  std::optional<at::cuda::CUDAEvent> ready;  // recorded on the copy stream after the H2D copies
#endif
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, DistributedSampler sampler, int64_t micro_batch,
               torch::Device device, LoaderOptions options)
    : dataset_(std::move(dataset)),
      sampler_(std::move(sampler)),
      micro_batch_(micro_batch),
      device_(device),
      options_(options) {
  ZT_CHECK(dataset_ != nullptr, "Loader: dataset is null");
  ZT_CHECK(micro_batch > 0, "Loader: micro batch must be positive, got ", micro_batch);
  ZT_CHECK(options_.prefetch >= 1, "Loader: prefetch must be >= 1, got ", options_.prefetch);
  ZT_CHECK(sampler_.dataset_size() == dataset_->size(), "Loader: the sampler was built for ",
           sampler_.dataset_size(), " samples but the dataset has ", dataset_->size());
  const int64_t n = sampler_.num_samples();
  batches_per_epoch_ = options_.drop_last_batch ? n / micro_batch : (n + micro_batch - 1) / micro_batch;
  ZT_CHECK(batches_per_epoch_ > 0, "Loader: rank ", sampler_.rank(), " gets ", n,
           " samples per epoch, fewer than one micro batch of ", micro_batch,
           " (lower train_micro_batch_size_per_gpu or use more data)");
  if (device_.is_cuda()) {
#ifdef ZT_WITH_CUDA
    ZT_CHECK(torch::cuda::is_available(), "Loader: device ", device_, " requested but no CUDA device is available");
    if (!device_.has_index()) device_ = torch::Device(torch::kCUDA, c10::cuda::current_device());
    copy_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
#else
    throw zt::Error(zt::detail::cat("Loader: device ", device_, " requested but zerotrain was built without CUDA"));
#endif
  }
  last_epoch_ = pos_.epoch;
}

Loader::~Loader() { stop(); }

void Loader::advance(LoaderState& pos) const {
  if (++pos.batch == batches_per_epoch_) {
    pos.batch = 0;
    ++pos.epoch;
  }
}

void Loader::start() {
  thread_ = std::thread([this, from = pos_] {
    LoaderState pos = from;
    std::vector<int64_t> indices;
    int64_t indices_epoch = -1;
    for (;;) {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch; });
        if (stop_) return;
      }
      auto item = std::make_shared<Item>();
      item->pos = pos;
      try {
        fill_batch(*item, indices, indices_epoch);
      } catch (...) {
        item->error = std::current_exception();
      }
      {
        std::lock_guard lk(mu_);
        queue_.push_back(item);
      }
      cv_.notify_all();
      if (item->error) return;  // the consumer rethrows; a later next() restarts here
      advance(pos);
    }
  });
}

void Loader::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  queue_.clear();
  stop_ = false;
}

void Loader::fill_batch(Item& item, std::vector<int64_t>& indices, int64_t& indices_epoch) {
  if (indices_epoch != item.pos.epoch) {
    sampler_.set_epoch(item.pos.epoch);
    indices = sampler_.indices();
    indices_epoch = item.pos.epoch;
  }
  const int64_t begin = item.pos.batch * micro_batch_;
  const int64_t n = std::min<int64_t>(micro_batch_, static_cast<int64_t>(indices.size()) - begin);
  std::vector<torch::Tensor> xs, ys, ps;
  xs.reserve(static_cast<size_t>(n));
  ys.reserve(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t index = indices[static_cast<size_t>(begin + j)];
    try {
      Example ex = dataset_->get(index);
      ZT_CHECK(j == 0 || (ex.x.sizes() == xs[0].sizes() && ex.y.sizes() == ys[0].sizes()), "example shapes ",
               ex.x.sizes(), "/", ex.y.sizes(), " differ from the batch's first ", xs[0].sizes(), "/",
               ys[0].sizes());
      ZT_CHECK(j == 0 || ex.pos.defined() == !ps.empty(), "example ", index,
               ex.pos.defined() ? " has" : " has no", " position ids, unlike the batch's first");
      xs.push_back(std::move(ex.x));
      ys.push_back(std::move(ex.y));
      if (ex.pos.defined()) ps.push_back(std::move(ex.pos));
    } catch (const std::exception& e) {
      throw zt::Error(zt::detail::cat("Loader: dataset example ", index, " (epoch ", item.pos.epoch, ", batch ",
                                      item.pos.batch, "): ", e.what()));
    }
  }
  const bool pin = device_.is_cuda() && options_.pin_memory;
  auto stack = [&](const std::vector<torch::Tensor>& ts) {
    std::vector<int64_t> shape{n};
    for (auto s : ts[0].sizes()) shape.push_back(s);
    auto out = torch::empty(shape, ts[0].options().device(torch::kCPU).pinned_memory(pin));  // (B, ...)
    torch::stack_out(out, ts, 0);
    return out;
  };
  torch::Tensor xh = stack(xs), yh = stack(ys);
  torch::Tensor ph = ps.empty() ? torch::Tensor() : stack(ps);
#ifdef ZT_WITH_CUDA
  if (device_.is_cuda()) {
    // See [Loader Streams].
    c10::cuda::CUDAStream stream(*copy_stream_);
    c10::cuda::CUDAStreamGuard guard(stream);
    item.x = xh.to(device_, /*non_blocking=*/true);
    item.y = yh.to(device_, /*non_blocking=*/true);
    if (ph.defined()) item.positions = ph.to(device_, /*non_blocking=*/true);
    item.ready.emplace();
    item.ready->record(stream);
    return;
  }
#endif
  item.x = xh;
  item.y = yh;
  item.positions = ph;
}

std::pair<torch::Tensor, torch::Tensor> Loader::next() {
  Batch b = next_batch();
  return {std::move(b.x), std::move(b.y)};
}

Batch Loader::next_batch() {
  if (!thread_.joinable()) start();
  std::shared_ptr<Item> item;
  {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !queue_.empty(); });
    item = queue_.front();
    queue_.pop_front();
  }
  cv_.notify_all();
  if (item->error) {
    stop();  // the thread has exited; the next call retries from the same position
    std::rethrow_exception(item->error);
  }
  ZT_ASSERT(item->pos == pos_, "loader produced batch (", item->pos.epoch, ", ", item->pos.batch, ") for (",
            pos_.epoch, ", ", pos_.batch, ")");
#ifdef ZT_WITH_CUDA
  if (item->ready) {
    auto consumer = c10::cuda::getCurrentCUDAStream(device_.index());
    item->ready->block(consumer);
    item->x.record_stream(consumer);
    item->y.record_stream(consumer);
    if (item->positions.defined()) item->positions.record_stream(consumer);
  }
#endif
  last_epoch_ = pos_.epoch;
  advance(pos_);
  return {std::move(item->x), std::move(item->y), std::move(item->positions)};
}

void Loader::set_state(const LoaderState& s) {
  ZT_CHECK(s.epoch >= 0 && s.batch >= 0 && s.batch < batches_per_epoch_, "Loader::set_state: position (epoch ",
           s.epoch, ", batch ", s.batch, ") is invalid: this loader has ", batches_per_epoch_,
           " batches per epoch (was the checkpoint saved with another micro batch, world size or data set?)");
  stop();
  pos_ = s;
  last_epoch_ = s.epoch;
}

}  // namespace zt::data
