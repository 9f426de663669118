// [Llama Fused Ops] (llama_fused.h): dispatch, the autograd Functions over
// kernels/llama_ops.h, and the reference formulations.
#include "models/llama_fused.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/stale_grad.h"
#include "kernels/aten.h"
#include "kernels/llama_ops.h"
#include "log/log.h"
#include "models/deferred_grad.h"
#include "models/model_util.h"
#include "models/shared_linear.h"

namespace zt::models {

namespace {

// -1: not yet read from the environment; 0 off; 1 on.
std::atomic<int> g_fused{-1};

bool same_device_dtype(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.device() == b.device() && a.scalar_type() == b.scalar_type();
}

// ---- RMSNorm --------------------------------------------------------------------------
// Three autograd Functions over one forward and one backward: the plain norm, the norm that
// also hands its input on (the residual stream; its backward adds that use's gradient in
// the same kernel), and the residual add fused with the norm after it ([Residual Norm]).

// The norm of x (or of x + delta, also returned as `sum`), as 2-D rows.
struct NormOut {
  torch::Tensor y, sum, rstd, in2, w;  // in2: the rows normalised (x, or the sum)
};

NormOut norm_forward(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& w, double eps) {
  const int64_t C = x.size(-1);
  NormOut o;
  const auto x2 = x.reshape({-1, C}).contiguous();
  o.w = w.contiguous();
  o.y = at::empty_like(x2, at::MemoryFormat::Contiguous);
  o.rstd = at::empty({x2.size(0)}, x2.options().dtype(at::kFloat));
  kernels::RmsNormArgs a;
  a.x = x2.data_ptr();
  torch::Tensor d2;
  if (delta.defined()) {
    d2 = delta.reshape({-1, C}).contiguous();
    o.sum = at::empty_like(x2, at::MemoryFormat::Contiguous);
    a.residual = d2.data_ptr();
    a.sum = o.sum.data_ptr();
  }
  a.weight = o.w.data_ptr();
  a.type = kernels::dtype_of(x2.scalar_type());
  a.rows = x2.size(0);
  a.cols = C;
  a.eps = static_cast<float>(eps);
  a.y = o.y.data_ptr();
  a.rstd = o.rstd.data_ptr<float>();
  kernels::rms_norm_forward(a, kernels::current_stream(x2.device()));
  o.in2 = delta.defined() ? o.sum : x2;
  return o;
}

// dw_j = sum_i dy_ij * x_ij * r_i: LayerNorm's dgamma with mean 0 (layer_norm_grad.h).
torch::Tensor norm_weight_grad(const torch::Tensor& g, const torch::Tensor& x2, const torch::Tensor& rstd) {
  const auto zero_mean = at::zeros({x2.size(0)}, rstd.options());
  return kernels::norm_param_grads(g, x2, zero_mean, rstd, /*need_w=*/true, /*need_b=*/false).first;
}

// Saves what norm_backward reads: the rows normalised, the weight, r, and the parameter.
void save_norm(torch::autograd::AutogradContext* ctx, const NormOut& o, const torch::Tensor& w) {
  ctx->save_for_backward({o.in2, o.w, o.rstd});
  if (w.requires_grad()) ctx->saved_data["w"] = w;  // the parameter itself ([Deferred Weight Gradients])
}

// {dL/d(input), dL/dw} from dL/dy (`gy`) and, when defined, the input's gradient from its
// other uses (`g_other`, added in the same kernel). `shape`: the input's.
std::pair<torch::Tensor, torch::Tensor> norm_backward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gy,
                                                      const torch::Tensor& g_other, bool input_grad, int w_index,
                                                      at::IntArrayRef shape) {
  const auto saved = ctx->get_saved_variables();
  const auto &x2 = saved[0], &w = saved[1], &rstd = saved[2];
  const int64_t C = x2.size(1);
  const auto g = gy.reshape({-1, C}).contiguous().to(x2.scalar_type());
  torch::Tensor dx, dw, go, ws;
  const bool want_dw = ctx->needs_input_grad(w_index);
  // dL/dw in the input gradient's pass where the kernel can (one read of dy and x).
  const int64_t ws_floats =
      input_grad && want_dw ? kernels::rms_norm_weight_grad_workspace_floats(kernels::dtype_of(x2.scalar_type()),
                                                                             x2.size(0), C)
                            : 0;
  if (input_grad) {
    dx = at::empty_like(x2, at::MemoryFormat::Contiguous);
    kernels::RmsNormGradArgs a;
    a.grad_out = g.data_ptr();
    a.x = x2.data_ptr();
    a.weight = w.data_ptr();
    a.rstd = rstd.data_ptr<float>();
    a.type = kernels::dtype_of(x2.scalar_type());
    a.rows = x2.size(0);
    a.cols = C;
    a.grad_x = dx.data_ptr();
    if (g_other.defined()) {
      go = g_other.reshape({-1, C}).contiguous().to(x2.scalar_type());
      a.grad_sum = go.data_ptr();
    }
    if (ws_floats > 0) {
      dw = at::empty({C}, x2.options());
      ws = at::empty({ws_floats}, rstd.options());
      a.grad_weight = dw.data_ptr();
      a.workspace = ws.data_ptr<float>();
    }
    kernels::rms_norm_backward_input(a, kernels::current_stream(g.device()));
    dx = dx.view(shape);
  }
  if (want_dw) {
    if (!dw.defined()) dw = norm_weight_grad(g, x2, rstd);  // the kernel could not form it in its pass
  } else if (ctx->saved_data.count("w")) {
    // zb-h1's input-gradient pass: the weight gradient later, in W. [Deferred Weight Gradients]
    defer_weight_grads({ctx->saved_data["w"].toTensor()},
                       [g, x2, rstd] { return std::vector<torch::Tensor>{norm_weight_grad(g, x2, rstd)}; });
  }
  return {dx, dw};
}

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               double eps) {
    const auto o = norm_forward(x, torch::Tensor(), w, eps);
    save_norm(ctx, o, w);
    ctx->saved_data["shape"] = x.sizes().vec();
    return o.y.view(x.sizes());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto shape = ctx->saved_data["shape"].toIntVector();
    auto [dx, dw] = norm_backward(ctx, grad_out[0], torch::Tensor(), ctx->needs_input_grad(0), 1, shape);
    return {dx, dw, torch::Tensor()};
  }
};

// (y, x) = (norm(x), x): x comes back as an output (autograd makes it a view of the input
// with this node as its source), so its gradient from the residual stream reaches this
// backward and is added in the norm's kernel instead of in a separate add.
struct RmsNormKeepFn : torch::autograd::Function<RmsNormKeepFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& w, double eps) {
    const auto o = norm_forward(x, torch::Tensor(), w, eps);
    save_norm(ctx, o, w);
    ctx->saved_data["shape"] = x.sizes().vec();
    return {o.y.view(x.sizes()), x};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto shape = ctx->saved_data["shape"].toIntVector();
    auto [dx, dw] = norm_backward(ctx, grad_out[0], grad_out[1], ctx->needs_input_grad(0), 1, shape);
    return {dx, dw, torch::Tensor()};
  }
};

// (h, y) = (x + delta, norm(x + delta)) in one kernel; the backward adds h's gradient from
// its other uses into the norm's input gradient, which is then both x's and delta's.
struct AddRmsNormFn : torch::autograd::Function<AddRmsNormFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& delta, const torch::Tensor& w, double eps) {
    const auto o = norm_forward(x, delta, w, eps);
    save_norm(ctx, o, w);
    ctx->saved_data["shape"] = x.sizes().vec();
    return {o.sum.view(x.sizes()), o.y.view(x.sizes())};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const bool input_grad = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    auto [dh, dw] = norm_backward(ctx, grad_out[1], grad_out[0], input_grad, 2, shape);
    return {ctx->needs_input_grad(0) ? dh : torch::Tensor(), ctx->needs_input_grad(1) ? dh : torch::Tensor(), dw,
            torch::Tensor()};
  }
};

// ---- Embedding ------------------------------------------------------------------------
// [Embedding Grad] The lookup is ATen's; the weight gradient goes straight into an existing
// .grad (the engine's flat buffer) through kernels::embedding_backward_add: only the rows of
// the batch's tokens are touched. ATen's backward forms the whole (V, C) gradient (a fill
// and a scatter) and autograd adds all of it into .grad: on Llama-3.2-1B (V 128 256) 0.95 ms
// of a 135 ms step. Without a .grad to add into it returns ATen's dense gradient.

torch::Tensor embedding_weight_grad(torch::Tensor w, const torch::Tensor& g, const torch::Tensor& idx, int64_t pad) {
  const int64_t C = w.size(1);
  if (!accumulates_in_place(w, g.scalar_type(), g.device())) {
    return at::embedding_dense_backward(g, idx, w.size(0), pad, /*scale_grad_by_freq=*/false);
  }
  // [Stale Gradients] the kernel only adds into the batch's rows: a stale .grad is zeroed
  // first (with tied embeddings the LM head, earlier in backward, has already written it).
  settle_grad(w.mutable_grad());
  const auto g2 = g.reshape({-1, C}).contiguous();
  auto [sorted, order] = at::sort(idx.reshape({-1}).to(at::kInt), /*stable=*/true, 0, /*descending=*/false);
  kernels::EmbeddingGradArgs a;
  a.grad_weight = w.mutable_grad().data_ptr();
  a.grad_out = g2.data_ptr();
  a.sorted = sorted.data_ptr<int>();
  a.order = order.data_ptr<int64_t>();
  a.type = kernels::dtype_of(g2.scalar_type());
  a.n = g2.size(0);
  a.cols = C;
  a.padding_idx = pad;
  kernels::embedding_backward_add(a, kernels::current_stream(g2.device()));
  return {};
}

struct EmbeddingFn : torch::autograd::Function<EmbeddingFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& w, const torch::Tensor& idx,
                               int64_t pad) {
    ctx->save_for_backward({idx});
    ctx->saved_data["w"] = w;  // the parameter: backward adds into its .grad
    ctx->saved_data["pad"] = pad;
    return at::embedding(w, idx, pad);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto idx = ctx->get_saved_variables()[0];
    auto w = ctx->saved_data["w"].toTensor();
    const int64_t pad = ctx->saved_data["pad"].toInt();
    const auto g = grad_out[0].to(w.scalar_type());
    torch::Tensor dw;
    if (ctx->needs_input_grad(0)) {
      dw = embedding_weight_grad(w, g, idx, pad);
    } else {
      // zb-h1's input-gradient pass: the weight gradient later, in W. [Deferred Weight Gradients]
      defer_weight_grads({w}, [w, g, idx, pad] { return std::vector<torch::Tensor>{embedding_weight_grad(w, g, idx, pad)}; });
    }
    return {dw, torch::Tensor(), torch::Tensor()};
  }
};

// ---- RoPE -----------------------------------------------------------------------------

// x's strides for the kernel: a size-1 dimension's stride is never used, so 0 (lets the
// vectorized path through whatever stride ATen gave it).
int64_t used_stride(const torch::Tensor& t, int64_t d) { return t.size(d) == 1 ? 0 : t.stride(d); }

// x with a contiguous last dimension and no overlap (a transposed view of the projection
// passes as it is), else a contiguous copy.
torch::Tensor dense_rows(const torch::Tensor& x) {
  return x.stride(-1) == 1 && x.is_non_overlapping_and_dense() ? x : x.contiguous();
}

torch::Tensor run_rope(const torch::Tensor& in, const torch::Tensor& cos, const torch::Tensor& sin, bool backward) {
  const auto x = dense_rows(in);
  auto out = at::empty_strided(x.sizes(), x.strides(), x.options());
  kernels::RopeArgs a;
  a.in = x.data_ptr();
  a.out = out.data_ptr();
  a.cos = cos.data_ptr();
  a.sin = sin.data_ptr();
  a.type = kernels::dtype_of(x.scalar_type());
  a.batch = x.size(0);
  a.heads = x.size(1);
  a.seq = x.size(2);
  a.head_dim = x.size(3);
  a.stride_batch = used_stride(x, 0);
  a.stride_head = used_stride(x, 1);
  a.stride_seq = used_stride(x, 2);
  a.cos_batch_stride = cos.dim() == 4 && cos.size(0) > 1 ? a.seq * a.head_dim : 0;
  a.backward = backward;
  kernels::rope(a, kernels::current_stream(x.device()));
  return out;
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  // cos/sin: contiguous, no gradient (they come from the inverse-frequency buffer).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return run_rope(x, cos, sin, /*backward=*/false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    return {run_rope(grad_out[0].to(saved[0].scalar_type()), saved[0], saved[1], /*backward=*/true), torch::Tensor(),
            torch::Tensor()};
  }
};

// ---- SwiGLU ---------------------------------------------------------------------------

struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    const auto g = gate.contiguous(), u = up.contiguous();
    auto out = at::empty_like(g, at::MemoryFormat::Contiguous);
    kernels::SwigluArgs a;
    a.gate = g.data_ptr();
    a.up = u.data_ptr();
    a.type = kernels::dtype_of(g.scalar_type());
    a.n = g.numel();
    a.out = out.data_ptr();
    kernels::swiglu_forward(a, kernels::current_stream(g.device()));
    ctx->save_for_backward({g, u});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &g = saved[0], &u = saved[1];
    const auto dy = grad_out[0].contiguous().to(g.scalar_type());
    auto dg = at::empty_like(g, at::MemoryFormat::Contiguous);
    auto du = at::empty_like(u, at::MemoryFormat::Contiguous);
    kernels::SwigluArgs a;
    a.gate = g.data_ptr();
    a.up = u.data_ptr();
    a.type = kernels::dtype_of(g.scalar_type());
    a.n = g.numel();
    a.grad_out = dy.data_ptr();
    a.grad_gate = dg.data_ptr();
    a.grad_up = du.data_ptr();
    kernels::swiglu_backward(a, kernels::current_stream(g.device()));
    return {ctx->needs_input_grad(0) ? dg : torch::Tensor(), ctx->needs_input_grad(1) ? du : torch::Tensor()};
  }
};

}  // namespace

bool llama_fused_enabled() {
  int v = g_fused.load(std::memory_order_relaxed);
  if (v >= 0) return v == 1;
  const char* env = std::getenv("ZT_LLAMA_FUSED");
  const bool on = !(env && std::strcmp(env, "0") == 0);
  int expected = -1;
  if (g_fused.compare_exchange_strong(expected, on ? 1 : 0) && !on) {
    log::info("models: ZT_LLAMA_FUSED=0: the Llama RMSNorm, RoPE and SwiGLU run as unfused ATen ops on CUDA");
  }
  return g_fused.load(std::memory_order_relaxed) == 1;
}

void set_llama_fused(bool on) { g_fused.store(on ? 1 : 0, std::memory_order_relaxed); }

torch::Tensor llama_rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const auto xf = x.to(torch::kFloat);
  const auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * y.to(x.scalar_type());
}

torch::Tensor llama_rope_reference(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos + util::rotate_half(x) * sin;  // cos/sin (T, hd) or (B, 1, T, hd): broadcast
}

torch::Tensor llama_swiglu_reference(const torch::Tensor& gate, const torch::Tensor& up) {
  return torch::nn::functional::silu(gate) * up;
}

namespace {
bool norm_fuses(const torch::Tensor& x, const torch::Tensor& weight) {
  return kernels::runs_on(x) && x.dim() >= 1 && x.numel() > 0 && same_device_dtype(x, weight) && weight.dim() == 1 &&
         weight.size(0) == x.size(-1) && llama_fused_enabled();
}
}  // namespace

torch::Tensor llama_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return norm_fuses(x, weight) ? RmsNormFn::apply(x, weight, eps) : llama_rms_norm_reference(x, weight, eps);
}

std::pair<torch::Tensor, torch::Tensor> llama_rms_norm_keep(const torch::Tensor& x, const torch::Tensor& weight,
                                                            double eps) {
  if (!norm_fuses(x, weight)) return {llama_rms_norm_reference(x, weight, eps), x};
  auto out = RmsNormKeepFn::apply(x, weight, eps);
  return {out[0], out[1]};
}

std::pair<torch::Tensor, torch::Tensor> llama_add_rms_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                                           const torch::Tensor& weight, double eps) {
  if (!norm_fuses(x, weight) || !same_device_dtype(x, delta) || delta.sizes() != x.sizes()) {
    auto h = x + delta;
    return {h, llama_rms_norm_reference(h, weight, eps)};
  }
  auto out = AddRmsNormFn::apply(x, delta, weight, eps);
  return {out[0], out[1]};
}

torch::Tensor llama_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  bool fused = kernels::runs_on(x) && x.dim() == 4 && x.numel() > 0 && x.size(3) % 2 == 0 &&
               same_device_dtype(x, cos) && same_device_dtype(x, sin) && cos.sizes() == sin.sizes() &&
               !cos.requires_grad() && !sin.requires_grad();
  if (fused) {
    const int64_t T = x.size(2), hd = x.size(3);
    const bool per_seq = cos.dim() == 2 && cos.size(0) == T && cos.size(1) == hd;
    const bool per_example = cos.dim() == 4 && (cos.size(0) == x.size(0) || cos.size(0) == 1) && cos.size(1) == 1 &&
                             cos.size(2) == T && cos.size(3) == hd;
    fused = (per_seq || per_example) && llama_fused_enabled();
  }
  if (!fused) return llama_rope_reference(x, cos, sin);
  return RopeFn::apply(x, cos.contiguous(), sin.contiguous());
}

torch::Tensor llama_swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  const bool fused = kernels::runs_on(gate) && same_device_dtype(gate, up) && gate.sizes() == up.sizes() &&
                     gate.numel() > 0 && llama_fused_enabled();
  return fused ? SwigluFn::apply(gate, up) : llama_swiglu_reference(gate, up);
}

torch::Tensor llama_embedding(const torch::Tensor& weight, const torch::Tensor& idx, int64_t padding_idx) {
  const bool fused = kernels::runs_on(weight) && weight.requires_grad() && torch::GradMode::is_enabled() &&
                     weight.dim() == 2 && weight.size(0) <= 0x7fffffff && idx.device() == weight.device() &&
                     idx.numel() > 0 && llama_fused_enabled();
  return fused ? EmbeddingFn::apply(weight, idx, padding_idx) : torch::embedding(weight, idx, padding_idx);
}

}  // namespace zt::models
