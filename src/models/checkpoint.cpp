#include "models/checkpoint.h"

#include "zerotrain/error.h"

namespace zt::models {
namespace {

thread_local int t_recompute_depth = 0;

// Counts a recompute in flight on this thread for as long as it lives (exceptions included).
struct RecomputeScope {
  RecomputeScope() { ++t_recompute_depth; }
  ~RecomputeScope() { --t_recompute_depth; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

// Keeps the checkpointed input x for backward: with cpu_checkpointing (x on CUDA) a pinned
// host copy, else x itself. Pinned destination + non_blocking: the D2H copy is queued on the
// current stream and the host does not wait; backward's H2D copy is queued on the same
// stream after it, so nobody reads the host copy before it is complete.
void keep_input(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, bool cpu_checkpointing) {
  if (cpu_checkpointing && x.is_cuda()) {
    auto host = torch::empty(x.sizes(), x.options().device(torch::kCPU).pinned_memory(true));
    host.copy_(x, /*non_blocking=*/true);
    ctx->saved_data["x_host"] = host;
    ctx->saved_data["x_device"] = c10::IValue(x.device());
  } else {
    ctx->save_for_backward({x});
  }
}

// What keep_input kept, back on x's device.
torch::Tensor kept_input(torch::autograd::AutogradContext* ctx) {
  if (auto it = ctx->saved_data.find("x_host"); it != ctx->saved_data.end()) {
    return it->second.toTensor().to(ctx->saved_data["x_device"].toDevice(), /*non_blocking=*/true);
  }
  return ctx->get_saved_variables()[0];
}

// The autograd context stores IValues only; fn travels in a capsule.
struct FnHolder : torch::CustomClassHolder {
  explicit FnHolder(CheckpointFn f, StashFn s = {}) : fn(std::move(f)), stash_fn(std::move(s)) {}
  CheckpointFn fn;
  StashFn stash_fn;                         // empty: x saved as below
  std::unique_ptr<CheckpointStash> stash;  // stash_fn(x), from forward to backward
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // `anchor` is an empty tensor that requires grad when x does not: without
  // it the output would not require grad, backward would never run, and the parameters
  // inside fn would silently get no gradient (e.g. a frozen embedding feeding block 0).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor anchor,
                               c10::intrusive_ptr<FnHolder> holder, bool cpu_checkpointing) {
    // Function::apply already runs forward with grad mode off: fn saves no activations.
    torch::Tensor y = holder->fn(x);
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["x_requires_grad"] = x.requires_grad();
    if (holder->stash_fn) {
      holder->stash = holder->stash_fn(x);
    } else {
      keep_input(ctx, x, cpu_checkpointing);
    }
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    if (!grad_out[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    auto holder = ctx->saved_data["fn"].toCapsule();
    auto* fn_holder = static_cast<FnHolder*>(holder.get());
    torch::Tensor x;
    if (fn_holder->stash) {
      x = fn_holder->stash->restore();
      fn_holder->stash.reset();
    } else {
      x = kept_input(ctx);
    }
    const bool x_requires_grad = ctx->saved_data["x_requires_grad"].toBool();

    torch::Tensor x_in = x.detach().requires_grad_(x_requires_grad);
    torch::Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      RecomputeScope recomputing;
      y = fn_holder->fn(x_in);
    }
    ZT_CHECK_T(y.requires_grad(), zt::InternalError,
               "checkpointed function's recomputed output does not require grad: fn must depend on "
               "its input or on parameters that require grad");
    // Reentrant backward: accumulates into parameter .grad (firing their hooks) and into
    // x_in.grad, which is this node's gradient for x.
    torch::autograd::backward({y}, {grad_out[0]});
    torch::Tensor gx = x_requires_grad ? x_in.grad() : torch::Tensor();
    return {gx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// [Checkpointed Aux] (checkpoint.h): the two-output variant. x is kept as CheckpointFunction
// keeps it (keep_input).
struct AuxHolder : torch::CustomClassHolder {
  explicit AuxHolder(CheckpointFn2 f) : fn(std::move(f)) {}
  CheckpointFn2 fn;
};

struct CheckpointAuxFunction : torch::autograd::Function<CheckpointAuxFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                                                torch::Tensor anchor, c10::intrusive_ptr<AuxHolder> holder,
                                                bool cpu_checkpointing) {
    auto [y, aux] = holder->fn(x);
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["x_requires_grad"] = x.requires_grad();
    keep_input(ctx, x, cpu_checkpointing);
    return {y, aux};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const torch::autograd::variable_list none = {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    if (!grad_out[0].defined() && !grad_out[1].defined()) return none;
    auto holder = ctx->saved_data["fn"].toCapsule();
    auto* fn_holder = static_cast<AuxHolder*>(holder.get());
    const torch::Tensor x = kept_input(ctx);
    const bool x_requires_grad = ctx->saved_data["x_requires_grad"].toBool();
    torch::Tensor x_in = x.detach().requires_grad_(x_requires_grad);
    std::pair<torch::Tensor, torch::Tensor> out;
    {
      torch::AutoGradMode grad_on(true);
      RecomputeScope recomputing;
      out = fn_holder->fn(x_in);
    }
    // Back-propagate from each recomputed output that has a gradient and a graph.
    std::vector<torch::Tensor> roots, grads;
    if (grad_out[0].defined() && out.first.requires_grad()) {
      roots.push_back(out.first);
      grads.push_back(grad_out[0]);
    }
    if (grad_out[1].defined() && out.second.requires_grad()) {
      roots.push_back(out.second);
      grads.push_back(grad_out[1]);
    }
    ZT_CHECK_T(!roots.empty(), zt::InternalError,
               "checkpointed function's recomputed outputs do not require grad: fn must depend on its input or on "
               "parameters that require grad");
    torch::autograd::backward(roots, grads);
    torch::Tensor gx = x_requires_grad ? x_in.grad() : torch::Tensor();
    return {gx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::pair<torch::Tensor, torch::Tensor> checkpoint_with_aux(const CheckpointFn2& fn2, const torch::Tensor& x,
                                                            bool cpu_checkpointing) {
  if (!torch::GradMode::is_enabled()) return fn2(x);
  auto holder = c10::make_intrusive<AuxHolder>(fn2);
  auto anchor = torch::empty({0}, x.options().requires_grad(!x.requires_grad()));
  auto out = CheckpointAuxFunction::apply(x, anchor, holder, cpu_checkpointing);
  return {out[0], out[1]};
}

torch::Tensor checkpoint(const CheckpointFn& fn, const torch::Tensor& x, bool cpu_checkpointing) {
  if (!torch::GradMode::is_enabled()) return fn(x);
  auto holder = c10::make_intrusive<FnHolder>(fn);
  // Always defined: the autograd node records metadata for every tensor input.
  auto anchor = torch::empty({0}, x.options().requires_grad(!x.requires_grad()));
  return CheckpointFunction::apply(x, anchor, holder, cpu_checkpointing);
}

torch::Tensor checkpoint(const CheckpointFn& fn, const torch::Tensor& x, const StashFn& stash) {
  if (!torch::GradMode::is_enabled()) return fn(x);
  auto holder = c10::make_intrusive<FnHolder>(fn, stash);
  auto anchor = torch::empty({0}, x.options().requires_grad(!x.requires_grad()));
  return CheckpointFunction::apply(x, anchor, holder, /*cpu_checkpointing=*/false);
}

bool in_checkpoint_recompute() { return t_recompute_depth > 0; }

}  // namespace zt::models
