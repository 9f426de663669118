// ZeRO-Offload: the fp32 master shard and Adam state in host memory, the step on the CPU.
//
// Data flow of one step (stages 2-3; stage 1 reduces at the step, then copies):
//   backward  each bucket's reduce-scatter lands in the device gradient shard; on the
//             boundary micro-step a copy stream waits for it and copies the shard to a
//             host buffer while backward goes on (gradients stream to the host).
//   step      the global norm and the overflow check run on the device gradients (one
//             number); the host waits for the copy stream; the CPU Adam (SIMD + OpenMP)
//             updates master, m and v of one sub-group (sub_group_size elements) and
//             writes its compute-dtype copy to a host buffer, which an upload stream copies
//             to the device while the CPU computes the next sub-group.
//   after     stages 1-2 all-gather the updated shards as without offload; stage 3 gathers
//             them when units are next used (with offload_param they stay in host memory
//             and are uploaded as each unit is gathered).
// Host buffers are page-locked when offload_optimizer.pin_memory is true (required for the
// copies to be asynchronous).
#include <omp.h>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "offload/host_memory.h"
#include "optim/cpu_adam.h"
#include "zero/agree.h"
#include "zero/offload_streams.h"
#include "zero/zero_optimizer.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::zero {

void ZeroOptimizer::init_offload() {
  const int64_t owned = L_.owned_numel();
  host_grad_ = host_buffer(owned);
  // Stage 3 with offload_param: the CPU step writes the host-resident shard directly; with
  // offload_param nvme it writes one bucket at a time into a scratch buffer and from there
  // into the parameter file. NVMe optimizer: the step writes its compute-dtype copy into
  // the staging buffers (zero_offload_nvme.cpp), so there is no separate upload buffer.
  if (opt_.stage == 3 && opt_.offload_param && !opt_.param_nvme) {
    host_param_ = param_shard_;
  } else if (const int64_t n = upload_buffer_numel()) {
    host_param_ = host_buffer(n);
  }
  streamed_.assign(L_.flat.buckets.size(), false);
#ifdef ZT_WITH_CUDA
  if (opt_.device.is_cuda()) {
    streams_ = std::make_shared<CopyStreams>(CopyStreams{c10::cuda::getStreamFromPool(false, opt_.device.index()),
                                                         c10::cuda::getStreamFromPool(false, opt_.device.index())});
  }
#endif
  // Ranks of one host share its cores: unless OMP_NUM_THREADS says otherwise, each rank's
  // CPU Adam gets cores / ranks-on-this-host threads.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int local = std::max(1, comm::discover_rank().local_world_size);
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    omp_set_num_threads(std::max(1, cores / local));
  }
  if (rank_ == 0 && !opt_.nvme) {  // NVMe: init_nvme says where the state is
    log::info("offload_optimizer: %.3f GiB of fp32 state in %s host memory, CPU Adam kernel %s, "
              "%d threads per rank",
                 3.0 * static_cast<double>(state_.master.nbytes()) / (1024.0 * 1024.0 * 1024.0), state_.master.is_pinned() ? "page-locked" : "pageable",
                 optim::kernel_name(optim::best_cpu_kernel()), omp_get_max_threads());
  }
}

torch::Tensor ZeroOptimizer::param_dst(int b) {
  if (opt_.stage == 3) return opt_.offload_param ? torch::Tensor() : L_.owned_view(param_shard_, b);
  return L_.owned_in_flat(flat_param_, b);
}

void ZeroOptimizer::stream_grad_to_host(int b, const comm::WorkPtr& reduce) {
#ifdef ZT_WITH_CUDA
  if (!opt_.device.is_cuda() || !streams_) return;
  c10::cuda::CUDAStreamGuard guard(copy_streams(streams_)->d2h);
  reduce->wait();  // the copy stream waits for the reduce-scatter, not the host
  L_.owned_view(host_grad_, b).copy_(reducer_->grad(b), /*non_blocking=*/true);
  streamed_[b] = true;
#else
  (void)b;
  (void)reduce;
#endif
}

void ZeroOptimizer::offload_step(double factor, const StepInputs& in) {
  torch::NoGradGuard no_grad;
  const int nb = static_cast<int>(L_.flat.buckets.size());
  // Delayed update: first apply the previous step's CPU update (it ran, and uploaded its
  // result to the device, while this step's forward/backward computed); refresh_params()
  // after this call all-gathers it.
  if (opt_.delayed_update && worker_.joinable()) apply_delayed_update();
  // Gradients on the host: what backward did not stream yet is copied now.
  for (int b = 0; b < nb; ++b) {
    if (!streamed_[b]) L_.owned_view(host_grad_, b).copy_(reducer_->grad(b));
  }
#ifdef ZT_WITH_CUDA
  if (streams_) copy_streams(streams_)->d2h.synchronize();
#endif
  std::fill(streamed_.begin(), streamed_.end(), false);
  if (nvme_) {
    nvme_update(host_grad_, factor, in);  // the config rejects the delayed update with NVMe
    return;
  }
  if (!opt_.delayed_update) {
    cpu_update(host_grad_, factor, in, Upload::kParams);
    return;
  }
  // The next backward streams into the other buffer while the CPU reads this one.
  torch::Tensor grads = host_grad_;
  // Page-locked like host_grad_ (empty_like would not be): backward's asynchronous copies
  // into a pageable buffer would block the autograd thread on every bucket.
  if (!host_grad_spare_.defined()) host_grad_spare_ = host_buffer(host_grad_.numel());
  std::swap(host_grad_, host_grad_spare_);
  // The worker uploads each updated sub-group into a device buffer of its own while the
  // next forward/backward still reads the current parameters; the next step only copies
  // it into place on the device.
  if (opt_.device.is_cuda() && !delayed_stage_.defined()) {
    delayed_stage_ = torch::empty({host_param_.numel()}, torch::TensorOptions().device(opt_.device).dtype(opt_.dtype));
  }
  // Two cores of this rank's share stay free for the training thread, which launches the
  // next forward/backward while the CPU step runs.
  const int threads = std::max(1, omp_get_max_threads() - 2);
  worker_ = std::thread([this, grads, factor, in, threads] {
    try {
#ifdef ZT_WITH_CUDA
      // CUDA work on this thread (the uploads) belongs to the rank's device.
      if (opt_.device.is_cuda()) c10::cuda::set_device(opt_.device.index());
#endif
      omp_set_num_threads(threads);
      cpu_update(grads, factor, in, delayed_stage_.defined() ? Upload::kDelayedStage : Upload::kNone);
#ifdef ZT_WITH_CUDA
      // The next worker rewrites host_param_: its uploads must have left it by then.
      if (delayed_stage_.defined()) copy_streams(streams_)->h2d.synchronize();
#endif
    } catch (...) {
      worker_error_ = std::current_exception();
    }
  });
}

int64_t ZeroOptimizer::host_bytes_planned() const {
  if (!opt_.offload_optimizer) return 0;
  const int64_t d = static_cast<int64_t>(c10::elementSize(opt_.dtype));
  const int64_t owned = L_.owned_numel();
  int64_t b = d * owned;                    // host_grad_
  if (!opt_.nvme) b += 12 * owned;          // state_.master, state_.exp_avg, state_.exp_avg_sq (Adam only)
  if (opt_.delayed_update) b += d * owned;  // host_grad_spare_
  if (opt_.stage == 3 && opt_.offload_param && !opt_.param_nvme) {
    b += d * L_.flat.shard_numel;  // param_shard_, which is also host_param_
  }
  return b + d * upload_buffer_numel();  // host_param_ when it is a buffer of its own
}

int64_t ZeroOptimizer::upload_buffer_numel() const {
  if (opt_.param_nvme) return opt_.nvme ? 0 : L_.max_owned_numel();  // one bucket's scratch for the file
  if (opt_.stage == 3 && opt_.offload_param) return 0;              // the step writes the host shard
  return opt_.nvme ? 0 : L_.owned_numel();
}

void ZeroOptimizer::check_host_memory() const {
  const int64_t per_rank = host_bytes_planned();
  if (per_rank == 0) return;
  const int local = std::max(1, comm::discover_rank().local_world_size);
  // Every rank reads the host's free memory before any of them allocates (agree ends in a
  // collective), and all of them decide alike.
  agree<ConfigError>(group_, [&] {
    std::string source;
    const int64_t avail = offload::host_memory_available(&source);
    if (avail < 0) return;  // unknown: nothing to check against
    const int64_t need = per_rank * local;
    ZT_CHECK_T(need <= avail, ConfigError, "zero_optimization.offload_optimizer: the offloaded model state needs ",
               bytes_text(need), " of host memory (", bytes_text(per_rank), " per rank x ", local,
               " rank(s) on this host), but ", bytes_text(avail), " is available (", source,
               "). Put part of it on NVMe (zero_optimization.offload_param.device \"nvme\" moves 2 bytes per "
               "parameter there at stage 3, offload_optimizer.device \"nvme\" 12), use more hosts, or train a "
               "smaller model.");
  });
}

torch::Tensor ZeroOptimizer::host_buffer(int64_t numel, std::optional<at::ScalarType> dtype) const {
  return offload::host_zeros(numel, dtype.value_or(opt_.dtype), opt_.pin_memory && opt_.device.is_cuda());
}

// Joins the worker and puts its update in place: on CUDA the compute stream waits for the
// worker's uploads and copies the staged shard into the parameters (device to device);
// elsewhere the host result is copied in.
void ZeroOptimizer::apply_delayed_update() {
  worker_.join();
  if (worker_error_) std::rethrow_exception(std::exchange(worker_error_, nullptr));
#ifdef ZT_WITH_CUDA
  if (delayed_stage_.defined()) {
    compute_waits_for_uploads(*copy_streams(streams_), opt_.device.index());
    for (size_t k = 0; k < L_.flat.buckets.size(); ++k) {
      auto dst = param_dst(static_cast<int>(k));
      if (dst.defined()) dst.copy_(L_.owned_view(delayed_stage_, static_cast<int>(k)));
    }
    return;
  }
#endif
  upload_all();
}

void ZeroOptimizer::flush_delayed_update() {
  if (!worker_.joinable()) return;
  torch::NoGradGuard no_grad;
  apply_delayed_update();
  refresh_params();
}

void ZeroOptimizer::upload_bucket(int k, Upload to) {
  if (to == Upload::kNone) return;
  auto dst = to == Upload::kDelayedStage ? L_.owned_view(delayed_stage_, k) : param_dst(k);
  if (dst.defined()) dst.copy_(L_.owned_view(host_param_, k), /*non_blocking=*/true);  // on the current stream
}

void ZeroOptimizer::upload_all() {
  for (size_t k = 0; k < L_.flat.buckets.size(); ++k) upload_bucket(static_cast<int>(k), Upload::kParams);
}

void ZeroOptimizer::cpu_update(const torch::Tensor& grads, double factor, const StepInputs& in, Upload upload) {
  torch::NoGradGuard no_grad;
  const int nb = static_cast<int>(L_.flat.buckets.size());
#ifdef ZT_WITH_CUDA
  CopyStreams* cs = upload != Upload::kNone && streams_ ? copy_streams(streams_) : nullptr;
#endif
  // CPU Adam per sub-group; each sub-group's upload overlaps the next one's compute.
  std::vector<optim::AdamHyper> hs;
  for (int g = 0; g < rule_.num_groups(); ++g) hs.push_back(rule_.adam_hyper(factor, in, g));
  const bool half_out = opt_.dtype != at::kFloat;
  int b = 0;
  while (b < nb) {
    int end = b;
    int64_t n = 0;
    while (end < nb && (end == b || n + L_.owned_view(state_.master, end).numel() <= opt_.sub_group_numel)) {
      n += L_.owned_view(state_.master, end).numel();
      ++end;
    }
    for (int k = b; k < end; ++k) {
      auto master = L_.owned_view(state_.master, k), m = L_.owned_view(state_.exp_avg, k), v = L_.owned_view(state_.exp_avg_sq, k);
      auto out = param_nvme_ ? host_param_.narrow(0, 0, master.numel()) : L_.owned_view(host_param_, k);
      auto g = L_.owned_view(grads, k);
      // One call per parameter-group run of the bucket (one call with one group).
      rule_.for_group_runs(L_.owned_begin(k), master.numel(), [&](int64_t at, int64_t len, int grp) {
        optim::cpu_adam_step(master.narrow(0, at, len), m.narrow(0, at, len), v.narrow(0, at, len),
                             g.narrow(0, at, len), hs[grp], half_out ? out.narrow(0, at, len) : torch::Tensor());
      });
      if (!half_out) out.copy_(master);
      if (param_nvme_) param_nvme_write(L_.owned_begin(k), out);  // read back when its unit is next gathered
    }
    // Upload the sub-group on the upload stream (stage 3 with offload_param: it stays on
    // the host).
    if (upload != Upload::kNone) {
#ifdef ZT_WITH_CUDA
      std::optional<c10::cuda::CUDAStreamGuard> guard;
      if (cs) guard.emplace(cs->h2d);
#endif
      for (int k = b; k < end; ++k) upload_bucket(k, upload);
    }
    b = end;
  }
#ifdef ZT_WITH_CUDA
  // The delayed update's uploads are waited for when the next step applies them.
  if (cs && upload == Upload::kParams) compute_waits_for_uploads(*cs, opt_.device.index());
#endif
}

}  // namespace zt::zero
