// zerotrain's DeepSpeed JSON config: typed, validated, defaults filled.
//
// Every field is named exactly like DeepSpeed's JSON key and starts at the default
// DeepSpeed's *code* uses (where DeepSpeed's docs say otherwise, docs/config.md says
// which one zerotrain follows). `Config::from_json` reads a DeepSpeed config the way
// DeepSpeed does (aliases, deprecated keys, "auto" values, integers written as 2e8),
// but rejects what DeepSpeed silently ignores: an unknown key anywhere is an error that
// names the full key path and the nearest known key. All errors of a config are
// reported together, one per line, in a single zt::ConfigError.
//
// Keys that DeepSpeed knows but the engine cannot honour yet are accepted at their
// default value and rejected ("... is not supported yet by zerotrain") at any other;
// the list lives in one table, src/config/support.cpp.
#pragma once

#include <array>
#include <c10/core/ScalarType.h>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace zt {

// Where ZeRO-Offload keeps optimizer state / parameters. "none" means not offloaded.
enum class OffloadDevice { none, cpu, nvme };
const char* to_string(OffloadDevice device);

// optimizer.params. One struct for every supported type; keys that do not belong to the
// configured type are rejected at parse time, so fields of other types keep defaults.
struct OptimizerParams {
  /// Learning rate. DeepSpeed (FusedAdam / torch SGD): 1e-3.
  double lr = 1e-3;
  /// Adam(W) coefficients of the running averages of the gradient and its square. (0.9, 0.999).
  std::array<double, 2> betas{0.9, 0.999};
  /// Adam(W) term added to the denominator. 1e-8.
  double eps = 1e-8;
  /// Weight decay: decoupled (AdamW) when adam_w_mode, L2 added to the gradient otherwise. 0.
  double weight_decay = 0.0;
  /// Adam only: true = decoupled weight decay (AdamW). DeepSpeed's default for type "Adam"
  /// is true; type "AdamW" forces true. true.
  bool adam_w_mode = true;
  /// Adam(W): divide the moments by (1 - beta^t). true.
  bool bias_correction = true;
  /// Adam(W): AMSGrad variant. false (true is not supported yet).
  bool amsgrad = false;
  /// Adam(W): DeepSpeed picks torch.optim.Adam(W) instead of FusedAdam. Same math; accepted
  /// and recorded, zerotrain always uses its own kernels. false.
  bool torch_adam = false;
  /// SGD momentum factor. 0.
  double momentum = 0.0;
  /// SGD dampening of the momentum. 0.
  double dampening = 0.0;
  /// SGD Nesterov momentum (needs momentum > 0 and dampening 0). false.
  bool nesterov = false;
};

// "optimizer": { "type": ..., "params": {...} }.
struct OptimizerConfig {
  /// Canonical type name: "Adam", "AdamW" or "SGD" (matched case-insensitively, like
  /// DeepSpeed); empty when the config has no optimizer section. DeepSpeed: none.
  std::string type;
  /// The optimizer's hyper-parameters, DeepSpeed's defaults filled.
  OptimizerParams params;
};

// "scheduler": { "type": ..., "params": {...} }. Params keep DeepSpeed's names
// (lr_schedules.py) with every default filled in, derived defaults resolved
// (e.g. OneCycle's cycle_second_step_size = cycle_first_step_size).
struct SchedulerConfig {
  /// "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle" or "LRRangeTest"; empty when
  /// the config has no scheduler (constant lr). DeepSpeed: none.
  std::string type;
  /// Validated parameters, every key present. DeepSpeed: the class's keyword defaults.
  nlohmann::json params = nlohmann::json::object();
};

// "fp16": dynamic/static loss-scaled half precision.
struct Fp16Config {
  /// Train in fp16 with fp32 master weights. false.
  bool enabled = false;
  /// Autocast inputs to fp16 (not supported yet when true). false.
  bool auto_cast = false;
  /// Static loss scale; 0 = dynamic loss scaling. 0.
  double loss_scale = 0.0;
  /// Dynamic scaling starts at 2^initial_scale_power. 16.
  int64_t initial_scale_power = 16;
  /// Clean steps before the dynamic scale doubles. 1000.
  int64_t loss_scale_window = 1000;
  /// Overflows tolerated before the scale is halved (delayed shift). 2.
  int64_t hysteresis = 2;
  /// Refill hysteresis on every clean step instead of after a window. false.
  bool consecutive_hysteresis = false;
  /// The dynamic scale never goes below this. 1.
  double min_loss_scale = 1.0;
  /// Keep master weights and gradients in fp16 (not supported yet when true). false.
  bool fp16_master_weights_and_grads = false;
};

// "bf16" (alias "bfloat16"): bfloat16 compute with fp32 master weights, no loss scaling.
struct Bf16Config {
  /// Train in bf16 with fp32 master weights. false.
  bool enabled = false;
  /// Apply gradient updates during backward (not supported yet when true). false.
  bool immediate_grad_update = false;
  /// Check bf16 gradients for inf/NaN (not supported yet when true). false.
  bool check_grad_overflow = false;
  /// Master weights and gradients in bf16 (not supported yet when true). false.
  bool bf16_master_weights_and_grads = false;
  /// Optimizer states in bf16 (not supported yet when true). false.
  bool bf16_optimizer_states = false;
};

// zero_optimization.offload_optimizer: optimizer state (and the step) on the host.
struct OffloadOptimizerConfig {
  /// none | cpu | nvme. none.
  OffloadDevice device = OffloadDevice::none;
  /// Directory for NVMe swap files (required for device nvme). null (empty here).
  std::string nvme_path;
  /// NVMe swap buffers in the pool. 4.
  int64_t buffer_count = 4;
  /// Page-locked host memory. DeepSpeed's code: false (its docs say true). false.
  bool pin_memory = false;
  /// NVMe: overlap the read of the next tile with the step of this one. false.
  bool pipeline_read = false;
  /// NVMe: overlap the write of the previous tile with the step of this one. false.
  bool pipeline_write = false;
  /// NVMe: fast optimizer initialisation. false.
  bool fast_init = false;
  /// Fraction of optimizer states offloaded (< 1 only with stage 3). 1.0.
  double ratio = 1.0;
  /// zerotrain extension (ZeRO-Offload's "delayed parameter update"): the CPU step of
  /// step t runs while step t+1 computes, whose forward/backward therefore see parameters
  /// one update older. false.
  bool delayed_param_update = false;
};

// zero_optimization.offload_param: stage-3 parameters on the host or NVMe.
struct OffloadParamConfig {
  /// none | cpu | nvme. none.
  OffloadDevice device = OffloadDevice::none;
  /// Directory for NVMe swap files (required for device nvme). null (empty here).
  std::string nvme_path;
  /// NVMe swap buffers in the pool. 5.
  int64_t buffer_count = 5;
  /// Elements per NVMe swap buffer. 1e8.
  int64_t buffer_size = 100000000;
  /// Parameter elements kept in host memory when offloading to NVMe. 1e9.
  int64_t max_in_cpu = 1000000000;
  /// Page-locked host memory. DeepSpeed's code: false (its docs say true). false.
  bool pin_memory = false;
};

// "zero_optimization". Every stage3_* key is also accepted without the prefix.
struct ZeroConfig {
  /// 0 off (DDP), 1 optimizer states, 2 + gradients, 3 + parameters. 0.
  int64_t stage = 0;
  /// Put gradients into one contiguous buffer as they are produced. true.
  bool contiguous_gradients = true;
  /// Reduce-scatter (vs all-reduce) to average gradients. true.
  bool reduce_scatter = true;
  /// Elements reduced per bucket. 5e8.
  int64_t reduce_bucket_size = 500000000;
  /// All-gather (vs a series of broadcasts) updated shards after the step. true.
  bool allgather_partitions = true;
  /// Elements all-gathered per bucket. 5e8.
  int64_t allgather_bucket_size = 500000000;
  /// Overlap gradient reduction with backward. Resolved here as DeepSpeed's code does:
  /// true for stage 3, false otherwise, when not given (DeepSpeed's docs say false).
  bool overlap_comm = false;
  /// Initialise fp32 master weights from fp32 checkpoint copies. true.
  bool load_from_fp32_weights = true;
  /// Legacy elastic checkpoint (not supported yet when true). false.
  bool elastic_checkpoint = false;
  /// Optimizer offload; device none = off. DeepSpeed: null.
  OffloadOptimizerConfig offload_optimizer;
  /// Parameter offload (stage 3 only); device none = off. DeepSpeed: null.
  OffloadParamConfig offload_param;
  /// Tile of parameters processed per optimizer step / NVMe swap. 1e9.
  int64_t sub_group_size = 1000000000;
  /// Stage 3: elements fetched ahead of use. Code 5e7 (docs 5e8); floats are rounded. 5e7.
  int64_t stage3_prefetch_bucket_size = 50000000;
  /// Stage 3: parameters smaller than this stay unpartitioned. 1e5.
  int64_t stage3_param_persistence_threshold = 100000;
  /// Stage 3: bound on the elements kept unpartitioned in total. sys.maxsize.
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  /// Stage 3: parameters resident per GPU before releasing. 1e9.
  int64_t stage3_max_live_parameters = 1000000000;
  /// Stage 3: keep a parameter if it is reused within this many elements. 1e9.
  int64_t stage3_max_reuse_distance = 1000000000;
  /// Stage 3: gather the 16-bit weights when the model is saved (alias
  /// stage3_gather_fp16_weights_on_model_save). false.
  bool stage3_gather_16bit_weights_on_model_save = false;
  /// Stage 1/2: error on parameters that get no gradient when false. true.
  bool ignore_unused_parameters = true;
  /// Stage 1/2 + offload: spread gradient copies to the host over ranks. false.
  bool round_robin_gradients = false;
};

// "activation_checkpointing".
struct ActivationCheckpointingConfig {
  /// Partition checkpointed activations over model-parallel ranks. false.
  bool partition_activations = false;
  /// Keep checkpointed activations in host memory. false.
  bool cpu_checkpointing = false;
  /// Copy checkpoints into one preallocated buffer. false.
  bool contiguous_memory_optimization = false;
  /// Number of checkpoints (needed by contiguous_memory_optimization). null.
  std::optional<int64_t> number_checkpoints;
  /// Synchronize at each checkpoint boundary. false.
  bool synchronize_checkpoint_boundary = false;
  /// Time the checkpoint functions. false.
  bool profile = false;
};

// "aio": the async I/O engine of NVMe offload.
struct AioConfig {
  /// Bytes per I/O request. 1048576.
  int64_t block_size = 1048576;
  /// I/O requests in flight. 8.
  int64_t queue_depth = 8;
  /// I/O threads per request (newer DeepSpeed: intra_op_parallelism, accepted too). 1.
  int64_t thread_count = 1;
  /// Submit requests one at a time. false.
  bool single_submit = false;
  /// Overlap submission and completion. true.
  bool overlap_events = true;
  /// GPUDirect Storage. false.
  bool use_gds = false;
};

// "tensorboard" and "csv_monitor": DeepSpeed's monitors that write files, on rank 0 only
// (src/monitor, docs/monitoring.md). DeepSpeed: deepspeed/monitor/config.py.
struct MonitorOutputConfig {
  /// Write this monitor's files. false.
  bool enabled = false;
  /// The files go to output_path/job_name/ ("" = the working directory). "".
  std::string output_path;
  /// Directory inside output_path for this job. "DeepSpeedJobName".
  std::string job_name = "DeepSpeedJobName";
};

// "wandb". enabled = true: rank 0 writes an offline wandb run in $WANDB_DIR/wandb/ (or
// ./wandb/) that `wandb sync <run dir>` uploads (src/monitor/wandb_writer.h,
// docs/monitoring.md).
struct WandbConfig {
  /// false.
  bool enabled = false;
  /// wandb team (entity) and group. DeepSpeed: null (empty here).
  std::string team, group;
  /// wandb project. "deepspeed".
  std::string project = "deepspeed";
};

// "tensor_parallel" (DeepSpeed's AutoTP training section). Other keys of the section are
// accepted at DeepSpeed's defaults only. See docs/parallel.md.
struct TensorParallelConfig {
  /// Tensor-parallel degree; 0 (DeepSpeed: AutoTP off) and 1 both mean none. > 1 is not
  /// supported yet (no tensor-parallel layers). 0.
  int64_t autotp_size = 0;
};

// "pipeline" (DeepSpeed's pipeline engine section). See docs/parallel.md.
struct PipelineConfig {
  /// Pipeline stages. DeepSpeed's "auto" takes PipelineModule(num_stages); zerotrain has no
  /// pipeline module yet, so "auto" is 1. > 1 is not supported yet. "auto" (1).
  int64_t stages = 1;
};

// "expert_parallel" (DeepSpeed's AutoEP section). See docs/parallel.md.
struct ExpertParallelConfig {
  /// Expert parallelism on (not supported yet when true). false.
  bool enabled = false;
  /// Expert-parallel degree: ranks that split the experts of a layer, carved out of the
  /// data-parallel ranks (must divide dp). Takes effect only with enabled. 1.
  int64_t autoep_size = 1;
};

// An "auto" value found in a config (see Config::auto_keys).
struct AutoKey {
  /// Full key path, e.g. "train_batch_size" or "zero_optimization.reduce_bucket_size".
  std::string path;
  /// true: no default exists, the caller must put a value there before from_json
  /// (the batch keys, gradient_clipping, required scheduler params);
  /// false: DeepSpeed drops the key and its default applies.
  bool needs_value = false;
};

// A whole DeepSpeed config, resolved for one world size.
struct Config {
  /// Global batch = micro batch x accumulation steps x data-parallel ranks. Derived when
  /// not given (DeepSpeed's batch rule). DeepSpeed: none.
  int64_t train_batch_size = 0;
  /// Samples per rank per forward/backward. Derived when not given. DeepSpeed: none.
  int64_t train_micro_batch_size_per_gpu = 0;
  /// Micro batches per optimizer step. 1 when it cannot be derived. DeepSpeed: 1.
  int64_t gradient_accumulation_steps = 1;
  /// Clip the global gradient norm to this; 0 = off. DeepSpeed's code 0 (docs 1.0). 0.
  double gradient_clipping = 0.0;
  /// Divide gradients by the world size before the all-reduce instead of after. false.
  bool prescale_gradients = false;
  /// Divide gradients by this before the reduction and by world/factor after. 1.0.
  double gradient_predivide_factor = 1.0;
  /// Log every this many optimizer steps. 10 (newer DeepSpeed: null).
  int64_t steps_per_print = 10;
  /// Time forward/backward/step per rank and print the breakdown. false.
  bool wall_clock_breakdown = false;
  /// Allow ZeRO with an optimizer DeepSpeed has not tested. false.
  bool zero_allow_untested_optimizer = false;
  /// Require DeepSpeed's CPU optimizer with offload. true.
  bool zero_force_ds_cpu_optimizer = true;
  /// Print the engine state after the first step. false.
  bool dump_state = false;

  OptimizerConfig optimizer;                         ///< "optimizer"
  SchedulerConfig scheduler;                         ///< "scheduler"
  Fp16Config fp16;                                   ///< "fp16"
  Bf16Config bf16;                                   ///< "bf16" / "bfloat16"
  ZeroConfig zero_optimization;                      ///< "zero_optimization"
  ActivationCheckpointingConfig activation_checkpointing;  ///< "activation_checkpointing"
  AioConfig aio;                                     ///< "aio"
  MonitorOutputConfig tensorboard;                   ///< "tensorboard"
  MonitorOutputConfig csv_monitor;                   ///< "csv_monitor"
  WandbConfig wandb;                                 ///< "wandb"
  TensorParallelConfig tensor_parallel;              ///< "tensor_parallel"
  PipelineConfig pipeline;                           ///< "pipeline"
  ExpertParallelConfig expert_parallel;              ///< "expert_parallel"

  /// Not a DeepSpeed key: all ranks (dp x tp x pp), as passed to parse().
  int world_size = 1;
  /// Not a DeepSpeed key: the data-parallel world size the batch sizes were resolved for,
  /// world_size / (tp_size() x pp_size()).
  int dp_world_size = 1;
  /// Not a DeepSpeed key: "auto" values that fell back to DeepSpeed's default (paths).
  std::vector<std::string> auto_defaulted;
  /// Not a DeepSpeed key: one message per setting the engine cannot honour yet. Filled by
  /// parse(); from_json() throws when it is not empty.
  std::vector<std::string> not_supported_yet;

  /// Parses and validates `json` for `world_size` ranks and throws one ConfigError listing
  /// every problem, except "not supported yet" settings, which are collected in
  /// `not_supported_yet` (so tests and check-config can show a config that parses but
  /// cannot run yet). The batch sizes are resolved for the data-parallel ranks,
  /// world_size / (tp x pp) (= world_size without tensor or pipeline parallelism); the
  /// degrees are validated as parallel::ParallelDims (docs/parallel.md). `origin` names
  /// the source in messages (a file path).
  static Config parse(const nlohmann::json& json, int world_size,
                      const std::string& origin = "<json>");
  /// parse(), then throws a ConfigError listing `not_supported_yet` when it is not empty.
  static Config from_json(const nlohmann::json& json, int world_size,
                          const std::string& origin = "<json>");
  /// Reads the file (read_json_file) and calls from_json with the path as origin.
  static Config from_file(const std::string& path, int world_size);
  /// Reads a config file: JSON with comments allowed (DeepSpeed reads hjson). Errors name
  /// the path and, for syntax errors, the line and column; duplicate keys are errors; a
  /// directory, a file over kMaxJsonBytes or nesting over kMaxJsonDepth is an error.
  static nlohmann::json read_json_file(const std::string& path);
  /// read_json_file's parser for text already in memory; `origin` names it in messages.
  /// Every JSON library error is rewritten with the origin, the key path and the fix.
  static nlohmann::json parse_json_text(const std::string& text, const std::string& origin);
  /// Limits on a config's text: bytes, and nesting of objects and arrays (the JSON
  /// parser recurses once per level, so a deeply nested file would overflow the stack).
  /// read_json_file, parse_json_text and parse enforce them.
  static constexpr size_t kMaxJsonBytes = size_t{16} << 20;
  static constexpr int kMaxJsonDepth = 64;
  /// Every "auto" value in `json`, sorted by key path.
  static std::vector<AutoKey> auto_keys(const nlohmann::json& json);

  /// The resolved config as DeepSpeed JSON: every field, defaults filled, derived batch
  /// sizes. parse(to_json()) gives back an equal config.
  nlohmann::json to_json() const;
  /// Dtype of parameters and activations: Half (fp16), BFloat16 (bf16) or Float.
  at::ScalarType compute_dtype() const;
  /// fp16 or bf16 enabled (fp32 master weights kept by the optimizer).
  bool mixed_precision() const;
  /// The parallel degrees the config asks for (1 = off); dp is dp_world_size.
  int tp_size() const { return tensor_parallel.autotp_size > 1 ? static_cast<int>(tensor_parallel.autotp_size) : 1; }
  int pp_size() const { return static_cast<int>(pipeline.stages); }
  int ep_size() const { return expert_parallel.enabled ? static_cast<int>(expert_parallel.autoep_size) : 1; }
};

}  // namespace zt
