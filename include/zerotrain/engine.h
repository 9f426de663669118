// zerotrain's training engine: DeepSpeed's three calls on a LibTorch module.
//
//   auto engine = zt::initialize(model, zt::Config::from_file("ds_config.json", world));
//   for (...) {
//     auto loss = engine->forward([&] { return model->loss(x, y); });
//     engine->backward(loss);
//     engine->step();          // a no-op except at the gradient-accumulation boundary
//   }
//
// The engine owns the parameters' storage from initialize() on: every trainable
// parameter becomes a view into one flat buffer of the compute dtype (fp32 / bf16 /
// fp16), gradients land in flat buffers, and the fp32 master weights and optimizer
// state exist only for this rank's shard (ZeRO stage >= 1). Do not replace parameter
// tensors after initialize().
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/model.h"
#include "zerotrain/report.h"

namespace zt {

// One optimizer parameter group (DeepSpeed / torch.optim param groups, reduced to what
// differs in practice). Everything else (betas, eps, adam_w_mode, momentum, clipping) is
// the config's, for every group.
struct ParamGroup {
  // Parameters of the model passed to initialize(), each requiring grad.
  std::vector<torch::Tensor> params;
  // Overrides optimizer.params.weight_decay for this group's parameters (>= 0); unset =
  // the config's.
  std::optional<double> weight_decay;
  // The group's lr = the schedule's lr for the step x lr_scale (finite, >= 0).
  double lr_scale = 1.0;
  // For error messages; empty = "group <index>".
  std::string name;
};

// The Hugging Face / Megatron convention: every trainable parameter with dim() < 2
// (biases, LayerNorm weights) in a group "no_decay" with weight_decay 0, the others in
// a group "decay" with `weight_decay`; both with lr_scale 1. Groups in that order,
// parameters in registration order; a group that would be empty is left out. Frozen
// parameters (requires_grad false) are in neither.
std::vector<ParamGroup> no_decay_groups(torch::nn::Module& model, double weight_decay);

struct EngineOptions {
  // Trainable tensors the engine manages; empty = all parameters of the model that
  // require grad. Other parameters are left as they are (frozen).
  std::vector<torch::Tensor> params;
  // Parameter groups (docs/engine.md#parameter-groups). Non-empty: the engine manages
  // exactly the union of the groups (other parameters are left as they are, frozen, as
  // with `params`, which must then be empty). A parameter may be in one group only, must
  // require grad, and a group may not be empty; violations throw ConfigError naming the
  // parameter and group. Empty: one group of `params` (or of all trainable parameters)
  // with the config's weight_decay and lr_scale 1 -- exactly the behaviour without groups.
  std::vector<ParamGroup> param_groups;
  // Group of data-parallel ranks; null = all ranks (comm::world_group()).
  comm::GroupPtr group;
  // The ranks holding the other parts of this model replica (the tensor x pipeline ranks
  // of one data-parallel replica; parallel::Topology::model_parallel()). The squared
  // gradient norm -- and with it the overflow check and clipping -- is summed over it, so
  // every rank of the model takes the same skip and clip decision. Null or size 1: none.
  comm::GroupPtr model_parallel;
  // Weight of a parameter's gradient in that norm, by its name in named_parameters();
  // unset = 1 for every parameter. A parameter held identically by k ranks of
  // model_parallel (a LayerNorm under tensor parallelism, a tied embedding on the first and
  // last pipeline stage) takes 1/k, so the global norm counts it once. Finite, >= 0.
  std::function<double(const std::string& name)> norm_weight;
  // Mixture of Experts under expert parallelism (docs/moe.md#the-engine; [Expert Groups] in
  // src/zero/zero_optimizer.h). is_expert(name) is true for a parameter that is an expert
  // held by this rank of `ep` only (models::MoE's "...experts.<i>..." parameters); every
  // other parameter is dense. With ep of size > 1 and at least one expert, the engine
  // keeps the experts in a second ZeRO shard group over expert_dp: their gradients are
  // averaged over expert_dp (dp / ep ranks) and scaled by 1/ep, so they equal ep 1's;
  // their optimizer state is partitioned over expert_dp at stages 1-2; the global gradient
  // norm (clipping, overflow) counts every expert once (summed over ep). Dense parameters
  // are reduced over `group` as without experts. Requirements (ConfigError otherwise): ep
  // and expert_dp both set, ep size x expert_dp size = group size (parallel::Topology::
  // ep() / expert_dp() of the same layout), ZeRO stage 0-2 (not 3), optimizer offload to cpu (not nvme).
  // Checkpoints store each expert under expert_global_name(name) (below); save_16bit_model
  // refuses a model with experts (docs/moe.md, what is left); gather_master_params returns
  // this rank's experts. Unset is_expert, ep null or of size 1: every parameter is dense
  // (experts at ep 1 are ordinary parameters), no cost.
  std::function<bool(const std::string& name)> is_expert;
  comm::GroupPtr ep;
  comm::GroupPtr expert_dp;
  // The name of this rank's expert `name` at ep 1: its global expert index in place of the
  // local one ("moe.experts.1.fc1.weight" -> "moe.experts.3.fc1.weight" on the second of two
  // ep ranks of 4 experts; GPT2Impl::global_param_name for the MoE GPT-2). Checkpoints store
  // experts under it ([Expert Checkpoints] in src/ckpt/engine_checkpoint.cpp), so one saved
  // at any ep loads at any other. Needed for save/load_checkpoint with experts at ep > 1
  // (ConfigError otherwise); unused without.
  std::function<std::string(const std::string& name)> expert_global_name;
  // The ranks a checkpoint spans when this engine's model is one part of a model cut by
  // layers, with its parameters under the whole model's names (a pipeline stage: every rank
  // of the pipeline, parallel::Topology::parent(); [Pipeline Checkpoints] in
  // src/ckpt/engine_checkpoint.cpp). save/load_checkpoint are then collective over it and
  // write or read one checkpoint of the whole model, as a non-pipelined run does. It must
  // contain `group`. Null: the engine's group (or, for a tensor-parallel model, the world).
  comm::GroupPtr checkpoint_group;
  // How tensor parallelism splits each parameter, by its name, for a model that is not a
  // ZeroModel (a pipeline stage cut from a tensor-parallel model); the ZeroModel's
  // tensor_parallel_spec otherwise. A spec that is not split but has size > 1 says the
  // parameter is replicated over a tp group of that size (its tp rank 0 saves it). With
  // checkpoint_group: each stage's tp shards join the one checkpoint ([TP Reshard]).
  std::function<TensorParallelSpec(const std::string& name)> tensor_parallel_spec;
  // Device; unset = cuda:LOCAL_RANK when CUDA is available, else CPU.
  std::optional<torch::Device> device;
  // Where JSON-lines metrics go (one object per step); empty = none.
  std::string metrics_path;
  // Called on every rank with each step's report as it resolves (the step's device work
  // done, so device values of that step read without waiting), before the metrics line,
  // the monitor and take_reports() get it: fills StepReport::extra with the model's own
  // values. Runs on the thread that calls the engine; unset = none.
  std::function<void(StepReport&)> on_report;
  // Print the per-step line every steps_per_print steps (rank 0).
  bool print = true;
  // FLOPs per sample (forward + backward) for TFLOP/s and MFU in the report; 0 = unknown.
  double flops_per_sample = 0;
  double peak_tflops = 0;  // per device, for MFU; 0 = not reported
  // ZeRO-3 gather units in forward order (each a list of the model's parameters) and
  // their names. Empty: a model that implements zt::ZeroModel (zerotrain/model.h) gets
  // its zero_units(), driven by its unit hooks (GPT-2: one unit per block); any other
  // model runs with everything in one "root" unit. With units given here the model's
  // forward calls Engine::run_unit for each.
  // Parameters in no unit form the root unit (gathered for the whole forward+backward).
  std::vector<std::vector<torch::Tensor>> units;
  std::vector<std::string> unit_names;
  // Partitioned construction (the analogue of DeepSpeed's zero.Init): a parameter whose
  // numel differs from param_shape(name) is a placeholder; the engine materialises it on
  // the device (under ZeRO-3 one unit at a time, keeping only this rank's shard) and fills
  // it with param_init(name, tensor). A zt::ZeroModel whose deferred_init() is true fills
  // both itself (GPT-2 built with deferred_init).
  std::function<std::vector<int64_t>(const std::string& name)> param_shape;
  std::function<void(const std::string& name, torch::Tensor& t)> param_init;
  // ZeRO-3 only: frozen storage that is not a parameter, partitioned over the data-parallel
  // group byte for byte (no cast) and gathered with the unit of `unit_member` (a parameter
  // of the model; undefined, or in no unit: the root unit), exactly as the frozen parameters
  // are ([Frozen Units] in src/zero/frozen_shards.h); persistent under
  // stage3_param_persistence_threshold bytes. QLoRA's NF4 base is the user
  // (lora::partition_nf4_bases, docs/lora.md). `bytes`: uint8, 1-D, contiguous, not empty;
  // the engine points it at an empty tensor between gathers and at the gathered bytes (on
  // the engine's device) while its unit is gathered, so read it through the same tensor
  // object each time. In its unit's gathered buffer an entry starts at the sum of the sizes
  // before it: sizes that are multiples of 4 keep 4-byte alignment. A non-empty list at
  // stages 0-2 is a ConfigError.
  struct FrozenStorage {
    std::string name;
    torch::Tensor bytes;
    torch::Tensor unit_member;
  };
  std::vector<FrozenStorage> frozen_storage;
  // Divergence stop: after this many consecutive skipped steps (gradients inf/NaN on some
  // rank) step() throws TrainingError on every rank, in every precision. fp16 counts only
  // the steps skipped at fp16.min_loss_scale (the scale has nowhere lower to go); bf16 and
  // fp32 count every skipped step. <= 0: never stop (DeepSpeed's behaviour).
  int64_t max_skipped_steps = 50;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Runs the user's forward (returns the loss) and times it as the forward phase.
  virtual torch::Tensor forward(const std::function<torch::Tensor()>& fn) = 0;
  // Scales the loss (1/gradient_accumulation_steps, and the fp16 loss scale) and runs
  // backward; gradient reduction overlaps it (stages 0 and 2).
  virtual void backward(const torch::Tensor& loss) = 0;
  // One micro-step like backward(loss) for work whose loss is not a scalar of this rank:
  // a pipeline stage without the loss (outputs = what it sent on, grads = the gradients
  // the next stage sent back) or a split backward (inputs non-empty: gradients accumulate
  // only into these, e.g. the parameters in a weight-gradient pass after an input-gradient
  // pass made with torch::autograd::grad). The grads must already carry backward_scale()
  // (the stage holding the loss applies it). `loss`, when defined (unscaled), is added to
  // the step's reported loss as backward(loss) adds its loss.
  virtual void backward(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& grads,
                        const std::vector<torch::Tensor>& inputs = {}, const torch::Tensor& loss = {}) = 0;
  // The factor backward(loss) multiplies the loss by: the fp16 loss scale (1 otherwise)
  // over gradient_accumulation_steps.
  virtual double backward_scale() const = 0;
  // At the accumulation boundary: reduce (stage 1), unscale, overflow check, clip,
  // optimizer step on this rank's shard, all-gather updated parameters. Elsewhere a
  // no-op. Returns true when this call was a boundary.
  virtual bool step() = 0;

  // The next four wait for the last step's device work (one synchronization): on CUDA,
  // step() returns without waiting for the GPU, and what the step decided on the device
  // (overflow, gradient norm) and measured there (loss, phase times) is read later.
  // A training loop that reads them every step makes the CPU wait for the GPU every step;
  // take_reports() gives the same reports without waiting.
  virtual bool was_step_skipped() = 0;
  virtual double get_lr() = 0;
  virtual double loss_scale() = 0;
  virtual int64_t global_steps() const = 0;
  // DeepSpeed's global_samples: samples trained so far over all data-parallel ranks. Each
  // step (skipped ones too) adds the train_batch_size it ran with; saved in checkpoints and
  // restored by load_checkpoint, so after a resume at another batch size (another
  // gradient_accumulation_steps or world) it is the saved count plus the new batch per step.
  virtual int64_t global_samples() const = 0;
  virtual int64_t micro_steps() const = 0;
  virtual bool is_gradient_accumulation_boundary() const = 0;
  virtual const Config& config() const = 0;
  virtual torch::Device device() const = 0;
  virtual at::ScalarType compute_dtype() const = 0;
  virtual const comm::GroupPtr& group() const = 0;
  virtual ModelStateBytes model_state_bytes() const = 0;
  // The report of the last completed step (valid after the first boundary); waits for it.
  virtual const StepReport& last_report() = 0;
  // Reports of the steps whose device work has finished, oldest first, each returned once.
  // wait = false never blocks: on CUDA the report of a step usually arrives during the
  // next one. wait = true first waits for every step so far. On the CPU every step is
  // reported by its step() call. Reports not taken are kept up to the newest 1024.
  virtual std::vector<StepReport> take_reports(bool wait = false) = 0;

  // ZeRO-3: runs fn(x) as unit `unit` (index into EngineOptions.units): its parameters are
  // gathered before, released after (per stage3_max_reuse_distance), and gathered again
  // just before its backward. At stages 0-2 this is fn(x).
  virtual torch::Tensor run_unit(int unit, const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                                 const torch::Tensor& x) = 0;
  // ZeRO-3: the names of the gather units in forward order (EngineOptions.unit_names, or
  // the ZeroModel's), without the root and persistent units. Empty at stages 0-2.
  virtual std::vector<std::string> unit_names() const = 0;
  // ZeRO-3: every parameter full-size until release_params() (collective), e.g. to evaluate
  // or export outside forward(). No-ops at stages 0-2.
  virtual void gather_params() = 0;
  virtual void release_params() = 0;

  // fp32 master copy of every managed parameter, full size (collective: every rank of
  // the group must call it). For evaluation, tests and checkpoint export.
  virtual std::vector<torch::Tensor> gather_master_params() = 0;

  // The managed parameters in the compute dtype (bf16/fp16; fp32 when training in fp32),
  // by parameter name, in one safetensors file written by rank 0 (DeepSpeed's
  // save_16bit_model). Collective. Under ZeRO-3 it needs
  // zero_optimization.stage3_gather_16bit_weights_on_model_save = true, as in DeepSpeed.
  virtual void save_16bit_model(const std::string& path) = 0;

  // Checkpoints (docs/checkpoints.md). Both are collective: every rank of the group calls
  // them with the same arguments; a failure on any rank throws zt::CheckpointError on all.
  //
  // Writes DIR/TAG/ (one rank_RRRRR.safetensors per rank and manifest.json) and then
  // DIR/latest = TAG, atomically: the checkpoint is visible only once complete and
  // synced. Only between steps (at an accumulation boundary). tag "" = "global_stepN".
  // client_state (rank 0's) is stored in the manifest and returned by load_checkpoint.
  //
  // async = true: the call only snapshots the state (fragments, counters, RNG, loss
  // scaler, client_state) into host memory (pinned on CUDA) and returns; a background
  // thread writes and fsyncs this rank's file. The collective part (agreement, manifest,
  // rename, `latest`) runs on the calling thread later: at the first step() boundary at
  // which every rank's writer has finished (one small all-reduce per step while a save is
  // in flight), or in the next save_checkpoint / load_checkpoint / wait_checkpoint, or
  // the destructor. A save called while another is in flight first waits for it. A
  // writer error is thrown (CheckpointError naming the file) by the call that publishes;
  // when that call is save_checkpoint, its own save is taken first (sync: written and
  // published; async: started) and the previous failure is thrown after it, the message
  // saying what became of this save; load_checkpoint likewise loads first
  // (docs/reliability.md).
  virtual void save_checkpoint(const std::string& dir, const std::string& tag = "",
                               const nlohmann::json& client_state = nlohmann::json::object(),
                               bool async = false) = 0;
  // Collective: waits for an in-flight asynchronous save and publishes it (throws its
  // error). No-op when none is in flight.
  virtual void wait_checkpoint() = 0;
  // Whether an asynchronous save is not yet published.
  virtual bool checkpoint_pending() const = 0;
  // The last published save (index 0: none yet).
  virtual const CheckpointSaveReport& last_checkpoint_save() const = 0;
  // Restores parameters, fp32 master weights, optimizer state, step counters, loss scaler,
  // LR schedule position and RNG states from DIR/TAG (tag "" = the tag in DIR/latest),
  // saved by any world size and ZeRO stage. Verifies every file it reads (size, CRC-32C,
  // tensor shapes). Returns the saved client_state. Call right after initialize().
  // An asynchronous save in flight is published first; when it failed, the checkpoint is
  // still loaded and then the failure is thrown (CheckpointError on every rank, saying the
  // load succeeded), as save_checkpoint does (docs/reliability.md).
  virtual nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = "") = 0;
};

// Wraps `model`: moves it to the device, casts it to the config's compute dtype, makes
// every rank start from rank 0's parameters, and partitions per zero_optimization.stage.
std::unique_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const Config& config,
                                   EngineOptions options = {});

// The device a rank should use: cuda:LOCAL_RANK when CUDA is available, else CPU.
torch::Device default_device();

}  // namespace zt
