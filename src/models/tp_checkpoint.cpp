#include "models/tp_checkpoint.h"

#include <chrono>
#include <mutex>
#include <sstream>

#include "log/log.h"
#include "zerotrain/error.h"

namespace zt::models {

// See [TP Activation Checkpointing]. Forward runs on the caller's thread, backward's
// restore and recompute on the autograd engine's: the counters are under a mutex.
struct TpCheckpointState {
  std::mutex mu;
  int64_t held = 0;
  int64_t peak = 0;
  // contiguous_memory_optimization: (slots, slot_numel), slot i for layer i.
  torch::Tensor buffer;
  std::vector<char> live;
  // profile: milliseconds per checkpointed layer since the last line.
  struct Times {
    double forward = 0, restore = 0, recompute = 0;
  };
  std::vector<Times> times;
  bool device_noted = false;

  void add(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    held += bytes;
    peak = std::max(peak, held);
  }
};

namespace {

using TpClock = std::chrono::steady_clock;

double ms_since(TpClock::time_point t0) {
  return std::chrono::duration<double, std::milli>(TpClock::now() - t0).count();
}

// synchronize_checkpoint_boundary and the profile's clock reads: CUDA work is asynchronous.
void tp_ckpt_sync(const torch::Tensor& t) {
  if (t.defined() && t.is_cuda()) torch::cuda::synchronize(t.device().index());
}

// What one checkpointed layer keeps of its input x (see [TP Activation Checkpointing]).
class TpStash final : public CheckpointStash {
 public:
  TpStash(std::shared_ptr<TpCheckpointState> st, comm::GroupPtr g, int64_t layer, bool profile)
      : st_(std::move(st)), group_(std::move(g)), layer_(layer), profile_(profile) {}
  ~TpStash() override { release(); }

  // Fills the stash from x; partition: keep this rank's ceil(numel/tp) elements.
  void keep(const torch::Tensor& x, bool partition, bool cpu, bool contiguous) {
    sizes_ = x.sizes().vec();
    numel_ = x.numel();
    device_ = x.device();
    partitioned_ = partition;
    const auto src = x.detach();
    torch::Tensor piece = src;  // what is kept, before its placement
    int64_t keep_numel = numel_;
    if (partition) {
      const int64_t n = group_->size(), r = group_->rank();
      part_ = (numel_ + n - 1) / n;
      const int64_t start = std::min(numel_, r * part_), len = std::min(part_, numel_ - start);
      piece = src.reshape({-1}).narrow(0, start, len);
      keep_numel = part_;
    }
    const bool to_host = cpu && x.is_cuda();
    auto opts = x.options().device(to_host ? torch::Device(torch::kCPU) : x.device());
    if (to_host) opts = opts.pinned_memory(true);
    if (contiguous) {
      kept_ = slot(keep_numel, opts);
    } else if (partition || to_host) {
      kept_ = torch::empty({keep_numel}, opts);
    }
    if (kept_.defined()) {
      // Pinned destination + non_blocking: the D2H copy is queued on the current stream and
      // restore()'s H2D copy after it (as models/checkpoint.cpp).
      const int64_t len = piece.numel();
      kept_.narrow(0, 0, len).copy_(piece.reshape({-1}), /*non_blocking=*/to_host);
      if (len < keep_numel) kept_.narrow(0, len, keep_numel - len).zero_();  // the padding
    } else {
      kept_ = src;  // the input itself: nothing copied
    }
    bytes_ = kept_.numel() * static_cast<int64_t>(kept_.element_size());
    st_->add(bytes_);
  }

  torch::Tensor restore() override {
    const auto t0 = TpClock::now();
    torch::Tensor t = kept_.device() == device_ ? kept_ : kept_.to(device_, /*non_blocking=*/true);
    if (partitioned_) {
      auto part = t.contiguous();
      auto full = torch::empty({part_ * group_->size()}, part.options());
      group_->all_gather(full, part);
      t = full.narrow(0, 0, numel_).view(sizes_);
    } else {
      t = t.view(sizes_);
      if (slot_) t = t.clone();  // the slot is reused by the next forward
    }
    release();
    if (profile_) {
      tp_ckpt_sync(t);
      std::lock_guard<std::mutex> lock(st_->mu);
      st_->times[static_cast<size_t>(layer_)].restore += ms_since(t0);
    }
    return t;
  }

 private:
  // contiguous_memory_optimization: slot `layer_` of the one buffer (allocated, or
  // reallocated for a new size, while no slot is live).
  torch::Tensor slot(int64_t numel, const torch::TensorOptions& opts) {
    std::lock_guard<std::mutex> lock(st_->mu);
    auto& buf = st_->buffer;
    const auto slots = static_cast<int64_t>(st_->live.size());
    const bool fits = buf.defined() && buf.size(1) == numel && buf.scalar_type() == opts.dtype().toScalarType() &&
                      buf.device() == opts.device();
    if (!fits) {
      for (char l : st_->live) {
        ZT_CHECK_T(!l, zt::ConfigError, "activation_checkpointing.contiguous_memory_optimization: checkpoint inputs "
                   "of different sizes or dtypes in one forward (", numel, " elements now); the buffer holds one size; "
                   "set contiguous_memory_optimization false");
      }
      buf = torch::empty({slots, numel}, opts);
      log::info("activation checkpointing: contiguous_memory_optimization: one buffer of %lld slots x %lld elements "
                "(%.2f MiB) on %s", static_cast<long long>(slots), static_cast<long long>(numel),
                static_cast<double>(buf.numel() * buf.element_size()) / (1024.0 * 1024.0), buf.device().str().c_str());
    }
    auto& l = st_->live[static_cast<size_t>(layer_)];
    ZT_CHECK_T(!l, zt::ConfigError, "activation_checkpointing.contiguous_memory_optimization: checkpoint slot ", layer_,
               " still holds the input of an earlier forward whose backward has not run (two training forwards "
               "without a backward between); run backward after each forward, or set "
               "contiguous_memory_optimization false");
    l = 1;
    slot_ = true;
    return buf[layer_];
  }

  void release() {
    if (!bytes_ && !slot_) return;
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      st_->held -= bytes_;
      if (slot_) st_->live[static_cast<size_t>(layer_)] = 0;
    }
    bytes_ = 0;
    slot_ = false;
    kept_ = torch::Tensor();
  }

  std::shared_ptr<TpCheckpointState> st_;
  comm::GroupPtr group_;
  int64_t layer_;
  bool profile_;
  std::vector<int64_t> sizes_;
  int64_t numel_ = 0;
  int64_t part_ = 0;
  torch::Device device_{torch::kCPU};
  bool partitioned_ = false;
  bool slot_ = false;
  int64_t bytes_ = 0;
  torch::Tensor kept_;
};

}  // namespace

TpCheckpointOptions TpCheckpointOptions::from_config(const ActivationCheckpointingConfig& c) {
  TpCheckpointOptions o;
  o.partition_activations = c.partition_activations;
  o.cpu_checkpointing = c.cpu_checkpointing;
  o.contiguous_memory_optimization = c.contiguous_memory_optimization;
  o.number_checkpoints = c.number_checkpoints;
  o.synchronize_checkpoint_boundary = c.synchronize_checkpoint_boundary;
  o.profile = c.profile;
  return o;
}

TpCheckpointer::TpCheckpointer(comm::GroupPtr tp, int64_t n_layers, TpCheckpointOptions o, bool sequence_parallel)
    : group_(std::move(tp)), opts_(std::move(o)), state_(std::make_shared<TpCheckpointState>()) {
  count_ = opts_.number_checkpoints.value_or(n_layers);
  ZT_CHECK_T(count_ >= 0 && count_ <= n_layers, zt::ConfigError, "activation_checkpointing.number_checkpoints = ",
             count_, " must be in [0, ", n_layers, "] (the model's layers; layers [0, n) are checkpointed)");
  const int n = group_ ? group_->size() : 1;
  if (opts_.partition_activations) {
    if (sequence_parallel) {
      notes_.push_back("partition_activations: under sequence parallelism each layer input is already this rank's "
                       "1/" + std::to_string(n) + " of the sequence (a different slice on every tp rank), so it is "
                       "kept whole; nothing is partitioned further");
    } else if (n == 1) {
      notes_.push_back("partition_activations: one tensor-parallel rank, one part: the input is kept whole");
    } else {
      partition_ = true;
      notes_.push_back("partition_activations: each tp rank keeps 1/" + std::to_string(n) +
                       " of every checkpointed layer input and all-gathers it over tp in recompute");
    }
  }
  if (opts_.contiguous_memory_optimization) {
    state_->live.assign(static_cast<size_t>(count_), 0);
    if (!opts_.number_checkpoints) {
      notes_.push_back("contiguous_memory_optimization: number_checkpoints unset: one buffer slot per layer (" +
                       std::to_string(count_) + ")");
    }
  }
  if (opts_.profile) {
    state_->times.assign(static_cast<size_t>(count_), {});
    notes_.push_back("profile: one line per backward with each checkpoint's forward, restore and recompute ms");
  }
  for (const auto& s : notes_) log::info("activation checkpointing: %s", s.c_str());
}

TpCheckpointer::~TpCheckpointer() = default;

int64_t TpCheckpointer::bytes_held() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->held;
}

int64_t TpCheckpointer::peak_bytes_held() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->peak;
}

void TpCheckpointer::reset_peak() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->peak = state_->held;
}

torch::Tensor TpCheckpointer::run(int64_t layer, const CheckpointFn& fn, const torch::Tensor& x) {
  if (!checkpoints(layer) || !torch::GradMode::is_enabled()) return fn(x);
  const auto& o = opts_;
  if (!state_->device_noted) {
    state_->device_noted = true;
    if (o.cpu_checkpointing && !x.is_cuda()) {
      log::info("activation checkpointing: cpu_checkpointing: the layer inputs are already in host memory (%s); "
                "they are kept where they are", x.device().str().c_str());
    }
    if (o.synchronize_checkpoint_boundary && !x.is_cuda()) {
      log::info("activation checkpointing: synchronize_checkpoint_boundary: on the CPU every op completes before "
                "the next starts; a checkpoint boundary has nothing to wait for");
    }
  }
  const bool sync = o.synchronize_checkpoint_boundary, profile = o.profile;
  auto st = state_;
  // The recompute (backward) side: boundaries and times around fn.
  CheckpointFn body = fn;
  if (sync || profile) {
    body = [fn, st, layer, sync, profile](const torch::Tensor& t) {
      if (!in_checkpoint_recompute()) return fn(t);
      if (sync || profile) tp_ckpt_sync(t);
      const auto t0 = TpClock::now();
      auto y = fn(t);
      if (sync || profile) tp_ckpt_sync(y);
      if (profile) {
        std::ostringstream line;
        {
          std::lock_guard<std::mutex> lock(st->mu);
          st->times[static_cast<size_t>(layer)].recompute += ms_since(t0);
          if (layer == 0) {  // the last layer recomputed in this backward
            line.setf(std::ios::fixed);
            line.precision(3);
            line << "activation checkpointing profile (ms, forward/restore/recompute):";
            for (size_t i = 0; i < st->times.size(); ++i) {
              auto& s = st->times[i];
              line << " L" << i << " " << s.forward << "/" << s.restore << "/" << s.recompute;
              s = {};
            }
          }
        }
        if (layer == 0) log::info("%s", line.str().c_str());
      }
      return y;
    };
  }
  const bool partition = partition_, cpu = o.cpu_checkpointing, contiguous = o.contiguous_memory_optimization;
  StashFn stash = [st, g = group_, layer, partition, cpu, contiguous, profile](const torch::Tensor& t) {
    auto s = std::make_unique<TpStash>(st, g, layer, profile);
    s->keep(t, partition, cpu, contiguous);
    return s;
  };
  if (sync || profile) tp_ckpt_sync(x);
  const auto t0 = TpClock::now();
  auto y = checkpoint(body, x, stash);
  if (sync || profile) tp_ckpt_sync(y);
  if (profile) {
    std::lock_guard<std::mutex> lock(st->mu);
    st->times[static_cast<size_t>(layer)].forward += ms_since(t0);
  }
  return y;
}

}  // namespace zt::models
