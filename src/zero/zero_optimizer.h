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
#include <functional>
#include <memory>
#include <string>
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

  // ---- Checkpoint state (src/zero/zero_state.cpp; see docs/checkpoints.md) ----
  // Written only in terms of layout_, params_/user_index_, owned_view() and the owned
  // fp32 buffers, so every stage that keeps "rank r owns shard r of every bucket" and
  // refresh_params() gets checkpoints unchanged.
  //
  // Per-element fp32 state kinds: "master", then "exp_avg" and "exp_avg_sq" (Adam) or
  // "momentum" (SGD with momentum != 0).
  std::vector<std::string> state_kinds() const;
  // Managed parameters in the user's order (as given to the constructor).
  std::vector<torch::Tensor> user_params() const;
  // Their full shapes, user order (stage 3 must return the recorded shapes: a released
  // parameter's data is empty).
  std::vector<std::vector<int64_t>> user_param_shapes() const;
  // Elements [begin, end) of the flattened parameter `param` (user index), with a view
  // (fp32, on the device, no copy) of each state kind over them, in state_kinds() order.
  struct StateFragment {
    int param = 0;
    int64_t begin = 0, end = 0;
    std::vector<torch::Tensor> state;
  };
  // What this rank writes: the parameter pieces inside shard `rank` of every bucket, for
  // every stage (stage-0 ranks hold equal copies and each writes only its shard), so
  // the fragments of all ranks tile every parameter exactly once.
  std::vector<StateFragment> state_fragments();
  // Fills the state this rank owns: fetch(param, begin, end, kind) returns end-begin fp32
  // values (any device). No communication; call finish_state_import() on every rank after.
  using StateFetch = std::function<torch::Tensor(int param, int64_t begin, int64_t end, const std::string& kind)>;
  void import_state(const StateFetch& fetch);
  // Rebuilds the compute-dtype parameters from the imported master (refresh_params();
  // collective for sharded stages).
  void finish_state_import();

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
