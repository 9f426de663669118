// StepBackend: the optimizer step of one shard group behind one interface, part (d) of
// "ZeRO as parts" (docs/zero-parts.md). ZeroOptimizer picks one at construction:
//   DeviceStep   (step_device.h)    the fp32 state where the gradients are (GPU fused
//                                   kernel / ATen, or the CPU of a CPU rank)
//   CpuAdamStep  (step_cpu_adam.h)  ZeRO-Offload: the state in host memory, SIMD CPU Adam;
//                                   owns the gradient streaming, the uploads and the
//                                   delayed update's worker
//   NvmeStep     (step_nvme.h)      ZeRO-Infinity: CPU Adam over the state swapped through
//                                   a swap file per rank
// and calls it once per step or per bucket (never per element). The backend owns what only
// it uses (host buffers, copy streams, swap files, the worker thread); the layout, the rule,
// the owned state and the owner's parameter buffers reach it through StepContext.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zero/optimizer_state.h"
#include "zero/shard_layout.h"
#include "zerotrain/comm.h"
#include "zerotrain/report.h"

namespace zt::zero {

struct ZeroOptions;  // zero_options.h

// What an offload backend reads and writes of its owner (ZeroOptimizer). Every reference
// and callback outlives the backend.
struct StepContext {
  const ZeroOptions& opt;
  const ShardLayout& L;
  const OptimizerRule& rule;
  OwnedState& state;              // host buffers with offload; none with NVMe (the swap file)
  comm::GroupPtr group;
  // Bucket b's owned reduced gradient (compute dtype, on the device).
  std::function<torch::Tensor(int b)> grad;
  // Where bucket b's updated compute-dtype shard goes: the parameters (stages 1-2), the
  // device shard (stage 3); undefined at stage 3 with offload_param (the host shard is it).
  std::function<torch::Tensor(int b)> param_dst;
  // Bucket b's compute-dtype shard at construction (the initial fp32 master is cast from it).
  std::function<torch::Tensor(int b)> param_src;
  // Stage 3 with offload: the compute-dtype shard (host memory with offload_param), else
  // undefined.
  torch::Tensor param_shard;
  // offload_param nvme ([NVMe Params]): writes elements [begin, begin + src.numel()) of
  // the shard into the parameter file, and reads `numel` of them (a host tensor in a staging
  // slot). Null without it.
  std::function<void(int64_t begin, const torch::Tensor& src)> param_file_write;
  std::function<torch::Tensor(int64_t begin, int64_t numel)> param_file_read;
};

// Fills the state of a checkpoint: fetch(layout index, begin, end, kind) returns end-begin
// fp32 values of that parameter's flattened elements (any device).
using LayoutStateFetch =
    std::function<torch::Tensor(int layout_index, int64_t begin, int64_t end, const std::string& kind)>;

class StepBackend {
 public:
  virtual ~StepBackend() = default;
  virtual const char* name() const = 0;

  // Backward: bucket b's final reduction was issued (`reduce`): an offload backend starts
  // copying the gradient shard to the host.
  virtual void grad_issued(int b, const comm::WorkPtr& reduce) {
    (void)b;
    (void)reduce;
  }
  // Whether the step can take its overflow check and clipping from the device
  // (StepOutcome::norm_sq), and the deferred tensors from the global sum of squares.
  virtual bool can_defer() const { return false; }
  virtual void defer(const torch::Tensor& sq, const StepInputs& in) {
    (void)sq;
    (void)in;
  }
  // The update of every owned element with its gradient x factor. Returns whether it wrote
  // the compute-dtype parameters (then the owner casts nothing).
  virtual bool update(double factor, const StepInputs& in) = 0;
  // After the owner refreshed the parameters.
  virtual void end_step() {}
  // A step still in flight (the delayed update): finishes it and puts it into the
  // parameters. Returns whether there was one (the owner then refreshes the parameters).
  virtual bool flush() { return false; }
  // Drops a step still in flight: a loaded state replaces what it would write.
  virtual void drop_in_flight() {}

  // The owned fp32 state in state_kinds() order (master only when master_only): views of
  // OwnedState, or host copies read back from a swap file.
  virtual std::vector<torch::Tensor> state_buffers(bool master_only);
  // Loads the owned state from a checkpoint. false: the state is OwnedState's buffers,
  // which the owner fills.
  virtual bool import_state(const LayoutStateFetch& fetch) {
    (void)fetch;
    return false;
  }
  // After a load: brings the compute-dtype copies the backend writes in line with the
  // loaded master (before the owner refreshes the parameters).
  virtual void finish_import() {}
  // Adds the backend's buffers to the owner's byte counts.
  virtual void add_state_bytes(ModelStateBytes& m) const { (void)m; }
  // NVMe: the swap file of this rank and the last step's swap ("" and zeros otherwise).
  virtual std::string swap_file() const { return {}; }
  virtual StepReport::Nvme swap_stats() const { return {}; }

 protected:
  explicit StepBackend(OwnedState& state) : owned_(state) {}
  OwnedState& owned_;
};

inline std::vector<torch::Tensor> StepBackend::state_buffers(bool master_only) {
  if (master_only) return {owned_.master};
  return owned_.buffers();
}

}  // namespace zt::zero
