// Internal: one parser per DeepSpeed config section, the scheduler's parameter tables,
// and the "not supported yet" table (support.cpp). See reader.h for how errors flow.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/reader.h"
#include "zerotrain/config.h"

namespace zt::config {

// sections.cpp: typed sections. Each reads its keys through `s` (DeepSpeed's defaults,
// aliases, "auto") and records errors in s.ctx().
OptimizerConfig parse_optimizer(Section s, std::vector<std::string>& not_supported);
Fp16Config parse_fp16(Section s);
Bf16Config parse_bf16(Section s);
// `top` is the whole config: zero_optimization may be a bool (DeepSpeed's old format).
ZeroConfig parse_zero(Section& top, std::vector<std::string>& not_supported);
ActivationCheckpointingConfig parse_activation_checkpointing(Section s);
AioConfig parse_aio(Section s, std::vector<std::string>& not_supported);
// monitor.cpp: "tensorboard" / "csv_monitor" (s is the section) and "wandb".
MonitorOutputConfig parse_monitor_output(Section s);
WandbConfig parse_wandb(Section s);
json monitor_output_to_json(const MonitorOutputConfig& m);
json wandb_to_json(const WandbConfig& w);
// parallel.cpp: the parallel degrees (docs/parallel.md).
TensorParallelConfig parse_tensor_parallel(Section s, std::vector<std::string>& not_supported);
PipelineConfig parse_pipeline(Section s, std::vector<std::string>& not_supported);
ExpertParallelConfig parse_expert_parallel(Section s);
// Sets c.world_size and c.dp_world_size = world / (tp x pp) after validating the degrees
// as parallel::ParallelDims; on an error records it and sets dp_world_size 0.
void resolve_parallel(Context& ctx, Config& c, int world_size);
// {"tensor_parallel": {...}, "pipeline": {...}, "expert_parallel": {...}}.
json parallel_to_json(const Config& c);
// Errors between keys of different sections (fp16 + bf16, offload without its stage).
void check_cross_section(Context& ctx, const Config& c);

json offload_optimizer_to_json(const OffloadOptimizerConfig& o);
json offload_param_to_json(const OffloadParamConfig& o);
json zero_to_json(const ZeroConfig& z);
json optimizer_to_json(const OptimizerConfig& o);

// scheduler.cpp: validates params against DeepSpeed's lr_schedules.py names and fills
// every default. `optimizer` supplies WarmupLR's default warmup_max_lr (its lr).
SchedulerConfig parse_scheduler(Section s, const OptimizerConfig& optimizer,
                                std::vector<std::string>& not_supported);
// Required scheduler params: an "auto" there needs a value from the caller.
bool scheduler_param_required(std::string_view type, std::string_view param);

// support.cpp: the one place that says what the engine cannot honour yet.
struct TypeName {
  std::string canonical;  // DeepSpeed's spelling; empty when the name is unknown
  bool supported = false;
  std::string nearest;    // unknown names: the closest known one within 2 edits, if any
};
TypeName lookup_optimizer(std::string_view name);
TypeName lookup_scheduler(std::string_view name);
std::string supported_optimizers();  // "Adam, AdamW, SGD"
std::string supported_schedulers();
// Keys DeepSpeed knows that zerotrain models only as "default or not supported yet":
// reads them from `s` (tables keyed by s.path(): "", "optimizer", "zero_optimization",
// "zero_optimization.offload_optimizer", "aio", "tensor_parallel", "pipeline").
void read_known_keys(Section& s, std::vector<std::string>& not_supported);
// Typed settings away from their default that the engine cannot honour yet.
void check_support(const Config& c, std::vector<std::string>& not_supported);

}  // namespace zt::config
