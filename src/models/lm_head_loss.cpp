#include "models/lm_head_loss.h"

#include <algorithm>
#include <limits>

#include "common/stale_grad.h"
#include "kernels/aten.h"
#include "kernels/llama_ops.h"
#include "kernels/softmax_xent.h"
#include "models/deferred_grad.h"
#include "models/shared_linear.h"  // accumulates_in_place
#include "zerotrain/error.h"


namespace zt::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// logits (n, Vp) contiguous, in place -> d(sum of the rows' losses)/d(logits); adds the
// rows' losses to loss_sum (fp32 scalar).
void fused_softmax_xent(torch::Tensor& logits, const torch::Tensor& targets, int64_t V, torch::Tensor& loss_sum) {
  kernels::SoftmaxXentArgs a;
  a.logits = logits.data_ptr();
  a.type = kernels::dtype_of(logits.scalar_type());
  a.rows = logits.size(0);
  a.cols = V;
  a.ld = logits.stride(0);
  a.targets = targets.data_ptr<int64_t>();
  a.loss_sum = loss_sum.data_ptr<float>();
  kernels::softmax_xent(a, kernels::current_stream(logits.device()));
}

struct LmHeadCrossEntropy : torch::autograd::Function<LmHeadCrossEntropy> {
  // need_dx / need_dw: whether backward will be asked for x's / w's gradient (the input
  // requires grad and grad mode is on); what is not needed is neither computed nor kept.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& targets, int64_t pad_multiple, int64_t chunk_rows, bool need_dx,
                               bool need_dw) {
    const int64_t N = x.size(0), C = x.size(1), V = w.size(0);
    const int64_t m = std::max<int64_t>(1, pad_multiple);
    const int64_t Vp = (V + m - 1) / m * m;
    const auto wp = Vp > V ? at::constant_pad_nd(w, {0, 0, 0, Vp - V}) : w;  // (Vp, C)
    const auto fopt = x.options().dtype(at::kFloat);
    // (N, C): d(sum of losses)/dx. (Vp, C), fp32 across chunks: d(sum of losses)/dw, only for a
    // trained head: a frozen one (LoRA) would hold V x C x 4 bytes from here to the end of
    // backward for nothing (2.1 GB for Llama-3-8B's head; [LM Head Memory] in docs/lora.md).
    torch::Tensor dx = need_dx ? at::empty_like(x, at::MemoryFormat::Contiguous) : torch::Tensor();
    // CUDA: zerotrain's fused kernel turns each chunk's logits into their gradient in
    // place (src/kernels/softmax_xent.h), with no host sync.
    const bool fused = kernels::runs_on(x);
    // Fused: the first chunk's GEMM writes dw with beta 0, so it needs no zeroing pass
    // (N > 0: there is a first chunk). Unfused: each chunk's product is added to zeros.
    torch::Tensor dw;
    if (need_dw) dw = fused && N > 0 ? at::empty({Vp, C}, fopt) : at::zeros({Vp, C}, fopt);
    auto loss_sum = at::zeros({}, fopt);
    const auto valid_all = targets.ne(-1);
    // Unfused, one host sync per call: masking rows of ignored targets is a full pass
    // over the chunk's logits, worth skipping when (as in pre-training) every target counts.
    const bool any_ignored = !fused && !valid_all.all().item<bool>();
    const int64_t rows = std::max<int64_t>(1, chunk_rows);
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t n = std::min(rows, N - r0);
      const auto xc = x.narrow(0, r0, n);                      // (n, C)
      if (fused) {
        auto g = at::mm(xc, wp.t());                            // (n, Vp) logits -> gradient
        fused_softmax_xent(g, targets.narrow(0, r0, n), V, loss_sum);
        if (need_dx) {
          auto dxc = dx.narrow(0, r0, n);  // (n, C), contiguous rows
          at::mm_out(dxc, g, wp);
        }
        // dw += g^T xc accumulated by the GEMM itself in fp32 (bf16/fp16 inputs, fp32 output
        // and beta 1): no (Vp, C) product in x's dtype and no separate pass adding it, which
        // cost one read-read-write of the fp32 head gradient per chunk (8.6 ms of a Llama-3.2-1B
        // step at mb 4: 8 chunks of 1 GB). fp32 inputs: the plain addmm. The first chunk
        // writes dw with beta 0 (dw is uninitialised; beta 0 reads none of it, NaN included).
        if (need_dw) {
          const double beta = r0 == 0 ? 0.0 : 1.0;
          if (x.scalar_type() == at::kFloat) dw.addmm_(g.t(), xc, beta);
          else at::addmm_out(dw, dw, g.t(), xc, at::kFloat, beta);
        }
        continue;
      }
      const auto valid = valid_all.narrow(0, r0, n);           // (n)
      const auto t = at::where(valid, targets.narrow(0, r0, n), at::zeros({}, targets.options()));
      auto lc = at::mm(xc, wp.t()).to(at::kFloat);             // (n, Vp) fp32
      if (Vp > V) lc.narrow(1, V, Vp - V).fill_(-std::numeric_limits<float>::infinity());
      lc = at::log_softmax(lc, 1);                             // (n, Vp), one fused kernel
      const auto picked = lc.gather(1, t.unsqueeze(1)).squeeze(1);  // log p(target)
      loss_sum.sub_((picked * valid).sum());
      if (!need_dx && !need_dw) continue;
      // d(loss_i)/d(logits_i) = softmax_i - onehot(t_i), zero for ignored rows; in place.
      lc.exp_();
      lc.scatter_add_(1, t.unsqueeze(1), at::full({n, 1}, -1.0f, fopt));
      if (any_ignored) lc.mul_(valid.unsqueeze(1));
      const auto g = lc.to(x.scalar_type());                   // (n, Vp)
      if (need_dx) {
        auto dxc = dx.narrow(0, r0, n);  // (n, C), contiguous rows
        at::mm_out(dxc, g, wp);
      }
      if (need_dw) dw.add_(at::mm(g.t(), xc));  // (Vp, C)
    }
    const auto count = valid_all.sum().to(at::kFloat).clamp_min(1.0);
    ctx->save_for_backward({dx, need_dw ? dw.narrow(0, 0, V) : dw, count});
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    if (need_dw) ctx->saved_data["w"] = w;  // the parameter itself (its .grad is read in backward)
    return loss_sum / count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto scale = grad_out[0].to(at::kFloat) / saved[2];  // d(mean)/d(sum) times upstream
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    torch::Tensor dx, dw;
    if (saved[0].defined()) dx = (saved[0].to(at::kFloat) * scale).to(saved[0].scalar_type());
    if (saved[1].defined()) {
      auto w = ctx->saved_data["w"].toTensor();
      if (ctx->needs_input_grad(1)) {
        dw = weight_grad(w, saved[1], scale, w_dtype);
      } else {
        // zb-h1's input-gradient pass: the head's gradient later, in W (the (V, C) fp32 sum is
        // kept until then; only the scaling is deferred). [Deferred Weight Gradients]
        defer_weight_grads({w}, [w, sum = saved[1], scale, w_dtype] {
          return std::vector<torch::Tensor>{weight_grad(w, sum, scale, w_dtype)};
        });
      }
    }
    return {dx, dw, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
  // The head's gradient sum (V, C fp32) x scale: added into w.grad in place when it can take it
  // (undefined is returned), else a fresh gradient in w's dtype.
  static torch::Tensor weight_grad(torch::Tensor w, const torch::Tensor& sum, const torch::Tensor& scale,
                                   at::ScalarType w_dtype) {
    if (accumulates_in_place(w, w_dtype, sum.device())) {
      // W.grad exists (the engine's flat gradient buffer at ZeRO stages 0-1): add the scaled
      // fp32 sum into it in one pass, rounded once, as GPT-2's LinearFn accumulates in its GEMM;
      // W's AccumulateGrad then receives no gradient (its hooks still run). Saves the (V, C)
      // gradient in w's dtype and autograd's separate add of it (two passes over V x C).
      auto& g = w.mutable_grad();
      const bool overwrite = take_grad_stale(g);  // [Stale Gradients] the first write stores
      if (kernels::runs_on(g) && g.is_contiguous() && sum.is_contiguous() && sum.scalar_type() == at::kFloat &&
          scale.scalar_type() == at::kFloat && scale.numel() == 1 && scale.device() == g.device()) {
        kernels::AddScaledArgs a;  // the same sum, one vectorized pass (ATen's addcmul_ of mixed dtypes is not)
        a.dst = g.data_ptr();
        a.src = sum.data_ptr<float>();
        a.scale = scale.data_ptr<float>();
        a.type = kernels::dtype_of(g.scalar_type());
        a.n = g.numel();
        a.overwrite = overwrite;
        kernels::add_scaled(a, kernels::current_stream(g.device()));
      } else if (overwrite) {
        at::mul_out(g, sum, scale);
      } else {
        g.addcmul_(sum, scale);
      }
      return {};
    }
    // Computed in fp32, rounded once into w's dtype: (dw * scale).to(w_dtype) without the
    // (V, C) fp32 temporary (on CUDA; the CPU's TensorIterator makes one internally).
    auto dw = at::empty(sum.sizes(), sum.options().dtype(w_dtype));
    at::mul_out(dw, sum, scale);
    return dw;
  }
};

}  // namespace

int64_t lm_head_logit_bytes(const torch::Tensor& x) {
  // Must agree with LmHeadCrossEntropy::forward's choice of path (`fused`).
  return kernels::runs_on(x) ? static_cast<int64_t>(x.element_size()) : 4;
}

torch::Tensor lm_head_cross_entropy(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& targets,
                                    int64_t pad_multiple, int64_t chunk_rows) {
  ZT_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "lm_head_cross_entropy: x ", x.sizes(),
           " and w ", w.sizes(), " must be (N, C) and (V, C)");
  ZT_CHECK(targets.dim() == 1 && targets.size(0) == x.size(0) && targets.scalar_type() == at::kLong,
           "lm_head_cross_entropy: targets must be (N) int64, got ", targets.sizes(), " ", targets.scalar_type());
  ZT_CHECK(x.scalar_type() == w.scalar_type(), "lm_head_cross_entropy: x is ", x.scalar_type(), " but w is ",
           w.scalar_type());
  const bool grad = torch::GradMode::is_enabled();
  return LmHeadCrossEntropy::apply(x.contiguous(), w, targets.contiguous(), pad_multiple, chunk_rows,
                                   grad && x.requires_grad(), grad && w.requires_grad());
}

}  // namespace zt::models
