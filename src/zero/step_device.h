// DeviceStep: the optimizer step backend whose fp32 state lives where the gradients are
// (the GPU, or the CPU of a CPU rank), part (d) of "ZeRO as parts" (docs/zero-parts.md).
// On CUDA with zerotrain's kernels it runs the fused Adam/AdamW kernel ([Fused Step]);
// otherwise ATen's fused Adam/AdamW (or the plain loops for SGD and Adam without bias
// correction), over chunks of buckets. The other backends behind StepBackend
// (step_backend.h): CpuAdamStep (step_cpu_adam.h) and NvmeStep (step_nvme.h).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "zero/optimizer_state.h"
#include "zero/step_backend.h"
#include "zero/shard_layout.h"

namespace zt::zero {

struct DeviceStepOptions {
  torch::Device device = torch::kCPU;
  at::ScalarType dtype = at::kFloat;  // compute dtype of gradients and parameters
};

class DeviceStep final : public StepBackend {
 public:
  // Bucket b's owned gradient (compute dtype, on the device).
  using GradFn = std::function<torch::Tensor(int b)>;
  // Where the fused kernel writes bucket b's updated compute-dtype parameters (undefined:
  // it does not; stage 3 gathers from the master instead).
  using ParamFn = std::function<torch::Tensor(int b)>;

  // Updates `state` (its buffers on `options.device`) over `layout`'s owned elements by
  // `rule`. All three outlive the step. As a StepBackend (update()), the gradients and
  // parameter destinations come from `grad` and `params`.
  DeviceStep(const ShardLayout& layout, const OptimizerRule& rule, OwnedState& state, DeviceStepOptions options,
             GradFn grad = nullptr, ParamFn params = nullptr);

  const char* name() const override { return "device"; }
  // Whether the step can take its overflow check and clipping from the device
  // (StepOutcome::norm_sq): CUDA, Adam/AdamW with bias correction.
  bool can_defer() const override;
  // Whether the step runs zerotrain's fused kernel ([Fused Step]).
  bool use_kernel() const;
  // A deferred step: from the global sum of squares of the scaled gradients, the device
  // tensors the update reads (found_inf: 1 skips it; the scale: clipping / loss scale).
  void defer(const torch::Tensor& sq, const StepInputs& in) override;
  // The update of every owned element with its gradient x factor (deferred: x the device
  // scale, skipped on overflow). Returns whether it wrote the compute-dtype parameters.
  bool step(double factor, const StepInputs& in, const GradFn& grad, const ParamFn& params);
  bool update(double factor, const StepInputs& in) override { return step(factor, in, grad_, params_); }
  // Forgets the deferred tensors (after the step).
  void clear_deferred() { grad_scale_ = found_inf_ = torch::Tensor(); }
  void end_step() override { clear_deferred(); }

 private:
  bool kernel_step(double factor, const StepInputs& in, const GradFn& grad, const ParamFn& params);
  // Updates the owned parts of `buckets` with their gradients times `factor`.
  void apply(const std::vector<int>& buckets, double factor, const StepInputs& in, const GradFn& grad);
  // The update of lists of (fp32 master, fp32 gradient, state) tensors with one lr and
  // weight decay (fused Adam/AdamW kernels, or the SGD loop).
  void update_tensors(std::vector<at::Tensor>& ps, std::vector<at::Tensor>& gs, std::vector<at::Tensor>& ms,
                      std::vector<at::Tensor>& vs, const StepInputs& in, double lr, double weight_decay);

  const ShardLayout& L_;
  const OptimizerRule& rule_;
  OwnedState& state_;
  DeviceStepOptions opt_;
  GradFn grad_;
  ParamFn params_;
  torch::Tensor step_t_;  // () fp32 on the device, for ATen's fused Adam kernels
  // A deferred step (StepOutcome::norm_sq): 1-element fp32 device tensors the fused
  // kernels read. ATen's divide the gradients by grad_scale_; found_inf_ = 1 skips.
  torch::Tensor grad_scale_, found_inf_;
};

}  // namespace zt::zero
