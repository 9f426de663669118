// zt::Config: the top level of a DeepSpeed config (batch rule, scalar keys), the file
// reader, "auto" discovery and the resolved JSON. Sections live in sections.cpp and
// scheduler.cpp; what the engine cannot run yet lives in support.cpp.
#include "zerotrain/config.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "config/reader.h"
#include "config/sections.h"
#include "zerotrain/error.h"

namespace zt {

const char* to_string(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::cpu: return "cpu";
    case OffloadDevice::nvme: return "nvme";
    case OffloadDevice::none: break;
  }
  return "none";
}

namespace config {
namespace {

constexpr const char* kTrainBatch = "train_batch_size";
constexpr const char* kMicroBatch = "train_micro_batch_size_per_gpu";
constexpr const char* kAccumulation = "gradient_accumulation_steps";
constexpr const char* kClipping = "gradient_clipping";
// Top-level keys whose "auto" DeepSpeed never resolves itself (the HF Trainer does).
constexpr const char* kCallerAutoKeys[] = {kTrainBatch, kMicroBatch, kAccumulation, kClipping};

using i128 = __int128;

std::string str(int64_t v) { return std::to_string(v); }

// DeepSpeed's batch rule: train = micro * accumulation * world; any two give the third,
// accumulation defaults to 1. Every failure names the keys, the numbers and the fix.
void resolve_batch(Context& ctx, Config& c, std::optional<int64_t> t, std::optional<int64_t> m,
                   std::optional<int64_t> g) {
  const int64_t w = c.dp_world_size;
  const std::string ws = "world size (" + str(w) + ")";
  if (t && m && g) {
    i128 product = i128(*m) * *g * w;
    if (product != *t) {
      std::string msg = std::string(kTrainBatch) + " (" + str(*t) + ") != " + kMicroBatch + " (" + str(*m) +
                        ") * " + kAccumulation + " (" + str(*g) + ") * " + ws + " = " +
                        (product > INT64_MAX ? std::string("overflow") : str(int64_t(product))) + ": set " +
                        kTrainBatch + " to " + (product > INT64_MAX ? std::string("a smaller value") : str(int64_t(product)));
      if (*t % (*m * w) == 0) msg += ", or " + std::string(kAccumulation) + " to " + str(*t / (*m * w));
      if (*t % (*g * w) == 0) msg += ", or " + std::string(kMicroBatch) + " to " + str(*t / (*g * w));
      msg += ", or remove one of the three keys and zerotrain derives it";
      ctx.error(msg);
      return;
    }
  } else if (t && m) {
    i128 per_step = i128(*m) * w;
    if (per_step > *t || *t % (*m * w) != 0) {
      ctx.error(std::string(kTrainBatch) + " (" + str(*t) + ") is not a multiple of " + kMicroBatch + " (" +
                str(*m) + ") * " + ws + " = " + str(int64_t(per_step)) + ", so " + kAccumulation +
                " cannot be derived: set " + kTrainBatch + " to a multiple of " + str(int64_t(per_step)) +
                " or change " + kMicroBatch);
      return;
    }
    g = *t / (*m * w);
  } else if (t && g) {
    i128 per_sample = i128(*g) * w;
    if (per_sample > *t || *t % (*g * w) != 0) {
      ctx.error(std::string(kTrainBatch) + " (" + str(*t) + ") is not a multiple of " + kAccumulation + " (" +
                str(*g) + ") * " + ws + " = " + str(int64_t(per_sample)) + ", so " + kMicroBatch +
                " cannot be derived: set " + kTrainBatch + " to a multiple of " + str(int64_t(per_sample)) +
                " or change " + kAccumulation);
      return;
    }
    m = *t / (*g * w);
  } else if (m && g) {
    t = *m * *g * w;
  } else if (t) {
    if (*t % w != 0) {
      ctx.error(std::string(kTrainBatch) + " (" + str(*t) + ") is not divisible by " + ws + ", so " + kMicroBatch +
                " cannot be derived: set " + kTrainBatch + " to a multiple of " + str(w) + " or set " + kMicroBatch);
      return;
    }
    g = 1;
    m = *t / w;
  } else if (m) {
    g = 1;
    t = *m * w;
  } else {
    ctx.error(std::string("neither ") + kTrainBatch + " nor " + kMicroBatch + " is set: set " + kMicroBatch +
              " (samples per rank per step) or " + kTrainBatch + " (samples per optimizer step, all ranks)");
    return;
  }
  c.train_batch_size = *t;
  c.train_micro_batch_size_per_gpu = *m;
  c.gradient_accumulation_steps = *g;
}

void parse_top_level(Section& top, Config& c, int world_size, std::vector<std::string>& not_supported) {
  Context& ctx = top.ctx();
  // The degrees first: the batch rule counts data-parallel ranks, world / (tp x pp).
  c.tensor_parallel = parse_tensor_parallel(top.sub("tensor_parallel"), not_supported);
  c.pipeline = parse_pipeline(top.sub("pipeline"), not_supported);
  c.expert_parallel = parse_expert_parallel(top.sub("expert_parallel"));
  resolve_parallel(ctx, c, world_size);
  // "auto" at the top stays unresolved: the caller fills it (see AutoKey::needs_value).
  std::string unresolved;
  for (const char* key : kCallerAutoKeys) {
    const json* v = top.raw(key);
    if (v && is_auto(*v)) unresolved += (unresolved.empty() ? "" : ", ") + std::string(key);
  }
  if (!unresolved.empty()) {
    ctx.error(unresolved + ": \"auto\" is left for the launcher to fill (the HF Trainer does it for DeepSpeed; " +
              "zerotrain train fills them from its flags and the world size): put numbers there before " +
              "Config::from_json, or remove the batch key and let the batch rule derive it");
  }
  auto batch_key = [&](const char* key) -> std::optional<int64_t> {
    const json* v = top.raw(key);
    if (!v || is_auto(*v) || v->is_null()) return std::nullopt;
    return to_int(ctx, key, *v, IntRule{1});
  };
  size_t errors_before = ctx.errors().size();
  auto t = batch_key(kTrainBatch);
  auto m = batch_key(kMicroBatch);
  auto g = batch_key(kAccumulation);
  if (unresolved.empty() && ctx.errors().size() == errors_before && c.dp_world_size > 0) resolve_batch(ctx, c, t, m, g);

  const json* clip = top.raw(kClipping);
  if (clip && !is_auto(*clip)) {
    c.gradient_clipping = to_double(ctx, kClipping, *clip, DoubleRule{0.0}, 0.0).value_or(0.0);
  }
  c.prescale_gradients = top.get_bool("prescale_gradients", c.prescale_gradients);
  c.gradient_predivide_factor =
      top.get_double("gradient_predivide_factor", c.gradient_predivide_factor, DoubleRule{0.0, INFINITY, true});
  const json* spp = top.raw("steps_per_print");
  if (spp && !spp->is_null()) c.steps_per_print = top.get_int("steps_per_print", c.steps_per_print, IntRule{1});
  c.wall_clock_breakdown = top.get_bool("wall_clock_breakdown", c.wall_clock_breakdown);
  c.zero_allow_untested_optimizer = top.get_bool("zero_allow_untested_optimizer", c.zero_allow_untested_optimizer);
  c.zero_force_ds_cpu_optimizer = top.get_bool("zero_force_ds_cpu_optimizer", c.zero_force_ds_cpu_optimizer);
  c.dump_state = top.get_bool("dump_state", c.dump_state);

  c.optimizer = parse_optimizer(top.sub("optimizer"), not_supported);
  c.scheduler = parse_scheduler(top.sub("scheduler"), c.optimizer, not_supported);
  c.fp16 = parse_fp16(top.sub("fp16"));
  c.bf16 = parse_bf16(top.sub("bf16", {"bfloat16"}));
  c.zero_optimization = parse_zero(top, not_supported);
  c.activation_checkpointing = parse_activation_checkpointing(top.sub("activation_checkpointing"));
  c.aio = parse_aio(top.sub("aio"), not_supported);
  read_known_keys(top, not_supported);
}

std::string bullet_list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += "\n  - " + i;
  return out;
}

void collect_autos(const json& j, const std::string& path, const json& root, std::vector<AutoKey>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) collect_autos(*it, join_path(path, it.key()), root, out);
    return;
  }
  if (!is_auto(j)) return;
  bool needs = false;
  for (const char* key : kCallerAutoKeys) needs = needs || path == key;
  const std::string prefix = "scheduler.params.";
  if (path.rfind(prefix, 0) == 0 && root.contains("scheduler") && root["scheduler"].is_object()) {
    const json& type = root["scheduler"].value("type", json());
    if (type.is_string()) {
      TypeName t = lookup_scheduler(type.get<std::string>());
      needs = scheduler_param_required(t.canonical, path.substr(prefix.size()));
    }
  }
  out.push_back(AutoKey{path, needs});
}

}  // namespace
}  // namespace config

Config Config::parse(const nlohmann::json& json, int world_size, const std::string& origin) {
  ZT_CHECK_T(world_size >= 1, ConfigError, origin, ": the world size must be >= 1, got ", world_size);
  ZT_CHECK_T(json.is_object(), ConfigError, origin, ": a DeepSpeed config is a JSON object ({...}), found ",
             config::type_name(json));
  config::Context ctx;
  config::Section top(ctx, "", &json);
  Config c;
  std::vector<std::string> not_supported;
  config::parse_top_level(top, c, world_size, not_supported);
  config::check_cross_section(ctx, c);
  ctx.check_unknown_keys();
  const auto& errors = ctx.errors();
  if (!errors.empty()) {
    throw ConfigError(origin + ": " + std::to_string(errors.size()) + (errors.size() == 1 ? " error" : " errors") +
                      " in the DeepSpeed config:" + config::bullet_list(errors));
  }
  config::check_support(c, not_supported);
  c.not_supported_yet = std::move(not_supported);
  c.auto_defaulted = ctx.auto_defaulted();
  return c;
}

Config Config::from_json(const nlohmann::json& json, int world_size, const std::string& origin) {
  Config c = parse(json, world_size, origin);
  const auto& ns = c.not_supported_yet;
  if (!ns.empty()) {
    throw ConfigError(origin + ": " + std::to_string(ns.size()) + " setting" + (ns.size() == 1 ? "" : "s") +
                      " not supported yet by zerotrain:" + config::bullet_list(ns));
  }
  return c;
}

Config Config::from_file(const std::string& path, int world_size) {
  return from_json(read_json_file(path), world_size, path);
}

nlohmann::json Config::read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZT_CHECK_T(in.good(), ConfigError, "cannot open config file '", path, "': ", std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  // DeepSpeed (hjson) rejects duplicate keys; nlohmann would keep the last one silently.
  std::vector<std::string> key_stack;
  std::vector<std::set<std::string>> seen;
  std::vector<std::string> duplicates;
  nlohmann::json::parser_callback_t on_event = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& v) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      seen.emplace_back();
      key_stack.emplace_back();
    } else if (event == E::object_end) {
      seen.pop_back();
      key_stack.pop_back();
    } else if (event == E::key) {
      const auto& k = v.get_ref<const std::string&>();
      key_stack.back() = k;
      if (!seen.back().insert(k).second) {
        std::string p;
        for (const auto& s : key_stack) p = config::join_path(p, s);
        duplicates.push_back(p);
      }
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(buffer.str(), on_event, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    auto pos = what.find("] ");
    throw ConfigError(path + ": invalid JSON: " + (pos == std::string::npos ? what : what.substr(pos + 2)));
  }
  if (!duplicates.empty()) {
    std::string list;
    for (const auto& d : duplicates) list += (list.empty() ? "" : ", ") + d;
    throw ConfigError(path + ": duplicate key" + (duplicates.size() == 1 ? " " : "s ") + list +
                      " (DeepSpeed rejects duplicate keys too): keep one of each");
  }
  return j;
}

std::vector<AutoKey> Config::auto_keys(const nlohmann::json& json) {
  std::vector<AutoKey> out;
  config::collect_autos(json, "", json, out);
  return out;
}

nlohmann::json Config::to_json() const {
  using nlohmann::json;
  const auto& a = activation_checkpointing;
  json j = {
      {"train_batch_size", train_batch_size},
      {"train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu},
      {"gradient_accumulation_steps", gradient_accumulation_steps},
      {"gradient_clipping", gradient_clipping},
      {"prescale_gradients", prescale_gradients},
      {"gradient_predivide_factor", gradient_predivide_factor},
      {"steps_per_print", steps_per_print},
      {"wall_clock_breakdown", wall_clock_breakdown},
      {"zero_allow_untested_optimizer", zero_allow_untested_optimizer},
      {"zero_force_ds_cpu_optimizer", zero_force_ds_cpu_optimizer},
      {"dump_state", dump_state},
      {"fp16",
       {{"enabled", fp16.enabled},
        {"auto_cast", fp16.auto_cast},
        {"loss_scale", fp16.loss_scale},
        {"initial_scale_power", fp16.initial_scale_power},
        {"loss_scale_window", fp16.loss_scale_window},
        {"hysteresis", fp16.hysteresis},
        {"consecutive_hysteresis", fp16.consecutive_hysteresis},
        {"min_loss_scale", fp16.min_loss_scale},
        {"fp16_master_weights_and_grads", fp16.fp16_master_weights_and_grads}}},
      {"bf16",
       {{"enabled", bf16.enabled},
        {"immediate_grad_update", bf16.immediate_grad_update},
        {"check_grad_overflow", bf16.check_grad_overflow},
        {"bf16_master_weights_and_grads", bf16.bf16_master_weights_and_grads},
        {"bf16_optimizer_states", bf16.bf16_optimizer_states}}},
      {"zero_optimization", config::zero_to_json(zero_optimization)},
      {"activation_checkpointing",
       {{"partition_activations", a.partition_activations},
        {"cpu_checkpointing", a.cpu_checkpointing},
        {"contiguous_memory_optimization", a.contiguous_memory_optimization},
        {"number_checkpoints", a.number_checkpoints ? json(*a.number_checkpoints) : json(nullptr)},
        {"synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary},
        {"profile", a.profile}}},
      {"aio",
       {{"block_size", aio.block_size},
        {"queue_depth", aio.queue_depth},
        {"thread_count", aio.thread_count},
        {"single_submit", aio.single_submit},
        {"overlap_events", aio.overlap_events},
        {"use_gds", aio.use_gds}}},
  };
  j.update(config::parallel_to_json(*this));
  if (!optimizer.type.empty()) j["optimizer"] = config::optimizer_to_json(optimizer);
  if (!scheduler.type.empty()) j["scheduler"] = json{{"type", scheduler.type}, {"params", scheduler.params}};
  return j;
}

at::ScalarType Config::compute_dtype() const {
  if (fp16.enabled) return at::kHalf;
  if (bf16.enabled) return at::kBFloat16;
  return at::kFloat;
}

bool Config::mixed_precision() const { return fp16.enabled || bf16.enabled; }

}  // namespace zt
