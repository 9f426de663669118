// config_notes: see [Config Notes] in config/notes.h.
#include "config/notes.h"

#include "zerotrain/config.h"

namespace zt::config {

namespace {

using json = nlohmann::json;

// The value at a dotted path of the raw config (first name found of `names` for the last
// key, DeepSpeed's aliases), or null when absent.
const json* find(const json& raw, const std::vector<std::string>& sections, const std::vector<std::string>& names) {
  const json* at = &raw;
  for (const auto& s : sections) {
    if (!at->is_object() || !at->contains(s)) return nullptr;
    at = &(*at)[s];
  }
  if (!at->is_object()) return nullptr;
  for (const auto& n : names)
    if (at->contains(n)) return &(*at)[n];
  return nullptr;
}

std::string path_of(const std::vector<std::string>& sections, const std::string& key) {
  std::string p;
  for (const auto& s : sections) p += s + ".";
  return p + key;
}

}  // namespace

std::vector<std::string> config_notes(const json& raw, const Config& c) {
  std::vector<std::string> out;
  const int64_t stage = c.zero_optimization.stage;
  // A key set to anything but DeepSpeed's default `def` (a JSON value) gets `what`.
  auto differs = [&](const std::vector<std::string>& sections, const std::vector<std::string>& names,
                     const json& def, const std::string& what) {
    const json* v = find(raw, sections, names);
    if (v == nullptr || v->is_null() || (v->is_string() && *v == "auto")) return;
    const bool same = v->is_number() && def.is_number() ? v->get<double>() == def.get<double>() : *v == def;
    if (!same) out.push_back(path_of(sections, names[0]) + " = " + v->dump() + ": " + what);
  };
  const std::vector<std::string> zo = {"zero_optimization"};
  differs(zo, {"contiguous_gradients"}, true,
          "no effect: zerotrain always reduces gradients through contiguous buckets");
  if (stage != 1) {
    differs(zo, {"overlap_comm"}, true,
            "no effect at stage " + std::to_string(stage) +
                ": zerotrain reduces gradient buckets during backward at stages 0, 2 and 3 (overlap_comm "
                "chooses between that and reducing at the step at stage 1 only)");
  }
  if (stage == 3) {
    const json* v = find(raw, zo, {"reduce_bucket_size"});
    if (v != nullptr && !v->is_null() && !(v->is_string() && *v == "auto")) {
      out.push_back("zero_optimization.reduce_bucket_size = " + v->dump() +
                    ": no effect at stage 3: gradients are reduced one bucket per gather unit (a block)");
    }
  }
  differs(zo, {"stage3_model_persistence_threshold", "model_persistence_threshold"}, json(9223372036854775807LL),
          "no effect: zerotrain keeps resident only the parameters under stage3_param_persistence_threshold");
  differs(zo, {"round_robin_gradients"}, false, "no effect: a DeepSpeed bucket-ordering tuning zerotrain does not need");
  differs(zo, {"memory_efficient_linear"}, true, "no effect: zerotrain's linear layers keep no extra copies either way");
  const std::vector<std::string> oo = {"zero_optimization", "offload_optimizer"};
  differs(oo, {"pipeline_read"}, false, "no effect: NVMe reads always overlap the CPU optimizer step in zerotrain");
  differs(oo, {"pipeline_write"}, false, "no effect: NVMe writes always overlap the CPU optimizer step in zerotrain");
  differs(oo, {"fast_init"}, false, "no effect: zerotrain initialises the swap file in one pass either way");
  differs({"optimizer", "params"}, {"torch_adam"}, false,
          "no effect: zerotrain runs its own Adam (fused on the GPU, SIMD on the CPU), equal to torch.optim's");
  differs({}, {"zero_allow_untested_optimizer"}, false,
          "no effect: zerotrain runs only the optimizers it implements (Adam, AdamW, SGD)");
  differs({}, {"zero_force_ds_cpu_optimizer"}, true, "no effect: offload always steps with zerotrain's CPU Adam");
  if (const json* t = find(raw, {}, {"timers"}); t != nullptr && !t->is_null() && !(t->is_object() && t->empty())) {
    out.push_back("timers = " + t->dump() +
                  ": no effect: zerotrain times every step's phases in its report (wall_clock_breakdown prints them)");
  }
  return out;
}

}  // namespace zt::config
