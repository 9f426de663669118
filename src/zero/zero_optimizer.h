// ZeroOptimizer: flat parameter/gradient buffers, gradient reduction per bucket, and the
// partitioned optimizer step for ZeRO stages 0, 1 and 2. The engine (src/engine) drives
// it; it holds no timing or reporting logic.
//
// Who holds what (Ψ = parameters, N = ranks, compute dtype of 2 bytes):
//   stage 0: params Ψ, grads Ψ (all-reduced per bucket in backward), master+m+v Ψ
//   stage 1: params Ψ, grads Ψ (reduce-scattered at the boundary), master+m+v Ψ/N
//   stage 2: params Ψ, grads Ψ/N (reduce-scattered per bucket in backward), master+m+v Ψ/N
// See src/zero/partition.h for the layout and [Stream Rules] in zerotrain/comm.h.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <vector>

#include "zero/partition.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt::zero {

struct ZeroOptions {
  int stage = 0;
  at::ScalarType dtype = at::kFloat;  // compute dtype of params and grads
  torch::Device device = torch::kCPU;
  int64_t reduce_bucket_numel = 500000000;
  int64_t allgather_bucket_numel = 500000000;
  bool overlap_comm = true;            // reduce buckets from backward hooks (stages 0, 2)
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  OptimizerConfig optimizer;
};

// Per-step inputs of the optimizer step.
struct StepInputs {
  double lr = 0;
  double loss_scale = 1;     // gradients are divided by this
  double clip = 0;           // global-norm clip, 0 = off
  int64_t step = 1;          // 1-based optimizer step (bias correction)
  std::optional<double> momentum;  // schedule-driven beta1 / SGD momentum (OneCycle)
};
struct StepOutcome {
  bool overflow = false;
  double grad_norm = 0;  // before clipping, after unscaling
};

class ZeroOptimizer {
 public:
  // params: managed tensors in the user's order; they become views into flat buffers.
  ZeroOptimizer(std::vector<torch::Tensor> params, comm::GroupPtr group, ZeroOptions options);
  ~ZeroOptimizer();

  // Before backward of each micro-step: `boundary` says whether this micro-step ends the
  // accumulation window (stage 0 reduces only then; stage 2 reduces every micro-step).
  void begin_backward(bool boundary, bool first_micro_step);
  // After loss.backward() returned: reduce what no hook reduced, wait for reductions.
  // Returns the time the compute stream waited for gradient communication (ms).
  double end_backward();
  // At the boundary: finish reduction (stage 1), unscale, check overflow, clip, update
  // this rank's shard, refresh the compute-dtype parameters (all-gather for stages 1-2).
  StepOutcome step(const StepInputs& in);
  void zero_grad();

  ModelStateBytes state_bytes() const;
  std::vector<torch::Tensor> gather_master_params();
  const FlatLayout& layout() const { return layout_; }
  int64_t buckets_launched() const { return buckets_launched_; }
  int64_t buckets_launched_in_backward() const { return buckets_in_backward_; }
  void reset_counters() { buckets_launched_ = buckets_in_backward_ = 0; }

 private:
  void on_grad_ready(int layout_index);
  void launch_bucket(int b);
  torch::Tensor owned_grad_fp32();
  void apply_optimizer(torch::Tensor& grad32, const StepInputs& in);
  void refresh_params();
  torch::Tensor bucket_view(const torch::Tensor& flat, int b) const;
  torch::Tensor shard_view(const torch::Tensor& flat, int b) const;        // rank's shard inside a full flat
  torch::Tensor owned_view(const torch::Tensor& owned, int b) const;       // bucket b inside an owned buffer

  ZeroOptions opt_;
  comm::GroupPtr group_;
  int rank_ = 0, world_ = 1;
  std::vector<torch::Tensor> params_;        // layout order
  std::vector<int> user_index_;              // layout index -> user index
  FlatLayout layout_;
  bool owns_all_ = true;                     // stage 0: this rank updates everything
  bool sgd_ = false;                         // optimizer.type SGD (else Adam / AdamW)
  bool adamw_ = true;                        // decoupled weight decay (AdamW / adam_w_mode)

  torch::Tensor flat_param_;   // (total) compute dtype: every param is a view into it
  torch::Tensor flat_grad_;    // (total) compute dtype, stages 0-1: every .grad is a view
  torch::Tensor grad_shard_;   // (shard) compute dtype, stage 2
  torch::Tensor master_;       // (owned) fp32
  torch::Tensor exp_avg_, exp_avg_sq_;  // (owned) fp32, Adam
  torch::Tensor momentum_buf_;          // (owned) fp32, SGD with momentum
  torch::Tensor step_t_;                // () fp32 on device, for the fused Adam kernels

  // Backward bookkeeping.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<int> pending_;              // per bucket: params still to arrive
  std::vector<bool> launched_;            // per bucket: reduced in this micro-step
  std::vector<torch::Tensor> staging_;    // stage 2: per bucket full-size grads until reduced
  std::vector<torch::Tensor> deferred_;   // stage 2: reduce-scatter outputs to add at the end
  std::vector<comm::WorkPtr> works_;
  bool reducing_ = false;                 // hooks reduce in this micro-step
  bool first_micro_ = true;
  bool in_backward_ = false;
  int64_t buckets_launched_ = 0, buckets_in_backward_ = 0;
};

}  // namespace zt::zero
