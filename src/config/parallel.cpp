// The parallel degrees of a DeepSpeed config: tensor_parallel.autotp_size (AutoTP),
// pipeline.stages and expert_parallel.autoep_size (AutoEP). They are read here, checked
// together with the world size as parallel::ParallelDims (once, in resolve_parallel), and
// a degree > 1 is "not supported yet" (support.cpp) until the engine implements it.
// See docs/parallel.md and [Rank Order] in src/parallel/layout.h.
#include "config/pipeline_options.h"
#include "config/sections.h"
#include "config/tensor_parallel_options.h"
#include "parallel/layout.h"
#include "zerotrain/error.h"

namespace zt::config {

namespace {
// More ranks than any job has; keeps the degrees in int range.
constexpr IntRule kDegree{1, 1 << 20};
}  // namespace

TensorParallelConfig parse_tensor_parallel(Section s, std::vector<std::string>& not_supported) {
  TensorParallelConfig t;
  t.autotp_size = s.get_int("autotp_size", t.autotp_size, IntRule{0, kDegree.max});
  // zerotrain's key (tensor_parallel_options.h); applied by `train --tp`.
  if (s.get_bool("sequence_parallel", false) && t.autotp_size <= 1) {
    not_supported.push_back(s.path_of("sequence_parallel") + " = true is set but takes effect only with " +
                            s.path_of("autotp_size") + " > 1 (it splits the sequence over the tensor-parallel " +
                            "ranks): set autotp_size (or train --tp N) or remove sequence_parallel");
  }
  read_known_keys(s, not_supported);
  return t;
}

TensorParallelOptions tensor_parallel_options(const json& ds_config) {
  Context ctx;
  const json* p =
      ds_config.is_object() && ds_config.contains("tensor_parallel") ? &ds_config.at("tensor_parallel") : nullptr;
  Section s(ctx, "tensor_parallel", p);
  TensorParallelOptions o;
  const int64_t size = s.get_int("autotp_size", 0, IntRule{0, kDegree.max});
  o.size = size > 1 ? size : 1;
  o.sequence_parallel = s.get_bool("sequence_parallel", false);
  s.accept_all_keys();  // the others are Config::parse's
  std::string msg;
  for (const auto& e : ctx.errors()) msg += "\n  " + e;
  if (!msg.empty()) throw ConfigError("invalid tensor_parallel section:" + msg);
  return o;
}

void drop_tensor_parallel_note(std::vector<std::string>& not_supported) {
  // The note config/support.cpp records for autotp_size > 1 starts with its key and value.
  std::erase_if(not_supported, [](const std::string& m) { return m.rfind("tensor_parallel.autotp_size = ", 0) == 0; });
}

PipelineConfig parse_pipeline(Section s, std::vector<std::string>& not_supported) {
  PipelineConfig p;
  p.stages = s.get_int("stages", p.stages, kDegree);
  PipelineOptions o;
  read_pipeline_keys(s, p.stages, o, not_supported);
  read_known_keys(s, not_supported);
  return p;
}

bool is_partition_method(const std::string& method) {
  const std::string m = lower(method);
  return m == "parameters" || m == "best" || m == "uniform" || m == "compute" || m.rfind("type:", 0) == 0;
}

std::string not_a_partition_method(const std::string& key, const std::string& method) {
  return key + " = \"" + method +
         "\" is not a partition method: use \"parameters\" (the default), \"uniform\", \"type:REGEX\" or "
         "\"compute\" (DeepSpeed's \"profile\" is not implemented there either)";
}

void read_pipeline_keys(Section& s, int64_t stages, PipelineOptions& o, std::vector<std::string>& not_supported) {
  const PipelineOptions def;
  o.stages = stages;
  std::vector<std::string> set;  // keys given with a value other than the default
  o.partition = s.get_string("partition", "best");
  if (o.partition != "best") set.push_back("partition");
  const std::string lower_partition = lower(o.partition);
  if (lower_partition == "best") {
    o.partition = def.partition;
  } else if (!is_partition_method(o.partition)) {
    s.ctx().error(not_a_partition_method(s.path_of("partition"), o.partition));
  }
  const bool seed_layers = s.get_bool("seed_layers", false);
  if (seed_layers) {
    not_supported.push_back(s.path_of("seed_layers") +
                            " = true is not supported yet by zerotrain: the stages take their layers from one "
                            "model built from one seed (so a pipelined run equals the non-pipelined one); set it "
                            "false or remove it");
  }
  o.activation_checkpoint_interval =
      s.get_int("activation_checkpoint_interval", def.activation_checkpoint_interval, IntRule{0, 1 << 20});
  if (o.activation_checkpoint_interval != def.activation_checkpoint_interval) set.push_back("activation_checkpoint_interval");
  for (const char* key : {"pipe_partitioned", "grad_partitioned"}) {
    if (!s.get_bool(key, true)) {
      not_supported.push_back(s.path_of(key) + " = false is not supported yet by zerotrain: it changes how " +
                              "activations travel between stages under tensor parallelism only (DeepSpeed's " +
                              "pipe engine ignores it without), which zerotrain does not have yet; remove it");
    }
  }
  o.schedule = s.get_string("schedule", def.schedule, {"gpipe", "1f1b", "interleaved", "zb-h1"});
  if (o.schedule != def.schedule) set.push_back("schedule");
  o.virtual_stages = s.get_int("virtual_stages", def.virtual_stages, IntRule{1, 1 << 10});
  if (o.virtual_stages != def.virtual_stages) set.push_back("virtual_stages");
  if (o.virtual_stages > 1 && o.schedule != "interleaved") {
    s.ctx().error(s.path_of("virtual_stages") + " = " + std::to_string(o.virtual_stages) + " needs " +
                  s.path_of("schedule") + " = \"interleaved\" (the only schedule with virtual stages): set " +
                  "the schedule or remove virtual_stages");
  }
  if (const auto k = s.get_opt_int("zb_max_pending_w", IntRule{0, 1 << 20})) {
    o.zb_max_pending_w = *k;
    set.push_back("zb_max_pending_w");
    if (o.schedule != "zb-h1") {
      s.ctx().error(s.path_of("zb_max_pending_w") + " = " + std::to_string(*k) +
                    " caps the pending weight passes of the zb-h1 schedule only, but " + s.path_of("schedule") +
                    " = \"" + o.schedule + "\": set the schedule to \"zb-h1\" or remove zb_max_pending_w");
    }
  }
  if (o.activation_checkpoint_interval > 0 && o.schedule == "zb-h1") {
    s.ctx().error(s.path_of("activation_checkpoint_interval") + " = " +
                  std::to_string(o.activation_checkpoint_interval) +
                  " cannot run with the zb-h1 schedule: a checkpointed range recomputes and back-propagates "
                  "its weights inside the input-gradient pass; use 1f1b or set the interval to 0");
  }
  if (stages == 1) {
    for (const auto& key : set) {
      not_supported.push_back(s.path_of(key) + " is set but takes effect only with pipeline.stages > 1: " +
                              "set pipeline.stages or remove " + s.path_of(key));
    }
  }
}

void drop_pipeline_stages_note(std::vector<std::string>& not_supported) {
  // The note config/support.cpp records for pipeline.stages > 1 starts with its key and value.
  std::erase_if(not_supported, [](const std::string& m) { return m.rfind("pipeline.stages = ", 0) == 0; });
}

PipelineOptions pipeline_options(const json& ds_config) {
  Context ctx;
  const json* p = ds_config.is_object() && ds_config.contains("pipeline") ? &ds_config.at("pipeline") : nullptr;
  Section s(ctx, "pipeline", p);
  PipelineOptions o;
  std::vector<std::string> not_supported;
  read_pipeline_keys(s, s.get_int("stages", 1, kDegree), o, not_supported);
  std::string msg;
  for (const auto& e : ctx.errors()) msg += "\n  " + e;
  for (const auto& e : not_supported) msg += "\n  " + e;
  if (!msg.empty()) throw ConfigError("invalid pipeline section:" + msg);
  return o;
}

ExpertParallelConfig parse_expert_parallel(Section s) {
  ExpertParallelConfig e;
  e.enabled = s.get_bool("enabled", e.enabled);
  e.autoep_size = s.get_int("autoep_size", e.autoep_size, kDegree);
  if (!e.enabled && e.autoep_size != 1) {
    s.ctx().error(s.path_of("autoep_size") + " = " + std::to_string(e.autoep_size) + " takes effect only with " +
                  s.path_of("enabled") + " true (DeepSpeed ignores it otherwise): set enabled true or remove " +
                  "autoep_size");
  }
  // AutoEP's other keys (presets, routing, kernels) are read by DeepSpeed only when it is
  // enabled, and enabled is itself not supported yet (support.cpp).
  s.accept_all_keys();
  return e;
}

void resolve_parallel(Context& ctx, Config& c, int world_size) {
  c.world_size = world_size;
  c.dp_world_size = world_size;
  try {
    c.dp_world_size = parallel::ParallelDims::derive(world_size, c.tp_size(), c.pp_size(), c.ep_size()).dp;
  } catch (const ConfigError& e) {
    ctx.error(std::string(e.what()) + " (degrees from tensor_parallel.autotp_size " +
              std::to_string(c.tensor_parallel.autotp_size) + ", pipeline.stages " + std::to_string(c.pipeline.stages) +
              ", expert_parallel.autoep_size " + std::to_string(c.ep_size()) + ")");
    c.dp_world_size = 0;  // unknown: the batch rule is not applied
  }
}

json parallel_to_json(const Config& c) {
  return {{"tensor_parallel", {{"autotp_size", c.tensor_parallel.autotp_size}}},
          {"pipeline", {{"stages", c.pipeline.stages}}},
          {"expert_parallel", {{"enabled", c.expert_parallel.enabled}, {"autoep_size", c.expert_parallel.autoep_size}}}};
}

}  // namespace zt::config
