// zt::Config: the top level of a DeepSpeed config (batch rule, scalar keys), the file
// reader, "auto" discovery and the resolved JSON. Sections live in sections.cpp and
// scheduler.cpp; what the engine cannot run yet lives in support.cpp.
#include "zerotrain/config.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
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

std::string str(int64_t v) { return std::to_string(v); }

// a * b, or nullopt when the product does not fit a 64-bit integer. Every size derived
// from config values goes through it: a wrapped product is a wrong batch size or a
// division by zero later.
std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// "train_micro_batch_size_per_gpu (4611686018427387904) * world size (4)" overflows.
std::string overflow_error(const std::string& product, const std::string& fix) {
  return product + " does not fit a 64-bit integer: " + fix;
}

// DeepSpeed's batch rule: train = micro * accumulation * world; any two give the third,
// accumulation defaults to 1. Every failure names the keys, the numbers and the fix;
// every product is checked (a value near 2^62 must be an error, not a wrapped size).
void resolve_batch(Context& ctx, Config& c, std::optional<int64_t> t, std::optional<int64_t> m,
                   std::optional<int64_t> g) {
  const int64_t w = c.dp_world_size;
  const std::string ws = "world size (" + str(w) + ")";
  const std::string ms = std::string(kMicroBatch) + " (" + (m ? str(*m) : "") + ")";
  const std::string gs = std::string(kAccumulation) + " (" + (g ? str(*g) : "") + ")";
  // m * w and g * w: the per-step samples of one micro batch / of one sample per rank.
  std::optional<int64_t> mw = m ? checked_mul(*m, w) : std::nullopt;
  std::optional<int64_t> gw = g ? checked_mul(*g, w) : std::nullopt;
  if (t && m && g) {
    std::optional<int64_t> product = mw ? checked_mul(*mw, *g) : std::nullopt;
    if (!product) {
      ctx.error(overflow_error(ms + " * " + gs + " * " + ws, "lower " + std::string(kMicroBatch) + " or " +
                                                                   kAccumulation + " so that their product with the " +
                                                                   "world size is " + kTrainBatch + " (" + str(*t) + ")"));
      return;
    }
    if (*product != *t) {
      std::string msg = std::string(kTrainBatch) + " (" + str(*t) + ") != " + ms + " * " + gs + " * " + ws + " = " +
                        str(*product) + ": set " + kTrainBatch + " to " + str(*product);
      if (mw && *t % *mw == 0) msg += ", or " + std::string(kAccumulation) + " to " + str(*t / *mw);
      if (gw && *t % *gw == 0) msg += ", or " + std::string(kMicroBatch) + " to " + str(*t / *gw);
      msg += ", or remove one of the three keys and zerotrain derives it";
      ctx.error(msg);
      return;
    }
  } else if (t && m) {
    if (!mw || *mw > *t || *t % *mw != 0) {
      ctx.error(std::string(kTrainBatch) + " (" + str(*t) + ") is not a multiple of " + ms + " * " + ws + " = " +
                (mw ? str(*mw) : std::string("more than 2^63")) + ", so " + kAccumulation +
                " cannot be derived: set " + kTrainBatch + " to a multiple of " +
                (mw ? str(*mw) : std::string("it")) + " or lower " + kMicroBatch);
      return;
    }
    g = *t / *mw;
  } else if (t && g) {
    if (!gw || *gw > *t || *t % *gw != 0) {
      ctx.error(std::string(kTrainBatch) + " (" + str(*t) + ") is not a multiple of " + gs + " * " + ws + " = " +
                (gw ? str(*gw) : std::string("more than 2^63")) + ", so " + kMicroBatch +
                " cannot be derived: set " + kTrainBatch + " to a multiple of " +
                (gw ? str(*gw) : std::string("it")) + " or lower " + kAccumulation);
      return;
    }
    m = *t / *gw;
  } else if (m && g) {
    t = mw ? checked_mul(*mw, *g) : std::nullopt;
    if (!t) {
      ctx.error(overflow_error(ms + " * " + gs + " * " + ws + " (= " + kTrainBatch + ")",
                               "lower " + std::string(kMicroBatch) + " or " + kAccumulation));
      return;
    }
  } else if (t) {
    if (*t % w != 0) {
      ctx.error(std::string(kTrainBatch) + " (" + str(*t) + ") is not divisible by " + ws + ", so " + kMicroBatch +
                " cannot be derived: set " + kTrainBatch + " to a multiple of " + str(w) + " or set " + kMicroBatch);
      return;
    }
    g = 1;
    m = *t / w;
  } else if (m) {
    if (!mw) {
      ctx.error(overflow_error(ms + " * " + ws + " (= " + kTrainBatch + ")", "lower " + std::string(kMicroBatch)));
      return;
    }
    g = 1;
    t = mw;
  } else {
    ctx.error(std::string("neither ") + kTrainBatch + " nor " + kMicroBatch + " is set: set " + kMicroBatch +
              " (samples per rank per step) or " + kTrainBatch + " (samples per optimizer step, all ranks)");
    return;
  }
  c.train_batch_size = *t;
  c.train_micro_batch_size_per_gpu = *m;
  c.gradient_accumulation_steps = *g;
}

// Nesting depth of JSON text, counted without recursion: strings (with escapes) and the
// comments the reader accepts (// and /* */) are skipped. Throws past kMaxJsonDepth,
// naming the line where the limit is crossed.
void check_json_depth(const std::string& text, const std::string& origin) {
  int depth = 0;
  size_t line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line;
    } else if (ch == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
        else if (text[i] == '\n') ++line;
      }
    } else if (ch == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') ++i;
      --i;  // the newline is counted by the loop
    } else if (ch == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      for (i += 2; i + 1 < text.size() && !(text[i] == '*' && text[i + 1] == '/'); ++i)
        if (text[i] == '\n') ++line;
      ++i;
    } else if (ch == '{' || ch == '[') {
      ZT_CHECK_T(++depth <= Config::kMaxJsonDepth, ConfigError, origin, ": JSON nested deeper than ",
                 Config::kMaxJsonDepth, " levels (line ", line, "): a DeepSpeed config nests 4 levels; ",
                 "this is not a DeepSpeed config or it is corrupt");
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
}

// The same bound for a JSON value built in memory (Config::parse's input), iteratively;
// the error names the key path where the limit is crossed.
void check_json_depth(const json& root, const std::string& origin) {
  struct Item {
    const json* value;
    int depth;
    std::string path;
  };
  std::vector<Item> stack{{&root, 1, ""}};
  while (!stack.empty()) {
    Item item = std::move(stack.back());
    stack.pop_back();
    if (!item.value->is_structured()) continue;
    ZT_CHECK_T(item.depth <= Config::kMaxJsonDepth, ConfigError, origin, ": ", item.path,
               ": JSON nested deeper than ", Config::kMaxJsonDepth,
               " levels: a DeepSpeed config nests 4 levels; replace the value of ", item.path);
    if (item.value->is_object()) {
      for (auto it = item.value->begin(); it != item.value->end(); ++it)
        stack.push_back({&*it, item.depth + 1, join_path(item.path, it.key())});
    } else {
      size_t i = 0;
      for (const auto& child : *item.value) stack.push_back({&child, item.depth + 1, item.path + "[" + std::to_string(i++) + "]"});
    }
  }
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
  c.tensorboard = parse_monitor_output(top.sub("tensorboard"));
  c.csv_monitor = parse_monitor_output(top.sub("csv_monitor"));
  c.wandb = parse_wandb(top.sub("wandb"));
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
  config::check_json_depth(json, origin);
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
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  ZT_CHECK_T(!ec && std::filesystem::exists(status), ConfigError, "cannot open config file '", path, "': ",
             ec ? ec.message() : std::string("no such file"));
  ZT_CHECK_T(!std::filesystem::is_directory(status), ConfigError, "config file '", path,
             "' is a directory: give the DeepSpeed JSON file inside it (for example ", path, "/ds_config.json)");
  std::ifstream in(path, std::ios::binary);
  ZT_CHECK_T(in.good(), ConfigError, "cannot open config file '", path, "': ", std::strerror(errno));
  // Read at most one byte past the limit: a huge or endless file (/dev/zero) stops there.
  std::string text;
  char chunk[65536];
  while (in && text.size() <= kMaxJsonBytes) {
    in.read(chunk, sizeof(chunk));
    text.append(chunk, static_cast<size_t>(in.gcount()));
  }
  ZT_CHECK_T(!in.bad(), ConfigError, "cannot read config file '", path, "': ", std::strerror(errno));
  return parse_json_text(text, path);
}

nlohmann::json Config::parse_json_text(const std::string& text, const std::string& origin) {
  ZT_CHECK_T(text.size() <= kMaxJsonBytes, ConfigError, origin, ": the config is larger than ",
             kMaxJsonBytes >> 20, " MiB: a DeepSpeed config is a few KiB; give the JSON config, not a data or "
             "weights file");
  // nlohmann's parser recurses once per nesting level: bound the depth before it runs.
  config::check_json_depth(text, origin);
  // DeepSpeed (hjson) rejects duplicate keys; nlohmann would keep the last one silently.
  std::vector<std::string> key_stack;
  std::vector<std::set<std::string>> seen;
  std::vector<std::string> duplicates;
  auto key_path = [&] {
    std::string p;
    for (const auto& s : key_stack) p = config::join_path(p, s);
    return p;
  };
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
      if (!seen.back().insert(k).second) duplicates.push_back(key_path());
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, on_event, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::exception& e) {
    // Every library message is rewritten: the file, the key being read, the fix.
    std::string what = e.what();
    auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    const std::string key = key_path();
    const std::string at = key.empty() ? "" : " (in the value of " + key + ")";
    if (what.find("number overflow") != std::string::npos) {
      throw ConfigError(origin + ": " + what + at + ": the number is beyond the range of a double (about 1.8e308); " +
                        "write a smaller value" + (key.empty() ? "" : " for " + key));
    }
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
      throw ConfigError(origin + ": the file is empty: a DeepSpeed config is a JSON object such as "
                        "{\"train_micro_batch_size_per_gpu\": 8}");
    }
    throw ConfigError(origin + ": invalid JSON: " + what + at +
                      ": fix the JSON there (a missing comma, quote or bracket, or a trailing comma)");
  }
  if (!duplicates.empty()) {
    std::string list;
    for (const auto& d : duplicates) list += (list.empty() ? "" : ", ") + d;
    throw ConfigError(origin + ": duplicate key" + (duplicates.size() == 1 ? " " : "s ") + list +
                      " (DeepSpeed rejects duplicate keys too): keep one of each");
  }
  return j;
}

std::vector<AutoKey> Config::auto_keys(const nlohmann::json& json) {
  std::vector<AutoKey> out;
  config::check_json_depth(json, "<json>");  // collect_autos recurses
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
  j["tensorboard"] = config::monitor_output_to_json(tensorboard);
  j["csv_monitor"] = config::monitor_output_to_json(csv_monitor);
  j["wandb"] = config::wandb_to_json(wandb);
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
