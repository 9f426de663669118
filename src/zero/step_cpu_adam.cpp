// CpuAdamStep (step_cpu_adam.h): ZeRO-Offload, the fp32 master shard and Adam state in host
// memory, the step on the CPU.
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
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <utility>

#include "log/log.h"
#include "offload/host_memory.h"
#include "optim/cpu_adam.h"
#include "zero/offload_streams.h"
#include "zero/step_cpu_adam.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::zero {

CpuAdamStep::CpuAdamStep(StepContext ctx) : StepBackend(ctx.state), ctx_(std::move(ctx)) {
  const ZeroOptions& opt = ctx_.opt;
  const ShardLayout& L = ctx_.L;
  const int64_t owned = L.owned_numel();
  host_grad_ = host_buffer(opt, owned);
  // Stage 3 with offload_param: the CPU step writes the host-resident shard directly; with
  // offload_param nvme it writes one bucket at a time into a scratch buffer and from there
  // into the parameter file. NVMe optimizer: the step writes its compute-dtype copy into
  // the staging buffers (step_nvme.cpp), so there is no separate upload buffer.
  if (opt.stage == 3 && opt.offload_param && !opt.param_nvme) {
    host_param_ = ctx_.param_shard;
  } else if (const int64_t n = upload_buffer_numel(opt, L)) {
    host_param_ = host_buffer(opt, n);
  }
  streamed_.assign(L.flat.buckets.size(), false);
#ifdef ZT_WITH_CUDA
  if (opt.device.is_cuda()) {
    streams_ = std::make_shared<CopyStreams>(CopyStreams{c10::cuda::getStreamFromPool(false, opt.device.index()),
                                                         c10::cuda::getStreamFromPool(false, opt.device.index())});
  }
#endif
  // Ranks of one host share its cores: unless OMP_NUM_THREADS says otherwise, each rank's
  // CPU Adam gets cores / ranks-on-this-host threads.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int local = std::max(1, comm::discover_rank().local_world_size);
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    omp_set_num_threads(std::max(1, cores / local));
  }
  if (ctx_.group->rank() == 0 && !opt.nvme) {  // NVMe: NvmeStep says where the state is
    const torch::Tensor& master = ctx_.state.master;
    log::info("offload_optimizer: %.3f GiB of fp32 state in %s host memory, CPU Adam kernel %s, "
              "%d threads per rank",
                 3.0 * static_cast<double>(master.nbytes()) / (1024.0 * 1024.0 * 1024.0), master.is_pinned() ? "page-locked" : "pageable",
                 optim::kernel_name(optim::best_cpu_kernel()), omp_get_max_threads());
  }
}

CpuAdamStep::~CpuAdamStep() {
  if (worker_.joinable()) worker_.join();  // a delayed CPU step still running
}

void CpuAdamStep::grad_issued(int b, const comm::WorkPtr& reduce) {
#ifdef ZT_WITH_CUDA
  if (!ctx_.opt.device.is_cuda() || !streams_) return;
  c10::cuda::CUDAStreamGuard guard(copy_streams(streams_)->d2h);
  reduce->wait();  // the copy stream waits for the reduce-scatter, not the host
  ctx_.L.owned_view(host_grad_, b).copy_(ctx_.grad(b), /*non_blocking=*/true);
  streamed_[b] = true;
#else
  (void)b;
  (void)reduce;
#endif
}

void CpuAdamStep::grads_to_host() {
  const int nb = static_cast<int>(ctx_.L.flat.buckets.size());
  for (int b = 0; b < nb; ++b) {
    if (!streamed_[b]) ctx_.L.owned_view(host_grad_, b).copy_(ctx_.grad(b));
  }
#ifdef ZT_WITH_CUDA
  if (streams_) copy_streams(streams_)->d2h.synchronize();
#endif
  std::fill(streamed_.begin(), streamed_.end(), false);
}

bool CpuAdamStep::update(double factor, const StepInputs& in) {
  torch::NoGradGuard no_grad;
  const ZeroOptions& opt = ctx_.opt;
  // Delayed update: first apply the previous step's CPU update (it ran, and uploaded its
  // result to the device, while this step's forward/backward computed); the owner's
  // refresh of the parameters after this call all-gathers it.
  if (opt.delayed_update && worker_.joinable()) apply_delayed_update();
  grads_to_host();
  if (!opt.delayed_update) {
    cpu_update(host_grad_, factor, in, Upload::kParams);
    return false;  // the parameters come from the uploads; the owner casts nothing either way
  }
  // The next backward streams into the other buffer while the CPU reads this one.
  torch::Tensor grads = host_grad_;
  // Page-locked like host_grad_ (empty_like would not be): backward's asynchronous copies
  // into a pageable buffer would block the autograd thread on every bucket.
  if (!host_grad_spare_.defined()) host_grad_spare_ = host_buffer(opt, host_grad_.numel());
  std::swap(host_grad_, host_grad_spare_);
  // The worker uploads each updated sub-group into a device buffer of its own while the
  // next forward/backward still reads the current parameters; the next step only copies
  // it into place on the device.
  if (opt.device.is_cuda() && !delayed_stage_.defined()) {
    delayed_stage_ = torch::empty({host_param_.numel()}, torch::TensorOptions().device(opt.device).dtype(opt.dtype));
  }
  // Two cores of this rank's share stay free for the training thread, which launches the
  // next forward/backward while the CPU step runs.
  const int threads = std::max(1, omp_get_max_threads() - 2);
  worker_ = std::thread([this, grads, factor, in, threads] {
    try {
#ifdef ZT_WITH_CUDA
      // CUDA work on this thread (the uploads) belongs to the rank's device.
      if (ctx_.opt.device.is_cuda()) c10::cuda::set_device(ctx_.opt.device.index());
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
  return false;
}

int64_t CpuAdamStep::host_bytes_planned(const ZeroOptions& opt, const ShardLayout& L) {
  if (!opt.offload_optimizer) return 0;
  const int64_t d = static_cast<int64_t>(c10::elementSize(opt.dtype));
  const int64_t owned = L.owned_numel();
  int64_t b = d * owned;                   // host_grad_
  if (!opt.nvme) b += 12 * owned;          // state.master, state.exp_avg, state.exp_avg_sq (Adam only)
  if (opt.delayed_update) b += d * owned;  // host_grad_spare_
  if (opt.stage == 3 && opt.offload_param && !opt.param_nvme) {
    b += d * L.flat.shard_numel;  // the owner's param_shard_, which is also host_param_
  }
  return b + d * upload_buffer_numel(opt, L);  // host_param_ when it is a buffer of its own
}

int64_t CpuAdamStep::upload_buffer_numel(const ZeroOptions& opt, const ShardLayout& L) {
  if (opt.param_nvme) return opt.nvme ? 0 : L.max_owned_numel();  // one bucket's scratch for the file
  if (opt.stage == 3 && opt.offload_param) return 0;               // the step writes the host shard
  return opt.nvme ? 0 : L.owned_numel();
}

torch::Tensor CpuAdamStep::host_buffer(const ZeroOptions& opt, int64_t numel, std::optional<at::ScalarType> dtype) {
  return offload::host_zeros(numel, dtype.value_or(opt.dtype), opt.pin_memory && opt.device.is_cuda());
}

// Joins the worker and puts its update in place: on CUDA the compute stream waits for the
// worker's uploads and copies the staged shard into the parameters (device to device);
// elsewhere the host result is copied in.
void CpuAdamStep::apply_delayed_update() {
  worker_.join();
  if (worker_error_) std::rethrow_exception(std::exchange(worker_error_, nullptr));
#ifdef ZT_WITH_CUDA
  if (delayed_stage_.defined()) {
    compute_waits_for_uploads(*copy_streams(streams_), ctx_.opt.device.index());
    for (size_t k = 0; k < ctx_.L.flat.buckets.size(); ++k) {
      auto dst = ctx_.param_dst(static_cast<int>(k));
      if (dst.defined()) dst.copy_(ctx_.L.owned_view(delayed_stage_, static_cast<int>(k)));
    }
    return;
  }
#endif
  upload_all();
}

bool CpuAdamStep::flush() {
  if (!worker_.joinable()) return false;
  apply_delayed_update();
  return true;
}

void CpuAdamStep::drop_in_flight() {
  if (worker_.joinable()) worker_.join();  // its update is replaced by the loaded state
  worker_error_ = nullptr;
}

void CpuAdamStep::finish_import() {
  // The step writes the compute-dtype copy itself (the owner does not cast the master):
  // bring this rank's copy in line with the loaded master.
  const ShardLayout& L = ctx_.L;
  for (size_t b = 0; b < L.flat.buckets.size(); ++b) {
    const int bi = static_cast<int>(b);
    auto master = L.owned_view(ctx_.state.master, bi);
    if (ctx_.param_file_write) {
      ctx_.param_file_write(L.owned_begin(bi), master.to(ctx_.opt.dtype));
      continue;
    }
    L.owned_view(host_param_, bi).copy_(master);
    auto dst = ctx_.param_dst(bi);
    if (dst.defined()) dst.copy_(master);
  }
}

void CpuAdamStep::add_state_bytes(ModelStateBytes& m) const {
  auto nb = [](const torch::Tensor& t) -> int64_t { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; };
  m.params += nb(delayed_stage_);
  m.host = m.master + m.optimizer + nb(host_grad_) + nb(host_grad_spare_) +
           (host_param_.is_same(ctx_.param_shard) ? 0 : nb(host_param_));
  if (ctx_.opt.offload_param) m.host += nb(ctx_.param_shard);
}

void CpuAdamStep::upload_bucket(int k, Upload to) {
  if (to == Upload::kNone) return;
  auto dst = to == Upload::kDelayedStage ? ctx_.L.owned_view(delayed_stage_, k) : ctx_.param_dst(k);
  if (dst.defined()) dst.copy_(ctx_.L.owned_view(host_param_, k), /*non_blocking=*/true);  // on the current stream
}

void CpuAdamStep::upload_all() {
  for (size_t k = 0; k < ctx_.L.flat.buckets.size(); ++k) upload_bucket(static_cast<int>(k), Upload::kParams);
}

void CpuAdamStep::cpu_update(const torch::Tensor& grads, double factor, const StepInputs& in, Upload upload) {
  torch::NoGradGuard no_grad;
  const ShardLayout& L = ctx_.L;
  const OwnedState& st = ctx_.state;
  const int nb = static_cast<int>(L.flat.buckets.size());
#ifdef ZT_WITH_CUDA
  CopyStreams* cs = upload != Upload::kNone && streams_ ? copy_streams(streams_) : nullptr;
#endif
  // CPU Adam per sub-group; each sub-group's upload overlaps the next one's compute.
  std::vector<optim::AdamHyper> hs;
  for (int g = 0; g < ctx_.rule.num_groups(); ++g) hs.push_back(ctx_.rule.adam_hyper(factor, in, g));
  const bool half_out = ctx_.opt.dtype != at::kFloat;
  int b = 0;
  while (b < nb) {
    int end = b;
    int64_t n = 0;
    while (end < nb && (end == b || n + L.owned_view(st.master, end).numel() <= ctx_.opt.sub_group_numel)) {
      n += L.owned_view(st.master, end).numel();
      ++end;
    }
    for (int k = b; k < end; ++k) {
      auto master = L.owned_view(st.master, k), m = L.owned_view(st.exp_avg, k), v = L.owned_view(st.exp_avg_sq, k);
      auto out = ctx_.param_file_write ? host_param_.narrow(0, 0, master.numel()) : L.owned_view(host_param_, k);
      auto g = L.owned_view(grads, k);
      // One call per parameter-group run of the bucket (one call with one group).
      ctx_.rule.for_group_runs(L.owned_begin(k), master.numel(), [&](int64_t at, int64_t len, int grp) {
        optim::cpu_adam_step(master.narrow(0, at, len), m.narrow(0, at, len), v.narrow(0, at, len),
                             g.narrow(0, at, len), hs[grp], half_out ? out.narrow(0, at, len) : torch::Tensor());
      });
      if (!half_out) out.copy_(master);
      if (ctx_.param_file_write) ctx_.param_file_write(L.owned_begin(k), out);  // read back when its unit is next gathered
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
  if (cs && upload == Upload::kParams) compute_waits_for_uploads(*cs, ctx_.opt.device.index());
#endif
}

}  // namespace zt::zero
