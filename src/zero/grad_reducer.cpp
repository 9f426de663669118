#include "zero/grad_reducer.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "common/stale_grad.h"
#include "zerotrain/error.h"

namespace zt::zero {

GradReducer::GradReducer(const ShardLayout& layout, std::vector<torch::Tensor> params, std::vector<int> user_index,
                         comm::GroupPtr group, ReducerOptions options)
    : L_(layout), params_(std::move(params)), user_index_(std::move(user_index)), group_(std::move(group)),
      opt_(options) {
  ZT_ASSERT(params_.size() == L_.flat.params.size() && user_index_.size() == params_.size(), "reducer parameters");
  ZT_ASSERT(opt_.stage >= 0 && opt_.stage <= 3, "reducer stage ", opt_.stage);
  world_ = group_->size();
}

GradReducer::~GradReducer() {
  // Marks must not outlive the buffer they describe ([Stale Gradients]), nor hooks this object.
  if (flat_grad_.defined()) {
    for (size_t i = 0; i < params_.size(); ++i) forget_grad(L_.param_view(flat_grad_, static_cast<int>(i)));
  }
  for (const auto& [i, id] : stale_hooks_) params_[i].remove_hook(id);
}

torch::TensorOptions GradReducer::topt() const { return torch::TensorOptions().device(opt_.device).dtype(opt_.dtype); }

void GradReducer::allocate() {
  torch::NoGradGuard no_grad;
  if (opt_.stage <= 1) {
    flat_grad_ = torch::zeros({L_.flat.total_numel}, topt());
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].mutable_grad() = L_.param_view(flat_grad_, static_cast<int>(i)).view(params_[i].sizes());
    }
  } else {
    // grad_shard_ is allocated by the first reduction of a step and freed after the step:
    // between steps (forward included) no gradient memory is held.
    staging_.resize(L_.flat.buckets.size());
    deferred_.resize(L_.flat.buckets.size());
  }
  pending_.assign(L_.flat.buckets.size(), 0);
  launched_.assign(L_.flat.buckets.size(), false);
}

void GradReducer::install_hooks(size_t begin, size_t end) {
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

void GradReducer::begin_backward(bool boundary, bool first_micro_step) {
  first_micro_ = first_micro_step;
  boundary_ = boundary;
  // Stages 0 and 1 reduce once per window: during the backward of its last micro-step
  // (stage 0 all-reduces, stage 1 reduce-scatters each bucket into this rank's shard),
  // or, without overlap_comm, in reduce_now() at the step.
  reducing_ = opt_.stage >= 2 || (opt_.stage <= 1 && boundary && world_ > 1 && opt_.overlap_comm);
  for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
    pending_[b] = L_.flat.buckets[b].num_params;
    launched_[b] = false;
  }
  in_backward_ = true;
}

void GradReducer::on_grad_ready(int i) {
  // Stages 0-1: a gradient still stale here got nothing in this backward (an unused
  // parameter); it is zero before its bucket is reduced. [Stale Gradients]
  if (opt_.stage <= 1 && flat_grad_.defined()) settle(i);
  if (opt_.stage >= 2) {
    // Move the fresh gradient into the bucket's staging buffer and free it.
    torch::NoGradGuard no_grad;
    auto& p = params_[i];
    const ParamSlot& s = L_.flat.params[i];
    ZT_CHECK_T(!launched_[s.bucket], TrainingError, "a gradient of parameter ", user_index_[i],
               " (shape ", p.sizes(), ") arrived after its bucket was reduced: the parameter was used twice "
               "in one backward across a re-entrant boundary, which ZeRO stage ", opt_.stage, " cannot reduce");
    auto& stage = staging_[s.bucket];
    if (!stage.defined()) stage = torch::zeros({L_.flat.buckets[s.bucket].numel}, topt());
    const Bucket& B = L_.flat.buckets[s.bucket];
    ZT_CHECK_T(p.grad().numel() == s.numel, InternalError, "gradient of parameter ", user_index_[i], " has ",
               p.grad().numel(), " elements, expected ", s.numel);
    stage.narrow(0, s.offset - B.offset, s.numel).copy_(p.grad().reshape(-1));
    p.mutable_grad().reset();
  }
  if (!reducing_) return;
  const int b = L_.flat.params[i].bucket;
  if (--pending_[b] == 0) launch_bucket(b);
}

void GradReducer::launch_bucket(int b) {
  launched_[b] = true;
  ++buckets_launched_;
  if (in_backward_) ++buckets_in_backward_;
  const double pre = opt_.prescale_gradients ? opt_.gradient_predivide_factor : 1.0;
  // Averaging: plain mean (avg) unless gradients are prescaled (DeepSpeed:
  // divide by predivide_factor before the sum, multiply by predivide/world after).
  const comm::ReduceOp op = opt_.prescale_gradients ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
  torch::NoGradGuard no_grad;
  if (opt_.stage == 0) {
    auto t = L_.bucket_view(flat_grad_, b);
    if (pre != 1.0) t.div_(pre);
    works_.push_back(group_->all_reduce(t, op, /*async=*/true));
    return;
  }
  if (opt_.stage == 1) {  // in place: this rank's shard of the bucket receives the sum
    auto full = L_.bucket_view(flat_grad_, b);
    if (pre != 1.0) full.div_(pre);
    auto mine = L_.shard_view(flat_grad_, b);
    works_.push_back(group_->reduce_scatter(mine, full, op, /*async=*/true));
    return;
  }
  // Stages 2-3: reduce-scatter the staged bucket into this rank's gradient shard.
  auto& stage = staging_[b];
  if (!stage.defined()) stage = torch::zeros({L_.flat.buckets[b].numel}, topt());
  if (pre != 1.0) stage.div_(pre);
  if (!grad_shard_.defined()) grad_shard_ = torch::empty({L_.flat.shard_numel}, topt());
  auto dst = L_.owned_view(grad_shard_, b);
  torch::Tensor out = first_micro_ ? dst : torch::empty_like(dst);
  works_.push_back(group_->reduce_scatter(out, stage, op, /*async=*/true));
  if (!first_micro_) deferred_[b] = out;
  if (on_issued) on_issued(b, works_.back(), first_micro_ && boundary_);
  stage = torch::Tensor();  // the group keeps it alive until the collective is done
  if (on_done) on_done(b);
}

void GradReducer::launch_remaining() {
  in_backward_ = false;
  settle_all();  // what no writer took in this backward is zero from here on
  if (!reducing_) return;
  torch::NoGradGuard no_grad;
  // Buckets whose parameters got no gradient in this backward (unused parameters):
  // their gradient is zero; reduce them so every rank issues the same collectives.
  for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
    if (!launched_[b]) launch_bucket(static_cast<int>(b));
  }
}

DeviceSpan GradReducer::wait() {
  torch::NoGradGuard no_grad;
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
      L_.owned_view(grad_shard_, static_cast<int>(b)).add_(deferred_[b]);
      deferred_[b] = torch::Tensor();
    } else if (reducing_ && opt_.stage >= 2 && first_micro_ && post != 1.0) {
      L_.owned_view(grad_shard_, static_cast<int>(b)).mul_(post);
    }
  }
  if (reducing_ && opt_.stage <= 1 && post != 1.0) flat_grad_.mul_(post);
  return exposed;
}

void GradReducer::reduce_now() {
  settle_all();  // a step without end_backward (or without any backward) reads zeros
  reduce_unreduced();
  if (opt_.grad_scale != 1.0) {
    torch::NoGradGuard no_grad;
    if (flat_grad_.defined()) flat_grad_.mul_(opt_.grad_scale);
    if (grad_shard_.defined()) grad_shard_.mul_(opt_.grad_scale);
  }
}

void GradReducer::reduce_unreduced() {
  if (world_ <= 1 || opt_.stage >= 2 || reducing_) return;
  torch::NoGradGuard no_grad;
  const double pre = opt_.prescale_gradients ? opt_.gradient_predivide_factor : 1.0;
  const comm::ReduceOp op = opt_.prescale_gradients ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg;
  if (pre != 1.0) flat_grad_.div_(pre);
  for (int b = 0; b < L_.num_buckets(); ++b) {
    auto full = L_.bucket_view(flat_grad_, b);
    if (opt_.stage == 0) {
      works_.push_back(group_->all_reduce(full, op, true));
    } else {
      auto mine = L_.shard_view(flat_grad_, b);
      works_.push_back(group_->reduce_scatter(mine, full, op, true));
    }
  }
  for (auto& w : works_) w->wait();
  works_.clear();
  if (pre != 1.0) flat_grad_.mul_(pre / world_);
}

torch::Tensor GradReducer::grad(int b) {
  if (opt_.stage >= 2) {
    if (!grad_shard_.defined()) grad_shard_ = torch::zeros({L_.flat.shard_numel}, topt());
    return L_.owned_view(grad_shard_, b);
  }
  settle_all();
  return L_.owned_in_flat(flat_grad_, b);
}

void GradReducer::settle(size_t i) {
  if (stale_count_ > 0 && settle_grad(L_.param_view(flat_grad_, static_cast<int>(i)))) --stale_count_;
}

void GradReducer::settle_all() {
  if (!flat_grad_.defined() || stale_count_ == 0) return;
  // stale_count_ counts this reducer's marks minus those it cleared: the writers' clears
  // are not counted, so it is an upper bound until every parameter was looked at.
  for (size_t i = 0; i < params_.size(); ++i) settle(i);
  stale_count_ = 0;
}

void GradReducer::install_stale_hooks() {
  // Before autograd's AccumulateGrad adds a fresh gradient into a stale .grad, the .grad
  // is zeroed (the writers that overwrite took the mark before: see [Stale Gradients]).
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad()) continue;
    const unsigned id = params_[i].register_hook([this, i](const torch::Tensor&) { settle(i); });
    stale_hooks_.emplace_back(i, id);
  }
  stale_hooks_installed_ = true;
}

void GradReducer::zero_grad() {
  torch::NoGradGuard no_grad;
  if (flat_grad_.defined()) {
    // [Stale Gradients] mark instead of fill: the next backward's first writers overwrite.
    const bool mark = stale_grads_enabled();
    if (mark && !stale_hooks_installed_) install_stale_hooks();
    if (!mark) flat_grad_.zero_();
    stale_count_ = 0;
    // Re-attach the views in case user code replaced or reset a .grad.
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& g = params_[i].mutable_grad();
      auto view = L_.param_view(flat_grad_, static_cast<int>(i));
      if (!g.defined() || g.data_ptr() != view.data_ptr()) g = view.view(params_[i].sizes());
      if (!mark) {
        forget_grad(view);  // a mark left from a zero_grad with the marks on (no backward since)
      } else if (view.numel() > 0) {
        mark_grad_stale(view);
        ++stale_count_;
      }
    }
  }
  grad_shard_ = torch::Tensor();  // the next step's first reduction writes a fresh one
}

int64_t GradReducer::grad_bytes() const {
  const int64_t flat = flat_grad_.defined() ? static_cast<int64_t>(flat_grad_.nbytes()) : 0;
  // The gradient shard exists from the first reduction of a step to the step; counted at
  // its size throughout (what the ZeRO formulas count).
  return flat + (opt_.stage >= 2 ? L_.flat.shard_numel * static_cast<int64_t>(c10::elementSize(opt_.dtype)) : 0);
}

}  // namespace zt::zero
