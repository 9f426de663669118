#include "zero/zero_optimizer.h"

#include "kernels/aten.h"

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

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

ZeroOptimizer::ZeroOptimizer(std::vector<torch::Tensor> params, comm::GroupPtr group, ZeroOptions options)
    : opt_(std::move(options)), group_(std::move(group)) {
  ZT_CHECK_T(opt_.stage >= 0 && opt_.stage <= 3, ConfigError, "zero_optimization.stage ", opt_.stage,
             " does not exist: use 0, 1, 2 or 3");
  ZT_CHECK_T(!params.empty(), ConfigError, "the model has no trainable parameters to optimize");
  rank_ = group_->rank();
  world_ = group_->size();
  owns_all_ = opt_.stage == 0;
  groups_ = opt_.groups;
  if (groups_.empty()) groups_.push_back({"", 1.0, opt_.optimizer.params.weight_decay});
  ZT_ASSERT(opt_.param_group.empty() || opt_.param_group.size() == params.size(), "param_group size");
  for (int g : opt_.param_group) ZT_ASSERT(g >= 0 && g < static_cast<int>(groups_.size()), "param_group index");

  torch::NoGradGuard no_grad;
  auto topt = torch::TensorOptions().device(opt_.device);
  if (opt_.stage == 3) {
    init_stage3(params);
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
    layout_ = make_flat_layout(numels, std::max<int64_t>(1, opt_.reduce_bucket_numel), world_, kAlign);
    flat_param_ = torch::zeros({layout_.total_numel}, topt.dtype(opt_.dtype));
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      ZT_CHECK_T(p.device() == opt_.device && p.scalar_type() == opt_.dtype, InternalError,
                 "parameter not on the engine's device/dtype");
      auto view = flat_param_.narrow(0, layout_.params[i].offset, layout_.params[i].numel);
      view.copy_(p.detach().reshape(-1));
      p.set_data(view.view(p.sizes()));
    }
    // Every rank starts from rank 0's parameters (as DeepSpeed does at initialize).
    if (world_ > 1) group_->broadcast(flat_param_, 0);
  }

  const int64_t owned = owns_all_ ? layout_.total_numel : layout_.shard_numel;
  build_group_runs(owned);
  const std::string type = lower(opt_.optimizer.type);
  sgd_ = type == "sgd";
  adamw_ = type == "adamw" || opt_.optimizer.params.adam_w_mode;
  // Offload: the fp32 shard and its optimizer state live in host memory (NVMe: in a swap
  // file, zero_offload_nvme.cpp).
  // The fp32 state: on the device, or zero-filled host buffers with offload.
  auto state = [&](int64_t n) {
    return opt_.offload_optimizer ? host_buffer(n, at::kFloat) : torch::zeros({n}, topt.dtype(at::kFloat));
  };
  if (opt_.offload_optimizer) {
    // The config layer checks both (src/config/sections.cpp).
    ZT_ASSERT(opt_.stage >= 1, "ZeroOptions.offload_optimizer at stage 0");
    ZT_ASSERT(!sgd_, "ZeroOptions.offload_optimizer with SGD");
  }
  ZT_CHECK_T(!opt_.nvme || opt_.offload_optimizer, InternalError, "ZeroOptions.nvme needs offload_optimizer");
  // The config layer rejects delayed_param_update with nvme (src/config/sections.cpp).
  ZT_ASSERT(!(opt_.nvme && opt_.delayed_update), "ZeroOptions.delayed_update with nvme");
  if (opt_.nvme) check_nvme(owned);  // before any state is allocated
  if (opt_.stage != 3) check_host_memory();  // stage 3: init_stage3, before its host shard
  if (!opt_.nvme) {
    master_ = state(owned);
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      const int bi = static_cast<int>(b);
      if (param_nvme_) {  // offload_param nvme: the shard is in the parameter file
        owned_view(master_, bi).copy_(param_nvme_read(owned_begin(bi), owned_view(master_, bi).numel()).first);
        continue;
      }
      owned_view(master_, b)
          .copy_(opt_.stage == 3 ? owned_view(param_shard_, b)
                                 : (owns_all_ ? bucket_view(flat_param_, b) : shard_view(flat_param_, b)));
    }
  }
  // Stage 3: the master is the only standing copy of the shard, except with offload: then
  // the compute-dtype shard stays (on the device, or in host memory with offload_param)
  // and the CPU step writes it.
  if (!opt_.offload_optimizer) param_shard_ = torch::Tensor();
  if (sgd_) {
    if (opt_.optimizer.params.momentum != 0) momentum_buf_ = state(owned);
  } else if (!opt_.nvme) {
    exp_avg_ = state(owned);
    exp_avg_sq_ = state(owned);
  }
  if (opt_.offload_optimizer) init_offload();
  if (opt_.nvme) init_nvme(owned);
  step_t_ = torch::zeros({}, topt.dtype(at::kFloat));

  if (opt_.stage <= 1) {
    flat_grad_ = torch::zeros({layout_.total_numel}, topt.dtype(opt_.dtype));
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].mutable_grad() =
          flat_grad_.narrow(0, layout_.params[i].offset, layout_.params[i].numel).view(params_[i].sizes());
    }
  } else {
    // grad_shard_ is allocated by the first reduction of a step and freed after the step:
    // between steps (forward included) no gradient memory is held.
    staging_.resize(layout_.buckets.size());
    deferred_.resize(layout_.buckets.size());
  }
  pending_.assign(layout_.buckets.size(), 0);
  launched_.assign(layout_.buckets.size(), false);

  if (opt_.stage == 2 || (opt_.stage <= 1 && world_ > 1)) init_hooks(0, params_.size());  // stage 3: init_stage3
}

void ZeroOptimizer::init_hooks(size_t begin, size_t end) {
  // Gradient-ready hooks: after autograd accumulated a parameter's gradient.
  for (size_t i = begin; i < end; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    ZT_ASSERT(acc != nullptr, "parameter without a gradient accumulator");
    int idx = static_cast<int>(i);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, idx](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          on_grad_ready(idx);
          return outputs;
        }));
    accumulators_.push_back(std::move(acc));
  }
}

ZeroOptimizer::~ZeroOptimizer() {
  if (worker_.joinable()) worker_.join();  // a delayed CPU step still running
}

int64_t ZeroOptimizer::max_owned_numel() const {
  int64_t m = 1;
  for (const Bucket& B : layout_.buckets) m = std::max(m, owns_all_ ? B.numel : B.shard_numel);
  return m;
}

int64_t ZeroOptimizer::owned_begin(int b) const {
  return owns_all_ ? layout_.buckets[b].offset : layout_.shard_buffer_offsets[b];
}

torch::Tensor ZeroOptimizer::bucket_view(const torch::Tensor& flat, int b) const {
  const Bucket& B = layout_.buckets[b];
  return flat.narrow(0, B.offset, B.numel);
}
torch::Tensor ZeroOptimizer::shard_view(const torch::Tensor& flat, int b) const {
  const Bucket& B = layout_.buckets[b];
  return flat.narrow(0, B.shard_offset(rank_), B.shard_numel);
}
torch::Tensor ZeroOptimizer::owned_view(const torch::Tensor& owned, int b) const {
  const Bucket& B = layout_.buckets[b];
  if (owns_all_) return owned.narrow(0, B.offset, B.numel);
  return owned.narrow(0, layout_.shard_buffer_offsets[b], B.shard_numel);
}

void ZeroOptimizer::begin_backward(bool boundary, bool first_micro_step) {
  first_micro_ = first_micro_step;
  boundary_ = boundary;
  // Stages 0 and 1 reduce once per window: during the backward of its last micro-step
  // (stage 0 all-reduces, stage 1 reduce-scatters each bucket into this rank's shard),
  // or, without overlap_comm, in step().
  reducing_ = opt_.stage >= 2 || (opt_.stage <= 1 && boundary && world_ > 1 && opt_.overlap_comm);
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    pending_[b] = layout_.buckets[b].num_params;
    launched_[b] = false;
  }
  in_backward_ = true;
}

void ZeroOptimizer::on_grad_ready(int i) {
  if (opt_.stage >= 2) {
    // Move the fresh gradient into the bucket's staging buffer and free it.
    torch::NoGradGuard no_grad;
    auto& p = params_[i];
    const ParamSlot& s = layout_.params[i];
    ZT_CHECK_T(!launched_[s.bucket], TrainingError, "a gradient of parameter ", user_index_[i],
               " (shape ", p.sizes(), ") arrived after its bucket was reduced: the parameter was used twice "
               "in one backward across a re-entrant boundary, which ZeRO stage ", opt_.stage, " cannot reduce");
    auto& stage = staging_[s.bucket];
    if (!stage.defined()) stage = torch::zeros({layout_.buckets[s.bucket].numel}, torch::TensorOptions().device(opt_.device).dtype(opt_.dtype));
    const Bucket& B = layout_.buckets[s.bucket];
    ZT_CHECK_T(p.grad().numel() == s.numel, InternalError, "gradient of parameter ", user_index_[i], " has ",
               p.grad().numel(), " elements, expected ", s.numel);
    stage.narrow(0, s.offset - B.offset, s.numel).copy_(p.grad().reshape(-1));
    p.mutable_grad().reset();
  }
  if (!reducing_) return;
  const int b = layout_.params[i].bucket;
  if (--pending_[b] == 0) launch_bucket(b);
}

void ZeroOptimizer::launch_bucket(int b) {
  launched_[b] = true;
  ++buckets_launched_;
  if (in_backward_) ++buckets_in_backward_;
  const double pre = opt_.prescale_gradients ? opt_.gradient_predivide_factor : 1.0;
  // Averaging: plain mean (avg) unless gradients are prescaled (DeepSpeed:
  // divide by predivide_factor before the sum, multiply by predivide/world after).
  const comm::ReduceOp op = opt_.prescale_gradients ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
  torch::NoGradGuard no_grad;
  if (opt_.stage == 0) {
    auto t = bucket_view(flat_grad_, b);
    if (pre != 1.0) t.div_(pre);
    works_.push_back(group_->all_reduce(t, op, /*async=*/true));
    return;
  }
  if (opt_.stage == 1) {  // in place: this rank's shard of the bucket receives the sum
    auto full = bucket_view(flat_grad_, b);
    if (pre != 1.0) full.div_(pre);
    auto mine = shard_view(flat_grad_, b);
    works_.push_back(group_->reduce_scatter(mine, full, op, /*async=*/true));
    return;
  }
  // Stage 2: reduce-scatter the staged bucket into this rank's gradient shard.
  auto& stage = staging_[b];
  if (!stage.defined()) stage = torch::zeros({layout_.buckets[b].numel}, torch::TensorOptions().device(opt_.device).dtype(opt_.dtype));
  if (pre != 1.0) stage.div_(pre);
  if (!grad_shard_.defined()) grad_shard_ = torch::empty({layout_.shard_numel}, torch::TensorOptions().device(opt_.device).dtype(opt_.dtype));
  auto dst = owned_view(grad_shard_, b);
  torch::Tensor out = first_micro_ ? dst : torch::empty_like(dst);
  works_.push_back(group_->reduce_scatter(out, stage, op, /*async=*/true));
  if (!first_micro_) deferred_[b] = out;
  // Offload: the last micro-step's reduced shard is final; stream it to the host now,
  // while backward goes on.
  if (opt_.offload_optimizer && first_micro_ && boundary_ && !opt_.prescale_gradients) {
    stream_grad_to_host(b, works_.back());
  }
  stage = torch::Tensor();  // the group keeps it alive until the collective is done
  // Stage 3: the unit's gradients are out; its full parameters are no longer needed.
  if (opt_.stage == 3 && units_[b].kind != UnitKind::kPersistent) release(b);
}

DeviceSpan ZeroOptimizer::end_backward() {
  in_backward_ = false;
  torch::NoGradGuard no_grad;
  if (reducing_) {
    // Buckets whose parameters got no gradient in this backward (unused parameters):
    // their gradient is zero; reduce them so every rank issues the same collectives.
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      if (!launched_[b]) launch_bucket(static_cast<int>(b));
    }
  }
  if (opt_.stage == 3) {
    if (!hold_all_) release_all(/*persistent_too=*/false);  // units gathered (prefetched) but never used
    check_tags(/*all=*/true);
  }
  // Exposed communication: the time the compute stream waits for the reductions, measured
  // on the stream (read later by the engine, so the CPU does not stop here).
  DeviceSpan exposed;
  if (!works_.empty()) exposed = DeviceSpan::start(opt_.device);
  for (auto& w : works_) w->wait();
  works_.clear();
  exposed.stop();
  const double post = opt_.prescale_gradients ? opt_.gradient_predivide_factor / world_ : 1.0;
  for (size_t b = 0; b < deferred_.size(); ++b) {
    if (deferred_[b].defined()) {
      if (post != 1.0) deferred_[b].mul_(post);
      owned_view(grad_shard_, b).add_(deferred_[b]);
      deferred_[b] = torch::Tensor();
    } else if (reducing_ && opt_.stage >= 2 && first_micro_ && post != 1.0) {
      owned_view(grad_shard_, b).mul_(post);
    }
  }
  if (reducing_ && opt_.stage <= 1 && post != 1.0) flat_grad_.mul_(post);
  return exposed;
}

torch::Tensor ZeroOptimizer::grad_view(int b) {
  if (opt_.stage >= 2) {
    if (!grad_shard_.defined()) grad_shard_ = torch::zeros({layout_.shard_numel}, torch::TensorOptions().device(opt_.device).dtype(opt_.dtype));
    return owned_view(grad_shard_, b);
  }
  return owns_all_ ? bucket_view(flat_grad_, b) : shard_view(flat_grad_, b);
}

StepOutcome ZeroOptimizer::step(const StepInputs& in) {
  torch::NoGradGuard no_grad;
  StepOutcome out;
  const double pre = opt_.prescale_gradients ? opt_.gradient_predivide_factor : 1.0;
  const comm::ReduceOp op = opt_.prescale_gradients ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
  // Stages 0-1 without overlap_comm: all-reduce (0) or reduce-scatter (1) now.
  if (world_ > 1 && opt_.stage <= 1 && !reducing_) {
    if (pre != 1.0) flat_grad_.div_(pre);
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      auto full = bucket_view(flat_grad_, b);
      if (opt_.stage == 0) {
        works_.push_back(group_->all_reduce(full, op, true));
      } else {
        auto mine = shard_view(flat_grad_, b);
        works_.push_back(group_->reduce_scatter(mine, full, op, true));
      }
    }
    for (auto& w : works_) w->wait();
    works_.clear();
    if (pre != 1.0) flat_grad_.mul_(pre / world_);
  }

  // One number carries both the overflow check and the clipping norm: the sum of squares
  // is inf/NaN exactly when some gradient is. One fp32 norm per bucket, read in the
  // compute dtype: no fp32 copy of all gradients exists at any time.
  const int nb = static_cast<int>(layout_.buckets.size());
  std::vector<torch::Tensor> norms;
  norms.reserve(nb);
  for (int b = 0; b < nb; ++b) norms.push_back(at::linalg_vector_norm(grad_view(b), 2, std::nullopt, false, at::kFloat));
  auto sq = torch::stack(norms).to(at::kDouble).square().sum().reshape({1});
  if (!owns_all_ && world_ > 1) group_->all_reduce(sq, comm::ReduceOp::kSum);
  double factor = 1.0 / in.loss_scale;
  const bool defer = in.defer && can_defer();
  if (defer) {
    // The overflow check and the clipping coefficient stay on the device: the fused
    // kernels scale by grad_scale_ and skip everything when found_inf_ is 1, so the CPU
    // does not wait for the gradients here. The caller reads norm_sq when it is done.
    found_inf_ = sq.isfinite().logical_not().to(at::kFloat);
    auto norm = sq.sqrt() / in.loss_scale;
    auto inv = torch::full({1}, in.loss_scale, sq.options());
    if (in.clip > 0) inv = inv * at::clamp_min((norm + 1e-6) / in.clip, 1.0);
    inv = at::nan_to_num(inv, 1.0, 1.0, 1.0);  // inf/NaN: the step is skipped anyway
    // Our kernel multiplies by its scale; ATen's divide.
    grad_scale_ = (use_kernel() ? inv.reciprocal() : inv).to(at::kFloat);
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
  params_written_ = false;
  if (use_kernel()) {
    kernel_step(factor, in);
    refresh_params();
    grad_scale_ = found_inf_ = torch::Tensor();
    return out;
  }
  // Update in groups of buckets of at most kStepChunk elements: the fp32 gradients exist
  // for one group at a time (a 10B model's shard would otherwise need one more full copy).
  constexpr int64_t kStepChunk = int64_t{1} << 27;
  std::vector<int> group;
  int64_t in_group = 0;
  for (int b = 0; b < nb && !opt_.offload_optimizer; ++b) {
    const int64_t n = owned_view(master_, b).numel();
    if (!group.empty() && in_group + n > kStepChunk) {
      apply_optimizer(group, factor, in);
      group.clear();
      in_group = 0;
    }
    group.push_back(b);
    in_group += n;
  }
  if (opt_.offload_optimizer) {
    offload_step(factor, in);  // CPU step, uploads, then the stage's refresh below
  } else {
    if (!group.empty()) apply_optimizer(group, factor, in);
  }
  refresh_params();
  grad_scale_ = found_inf_ = torch::Tensor();
  return out;
}

bool ZeroOptimizer::use_kernel() const {
  return kernels::kernels_available() && opt_.device.is_cuda() && !opt_.offload_optimizer && !sgd_ &&
         master_.defined() && kernels::dtype_supported(opt_.dtype);
}

// [Fused Step] zerotrain's Adam/AdamW kernel (src/kernels/fused_adam.cu): per bucket and
// parameter-group run, one pass reads the compute-dtype gradient where the reduction left
// it, updates master, m and v, and writes the compute-dtype parameter (stages 0-2) --
// no fp32 copy of the gradients and no separate cast of the master afterwards.
void ZeroOptimizer::kernel_step(double factor, const StepInputs& in) {
  const auto& P = opt_.optimizer.params;
  const double beta1 = in.momentum.value_or(P.betas[0]);
  const double beta2 = P.betas[1];
  const double bc1 = P.bias_correction ? 1.0 - std::pow(beta1, static_cast<double>(in.step)) : 1.0;
  const double bc2 = P.bias_correction ? 1.0 - std::pow(beta2, static_cast<double>(in.step)) : 1.0;
  torch::Tensor scale = grad_scale_;
  if (!scale.defined() && factor != 1.0) scale = torch::full({1}, factor, master_.options());
  const bool write_params = opt_.stage <= 2;
  cudaStream_t stream = kernels::current_stream(opt_.device);
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    auto master = owned_view(master_, static_cast<int>(b));
    auto m = owned_view(exp_avg_, static_cast<int>(b));
    auto v = owned_view(exp_avg_sq_, static_cast<int>(b));
    auto grad = grad_view(static_cast<int>(b));
    torch::Tensor dst;
    if (write_params) dst = owns_all_ ? bucket_view(flat_param_, static_cast<int>(b)) : shard_view(flat_param_, static_cast<int>(b));
    ZT_CHECK_T(grad.numel() == master.numel() && (!dst.defined() || dst.numel() == master.numel()), InternalError,
               "fused step: bucket ", b, " has ", master.numel(), " master elements but ", grad.numel(),
               " gradient elements");
    for_group_runs(owned_begin(static_cast<int>(b)), master.numel(), [&](int64_t at, int64_t len, int g) {
      kernels::AdamArgs a;
      a.master = master.data_ptr<float>() + at;
      a.exp_avg = m.data_ptr<float>() + at;
      a.exp_avg_sq = v.data_ptr<float>() + at;
      a.grad = static_cast<const char*>(grad.data_ptr()) + at * grad.element_size();
      a.grad_type = kernels::dtype_of(grad.scalar_type());
      if (dst.defined()) {
        a.param_out = static_cast<char*>(dst.data_ptr()) + at * dst.element_size();
        a.param_type = kernels::dtype_of(dst.scalar_type());
      }
      a.n = len;
      a.lr = static_cast<float>(in.lr * groups_[g].lr_scale);
      a.beta1 = static_cast<float>(beta1);
      a.beta2 = static_cast<float>(beta2);
      a.eps = static_cast<float>(P.eps);
      a.weight_decay = static_cast<float>(groups_[g].weight_decay);
      a.bias_correction1 = static_cast<float>(bc1);
      a.bias_correction2 = static_cast<float>(bc2);
      a.adamw = adamw_;
      a.grad_scale = scale.defined() ? scale.data_ptr<float>() : nullptr;
      a.found_inf = found_inf_.defined() ? found_inf_.data_ptr<float>() : nullptr;
      kernels::fused_adam(a, stream);
    });
  }
  params_written_ = write_params;
}

bool ZeroOptimizer::can_defer() const {
  return opt_.device.is_cuda() && !opt_.offload_optimizer && !sgd_ && opt_.optimizer.params.bias_correction;
}

void ZeroOptimizer::build_group_runs(int64_t owned) {
  group_runs_.clear();
  if (groups_.size() == 1) {
    group_runs_.push_back({0, owned, 0});
    return;
  }
  // Each parameter's owned part, in owned order (buckets in order, parameters in order).
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const Bucket& B = layout_.buckets[b];
    const int64_t lo = owns_all_ ? B.offset : B.shard_offset(rank_);
    const int64_t size = owns_all_ ? B.numel : B.shard_numel;
    const int64_t ob = owned_begin(static_cast<int>(b));
    for (int k = 0; k < B.num_params; ++k) {
      const int i = B.first_param + k;
      const ParamSlot& s = layout_.params[i];
      const Range r = intersect({s.offset, s.offset + s.numel}, {lo, lo + size});
      if (r.size() == 0) continue;
      const int g = group_of_user(user_index_[i]);
      const int64_t at = ob + r.begin - lo;
      if (!group_runs_.empty() && group_runs_.back().group == g) {
        group_runs_.back().len = at + r.size() - group_runs_.back().begin;  // across padding
      } else {
        group_runs_.push_back({at, r.size(), g});
      }
    }
  }
  if (group_runs_.empty()) {  // this rank's shards are all padding
    group_runs_.push_back({0, owned, 0});
    return;
  }
  // Padding (zeros that stay zero) joins the run before it; the first run starts at 0.
  group_runs_.front().len += group_runs_.front().begin;
  group_runs_.front().begin = 0;
  for (size_t k = 0; k + 1 < group_runs_.size(); ++k) {
    group_runs_[k].len = group_runs_[k + 1].begin - group_runs_[k].begin;
  }
  group_runs_.back().len = owned - group_runs_.back().begin;
}

void ZeroOptimizer::for_group_runs(int64_t begin, int64_t n,
                                   const std::function<void(int64_t at, int64_t len, int group)>& fn) const {
  for (const GroupRun& run : group_runs_) {
    const Range r = intersect({begin, begin + n}, {run.begin, run.begin + run.len});
    if (r.size() > 0) fn(r.begin - begin, r.size(), run.group);
  }
}

void ZeroOptimizer::apply_optimizer(const std::vector<int>& buckets, double factor, const StepInputs& in) {
  std::vector<at::Tensor> ps, gs, ms, vs;
  for (int b : buckets) {
    ps.push_back(owned_view(master_, b));
    auto g = grad_view(b).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    if (factor != 1.0) g.mul_(factor);
    gs.push_back(g);
    if (exp_avg_.defined()) {
      ms.push_back(owned_view(exp_avg_, b));
      vs.push_back(owned_view(exp_avg_sq_, b));
    }
    if (momentum_buf_.defined()) ms.push_back(owned_view(momentum_buf_, b));
  }
  if (groups_.size() == 1) {
    update_tensors(ps, gs, ms, vs, in, in.lr * groups_[0].lr_scale, groups_[0].weight_decay);
    return;
  }
  // One update per group over its runs in these buckets (see [Group Runs]).
  for (int grp = 0; grp < static_cast<int>(groups_.size()); ++grp) {
    std::vector<at::Tensor> gp, gg, gm, gv;
    for (size_t k = 0; k < buckets.size(); ++k) {
      for_group_runs(owned_begin(buckets[k]), ps[k].numel(), [&](int64_t at, int64_t len, int g) {
        if (g != grp) return;
        gp.push_back(ps[k].narrow(0, at, len));
        gg.push_back(gs[k].narrow(0, at, len));
        if (!ms.empty()) gm.push_back(ms[k].narrow(0, at, len));
        if (!vs.empty()) gv.push_back(vs[k].narrow(0, at, len));
      });
    }
    if (!gp.empty()) update_tensors(gp, gg, gm, gv, in, in.lr * groups_[grp].lr_scale, groups_[grp].weight_decay);
  }
}

void ZeroOptimizer::update_tensors(std::vector<at::Tensor>& ps, std::vector<at::Tensor>& gs,
                                   std::vector<at::Tensor>& ms, std::vector<at::Tensor>& vs, const StepInputs& in,
                                   double lr, double weight_decay) {
  const auto& P = opt_.optimizer.params;
  if (sgd_) {
    const double mom = in.momentum.value_or(P.momentum);
    for (size_t k = 0; k < ps.size(); ++k) {
      auto& g = gs[k];
      if (weight_decay != 0) g.add_(ps[k], weight_decay);
      if (momentum_buf_.defined()) {
        auto& buf = ms[k];
        if (in.step == 1) {
          buf.copy_(g);
        } else {
          buf.mul_(mom).add_(g, 1.0 - P.dampening);
        }
        if (P.nesterov) {
          g.add_(buf, mom);
        } else {
          g = buf;
        }
      }
      ps[k].add_(g, -lr);
    }
    return;
  }
  // Adam / AdamW (adam_w_mode: decoupled weight decay).
  const bool adamw = adamw_;
  const double beta1 = in.momentum.value_or(P.betas[0]);
  const double beta2 = P.betas[1];
  if (P.bias_correction) {
    step_t_.fill_(static_cast<double>(in.step));
    std::vector<at::Tensor> steps(ps.size(), step_t_);  // read-only: the kernels do not advance it
    if (adamw) {
      at::_fused_adamw_(ps, gs, ms, vs, {}, steps, lr, beta1, beta2, weight_decay, P.eps, false, false,
                        grad_scale_.defined() ? std::optional<at::Tensor>(grad_scale_) : std::nullopt,
                        found_inf_.defined() ? std::optional<at::Tensor>(found_inf_) : std::nullopt);
    } else {
      at::_fused_adam_(ps, gs, ms, vs, {}, steps, lr, beta1, beta2, weight_decay, P.eps, false, false,
                       grad_scale_.defined() ? std::optional<at::Tensor>(grad_scale_) : std::nullopt,
                       found_inf_.defined() ? std::optional<at::Tensor>(found_inf_) : std::nullopt);
    }
    return;
  }
  for (size_t k = 0; k < ps.size(); ++k) {
    auto& g = gs[k];
    if (adamw) {
      ps[k].mul_(1.0 - lr * weight_decay);
    } else if (weight_decay != 0) {
      g.add_(ps[k], weight_decay);
    }
    ms[k].lerp_(g, 1.0 - beta1);
    vs[k].mul_(beta2).addcmul_(g, g, 1.0 - beta2);
    ps[k].addcdiv_(ms[k], vs[k].sqrt().add_(P.eps), -lr);
  }
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
  for (size_t b = 0; b < layout_.buckets.size() && !opt_.offload_optimizer && !params_written_; ++b) {
    (owns_all_ ? bucket_view(flat_param_, b) : shard_view(flat_param_, b)).copy_(owned_view(master_, b));
  }
  if (owns_all_ || world_ == 1) return;
  // Stages 1-2: all-gather every bucket in place, at most allgather_bucket_size elements
  // in flight at once.
  int64_t in_flight = 0;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    auto full = bucket_view(flat_param_, b);
    auto mine = shard_view(flat_param_, b);
    if (in_flight > 0 && in_flight + full.numel() > opt_.allgather_bucket_numel) {
      for (auto& w : works_) w->wait();
      works_.clear();
      in_flight = 0;
    }
    works_.push_back(group_->all_gather(full, mine, true));
    in_flight += full.numel();
  }
  for (auto& w : works_) w->wait();
  works_.clear();
}

void ZeroOptimizer::zero_grad() {
  torch::NoGradGuard no_grad;
  if (flat_grad_.defined()) {
    flat_grad_.zero_();
    // Re-attach the views in case user code replaced or reset a .grad.
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& g = params_[i].mutable_grad();
      auto view = flat_grad_.narrow(0, layout_.params[i].offset, layout_.params[i].numel);
      if (!g.defined() || g.data_ptr() != view.data_ptr()) g = view.view(params_[i].sizes());
    }
  }
  grad_shard_ = torch::Tensor();  // the next step's first reduction writes a fresh one
}

ModelStateBytes ZeroOptimizer::state_bytes() const {
  auto nb = [](const torch::Tensor& t) -> int64_t { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; };
  ModelStateBytes m;
  m.params = nb(flat_param_) + nb(param_shard_) + nb(delayed_stage_);
  // The gradient shard exists from the first reduction of a step to the step; counted
  // at its size throughout (what the ZeRO formulas count).
  m.grads = nb(flat_grad_) + (opt_.stage >= 2 ? layout_.shard_numel * static_cast<int64_t>(c10::elementSize(opt_.dtype)) : 0);
  m.master = nb(master_);
  m.optimizer = nb(exp_avg_) + nb(exp_avg_sq_) + nb(momentum_buf_);
  if (opt_.offload_optimizer) {
    m.host = m.master + m.optimizer + nb(host_grad_) + nb(host_grad_spare_) +
             (host_param_.is_same(param_shard_) ? 0 : nb(host_param_));
    if (opt_.offload_param) m.host += nb(param_shard_);
  }
  if (nvme_) nvme_state_bytes(m);  // master and Adam state on the drive, staging buffers in host memory
  if (param_nvme_) param_nvme_state_bytes(m);  // the compute-dtype shard on the drive, its slots in host memory
  return m;
}

void ZeroOptimizer::reset_counters() {
  buckets_launched_ = buckets_in_backward_ = 0;
  z3_.gathers = z3_.prefetched = z3_.releases = 0;
  z3_.peak_live_numel = z3_.live_numel;
}

std::vector<torch::Tensor> ZeroOptimizer::gather_master_params() {
  torch::NoGradGuard no_grad;
  flush_delayed_update();
  // NVMe: the master is read back from the swap file (a host copy of this rank's shard).
  const torch::Tensor master = nvme_ ? nvme_read_state(/*master_only=*/true)[0] : master_;
  torch::Tensor full;
  if (owns_all_) {
    full = master;
  } else {
    full = torch::empty({layout_.total_numel}, master.options());
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      auto out = bucket_view(full, b);
      auto in = owned_view(master, b).clone();
      group_->all_gather(out, in);
    }
  }
  std::vector<torch::Tensor> result(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto shape = opt_.stage == 3 ? c10::IntArrayRef(shapes_[i]) : params_[i].sizes();
    result[user_index_[i]] = full.narrow(0, layout_.params[i].offset, layout_.params[i].numel).view(shape).clone();
  }
  return result;
}

}  // namespace zt::zero
