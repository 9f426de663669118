// ZeroOptions: what one shard group (ZeroOptimizer, zero_optimizer.h) is built with; its
// step backends (step_backend.h) read the offload settings from it.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "offload/aio.h"
#include "zero/optimizer_state.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"

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
  // Parameter groups: the step uses lr x lr_scale and weight_decay of the parameter's
  // group. Empty = one group {1, optimizer.params.weight_decay}.
  using Group = ParamGroupSpec;
  std::vector<Group> groups;
  std::vector<int> param_group;  // user index -> index into groups; empty = all in group 0

  // Stage 3. Units in forward order (user parameter indices); parameters in no unit form
  // the "root" unit, gathered for the whole forward+backward. Parameters with fewer than
  // persistence_threshold elements form the "persistent" unit, never released.
  struct Unit {
    std::string name;
    std::vector<int> params;
    std::vector<int> frozen;  // its members of the frozen group (indices into `frozen` below)
    std::vector<int> frozen_storage;  // its members of the frozen storage group (indices into `frozen_storage`)
  };
  std::vector<Unit> units;
  std::vector<std::string> param_names;   // user index -> name (diagnostics); may be empty
  int64_t prefetch_numel = 50000000;      // stage3_prefetch_bucket_size
  int64_t max_live_numel = 1000000000;    // stage3_max_live_parameters
  int64_t max_reuse_distance = 1000000000; // stage3_max_reuse_distance
  int64_t persistence_threshold = 100000; // stage3_param_persistence_threshold
  // Placeholders to materialise (user index -> full shape, empty = a real parameter) and
  // their initialisation (user index, full-size tensor on the device).
  std::vector<std::vector<int64_t>> deferred_shapes;
  std::function<void(int, torch::Tensor&)> deferred_init;
  // Stage 3: the parameters without gradients (frozen_shards.h), partitioned and gathered
  // with the same units (Unit::frozen). Empty: none.
  std::vector<torch::Tensor> frozen;
  std::vector<std::string> frozen_names;
  // Stage 3: frozen byte storage (EngineOptions::frozen_storage: QLoRA's NF4 base), uint8,
  // partitioned and gathered byte for byte (no cast) in a shard group of its own with the
  // same units (Unit::frozen_storage) and the same release rule ([Frozen Units]). Empty: none.
  std::vector<torch::Tensor> frozen_storage;
  std::vector<std::string> frozen_storage_names;

  // ZeRO-Offload (stages 1-3): fp32 master and Adam state in host memory, the step on the
  // CPU (src/optim/cpu_adam.h), updated compute-dtype shards uploaded per sub-group.
  bool offload_optimizer = false;
  bool offload_param = false;       // stage 3: the compute-dtype shard lives in host memory too
  bool pin_memory = false;          // page-locked host buffers (async copies)
  int64_t sub_group_numel = 1000000000;  // sub_group_size: CPU step / upload granularity
  bool delayed_update = false;      // offload_optimizer.delayed_param_update
  // ZeRO-Infinity (offload_optimizer.device nvme, zero_offload_nvme.cpp): master and Adam
  // state in one swap file per rank under nvme_path instead of host memory, swapped per
  // sub-group through buffer_count staging buffers. Needs offload_optimizer.
  bool nvme = false;
  std::string nvme_path;
  int64_t buffer_count = 4;         // offload_optimizer.buffer_count
  offload::AioOptions aio;          // the "aio" section
  // offload_param.device nvme (stage 3, with offload_optimizer cpu or nvme; [NVMe Params]
  // in src/offload/nvme_state.h): the compute-dtype shard lives in a swap file under
  // param_nvme_path instead of host memory, read per unit through param_buffer_count slots.
  bool param_nvme = false;
  std::string param_nvme_path;
  int64_t param_buffer_count = 5;           // offload_param.buffer_count
  int64_t param_buffer_size = 100000000;    // offload_param.buffer_size: the largest unit shard must fit
  // The model-parallel group (tensor x pipeline ranks holding disjoint parameters): the
  // partial squared gradient norms, and with them the overflow flag, are summed over it
  // as well (zero/grad_norm.h). Null or size 1: this group's norm is the global one.
  comm::GroupPtr model_parallel;
  // Weight of each parameter's squared gradient norm in that sum (user index -> weight;
  // empty = 1 for every parameter). A parameter replicated on k ranks of model_parallel
  // (a LayerNorm under tensor parallelism, a tied embedding on two pipeline stages) has
  // weight 1/k, so the global norm counts it once. Weights must be finite and >= 0.
  std::vector<double> norm_weight;
  // Multiplies this shard group's reduced gradients once per step (ReducerOptions::
  // grad_scale): 1 for dense parameters; 1/ep for an expert shard group ([Expert Groups]).
  double grad_scale = 1.0;
};

}  // namespace zt::zero
