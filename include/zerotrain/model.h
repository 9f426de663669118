// What the engine may ask of a model (docs/architecture.md#the-model-interface).
//
// A model that derives from both torch::nn::Module and zt::ZeroModel tells the engine,
// without the engine knowing its type:
//   - its ZeRO-3 gather units in forward order (zero_units), and takes the hooks through
//     which it runs each unit through the engine (set_unit_hooks);
//   - the full shapes and the initialisation of parameters built as placeholders
//     (partitioned construction, the analogue of DeepSpeed's zero.Init);
//   - its training FLOPs per token;
//   - for tensor parallelism (later), how each parameter is split.
// Every method has a default, so a model implements only what it has. The engine finds
// the interface with dynamic_cast on the module passed to zt::initialize; a plain
// torch::nn::Module still works: everything in one "root" unit, or EngineOptions.units.
//
//   struct MyNetImpl : torch::nn::Module, zt::ZeroModel {
//     std::vector<zt::ModelUnit> zero_units() const override;  // one per block
//     void set_unit_hooks(zt::UnitHooks h) override { hooks_ = std::move(h); }
//     torch::Tensor forward(torch::Tensor x) {
//       for (size_t i = 0; i < blocks.size(); ++i)
//         x = zt::run_unit(hooks_, i, [&](const torch::Tensor& t) { return blocks[i]->forward(t); }, x);
//       return x;
//     }
//   };
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zt {

// Called around every unit's forward, including the recompute of a checkpointed unit
// during backward (`recompute` is then true). Under ZeRO-3 the engine gathers the unit's
// parameters in pre_forward and releases them in post_forward; wrap_output sees the
// unit's output outside any activation checkpoint and returns it wrapped in an autograd
// node that gathers the unit again before its backward. Any member may be empty (the
// engine installs none at stages 0-2).
struct UnitHooks {
  std::function<void(int64_t unit, bool recompute)> pre_forward;
  std::function<void(int64_t unit, bool recompute)> post_forward;
  std::function<torch::Tensor(int64_t unit, const torch::Tensor& y)> wrap_output;
};

// Runs fn(x) as unit `unit` through `hooks` (pre_forward, fn, post_forward, wrap_output):
// what a model without activation checkpointing calls for each unit.
torch::Tensor run_unit(const UnitHooks& hooks, int64_t unit,
                       const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x);

// One ZeRO-3 gather unit: the parameters it holds (of the module passed to initialize)
// and its name (reports, errors).
struct ModelUnit {
  std::string name;
  std::vector<torch::Tensor> params;
};

// How tensor parallelism splits a parameter. dim < 0: not split (replicated over the tp
// ranks). Otherwise the parameter is cut into equal slices along `dim`, one per rank of the
// named group of the topology ("tp"), as [TP Slices] (src/tp/shard.h) cuts it: `blocks`
// stacked blocks along dim each cut on its own, dim zero-padded to `padded` first (0: no
// padding). The engine's checkpoints store each slice with these coordinates and re-shard
// them on load at another tp ([TP Reshard] in src/ckpt/tp_reshard.h).
struct TensorParallelSpec {
  int64_t dim = -1;
  std::string group;
  int64_t blocks = 1;     // q, k, v stacked: 3
  int64_t padded = 0;     // size of dim after padding (a vocabulary that does not divide); 0 = none
  int64_t full_size = 0;  // size of dim in the full, unpadded parameter
  int rank = 0;           // this rank's slice ...
  int size = 1;           // ... of `size` (the tp degree)
  bool split() const { return dim >= 0; }
};

class ZeroModel {
 public:
  virtual ~ZeroModel() = default;

  // ZeRO-3 gather units in forward order; unit i is the one the model announces as i
  // through its UnitHooks. Empty: the engine puts every parameter in one root unit.
  // A parameter in no unit joins the root unit (gathered for the whole forward+backward).
  // EngineOptions.units, when given, takes precedence (and no hooks are installed).
  virtual std::vector<ModelUnit> zero_units() const { return {}; }
  // The engine installs its hooks at ZeRO-3 when it uses zero_units(), and installs empty
  // hooks when it goes away. A model with units must call them around each unit's forward
  // (see run_unit above), or its parameters are never gathered.
  virtual void set_unit_hooks(UnitHooks /*hooks*/) {}

  // Partitioned construction. true: some parameters are placeholders (their numel differs
  // from param_shape(name)) that the engine materialises on the device -- under ZeRO-3
  // one unit at a time, keeping only this rank's shard -- and fills with
  // init_parameter(name, t). EngineOptions.param_shape / param_init take precedence.
  virtual bool deferred_init() const { return false; }
  // The full shape of the parameter `name` (a key of named_parameters()).
  virtual std::vector<int64_t> param_shape(const std::string& name) const;
  // Fills the full-size tensor `t` of parameter `name` with its initialisation.
  virtual void init_parameter(const std::string& name, torch::Tensor& t) const;

  // Training FLOPs (forward + backward) per token at sequence length `seq`; a model whose
  // sample is not a sequence (an image classifier) counts a sample as one token, seq 1.
  // 0 = unknown (no TFLOP/s or MFU reported).
  virtual double flops_per_token(int64_t /*seq*/) const { return 0.0; }

  // How tensor parallelism splits the parameter `name`. Default: not split.
  virtual TensorParallelSpec tensor_parallel_spec(const std::string& /*name*/) const { return {}; }
};

}  // namespace zt
