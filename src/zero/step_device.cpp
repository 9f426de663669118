#include "zero/step_device.h"

#include <cmath>
#include <utility>

#include "kernels/aten.h"
#include "zerotrain/error.h"

namespace zt::zero {

DeviceStep::DeviceStep(const ShardLayout& layout, const OptimizerRule& rule, OwnedState& state,
                       DeviceStepOptions options, GradFn grad, ParamFn params)
    : StepBackend(state), L_(layout), rule_(rule), state_(state), opt_(options), grad_(std::move(grad)),
      params_(std::move(params)) {
  ZT_ASSERT(state_.master.defined(), "the device step needs the fp32 master");
  step_t_ = torch::zeros({}, torch::TensorOptions().device(opt_.device).dtype(at::kFloat));
}

bool DeviceStep::can_defer() const {
  return opt_.device.is_cuda() && !rule_.sgd() && rule_.params().bias_correction;
}

bool DeviceStep::use_kernel() const {
  return kernels::kernels_available() && opt_.device.is_cuda() && !rule_.sgd() && state_.master.defined() &&
         kernels::dtype_supported(opt_.dtype);
}

void DeviceStep::defer(const torch::Tensor& sq, const StepInputs& in) {
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
}

bool DeviceStep::step(double factor, const StepInputs& in, const GradFn& grad, const ParamFn& params) {
  if (use_kernel()) return kernel_step(factor, in, grad, params);
  // Update in groups of buckets of at most kStepChunk elements: the fp32 gradients exist
  // for one group at a time (a 10B model's shard would otherwise need one more full copy).
  constexpr int64_t kStepChunk = int64_t{1} << 27;
  std::vector<int> group;
  int64_t in_group = 0;
  for (int b = 0; b < L_.num_buckets(); ++b) {
    const int64_t n = L_.owned_view(state_.master, b).numel();
    if (!group.empty() && in_group + n > kStepChunk) {
      apply(group, factor, in, grad);
      group.clear();
      in_group = 0;
    }
    group.push_back(b);
    in_group += n;
  }
  if (!group.empty()) apply(group, factor, in, grad);
  return false;
}

// [Fused Step] zerotrain's Adam/AdamW kernel (src/kernels/fused_adam.cu): per bucket and
// parameter-group run, one pass reads the compute-dtype gradient where the reduction left
// it, updates master, m and v, and writes the compute-dtype parameter (stages 0-2) --
// no fp32 copy of the gradients and no separate cast of the master afterwards.
bool DeviceStep::kernel_step(double factor, const StepInputs& in, const GradFn& grad_of, const ParamFn& params) {
  const auto& P = rule_.params();
  const double beta1 = in.momentum.value_or(P.betas[0]);
  const double beta2 = P.betas[1];
  const double bc1 = P.bias_correction ? 1.0 - std::pow(beta1, static_cast<double>(in.step)) : 1.0;
  const double bc2 = P.bias_correction ? 1.0 - std::pow(beta2, static_cast<double>(in.step)) : 1.0;
  torch::Tensor scale = grad_scale_;
  if (!scale.defined() && factor != 1.0) scale = torch::full({1}, factor, state_.master.options());
  cudaStream_t stream = kernels::current_stream(opt_.device);
  bool wrote = false;
  for (int b = 0; b < L_.num_buckets(); ++b) {
    auto master = L_.owned_view(state_.master, b);
    auto m = L_.owned_view(state_.exp_avg, b);
    auto v = L_.owned_view(state_.exp_avg_sq, b);
    auto grad = grad_of(b);
    torch::Tensor dst = params(b);
    wrote = wrote || dst.defined();
    ZT_CHECK_T(grad.numel() == master.numel() && (!dst.defined() || dst.numel() == master.numel()), InternalError,
               "fused step: bucket ", b, " has ", master.numel(), " master elements but ", grad.numel(),
               " gradient elements");
    rule_.for_group_runs(L_.owned_begin(b), master.numel(), [&](int64_t at, int64_t len, int g) {
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
      a.lr = static_cast<float>(in.lr * rule_.group(g).lr_scale);
      a.beta1 = static_cast<float>(beta1);
      a.beta2 = static_cast<float>(beta2);
      a.eps = static_cast<float>(P.eps);
      a.weight_decay = static_cast<float>(rule_.group(g).weight_decay);
      a.bias_correction1 = static_cast<float>(bc1);
      a.bias_correction2 = static_cast<float>(bc2);
      a.adamw = rule_.adamw();
      a.grad_scale = scale.defined() ? scale.data_ptr<float>() : nullptr;
      a.found_inf = found_inf_.defined() ? found_inf_.data_ptr<float>() : nullptr;
      kernels::fused_adam(a, stream);
    });
  }
  return wrote;
}

void DeviceStep::apply(const std::vector<int>& buckets, double factor, const StepInputs& in, const GradFn& grad) {
  std::vector<at::Tensor> ps, gs, ms, vs;
  for (int b : buckets) {
    ps.push_back(L_.owned_view(state_.master, b));
    auto g = grad(b).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    if (factor != 1.0) g.mul_(factor);
    gs.push_back(g);
    if (state_.exp_avg.defined()) {
      ms.push_back(L_.owned_view(state_.exp_avg, b));
      vs.push_back(L_.owned_view(state_.exp_avg_sq, b));
    }
    if (state_.momentum.defined()) ms.push_back(L_.owned_view(state_.momentum, b));
  }
  if (rule_.num_groups() == 1) {
    update_tensors(ps, gs, ms, vs, in, in.lr * rule_.group(0).lr_scale, rule_.group(0).weight_decay);
    return;
  }
  // One update per group over its runs in these buckets (see [Group Runs]).
  for (int grp = 0; grp < rule_.num_groups(); ++grp) {
    std::vector<at::Tensor> gp, gg, gm, gv;
    for (size_t k = 0; k < buckets.size(); ++k) {
      rule_.for_group_runs(L_.owned_begin(buckets[k]), ps[k].numel(), [&](int64_t at, int64_t len, int g) {
        if (g != grp) return;
        gp.push_back(ps[k].narrow(0, at, len));
        gg.push_back(gs[k].narrow(0, at, len));
        if (!ms.empty()) gm.push_back(ms[k].narrow(0, at, len));
        if (!vs.empty()) gv.push_back(vs[k].narrow(0, at, len));
      });
    }
    if (!gp.empty()) {
      update_tensors(gp, gg, gm, gv, in, in.lr * rule_.group(grp).lr_scale, rule_.group(grp).weight_decay);
    }
  }
}

void DeviceStep::update_tensors(std::vector<at::Tensor>& ps, std::vector<at::Tensor>& gs, std::vector<at::Tensor>& ms,
                                std::vector<at::Tensor>& vs, const StepInputs& in, double lr, double weight_decay) {
  const auto& P = rule_.params();
  if (rule_.sgd()) {
    const double mom = in.momentum.value_or(P.momentum);
    for (size_t k = 0; k < ps.size(); ++k) {
      auto& g = gs[k];
      if (weight_decay != 0) g.add_(ps[k], weight_decay);
      if (state_.momentum.defined()) {
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
  const bool adamw = rule_.adamw();
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

}  // namespace zt::zero
