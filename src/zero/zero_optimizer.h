// ZeroOptimizer: one SHARD GROUP of ZeRO -- a set of parameters with its own communicator
// -- composed of parts that each own one concern (docs/zero-parts.md):
//   ShardLayout    (shard_layout.h)    the flat layout and this rank's views of it
//   GradReducer    (grad_reducer.h)    hooks, buckets, all-reduce / reduce-scatter
//   ParamGatherer  (param_gatherer.h)  stage 3: units, prefetch, reuse, persistence
//   OptimizerRule, OwnedState (optimizer_state.h)  the rule, parameter groups, fp32 state
//   StepBackend    (step_backend.h)    the step, picked at construction: DeviceStep
//                  (fused kernel / ATen), CpuAdamStep (offload, with the delayed update)
//                  or NvmeStep (NVMe-swapped CPU Adam)
// The engine (src/engine) drives it; it holds no timing or reporting logic. Partial
// gradient norms combine over shard groups and the model-parallel group (grad_norm.h).
//
// Who holds what (Ψ = parameters, N = ranks, compute dtype of 2 bytes):
//   stage 0: params Ψ, grads Ψ (all-reduced per bucket in backward), master+m+v Ψ
//   stage 1: params Ψ, grads Ψ (reduce-scattered at the boundary), master+m+v Ψ/N
//   stage 2: params Ψ, grads Ψ/N (reduce-scattered per bucket in backward), master+m+v Ψ/N
//   stage 3: grads Ψ/N, master+m+v Ψ/N; parameters exist only in the units gathered right
//            now (the fp32 master shard is cast to the compute dtype as it is gathered)
//
// Stage 3 (src/zero/zero3.cpp) reuses the stage-2 machinery with one bucket per gather
// unit: the rank owns shard r of every unit's parameters, gradients and optimizer state.
// A unit's full parameters exist only between its gather and its release; the model's
// parameter tensors point at the gathered buffer (set_data) while it exists and at an
// empty tensor otherwise.
// See src/zero/partition.h for the layout and [Stream Rules] in zerotrain/comm.h.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/phase_timer.h"
#include "offload/aio.h"
#include "optim/cpu_adam.h"
#include "zero/frozen_shards.h"
#include "zero/grad_reducer.h"
#include "zero/optimizer_state.h"
#include "zero/param_gatherer.h"
#include "zero/partition.h"
#include "zero/shard_layout.h"
#include "zero/step_backend.h"
#include "zero/zero_options.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/report.h"

namespace zt::zero {

struct NvmeParams;   // zero_offload_nvme.cpp

// StepInputs: zero/optimizer_state.h.
struct StepOutcome {
  bool overflow = false;
  double grad_norm = 0;  // before clipping, after unscaling
  // Set when the step was deferred (StepInputs::defer on a CUDA step without offload,
  // SGD or Adam without bias correction): the global sum of squares of the scaled
  // gradients (1 element, fp64, on the device, already reduced over ranks). The update
  // ran on the device and changed nothing where this is inf/NaN (overflow); `overflow`
  // and `grad_norm` above are not filled: the caller reads norm_sq when it is done.
  torch::Tensor norm_sq;
};

// [Expert Groups] (docs/moe.md; the engine composes them, src/engine/engine.cpp)
//  * An MoE model under expert parallelism (ep > 1) has two kinds of trainable parameters:
//    dense ones (the same tensor on every dp rank) and experts (rank r of an ep group holds
//    its own experts; the dp ranks with the same ep index hold the same experts: the
//    expert-dp group, dp/ep ranks). The engine makes one ZeroOptimizer per kind: dense over
//    dp, experts over expert-dp, with the same stage and optimizer.
//  * Expert gradients: the MoE layer's backward all-to-all leaves on an expert's owner the
//    SUM of the gradients of every ep rank's tokens. Averaging that over expert-dp gives
//    ep x the dp average; grad_scale = 1/ep makes it the dp average, the gradient ep 1 has.
//  * One global norm: the dense partial (same on every ep rank), plus the expert partial
//    summed over the ep group (every expert counted once), then summed over model_parallel.
//    Both optimizers take apply_step() with that one number: the same overflow skip and
//    clipping coefficient everywhere.
//  * Stage 3: both shard groups are stage 3, each with its own ParamGatherer over its own
//    group (dense over dp, experts over expert-dp), planned from the same unit list (each
//    unit with the group's own members; a unit without experts is a no-op in the expert
//    group). The engine drives both with the same calls (begin/end_forward, the unit hooks,
//    unit_output, gather/release_all): the dense unit is gathered first, then its experts.
class ZeroOptimizer {
 public:
  // params: managed tensors in the user's order; they become views into flat buffers.
  ZeroOptimizer(std::vector<torch::Tensor> params, comm::GroupPtr group, ZeroOptions options);
  ~ZeroOptimizer();

  // Before backward of each micro-step: `boundary` says whether this micro-step ends the
  // accumulation window (stage 0 reduces only then; stage 2 reduces every micro-step).
  void begin_backward(bool boundary, bool first_micro_step);
  // After loss.backward() returned: reduce what no hook reduced, wait for reductions.
  // Returns the span of the compute stream's wait for gradient communication (exposed time).
  DeviceSpan end_backward();
  // At the boundary: finish reduction (stage 1), unscale, check overflow, clip, update
  // this rank's shard, refresh the compute-dtype parameters (all-gather for stages 1-2).
  StepOutcome step(const StepInputs& in);
  // step() in two halves, for an engine with several shard groups that share one global
  // norm ([Expert Groups]): prepare_step() finishes the reduction and returns this shard
  // group's partial sum of squares (zero/grad_norm.h; not yet combined over model_parallel);
  // apply_step() takes the GLOBAL sum (every shard group, every model-parallel rank) and
  // does the rest of step(): overflow check, clipping, update, refresh. step(in) is
  // apply_step(combine_norm_sq({prepare_step()}, model_parallel), in).
  torch::Tensor prepare_step();
  StepOutcome apply_step(const torch::Tensor& global_sq, const StepInputs& in);
  void zero_grad();

  // Stage 3 (no-ops at stages 0-2). The engine calls begin/end_forward around the user's
  // forward; models call the unit hooks around each unit's forward (GPT-2 through its
  // BlockHooks, other models through Engine::run_unit).
  void begin_forward();
  void end_forward();
  void unit_pre_forward(int unit, bool recompute);
  void unit_post_forward(int unit, bool recompute);
  // Returns y wrapped so that the unit is gathered again just before its backward.
  torch::Tensor unit_output(int unit, const torch::Tensor& y);
  void gather_all();                 // every unit full-size (collective)
  void release_all(bool persistent_too);
  const Zero3Stats& zero3_stats() const { return gatherer_ ? gatherer_->stats() : no_z3_; }
  int num_units() const { return gatherer_ ? gatherer_->num_units() : 0; }
  // The frozen shard group's gathers (zeros without one).
  const Zero3Stats& frozen_stats() const { return frozen_ ? frozen_->gatherer().stats() : no_z3_; }
  // The frozen storage group's gathers, in bytes (zeros without one).
  const Zero3Stats& frozen_storage_stats() const {
    return frozen_storage_ ? frozen_storage_->gatherer().stats() : no_z3_;
  }

  ModelStateBytes state_bytes() const;
  // NVMe: the swap file of this rank ("" without NVMe offload), and the last step's swap.
  std::string nvme_file() const;
  StepReport::Nvme nvme_step_stats() const { return backend_->swap_stats(); }
  std::vector<torch::Tensor> gather_master_params();
  const FlatLayout& layout() const { return L_.flat; }
  int64_t buckets_launched() const { return reducer_->buckets_launched(); }
  int64_t buckets_launched_in_backward() const { return reducer_->buckets_launched_in_backward(); }
  void reset_counters();

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
  // This shard group's partial sum of squared gradients (1 element, fp64, on the device),
  // summed over group_ where the gradients are sharded (after the reduction).
  torch::Tensor grad_norm_sq();
  // Makes reducer_ over params_ and L_ (the layout must exist).
  void make_reducer();
  // Makes backend_ (the layout, the rule and the owned state must exist).
  void make_backend();
  // A zero-filled host buffer (offloaded state): page-locked at its exact size with
  // pin_memory on CUDA (offload/host_memory.h). The dtype defaults to the compute dtype.
  torch::Tensor host_buffer(int64_t numel, std::optional<at::ScalarType> dtype = std::nullopt) const;
  // A ConfigError on every rank, before any of it is allocated, when the ranks of this host
  // together need more than the host has available (offload/host_memory.h;
  // CpuAdamStep::host_bytes_planned).
  void check_host_memory() const;
  int group_of_user(int user_index) const {
    return opt_.param_group.empty() ? 0 : opt_.param_group[user_index];
  }
  // offload_param nvme (zero_offload_nvme.cpp): the stage-3 shard in its swap file
  // ([NVMe Params]). Element ranges of the shard; a read is a host tensor in a staging slot,
  // valid until param_buffer_count more reads; param_nvme_uploaded(slot) records that an
  // upload from it was issued.
  void init_param_nvme(int64_t max_unit_shard);
  std::pair<torch::Tensor, int> param_nvme_read(int64_t begin, int64_t numel);
  void param_nvme_uploaded(int slot);
  void param_nvme_write(int64_t begin, const torch::Tensor& src);
  void param_nvme_state_bytes(ModelStateBytes& m) const;
 public:
  // Delayed parameter update: finishes the CPU step in flight and applies it to the
  // parameters (collective at stages 1-2). Called before anything reads the master.
  void flush_delayed_update();
 private:
  torch::Tensor param_dst(int b);  // where bucket b's updated compute-dtype shard goes (offload)
  void refresh_params();

  // Stage 3 (zero3.cpp): units, layout and partition of the parameters; the gatherer.
  void init_stage3(std::vector<torch::Tensor>& params);
  void init_frozen();  // stage 3: the frozen shard group (frozen_shards.h), when there is one
  void make_gatherer(const UnitPlan& plan);
  GathererOptions gatherer_options() const;  // the stage3_* settings, for both gatherers

  ZeroOptions opt_;
  comm::GroupPtr group_;
  OptimizerRule rule_;                       // the update rule, parameter groups, [Group Runs]
  int rank_ = 0, world_ = 1;
  std::vector<torch::Tensor> params_;        // layout order
  std::vector<int> user_index_;              // layout index -> user index
  ShardLayout L_;                            // the layout and this rank's views of it (owns_all: stage 0)
  // Owned gradient pieces whose norm weight is not 1 ([Norm Weights] in zero_optimizer.cpp).
  struct WeightedPiece {
    int bucket;
    int64_t begin, numel;  // in the bucket's owned gradient
    double extra;          // weight - 1
  };
  std::vector<WeightedPiece> weighted_pieces_;
  void plan_weighted_pieces();
  std::unique_ptr<GradReducer> reducer_;     // gradients: hooks, buckets, reductions
  bool params_written_ = false;  // the step already wrote the compute-dtype parameters (fused kernel)

  torch::Tensor flat_param_;   // (total) compute dtype: every param is a view into it
  OwnedState state_;           // fp32 master and moments of the owned elements (device or host; none with NVMe)
  // The step backend (step_backend.h): DeviceStep, CpuAdamStep or NvmeStep. Destroyed first
  // (~ZeroOptimizer): a delayed step's worker uses the buffers below.
  std::unique_ptr<StepBackend> backend_;
  std::shared_ptr<NvmeParams> param_nvme_;  // offload_param nvme: the parameter file, its slots' upload events

  // Stage 3 state.
  std::unique_ptr<ParamGatherer> gatherer_;  // null at stages 0-2
  std::unique_ptr<FrozenShards> frozen_;     // stage 3 with frozen parameters, else null
  std::unique_ptr<FrozenShards> frozen_storage_;  // stage 3 with frozen byte storage (uint8), else null
  // The frozen groups' gatherers (driven by the same calls as the trained group's).
  std::vector<ParamGatherer*> frozen_gatherers() const;
  torch::Tensor param_shard_;            // (shard) compute dtype: only while initialize() partitions; kept with offload
  std::vector<std::vector<int64_t>> shapes_;  // layout index -> full shape
  Zero3Stats no_z3_;                     // stages 0-2: no gathers
};

}  // namespace zt::zero
