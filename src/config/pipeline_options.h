// The "pipeline" section's keys beyond `stages` (DeepSpeed's runtime/config.py defaults
// plus zerotrain's schedule choice), read by the config layer to validate them and by the
// pipeline engine (src/pipe) to apply them. Kept out of zerotrain/config.h so that adding
// them does not rebuild everything that includes the public config; Config::parse checks
// them, pipeline_options() returns them. See docs/pipeline.md.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace zt::config {

class Section;

struct PipelineOptions {
  /// Pipeline stages (pipeline.stages; "auto" = 1).
  int64_t stages = 1;
  /// PipelineModule's partition_method: "parameters", "uniform" or "type:REGEX".
  /// DeepSpeed's config default "best" (which its engine never reads) means "parameters",
  /// PipelineModule's default.
  std::string partition = "parameters";
  /// Layers per activation-checkpointed range of a stage (0 = off), DeepSpeed's
  /// activation_checkpoint_interval. Not with the zb-h1 schedule (see docs/pipeline.md).
  int64_t activation_checkpoint_interval = 0;
  /// zerotrain's key: "gpipe", "1f1b" (DeepSpeed's TrainSchedule, the default),
  /// "interleaved" or "zb-h1".
  std::string schedule = "1f1b";
  /// zerotrain's key: model chunks per stage for the interleaved schedule. 1.
  int64_t virtual_stages = 1;
  /// zerotrain's key, zb-h1 only: weight passes (W) a stage may keep pending, min(s, k) on
  /// stage s; 0 = each W right after its B. -1 (absent) = the paper's ZB-H1 (s on stage s).
  /// [ZB-H1 Pending Cap] in pipe/schedule.h.
  int64_t zb_max_pending_w = -1;
  // seed_layers (must be false), pipe_partitioned and grad_partitioned (must be true: they
  // act only under tensor parallelism, which zerotrain does not have) are checked, not kept.
};

// Whether `method` (any case) is a partition method: "parameters", "best" (= parameters),
// "uniform", "compute" or "type:REGEX". Both the config check and pipe/partition.cpp use it.
bool is_partition_method(const std::string& method);
// The error for a method that is not one: names it and the choices.
std::string not_a_partition_method(const std::string& key, const std::string& method);

// Reads every key of the pipeline section except `stages` into `o`, recording type errors
// in s.ctx() and settings zerotrain cannot honour in `not_supported` (each naming the key,
// the value and the fix). With stages == 1 a key set to other than its default is "not
// supported" too: it would have no pipeline to act on.
void read_pipeline_keys(Section& s, int64_t stages, PipelineOptions& o, std::vector<std::string>& not_supported);

// Removes from a config's not_supported_yet the note that pipeline.stages > 1 is not
// supported (it holds for zt::initialize only): what runs a pipeline -- zt::pipe::PipeEngine,
// `zerotrain train`'s pipeline path, check-config -- takes such a config.
void drop_pipeline_stages_note(std::vector<std::string>& not_supported);

// The pipeline section of a DeepSpeed config (JSON as read by Config::read_json_file).
// Throws ConfigError listing every problem with it.
PipelineOptions pipeline_options(const nlohmann::json& ds_config);

}  // namespace zt::config
