// NvmeStep (step_nvme.h), ZeRO-Infinity: the fp32 master weights and Adam state of this rank's shard live in one
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
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "log/log.h"
#include "offload/nvme_state.h"
#include "optim/cpu_adam.h"
#include "zero/agree.h"
#include "zero/offload_streams.h"
#include "zero/step_nvme.h"
#include "zero/swap_events.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::zero {

struct NvmeOffload : SwapWithEvents<offload::NvmeOptimizerState> {};

namespace {
constexpr const char* kNvmeStepPathKey = "zero_optimization.offload_optimizer.nvme_path";
}  // namespace

void NvmeStep::check_path(const ZeroOptions& opt, const comm::GroupPtr& group, int64_t owned) {
  const auto groups = offload::NvmeOptimizerState::split(owned, std::max<int64_t>(1, opt.sub_group_numel));
  const int64_t bytes = offload::NvmeOptimizerState::file_bytes_for(groups);
  // Ranks of one host usually share the drive: each needs room for its own file.
  const int local = std::max(1, comm::discover_rank().local_world_size);
  agree<ConfigError>(group, [&] { offload::check_nvme_path(kNvmeStepPathKey, opt.nvme_path, bytes * local); });
}

NvmeStep::NvmeStep(StepContext ctx) : CpuAdamStep(std::move(ctx)) {
  const int64_t owned = ctx_.L.owned_numel();
  torch::NoGradGuard no_grad;
  const bool half = ctx_.opt.dtype != at::kFloat;
  // The step writes the host shard directly (offload_param cpu); with offload_param nvme
  // it writes its scratch copy into the parameter file.
  const bool host_shard = ctx_.opt.stage == 3 && ctx_.opt.offload_param && !ctx_.param_file_write;
  const int world_rank = comm::discover_rank().rank;
  auto sink = std::make_shared<SwapLogSink>();
  sink->rank = world_rank;

  offload::NvmeStateOptions so;
  so.dir = ctx_.opt.nvme_path;
  so.stem = "zerotrain_rank" + std::to_string(world_rank) + "_optimizer";
  so.buffer_count = ctx_.opt.buffer_count;
  so.scratch_bytes_per_element = half && !host_shard ? static_cast<int64_t>(c10::elementSize(ctx_.opt.dtype)) : 0;
  so.pin = ctx_.opt.pin_memory && ctx_.opt.device.is_cuda();
  so.aio = ctx_.opt.aio;
  so.log = [sink](const std::string& line) {
    if (sink->hold) {
      sink->held.push_back(line);
    } else {
      sink->print(line);
    }
  };
  nvme_ = make_swap<NvmeOffload>(ctx_.group, ctx_.opt.device, [&] {
    return std::make_unique<offload::NvmeOptimizerState>(
        offload::NvmeOptimizerState::split(owned, std::max<int64_t>(1, ctx_.opt.sub_group_numel)), so);
  });
  offload::NvmeOptimizerState& st = *nvme_->state;

  // Rank 0 says where the state went; another rank speaks up only when its file fell back
  // (no io_uring or no O_DIRECT), so no fallback goes unreported.
  const bool fell_back = st.file().engine() != "io_uring" || !st.file().direct();
  if (ctx_.group->rank() == 0 || fell_back) {
    for (const auto& line : sink->held) sink->print(line, fell_back ? log::Level::kWarn : log::Level::kInfo);
  }
  sink->hold = false;
  sink->held.clear();
  if (ctx_.group->rank() == 0) {
    log::info("offload_optimizer nvme: %s of fp32 master + Adam state per rank in swap file '%s' (%s, "
              "engine %s, %s), %d sub-groups of <= %lld elements, %d staging buffers of %s in %s host memory, "
              "CPU Adam kernel %s, %d threads per rank",
                 bytes_text(owned * 12).c_str(), st.path().c_str(), bytes_text(st.file_bytes()).c_str(),
                 st.file().engine().c_str(), st.file().direct() ? "O_DIRECT" : "buffered, no O_DIRECT",
                 st.num_groups(), static_cast<long long>(std::min(owned, std::max<int64_t>(1, ctx_.opt.sub_group_numel))),
                 st.num_buffers(), bytes_text(st.staging_bytes() / st.num_buffers()).c_str(),
                 st.pinned() ? "page-locked" : "pageable", optim::kernel_name(optim::best_cpu_kernel()),
                 omp_get_max_threads());
    if (st.num_groups() > 1 && st.num_buffers() < 3) {
      log::warn("offload_optimizer nvme: buffer_count %lld: the swap-file reads do not overlap "
                "the CPU step (that needs 3 or more staging buffers; 4 is DeepSpeed's default)",
                   static_cast<long long>(ctx_.opt.buffer_count));
    }
  }

  // The initial state: master = the (rank 0) parameters in fp32, m = v = 0.
  agree<Error>(ctx_.group, [&] {
    st.pass(offload::NvmeOptimizerState::Mode::kWrite, [&](const offload::NvmeOptimizerState::Staged& s) {
      auto master = torch::from_blob(s.master, {s.numel}, torch::kFloat);
      if (ctx_.param_file_write) {  // the shard is in the parameter file, read a unit's piece at a time (slot size)
        ctx_.L.owned_pieces(s.begin, s.numel, [&](int, int64_t at, int64_t, int64_t len) {
          master.narrow(0, at, len).copy_(ctx_.param_file_read(s.begin + at, len));
        });
      } else {
        ctx_.L.owned_pieces(s.begin, s.numel, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
          auto src = ctx_.param_src(b);
          master.narrow(0, at, len).copy_(src.narrow(0, in_bucket, len));
        });
      }
      std::memset(s.exp_avg, 0, static_cast<size_t>(s.numel) * sizeof(float));
      std::memset(s.exp_avg_sq, 0, static_cast<size_t>(s.numel) * sizeof(float));
    });
  });
}

NvmeStep::~NvmeStep() = default;

bool NvmeStep::update(double factor, const StepInputs& in) {
  torch::NoGradGuard no_grad;
  grads_to_host();
  const torch::Tensor& grads = host_grad_;
  std::vector<optim::AdamHyper> hs;
  for (int g = 0; g < ctx_.rule.num_groups(); ++g) hs.push_back(ctx_.rule.adam_hyper(factor, in, g));
  const bool half = ctx_.opt.dtype != at::kFloat;
  const bool host_shard = ctx_.opt.stage == 3 && ctx_.opt.offload_param && !ctx_.param_file_write;
  const auto esize = static_cast<int64_t>(grads.element_size());
  const char* g0 = static_cast<const char*>(grads.data_ptr());
  ZT_ASSERT(grads.is_contiguous() && grads.scalar_type() == ctx_.opt.dtype, "host gradient buffer");
  NvmeOffload& N = *nvme_;
#ifdef ZT_WITH_CUDA
  CopyStreams* cs = streams_ ? copy_streams(streams_) : nullptr;
#endif
  N.state->pass(offload::NvmeOptimizerState::Mode::kReadWrite, [&](const offload::NvmeOptimizerState::Staged& s) {
    void* out = nullptr;
    if (half) out = host_shard ? static_cast<char*>(ctx_.param_shard.data_ptr()) + s.begin * esize : s.scratch;
    // One call per parameter-group run of the sub-group (one call with one group).
    ctx_.rule.for_group_runs(s.begin, s.numel, [&](int64_t at, int64_t len, int grp) {
      optim::cpu_adam_step(s.master + at, s.exp_avg + at, s.exp_avg_sq + at, g0 + (s.begin + at) * esize, ctx_.opt.dtype,
                           len, hs[grp], out ? static_cast<char*>(out) + at * esize : nullptr,
                           half ? ctx_.opt.dtype : at::ScalarType::Undefined);
    });
    // What the device gets: the compute-dtype copy, or the fp32 master itself.
    auto src = torch::from_blob(half ? out : s.master, {s.numel}, torch::TensorOptions().dtype(ctx_.opt.dtype));
    if (ctx_.param_file_write) {
      ctx_.param_file_write(s.begin, src);  // read back when its unit is next gathered
      return;
    }
    if (host_shard) {
      if (!half) ctx_.param_shard.narrow(0, s.begin, s.numel).copy_(src);
      return;  // gathered (uploaded) from the host shard when its unit is next used
    }
#ifdef ZT_WITH_CUDA
    std::optional<c10::cuda::CUDAStreamGuard> guard;
    if (cs) guard.emplace(cs->h2d);
#endif
    ctx_.L.owned_pieces(s.begin, s.numel, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
      ctx_.param_dst(b).narrow(0, in_bucket, len).copy_(src.narrow(0, at, len), /*non_blocking=*/true);
    });
#ifdef ZT_WITH_CUDA
    if (cs) N.uploaded[s.buffer].record(cs->h2d);  // the buffer is refilled only after this
#endif
  });
  const auto& ps = N.state->last_pass();
  step_.read_wait_ms = ps.read_wait_ms;
  step_.write_wait_ms = ps.write_wait_ms;
  step_.visit_ms = ps.visit_ms;
  step_.bytes_read = ps.bytes_read;
  step_.bytes_written = ps.bytes_written;
#ifdef ZT_WITH_CUDA
  if (cs) compute_waits_for_uploads(*cs, ctx_.opt.device.index());
#endif
  return false;  // the parameters come from the uploads
}

std::vector<torch::Tensor> NvmeStep::state_buffers(bool master_only) {
  const int64_t owned = ctx_.L.owned_numel();
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

bool NvmeStep::import_state(const LayoutStateFetch& fetch) {
  const auto kinds = ctx_.rule.state_kinds();
  ZT_ASSERT(kinds.size() == 3, "NVMe offload holds master, exp_avg and exp_avg_sq");
  // Read-modify-write: elements no parameter covers (padding) keep what the file holds.
  nvme_->state->pass(offload::NvmeOptimizerState::Mode::kReadWrite, [&](const offload::NvmeOptimizerState::Staged& s) {
    float* dst[3] = {s.master, s.exp_avg, s.exp_avg_sq};
    ctx_.L.owned_pieces(s.begin, s.numel, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
      const Bucket& B = ctx_.L.flat.buckets[b];
      const int64_t own0 = ctx_.L.owns_all ? B.offset : B.shard_offset(ctx_.L.rank);  // flat index of the bucket's owned part
      const Range flat{own0 + in_bucket, own0 + in_bucket + len};
      for (int i = B.first_param; i < B.first_param + B.num_params; ++i) {
        const ParamSlot& p = ctx_.L.flat.params[i];
        const Range piece = intersect(flat, {p.offset, p.offset + p.numel});
        if (piece.size() == 0) continue;
        for (size_t k = 0; k < kinds.size(); ++k) {
          torch::Tensor v = fetch(i, piece.begin - p.offset, piece.end - p.offset, kinds[k]);
          ZT_ASSERT(v.numel() == piece.size(), "state fetch returned ", v.numel(), " values for ", piece.size());
          torch::from_blob(dst[k] + at + (piece.begin - flat.begin), {piece.size()}, torch::kFloat)
              .copy_(v.reshape(-1));
        }
      }
    });
  });
  return true;
}

void NvmeStep::finish_import() {
  // The step writes the compute-dtype copy itself: bring this rank's copy in line with the
  // loaded master (as the CPU path does from its host master).
  const bool host_shard = ctx_.opt.stage == 3 && ctx_.opt.offload_param && !ctx_.param_file_write;
  nvme_->state->pass(offload::NvmeOptimizerState::Mode::kRead, [&](const offload::NvmeOptimizerState::Staged& s) {
    auto master = torch::from_blob(s.master, {s.numel}, torch::kFloat);
    if (ctx_.param_file_write) {
      ctx_.param_file_write(s.begin, master.to(ctx_.opt.dtype));
      return;
    }
    if (host_shard) {
      ctx_.param_shard.narrow(0, s.begin, s.numel).copy_(master);
      return;
    }
    // Blocking copies: the buffer is refilled right after this visit.
    ctx_.L.owned_pieces(s.begin, s.numel, [&](int b, int64_t at, int64_t in_bucket, int64_t len) {
      ctx_.param_dst(b).narrow(0, in_bucket, len).copy_(master.narrow(0, at, len));
    });
  });
}

void NvmeStep::add_state_bytes(ModelStateBytes& m) const {
  CpuAdamStep::add_state_bytes(m);
  // ctx_.state.master and the Adam buffers do not exist: the state is on the drive. host already
  // counts the gradient buffer (and the host shard with offload_param).
  const int64_t owned = ctx_.L.owned_numel();
  m.master = owned * static_cast<int64_t>(sizeof(float));
  m.optimizer = 2 * owned * static_cast<int64_t>(sizeof(float));
  m.nvme = nvme_->state->file_bytes();
  m.host += nvme_->state->staging_bytes();
}

std::string NvmeStep::swap_file() const { return nvme_->state->path(); }

}  // namespace zt::zero
