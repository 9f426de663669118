#include "zero/zero_optimizer.h"

#include "kernels/aten.h"
#include "offload/host_memory.h"
#include "zero/agree.h"
#include "zero/grad_norm.h"
#include "zero/step_cpu_adam.h"
#include "zero/step_device.h"
#include "zero/step_nvme.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>

#include "zerotrain/error.h"

namespace zt::zero {
namespace {
constexpr int64_t kAlign = 64;  // elements: shard boundaries stay 128-byte aligned in bf16
}  // namespace

ZeroOptimizer::ZeroOptimizer(std::vector<torch::Tensor> params, comm::GroupPtr group, ZeroOptions options)
    : opt_(std::move(options)), group_(std::move(group)), rule_(opt_.optimizer, opt_.groups) {
  ZT_CHECK_T(opt_.stage >= 0 && opt_.stage <= 3, ConfigError, "zero_optimization.stage ", opt_.stage,
             " does not exist: use 0, 1, 2 or 3");
  ZT_CHECK_T(!params.empty(), ConfigError, "the model has no trainable parameters to optimize");
  rank_ = group_->rank();
  world_ = group_->size();
  L_.rank = rank_;
  L_.owns_all = opt_.stage == 0;
  ZT_ASSERT(opt_.param_group.empty() || opt_.param_group.size() == params.size(), "param_group size");
  for (int g : opt_.param_group) ZT_ASSERT(g >= 0 && g < rule_.num_groups(), "param_group index");

  torch::NoGradGuard no_grad;
  auto topt = torch::TensorOptions().device(opt_.device);
  if (opt_.stage == 3) {
    init_stage3(params);
    init_frozen();
  } else {
    // Layout order: reverse of the user's order, the order gradients become ready.
    const int n = static_cast<int>(params.size());
    std::vector<int64_t> numels;
    std::vector<int> order;
    for (int i = n - 1; i >= 0; --i) order.push_back(i);
    // Parameter groups: each group's parameters contiguous (see [Group Runs]).
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return group_of_user(a) < group_of_user(b); });
    for (int i : order) {
      params_.push_back(params[i]);
      user_index_.push_back(i);
      numels.push_back(params[i].numel());
    }
    L_.flat = make_flat_layout(numels, std::max<int64_t>(1, opt_.reduce_bucket_numel), world_, kAlign);
    flat_param_ = torch::zeros({L_.flat.total_numel}, topt.dtype(opt_.dtype));
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      ZT_CHECK_T(p.device() == opt_.device && p.scalar_type() == opt_.dtype, InternalError,
                 "parameter not on the engine's device/dtype");
      auto view = flat_param_.narrow(0, L_.flat.params[i].offset, L_.flat.params[i].numel);
      view.copy_(p.detach().reshape(-1));
      p.set_data(view.view(p.sizes()));
    }
    // Every rank starts from rank 0's parameters (as DeepSpeed does at initialize).
    if (world_ > 1) group_->broadcast(flat_param_, 0);
    make_reducer();
  }

  const int64_t owned = L_.owned_numel();
  rule_.build_group_runs(L_, [this](int i) { return group_of_user(user_index_[i]); });
  // Offload: the fp32 shard and its optimizer state live in host memory (NVMe: in a swap
  // file, zero_offload_nvme.cpp).
  // The fp32 state: on the device, or zero-filled host buffers with offload.
  auto state = [&](int64_t n) {
    return opt_.offload_optimizer ? host_buffer(n, at::kFloat) : torch::zeros({n}, topt.dtype(at::kFloat));
  };
  if (opt_.offload_optimizer) {
    // The config layer checks both (src/config/sections.cpp).
    ZT_ASSERT(opt_.stage >= 1, "ZeroOptions.offload_optimizer at stage 0");
    ZT_ASSERT(!rule_.sgd(), "ZeroOptions.offload_optimizer with SGD");
  }
  ZT_ASSERT(!opt_.nvme || opt_.offload_optimizer, "ZeroOptions.nvme needs offload_optimizer");
  // The config layer rejects delayed_param_update with nvme (src/config/sections.cpp).
  ZT_ASSERT(!(opt_.nvme && opt_.delayed_update), "the delayed update is the CPU step's: not with NVMe");
  if (opt_.nvme) NvmeStep::check_path(opt_, group_, owned);  // before any state is allocated
  if (opt_.stage != 3) check_host_memory();  // stage 3: init_stage3, before its host shard
  if (!opt_.nvme) {
    state_.master = state(owned);
    for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
      const int bi = static_cast<int>(b);
      if (param_nvme_) {  // offload_param nvme: the shard is in the parameter file
        L_.owned_view(state_.master, bi).copy_(param_nvme_read(L_.owned_begin(bi), L_.owned_view(state_.master, bi).numel()).first);
        continue;
      }
      L_.owned_view(state_.master, b)
          .copy_(opt_.stage == 3 ? L_.owned_view(param_shard_, b)
                                 : L_.owned_in_flat(flat_param_, b));
    }
  }
  // Stage 3: the master is the only standing copy of the shard, except with offload: then
  // the compute-dtype shard stays (on the device, or in host memory with offload_param)
  // and the CPU step writes it.
  if (!opt_.offload_optimizer) param_shard_ = torch::Tensor();
  if (rule_.sgd()) {
    if (rule_.momentum_buffer()) state_.momentum = state(owned);
  } else if (!opt_.nvme) {
    state_.exp_avg = state(owned);
    state_.exp_avg_sq = state(owned);
  }
  make_backend();

  reducer_->allocate();
  if (opt_.stage == 2 || (opt_.stage <= 1 && world_ > 1)) reducer_->install_hooks(0, params_.size());  // stage 3: init_stage3
}

void ZeroOptimizer::make_backend() {
  // The device step (fused kernel / ATen) unless offload_optimizer moves the state to the
  // host (CPU Adam) or to a swap file (NVMe).
  if (!opt_.offload_optimizer) {
    backend_ = std::make_unique<DeviceStep>(
        L_, rule_, state_, DeviceStepOptions{opt_.device, opt_.dtype}, [this](int b) { return reducer_->grad(b); },
        [this](int b) { return opt_.stage <= 2 ? L_.owned_in_flat(flat_param_, b) : torch::Tensor(); });
    return;
  }
  StepContext ctx{opt_,
                  L_,
                  rule_,
                  state_,
                  group_,
                  [this](int b) { return reducer_->grad(b); },
                  [this](int b) { return param_dst(b); },
                  [this](int b) {
                    return opt_.stage == 3 ? L_.owned_view(param_shard_, b) : L_.owned_in_flat(flat_param_, b);
                  },
                  param_shard_,
                  nullptr,
                  nullptr};
  if (param_nvme_) {
    ctx.param_file_write = [this](int64_t begin, const torch::Tensor& src) { param_nvme_write(begin, src); };
    ctx.param_file_read = [this](int64_t begin, int64_t numel) { return param_nvme_read(begin, numel).first; };
  }
  if (opt_.nvme) {
    backend_ = std::make_unique<NvmeStep>(std::move(ctx));
  } else {
    backend_ = std::make_unique<CpuAdamStep>(std::move(ctx));
  }
}

void ZeroOptimizer::make_reducer() {
  plan_weighted_pieces();
  ReducerOptions ro;
  ro.stage = opt_.stage;
  ro.dtype = opt_.dtype;
  ro.device = opt_.device;
  ro.overlap_comm = opt_.overlap_comm;
  ro.prescale_gradients = opt_.prescale_gradients;
  ro.gradient_predivide_factor = opt_.gradient_predivide_factor;
  ro.grad_scale = opt_.grad_scale;
  reducer_ = std::make_unique<GradReducer>(L_, params_, user_index_, group_, ro);
  // Offload: the last micro-step's reduced shard is final; stream it to the host now,
  // while backward goes on.
  reducer_->on_issued = [this](int b, const comm::WorkPtr& work, bool final) {
    // Not with post-scaling still to come (prescale_gradients, grad_scale): CpuAdamStep::update
    // copies those buckets once they are final.
    if (opt_.offload_optimizer && final && !opt_.prescale_gradients && opt_.grad_scale == 1.0) {
      backend_->grad_issued(b, work);
    }
  };
  // Stage 3: the unit's gradients are out; its full parameters are no longer needed.
  reducer_->on_done = [this](int b) {
    if (gatherer_) gatherer_->on_reduced(b);
  };
}

ZeroOptimizer::~ZeroOptimizer() {
  backend_.reset();  // joins a delayed CPU step still running, which uses this shard group's buffers
}

void ZeroOptimizer::begin_backward(bool boundary, bool first_micro_step) {
  reducer_->begin_backward(boundary, first_micro_step);
}

DeviceSpan ZeroOptimizer::end_backward() {
  torch::NoGradGuard no_grad;
  reducer_->launch_remaining();
  if (gatherer_) gatherer_->end_backward();  // releases units prefetched but never used
  for (auto* g : frozen_gatherers()) g->end_backward();
  return reducer_->wait();
}

StepOutcome ZeroOptimizer::step(const StepInputs& in) {
  // One number carries both the overflow check and the clipping norm (zero/grad_norm.h):
  // this shard group's partial sum of squares, combined with the model-parallel ranks'.
  auto sq = prepare_step();
  return apply_step(combine_norm_sq({sq}, opt_.model_parallel), in);
}

torch::Tensor ZeroOptimizer::prepare_step() {
  torch::NoGradGuard no_grad;
  // Stages 0-1 without overlap_comm: all-reduce (0) or reduce-scatter (1) now; grad_scale.
  reducer_->reduce_now();
  return grad_norm_sq();
}

StepOutcome ZeroOptimizer::apply_step(const torch::Tensor& sq, const StepInputs& in) {
  torch::NoGradGuard no_grad;
  StepOutcome out;
  double factor = 1.0 / in.loss_scale;
  const bool defer = in.defer && backend_->can_defer();
  if (defer) {
    backend_->defer(sq, in);  // overflow check and clipping stay on the device
    out.norm_sq = sq;
    factor = 1.0;
  } else {
    const double total_sq = sq.item<double>() / (in.loss_scale * in.loss_scale);
    if (!std::isfinite(total_sq)) {
      out.overflow = true;
      return out;
    }
    out.grad_norm = std::sqrt(total_sq);
    if (in.clip > 0) {
      const double coef = in.clip / (out.grad_norm + 1e-6);
      if (coef < 1.0) factor *= coef;
    }
  }
  // Offload: the CPU step and its uploads (delayed: the previous step's put in place), then
  // the stage's refresh below.
  params_written_ = backend_->update(factor, in);
  refresh_params();
  backend_->end_step();
  return out;
}

void ZeroOptimizer::refresh_params() {
  if (opt_.stage == 3) {
    // The shard is all this rank keeps; units are gathered again when next used (no
    // all-gather after the step). Gathered copies are stale now.
    release_all(/*persistent_too=*/true);
    return;
  }
  // Cast the updated fp32 shard into the compute-dtype parameters (offload: the CPU step
  // already uploaded them).
  for (size_t b = 0; b < L_.flat.buckets.size() && !opt_.offload_optimizer && !params_written_; ++b) {
    L_.owned_in_flat(flat_param_, b).copy_(L_.owned_view(state_.master, b));
  }
  if (L_.owns_all || world_ == 1) return;
  // Stages 1-2: all-gather every bucket in place, at most allgather_bucket_size elements
  // in flight at once.
  std::vector<comm::WorkPtr> works;
  int64_t in_flight = 0;
  for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
    auto full = L_.bucket_view(flat_param_, b);
    auto mine = L_.shard_view(flat_param_, b);
    if (in_flight > 0 && in_flight + full.numel() > opt_.allgather_bucket_numel) {
      for (auto& w : works) w->wait();
      works.clear();
      in_flight = 0;
    }
    works.push_back(group_->all_gather(full, mine, true));
    in_flight += full.numel();
  }
  for (auto& w : works) w->wait();
}

// [Norm Weights]
//  * ZeroOptions.norm_weight gives each parameter a weight in the squared gradient norm:
//    the pieces of this rank's owned gradient that belong to a parameter of weight w != 1
//    add (w - 1) x their squared norm to the plain sum, so a parameter of weight w counts
//    w times. With tensor or pipeline parallelism a parameter held (identically) by k
//    model-parallel ranks has w = 1/k: the sum over the model-parallel group counts it once.
//  * The pieces are planned once from the layout (plan_weighted_pieces, in the
//    constructor); with no weight != 1 the norm is exactly the unweighted one, with no
//    extra work.
void ZeroOptimizer::plan_weighted_pieces() {
  weighted_pieces_.clear();
  if (opt_.norm_weight.empty()) return;
  ZT_CHECK_T(opt_.norm_weight.size() == params_.size(), ConfigError, "norm_weight has ", opt_.norm_weight.size(),
             " entries for ", params_.size(), " managed parameters");
  for (int b = 0; b < L_.num_buckets(); ++b) {
    const Bucket& B = L_.flat.buckets[b];
    const Range owned = L_.owned_flat_range(b);
    for (int li = B.first_param; li < B.first_param + B.num_params; ++li) {
      const double w = opt_.norm_weight[static_cast<size_t>(user_index_[li])];
      ZT_CHECK_T(std::isfinite(w) && w >= 0.0, ConfigError, "norm weight ", w, " of parameter ",
                 user_index_[li], " must be finite and >= 0");
      if (w == 1.0) continue;
      const ParamSlot& P = L_.flat.params[li];
      const Range r = intersect({P.offset, P.offset + P.numel}, owned);
      if (r.size() > 0) weighted_pieces_.push_back({b, r.begin - owned.begin, r.size(), w - 1.0});
    }
  }
}

torch::Tensor ZeroOptimizer::grad_norm_sq() {
  // One fp32 norm per bucket, read in the compute dtype: no fp32 copy of all gradients
  // exists at any time. Sharded gradients: summed over the group.
  const int nb = L_.num_buckets();
  std::vector<torch::Tensor> norms;
  norms.reserve(nb);
  for (int b = 0; b < nb; ++b) norms.push_back(at::linalg_vector_norm(reducer_->grad(b), 2, std::nullopt, false, at::kFloat));
  auto sq = torch::stack(norms).to(at::kDouble).square().sum().reshape({1});
  if (!weighted_pieces_.empty()) {
    // [Norm Weights] each piece counted `weight` times instead of once.
    std::vector<torch::Tensor> extra;
    extra.reserve(weighted_pieces_.size());
    for (const auto& w : weighted_pieces_) {
      auto piece = reducer_->grad(w.bucket).narrow(0, w.begin, w.numel);
      extra.push_back(at::linalg_vector_norm(piece, 2, std::nullopt, false, at::kFloat).to(at::kDouble).square() * w.extra);
    }
    sq = sq + torch::stack(extra).sum().reshape({1});
  }
  if (!L_.owns_all && world_ > 1) group_->all_reduce(sq, comm::ReduceOp::kSum);
  return sq;
}

void ZeroOptimizer::zero_grad() { reducer_->zero_grad(); }

ModelStateBytes ZeroOptimizer::state_bytes() const {
  auto nb = [](const torch::Tensor& t) -> int64_t { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; };
  ModelStateBytes m;
  m.params = nb(flat_param_) + nb(param_shard_);
  m.frozen_storage = frozen_storage_ ? frozen_storage_->shard_bytes() : 0;
  m.frozen = (frozen_ ? frozen_->shard_bytes() : 0) + m.frozen_storage;
  m.grads = reducer_->grad_bytes();
  m.master = state_.master_bytes();
  m.optimizer = state_.moment_bytes();
  // Offload: the host buffers (NVMe: master and Adam state on the drive, staging buffers in
  // host memory); the delayed update's device stage.
  backend_->add_state_bytes(m);
  if (param_nvme_) param_nvme_state_bytes(m);  // the compute-dtype shard on the drive, its slots in host memory
  return m;
}

void ZeroOptimizer::reset_counters() {
  reducer_->reset_counters();
  if (gatherer_) gatherer_->reset_counters();
  for (auto* g : frozen_gatherers()) g->reset_counters();
}

std::vector<torch::Tensor> ZeroOptimizer::gather_master_params() {
  torch::NoGradGuard no_grad;
  flush_delayed_update();
  // NVMe: the master is read back from the swap file (a host copy of this rank's shard).
  const torch::Tensor master = backend_->state_buffers(/*master_only=*/true)[0];
  torch::Tensor full;
  if (L_.owns_all) {
    full = master;
  } else {
    full = torch::empty({L_.flat.total_numel}, master.options());
    for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
      auto out = L_.bucket_view(full, b);
      auto in = L_.owned_view(master, b).clone();
      group_->all_gather(out, in);
    }
  }
  std::vector<torch::Tensor> result(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto shape = opt_.stage == 3 ? c10::IntArrayRef(shapes_[i]) : params_[i].sizes();
    result[user_index_[i]] = full.narrow(0, L_.flat.params[i].offset, L_.flat.params[i].numel).view(shape).clone();
  }
  return result;
}

// ---- Offload glue: where the CPU step writes, and the host memory it needs ----

torch::Tensor ZeroOptimizer::param_dst(int b) {
  if (opt_.stage == 3) return opt_.offload_param ? torch::Tensor() : L_.owned_view(param_shard_, b);
  return L_.owned_in_flat(flat_param_, b);
}

void ZeroOptimizer::flush_delayed_update() {
  torch::NoGradGuard no_grad;
  if (backend_->flush()) refresh_params();
}

void ZeroOptimizer::check_host_memory() const {
  const int64_t per_rank = CpuAdamStep::host_bytes_planned(opt_, L_);
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

std::string ZeroOptimizer::nvme_file() const { return backend_->swap_file(); }

torch::Tensor ZeroOptimizer::host_buffer(int64_t numel, std::optional<at::ScalarType> dtype) const {
  return CpuAdamStep::host_buffer(opt_, numel, dtype);
}

}  // namespace zt::zero
