// ZeRO-Infinity: the fp32 master weights and Adam state of this rank's shard live in one
// swap file per rank on an NVMe drive (offload_optimizer.device "nvme"), not in host memory.
//
// Host memory holds the gradient buffer (streamed during backward, as with CPU offload)
// and buffer_count staging buffers, each sized for one sub-group's master + m + v plus its
// compute-dtype copy. The step walks the sub-groups of sub_group_size elements through
// offload::NvmeOptimizerState::pass (see [NVMe Pipeline] in src/offload/nvme_state.h):
//   read    the next sub-groups' state is read from the file while the CPU Adam updates
//           the current one in its staging buffer;
//   step    the CPU Adam writes master, m, v in place and the bf16/fp16 copy into the
//           buffer's scratch area (fp32: the master itself is the copy);
//   upload  the copy goes to the device on the upload stream, as in the CPU path (stage 3
//           with offload_param: it is written straight into the host-resident shard);
//   write   the sub-group is written back asynchronously; its buffer is refilled only
//           after that write and the upload from it (an event per buffer) are done.
// Checkpoints read the state back through the same buffers (export: a host copy of the
// rank's state while the checkpoint is taken; import: sub-group by sub-group).
#include <omp.h>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "offload/nvme_state.h"
#include "zero/agree.h"
#include "optim/cpu_adam.h"
#include "zero/offload_streams.h"
#include "zero/zero_optimizer.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::zero {

// A swap file's owner (the optimizer state, or the parameter file) and one CUDA event per
// staging buffer: the last upload from it, which the reuse fence waits for.
template <class State>
struct SwapWithEvents {
#ifdef ZT_WITH_CUDA
  std::vector<at::cuda::CUDAEvent> uploaded;
#endif
  // After the events: its destructor runs the reuse fence, which waits on them.
  std::unique_ptr<State> state;
};
struct NvmeOffload : SwapWithEvents<offload::NvmeOptimizerState> {};
struct NvmeParams : SwapWithEvents<offload::NvmeParamFile> {};

namespace {

constexpr const char* kNvmePathKey = "zero_optimization.offload_optimizer.nvme_path";
constexpr const char* kParamNvmePathKey = "zero_optimization.offload_param.nvme_path";

// Creates a swap file's owner with make() on every rank (agree: one rank's failure stops
// all) with the rank's device current, so that cudaHostRegister of its buffers lands in
// this rank's context; then sets its reuse fence to wait for the buffer's last upload.
template <class S, class Make>
std::shared_ptr<S> make_swap(const comm::GroupPtr& g, c10::Device device, Make make) {
  auto s = std::make_shared<S>();
  agree<Error>(g, [&] {
#ifdef ZT_WITH_CUDA
    std::optional<c10::cuda::CUDAGuard> guard;
    if (device.is_cuda()) guard.emplace(device);
#endif
    s->state = make();
  });
#ifdef ZT_WITH_CUDA
  if (device.is_cuda()) {
    s->uploaded.resize(static_cast<size_t>(s->state->num_buffers()));
    S* raw = s.get();
    s->state->set_reuse_fence([raw](int k) { raw->uploaded[k].synchronize(); });
  }
#endif
  return s;
}

// aio's lines: held while the swap file is created, then printed (see init_nvme), then
// printed as they come (e.g. a swap file that cannot be removed at the end).
struct LogSink {
  int rank = 0;
  bool hold = true;
  std::vector<std::string> held;
  // Info, or warn for a rank's fallback (other ranks' info lines are not printed).
  void print(const std::string& line, log::Level level = log::Level::kWarn) const {
    log::write(level, line);
  }
};

}  // namespace

void ZeroOptimizer::check_nvme(int64_t owned) {
  const auto groups = offload::NvmeOptimizerState::split(owned, std::max<int64_t>(1, opt_.sub_group_numel));
  const int64_t bytes = offload::NvmeOptimizerState::file_bytes_for(groups);
  // Ranks of one host usually share the drive: each needs room for its own file.
  const int local = std::max(1, comm::discover_rank().local_world_size);
  agree<ConfigError>(group_, [&] { offload::check_nvme_path(kNvmePathKey, opt_.nvme_path, bytes * local); });
}

void ZeroOptimizer::init_nvme(int64_t owned) {
  torch::NoGradGuard no_grad;
  const bool half = opt_.dtype != at::kFloat;
  // The step writes the host shard directly (offload_param cpu); with offload_param nvme
  // it writes its scratch copy into the parameter file.
  const bool host_shard = opt_.stage == 3 && opt_.offload_param && !param_nvme_;
  const int world_rank = comm::discover_rank().rank;
  auto sink = std::make_shared<LogSink>();
  sink->rank = world_rank;

  offload::NvmeStateOptions so;
  so.dir = opt_.nvme_path;
  so.stem = "zerotrain_rank" + std::to_string(world_rank) + "_optimizer";
  so.buffer_count = opt_.buffer_count;
  so.scratch_bytes_per_element = half && !host_shard ? static_cast<int64_t>(c10::elementSize(opt_.dtype)) : 0;
  so.pin = opt_.pin_memory && opt_.device.is_cuda();
  so.aio = opt_.aio;
  so.log = [sink](const std::string& line) {
    if (sink->hold) {
      sink->held.push_back(line);
    } else {
      sink->print(line);
    }
  };
  nvme_ = make_swap<NvmeOffload>(group_, opt_.device, [&] {
    return std::make_unique<offload::NvmeOptimizerState>(
        offload::NvmeOptimizerState::split(owned, std::max<int64_t>(1, opt_.sub_group_numel)), so);
  });
  offload::NvmeOptimizerState& st = *nvme_->state;

  // Rank 0 says where the state went; another rank speaks up only when its file fell back
  // (no io_uring or no O_DIRECT), so no fallback goes unreported.
  const bool fell_back = st.file().engine() != "io_uring" || !st.file().direct();
  if (rank_ == 0 || fell_back) {
    for (const auto& line : sink->held) sink->print(line, fell_back ? log::Level::kWarn : log::Level::kInfo);
  }
  sink->hold = false;
  sink->held.clear();
  if (rank_ == 0) {
    log::info("offload_optimizer nvme: %s of fp32 master + Adam state per rank in swap file '%s' (%s, "
              "engine %s, %s), %d sub-groups of <= %lld elements, %d staging buffers of %s in %s host memory, "
              "CPU Adam kernel %s, %d threads per rank",
                 bytes_text(owned * 12).c_str(), st.path().c_str(), bytes_text(st.file_bytes()).c_str(),
                 st.file().engine().c_str(), st.file().direct() ? "O_DIRECT" : "buffered, no O_DIRECT",
                 st.num_groups(), static_cast<long long>(std::min(owned, std::max<int64_t>(1, opt_.sub_group_numel))),
                 st.num_buffers(), bytes_text(st.staging_bytes() / st.num_buffers()).c_str(),
                 st.pinned() ? "page-locked" : "pageable", optim::kernel_name(optim::best_cpu_kernel()),
                 omp_get_max_threads());
    if (st.num_groups() > 1 && st.num_buffers() < 3) {
      log::warn("offload_optimizer nvme: buffer_count %lld: the swap-file reads do not overlap "
                "the CPU step (that needs 3 or more staging buffers; 4 is DeepSpeed's default)",
                   static_cast<long long>(opt_.buffer_count));
    }
  }

  // The initial state: master = the (rank 0) parameters in fp32, m = v = 0.
  agree<Error>(group_, [&] {
    st.pass(offload::NvmeOptimizerState::Mode::kWrite, [&](const offload::NvmeOptimizerState::Staged& s) {
      auto master = torch::from_blob(s.master, {s.numel}, torch::kFloat);
      if (param_nvme_) {  // the shard is in the parameter file, read a unit's piece at a time (slot size)
        L_.owned_pieces(s.begin, s.numel, [&](int, int64_t at, int64_t, int64_t len) {
          master.narrow(0, at, len).copy_(param_nvme_read(s.begin + at, len).first);
        });
      } else {
        L_.owned_pieces(s.begin, s.numel, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
          auto src = opt_.stage == 3 ? L_.owned_view(param_shard_, b)
                                     : L_.owned_in_flat(flat_param_, b);
          master.narrow(0, at, len).copy_(src.narrow(0, in_bucket, len));
        });
      }
      std::memset(s.exp_avg, 0, static_cast<size_t>(s.numel) * sizeof(float));
      std::memset(s.exp_avg_sq, 0, static_cast<size_t>(s.numel) * sizeof(float));
    });
  });
}

void ZeroOptimizer::nvme_update(const torch::Tensor& grads, double factor, const StepInputs& in) {
  torch::NoGradGuard no_grad;
  std::vector<optim::AdamHyper> hs;
  for (int g = 0; g < rule_.num_groups(); ++g) hs.push_back(rule_.adam_hyper(factor, in, g));
  const bool half = opt_.dtype != at::kFloat;
  const bool host_shard = opt_.stage == 3 && opt_.offload_param && !param_nvme_;
  const auto esize = static_cast<int64_t>(grads.element_size());
  const char* g0 = static_cast<const char*>(grads.data_ptr());
  ZT_ASSERT(grads.is_contiguous() && grads.scalar_type() == opt_.dtype, "host gradient buffer");
  NvmeOffload& N = *nvme_;
#ifdef ZT_WITH_CUDA
  CopyStreams* cs = streams_ ? copy_streams(streams_) : nullptr;
#endif
  N.state->pass(offload::NvmeOptimizerState::Mode::kReadWrite, [&](const offload::NvmeOptimizerState::Staged& s) {
    void* out = nullptr;
    if (half) out = host_shard ? static_cast<char*>(param_shard_.data_ptr()) + s.begin * esize : s.scratch;
    // One call per parameter-group run of the sub-group (one call with one group).
    rule_.for_group_runs(s.begin, s.numel, [&](int64_t at, int64_t len, int grp) {
      optim::cpu_adam_step(s.master + at, s.exp_avg + at, s.exp_avg_sq + at, g0 + (s.begin + at) * esize, opt_.dtype,
                           len, hs[grp], out ? static_cast<char*>(out) + at * esize : nullptr,
                           half ? opt_.dtype : at::ScalarType::Undefined);
    });
    // What the device gets: the compute-dtype copy, or the fp32 master itself.
    auto src = torch::from_blob(half ? out : s.master, {s.numel}, torch::TensorOptions().dtype(opt_.dtype));
    if (param_nvme_) {
      param_nvme_write(s.begin, src);  // read back when its unit is next gathered
      return;
    }
    if (host_shard) {
      if (!half) param_shard_.narrow(0, s.begin, s.numel).copy_(src);
      return;  // gathered (uploaded) from the host shard when its unit is next used
    }
#ifdef ZT_WITH_CUDA
    std::optional<c10::cuda::CUDAStreamGuard> guard;
    if (cs) guard.emplace(cs->h2d);
#endif
    L_.owned_pieces(s.begin, s.numel, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
      param_dst(b).narrow(0, in_bucket, len).copy_(src.narrow(0, at, len), /*non_blocking=*/true);
    });
#ifdef ZT_WITH_CUDA
    if (cs) N.uploaded[s.buffer].record(cs->h2d);  // the buffer is refilled only after this
#endif
  });
  const auto& ps = N.state->last_pass();
  nvme_step_.read_wait_ms = ps.read_wait_ms;
  nvme_step_.write_wait_ms = ps.write_wait_ms;
  nvme_step_.visit_ms = ps.visit_ms;
  nvme_step_.bytes_read = ps.bytes_read;
  nvme_step_.bytes_written = ps.bytes_written;
#ifdef ZT_WITH_CUDA
  if (cs) compute_waits_for_uploads(*cs, opt_.device.index());
#endif
}

std::vector<torch::Tensor> ZeroOptimizer::nvme_read_state(bool master_only) {
  const int64_t owned = L_.owned_numel();
  std::vector<torch::Tensor> out;
  for (int k = 0; k < (master_only ? 1 : 3); ++k) out.push_back(torch::empty({owned}, torch::kFloat));
  nvme_->state->pass(offload::NvmeOptimizerState::Mode::kRead, [&](const offload::NvmeOptimizerState::Staged& s) {
    const float* src[3] = {s.master, s.exp_avg, s.exp_avg_sq};
    for (size_t k = 0; k < out.size(); ++k) {
      std::memcpy(out[k].data_ptr<float>() + s.begin, src[k], static_cast<size_t>(s.numel) * sizeof(float));
    }
  });
  return out;
}

void ZeroOptimizer::nvme_import(const StateFetch& fetch) {
  const auto kinds = state_kinds();
  ZT_ASSERT(kinds.size() == 3, "NVMe offload holds master, exp_avg and exp_avg_sq");
  // Read-modify-write: elements no parameter covers (padding) keep what the file holds.
  nvme_->state->pass(offload::NvmeOptimizerState::Mode::kReadWrite, [&](const offload::NvmeOptimizerState::Staged& s) {
    float* dst[3] = {s.master, s.exp_avg, s.exp_avg_sq};
    L_.owned_pieces(s.begin, s.numel, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
      const Bucket& B = L_.flat.buckets[b];
      const int64_t own0 = L_.owns_all ? B.offset : B.shard_offset(rank_);  // flat index of the bucket's owned part
      const Range flat{own0 + in_bucket, own0 + in_bucket + len};
      for (int i = B.first_param; i < B.first_param + B.num_params; ++i) {
        const ParamSlot& p = L_.flat.params[i];
        const Range piece = intersect(flat, {p.offset, p.offset + p.numel});
        if (piece.size() == 0) continue;
        for (size_t k = 0; k < kinds.size(); ++k) {
          torch::Tensor v = fetch(user_index_[i], piece.begin - p.offset, piece.end - p.offset, kinds[k]);
          ZT_ASSERT(v.numel() == piece.size(), "state fetch returned ", v.numel(), " values for ", piece.size());
          torch::from_blob(dst[k] + at + (piece.begin - flat.begin), {piece.size()}, torch::kFloat)
              .copy_(v.reshape(-1));
        }
      }
    });
  });
}

void ZeroOptimizer::nvme_finish_import() {
  // The step writes the compute-dtype copy itself: bring this rank's copy in line with the
  // loaded master (as the CPU path does from its host master).
  const bool host_shard = opt_.stage == 3 && opt_.offload_param && !param_nvme_;
  nvme_->state->pass(offload::NvmeOptimizerState::Mode::kRead, [&](const offload::NvmeOptimizerState::Staged& s) {
    auto master = torch::from_blob(s.master, {s.numel}, torch::kFloat);
    if (param_nvme_) {
      param_nvme_write(s.begin, master.to(opt_.dtype));
      return;
    }
    if (host_shard) {
      param_shard_.narrow(0, s.begin, s.numel).copy_(master);
      return;
    }
    // Blocking copies: the buffer is refilled right after this visit.
    L_.owned_pieces(s.begin, s.numel, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
      param_dst(b).narrow(0, in_bucket, len).copy_(master.narrow(0, at, len));
    });
  });
}

void ZeroOptimizer::nvme_state_bytes(ModelStateBytes& m) const {
  // state_.master and the Adam buffers do not exist: the state is on the drive. host already
  // counts the gradient buffer (and the host shard with offload_param).
  const int64_t owned = L_.owned_numel();
  m.master = owned * static_cast<int64_t>(sizeof(float));
  m.optimizer = 2 * owned * static_cast<int64_t>(sizeof(float));
  m.nvme = nvme_->state->file_bytes();
  m.host += nvme_->state->staging_bytes();
}

void ZeroOptimizer::param_nvme_state_bytes(ModelStateBytes& m) const {
  // The compute-dtype shard is a model state like any other, kept on the drive.
  m.params += L_.flat.shard_numel * static_cast<int64_t>(c10::elementSize(opt_.dtype));
  m.nvme += param_nvme_->state->file_bytes();
  m.host += param_nvme_->state->staging_bytes();
}

void ZeroOptimizer::init_param_nvme(int64_t max_unit_shard) {
  const int64_t esize = static_cast<int64_t>(c10::elementSize(opt_.dtype));
  const int64_t bytes = std::max<int64_t>(1, L_.flat.shard_numel) * esize;
  ZT_CHECK_T(max_unit_shard <= opt_.param_buffer_size, ConfigError, "zero_optimization.offload_param.buffer_size = ",
             opt_.param_buffer_size, " elements, but the largest unit's shard on this rank has ", max_unit_shard,
             ": raise buffer_size to at least ", max_unit_shard, " (each staging buffer holds one unit's shard)");
  // max_in_cpu bounds the parameters kept resident in host memory besides the swap
  // buffers (DeepSpeed's cache); zerotrain keeps none, so any value holds.
  const int local = std::max(1, comm::discover_rank().local_world_size);
  agree<ConfigError>(group_, [&] { offload::check_nvme_path(kParamNvmePathKey, opt_.param_nvme_path, bytes * local); });
  const int world_rank = comm::discover_rank().rank;
  offload::NvmeStateOptions so;
  so.dir = opt_.param_nvme_path;
  so.stem = "zerotrain_rank" + std::to_string(world_rank) + "_params";
  so.buffer_count = opt_.param_buffer_count;
  so.pin = opt_.pin_memory && opt_.device.is_cuda();
  so.aio = opt_.aio;
  auto sink = std::make_shared<LogSink>();
  sink->rank = world_rank;
  sink->hold = false;
  so.log = [sink, this](const std::string& line) {
    if (rank_ == 0) sink->print(line, log::Level::kInfo);
  };
  param_nvme_ = make_swap<NvmeParams>(group_, opt_.device, [&] {
    return std::make_unique<offload::NvmeParamFile>(bytes, max_unit_shard * esize, so);
  });
  if (rank_ == 0) {
    const auto& f = *param_nvme_->state;
    log::info("offload_param nvme: %s of %s parameters per rank in swap file '%s' (engine %s, %s), "
              "%d staging buffers of %s in %s host memory",
                 bytes_text(bytes).c_str(), c10::toString(opt_.dtype), f.path().c_str(), f.file().engine().c_str(),
                 f.file().direct() ? "O_DIRECT" : "buffered, no O_DIRECT", f.num_buffers(),
                 bytes_text(max_unit_shard * esize).c_str(), f.pinned() ? "page-locked" : "pageable");
  }
}

std::pair<torch::Tensor, int> ZeroOptimizer::param_nvme_read(int64_t begin, int64_t numel) {
  const int64_t esize = static_cast<int64_t>(c10::elementSize(opt_.dtype));
  const auto v = param_nvme_->state->read(begin * esize, numel * esize);
  return {torch::from_blob(const_cast<void*>(v.data), {numel}, torch::TensorOptions().dtype(opt_.dtype)), v.slot};
}

void ZeroOptimizer::param_nvme_uploaded(int slot) {
#ifdef ZT_WITH_CUDA
  if (opt_.device.is_cuda()) param_nvme_->uploaded[static_cast<size_t>(slot)].record(
      c10::cuda::getCurrentCUDAStream(opt_.device.index()));
#else
  (void)slot;
#endif
}

void ZeroOptimizer::param_nvme_write(int64_t begin, const torch::Tensor& src) {
  ZT_ASSERT(src.device().is_cpu() && src.is_contiguous() && src.scalar_type() == opt_.dtype, "parameter write source");
  const int64_t esize = static_cast<int64_t>(c10::elementSize(opt_.dtype));
  param_nvme_->state->write(begin * esize, src.data_ptr(), src.numel() * esize);
}

std::string ZeroOptimizer::nvme_file() const { return nvme_ ? nvme_->state->path() : std::string(); }

}  // namespace zt::zero
