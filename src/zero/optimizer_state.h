// The sharded optimizer state of one shard group, part (d) of "ZeRO as parts"
// (docs/zero-parts.md): the update rule with its parameter groups over this rank's owned
// elements (OptimizerRule), and the fp32 buffers of those elements (OwnedState). The
// step backends (step_backend.h: DeviceStep, CpuAdamStep, NvmeStep) update them.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "optim/cpu_adam.h"
#include "zero/shard_layout.h"
#include "zerotrain/config.h"

namespace zt::zero {

// A parameter group: the step uses lr x lr_scale and this weight decay.
struct ParamGroupSpec {
  std::string name;
  double lr_scale = 1.0;
  double weight_decay = 0.0;
};

// Per-step inputs of the optimizer step.
struct StepInputs {
  double lr = 0;
  double loss_scale = 1;     // gradients are divided by this
  double clip = 0;           // global-norm clip, 0 = off
  int64_t step = 1;          // 1-based optimizer step (bias correction)
  std::optional<double> momentum;  // schedule-driven beta1 / SGD momentum (OneCycle)
  // Allow the step to decide overflow and clipping on the device (see StepOutcome).
  bool defer = false;
};

class OptimizerRule {
 public:
  // type "Adam", "AdamW" or "SGD" (any case); groups: at least one (empty = one group with
  // the config's weight decay).
  OptimizerRule(OptimizerConfig config, std::vector<ParamGroupSpec> groups);

  bool sgd() const { return sgd_; }
  bool adamw() const { return adamw_; }  // decoupled weight decay (AdamW / adam_w_mode)
  // SGD with momentum != 0 keeps a momentum buffer.
  bool momentum_buffer() const { return sgd_ && config_.params.momentum != 0; }
  const OptimizerParams& params() const { return config_.params; }
  int num_groups() const { return static_cast<int>(groups_.size()); }
  const ParamGroupSpec& group(int g) const { return groups_[g]; }
  // Per-element fp32 state kinds: "master", then "exp_avg" and "exp_avg_sq" (Adam) or
  // "momentum" (SGD with momentum != 0).
  std::vector<std::string> state_kinds() const;

  // [Group Runs] The owned elements are cut into runs of one parameter group each
  // (covering [0, owned) in order; padding joins a neighbouring run). Every optimizer
  // update over an owned range calls fn(offset in the range, length, group) for the
  // range's parts in order: one call covering the range when there is one group.
  // group_of: layout index -> parameter group.
  void build_group_runs(const ShardLayout& L, const std::function<int(int layout_index)>& group_of);
  void for_group_runs(int64_t begin, int64_t n, const std::function<void(int64_t at, int64_t len, int group)>& fn) const;
  // The CPU Adam hyper-parameters of parameter group `group` with gradients x factor.
  optim::AdamHyper adam_hyper(double factor, const StepInputs& in, int group) const;

 private:
  struct GroupRun {
    int64_t begin = 0, len = 0;  // owned coordinates
    int group = 0;
  };
  OptimizerConfig config_;
  std::vector<ParamGroupSpec> groups_;
  bool sgd_ = false;
  bool adamw_ = true;
  std::vector<GroupRun> runs_;
};

// The fp32 state of the owned elements (owned_numel() each, on the device or in host
// memory). Undefined tensors are kinds the rule does not keep (or, with NVMe, state kept
// in the swap file instead).
struct OwnedState {
  torch::Tensor master;                 // (owned) fp32
  torch::Tensor exp_avg, exp_avg_sq;    // (owned) fp32, Adam
  torch::Tensor momentum;               // (owned) fp32, SGD with momentum
  // The defined buffers in state_kinds() order.
  std::vector<torch::Tensor> buffers() const;
  int64_t master_bytes() const;
  int64_t moment_bytes() const;
};

}  // namespace zt::zero
