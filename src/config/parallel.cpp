// The parallel degrees of a DeepSpeed config: tensor_parallel.autotp_size (AutoTP),
// pipeline.stages and expert_parallel.autoep_size (AutoEP). They are read here, checked
// together with the world size as parallel::ParallelDims (once, in resolve_parallel), and
// a degree > 1 is "not supported yet" (support.cpp) until the engine implements it.
// See docs/parallel.md and [Rank Order] in src/parallel/layout.h.
#include "config/sections.h"
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
  read_known_keys(s, not_supported);
  return t;
}

PipelineConfig parse_pipeline(Section s, std::vector<std::string>& not_supported) {
  PipelineConfig p;
  p.stages = s.get_int("stages", p.stages, kDegree);
  read_known_keys(s, not_supported);
  return p;
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
