// GradReducer: part (b) of "ZeRO as parts" (docs/zero-parts.md). It owns the gradients
// of one shard group's parameters and reduces them over the group's communicator, bucket
// by bucket, from autograd's gradient-ready hooks:
//   stage 0  gradients in one flat buffer (.grad are views); each bucket is all-reduced in
//            the backward of the window's last micro-step
//   stage 1  the same buffer; each bucket is reduce-scattered in place into this rank's
//            shard in the last micro-step's backward
//   stage 2  each bucket's gradients are staged as they arrive (.grad is freed) and
//            reduce-scattered into the gradient shard in every micro-step's backward
//            (later micro-steps add into it after the wait)
//   stage 3  as stage 2, one bucket per gather unit
// Without overlap_comm (stages 0-1) nothing is reduced in backward: reduce_now() does it
// at the step. The reducer knows nothing of optimizer state, offload or gathering: the
// owner hears of each stage-2/3 reduction through on_issued/on_done.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/phase_timer.h"
#include "zero/shard_layout.h"
#include "zerotrain/comm.h"

namespace zt::zero {

struct ReducerOptions {
  int stage = 0;
  at::ScalarType dtype = at::kFloat;  // gradients' dtype (the compute dtype)
  torch::Device device = torch::kCPU;
  bool overlap_comm = true;           // stages 0-1: reduce from hooks in backward
  bool prescale_gradients = false;    // divide by the predivide factor before the sum
  double gradient_predivide_factor = 1.0;
  // Multiplies the window's reduced gradient once, in reduce_now() at the step (after the
  // average over the group). 1 = none (no work). Expert parameters use 1/ep: their
  // gradient on the owner is already the SUM over the ep group's tokens, so the average
  // over expert-dp times 1/ep is the average over all dp ranks ([Expert Groups] in
  // zero_optimizer.h; DeepSpeed #5618 is this factor missing).
  double grad_scale = 1.0;
};

class GradReducer {
 public:
  // layout: the shard group's layout (outlives the reducer); params: its parameters in
  // layout order; user_index: their indices as the user gave them (for messages).
  GradReducer(const ShardLayout& layout, std::vector<torch::Tensor> params, std::vector<int> user_index,
              comm::GroupPtr group, ReducerOptions options);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Stages 2-3, in the reducing backward: right after bucket b's reduce-scatter was issued
  // (`final`: the window's last micro-step wrote straight into the gradient shard, whose
  // view grad(b) is complete once `work` is), and after its staging buffer was let go.
  std::function<void(int b, const comm::WorkPtr& work, bool final)> on_issued;
  std::function<void(int b)> on_done;

  // Allocates what the stage keeps between steps (stages 0-1: the flat gradient buffer
  // with every .grad a view into it). Call once, after the layout's parameters exist.
  void allocate();
  // Gradient-ready hooks on parameters [begin, end) (layout indices). The parameters must
  // have their final dtype, device and shape (autograd's accumulator remembers them).
  void install_hooks(size_t begin, size_t end);

  // Before backward of each micro-step (see ZeroOptimizer::begin_backward).
  void begin_backward(bool boundary, bool first_micro_step);
  // After loss.backward() returned: reduce the buckets no hook reduced (unused parameters)
  // so every rank issues the same collectives.
  void launch_remaining();
  // Waits (the compute stream, not the host, on CUDA) for this backward's reductions and
  // applies the post-scaling. Returns the span of that wait (exposed communication).
  DeviceSpan wait();
  // At the step, once per window: stages 0-1 without overlap_comm reduce every bucket now
  // (blocking); then grad_scale applies (every stage).
  void reduce_now();
  // Whether the hooks of this micro-step's backward reduce.
  bool reducing() const { return reducing_; }
  // Bucket b's reduced gradient owned by this rank (compute dtype, on the device): a view
  // of the flat buffer (stages 0-1) or of the gradient shard (stages 2-3, zero-filled if no
  // reduction wrote it yet).
  torch::Tensor grad(int b);
  // Stages 0-1: marks the flat gradients stale (re-attaching .grad views): each counts as
  // zero, and the next backward's first writer overwrites it ([Stale Gradients],
  // common/stale_grad.h; `ZT_STALE_GRADS=0` zeroes them here instead). Drops the gradient
  // shard (stages 2-3).
  void zero_grad();
  // Bytes of gradient memory as the ZeRO formulas count it (the shard at its full size).
  int64_t grad_bytes() const;

  int64_t buckets_launched() const { return buckets_launched_; }
  int64_t buckets_launched_in_backward() const { return buckets_in_backward_; }
  void reset_counters() { buckets_launched_ = buckets_in_backward_ = 0; }

 private:
  void on_grad_ready(int layout_index);
  void launch_bucket(int b);
  void reduce_unreduced();  // reduce_now's reduction (stages 0-1 without overlap_comm)
  // [Stale Gradients] zeroes parameter i's gradient if still marked stale (settle_all: all).
  void settle(size_t i);
  void settle_all();
  void install_stale_hooks();
  torch::TensorOptions topt() const;

  const ShardLayout& L_;
  std::vector<torch::Tensor> params_;     // layout order
  std::vector<int> user_index_;
  comm::GroupPtr group_;
  ReducerOptions opt_;
  int world_ = 1;

  torch::Tensor flat_grad_;   // (total) compute dtype, stages 0-1: every .grad is a view
  torch::Tensor grad_shard_;  // (shard) compute dtype, stages 2-3, from the first reduction to the step
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<int> pending_;              // per bucket: params still to arrive
  std::vector<bool> launched_;            // per bucket: reduced in this micro-step
  std::vector<torch::Tensor> staging_;    // stages 2-3: per bucket full-size grads until reduced
  std::vector<torch::Tensor> deferred_;   // stages 2-3: reduce-scatter outputs to add after the wait
  std::vector<comm::WorkPtr> works_;
  bool reducing_ = false;                 // hooks reduce in this micro-step
  bool first_micro_ = true;
  bool boundary_ = true;                  // this backward ends the accumulation window
  bool in_backward_ = false;
  size_t stale_count_ = 0;                // [Stale Gradients] this reducer's marks still set
  bool stale_hooks_installed_ = false;
  std::vector<std::pair<size_t, unsigned>> stale_hooks_;  // (parameter, tensor hook id)
  int64_t buckets_launched_ = 0, buckets_in_backward_ = 0;
};

}  // namespace zt::zero
