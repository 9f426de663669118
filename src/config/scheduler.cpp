// "scheduler": DeepSpeed's LR schedules (deepspeed/runtime/lr_schedules.py). DeepSpeed
// passes params as keyword arguments to the schedule's constructor, so a misspelt key
// is a TypeError there; here it is an error naming the key and the nearest known one.
// Every default is filled in so the engine never needs DeepSpeed's tables.
#include "config/sections.h"

namespace zt::config {

namespace {

enum class Kind { number, integer, boolean, string };

// One keyword argument of a schedule. `def` null with `required` false means a default
// derived from other params (resolved in parse_scheduler).
struct ParamSpec {
  const char* name;
  Kind kind;
  json def;
  bool required = false;
  double min = 0.0;
  double max = std::numeric_limits<double>::infinity();
};

struct ScheduleSpec {
  const char* type;
  std::vector<ParamSpec> params;
};

const std::vector<ScheduleSpec>& schedule_specs() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // last_batch_iteration: the constructor's resume index; -1 = start from scratch.
  static const std::vector<ScheduleSpec> specs = {
      {"WarmupLR",
       {{"warmup_min_lr", Kind::number, 0.0},
        {"warmup_max_lr", Kind::number, nullptr},  // DeepSpeed: the optimizer's lr
        {"warmup_num_steps", Kind::integer, 1000, false, 1},
        {"warmup_type", Kind::string, "log"},
        {"last_batch_iteration", Kind::integer, -1, false, -1}}},
      {"WarmupDecayLR",
       {{"total_num_steps", Kind::integer, nullptr, true, 1},
        {"warmup_min_lr", Kind::number, 0.0},
        {"warmup_max_lr", Kind::number, 0.001},
        {"warmup_num_steps", Kind::integer, 1000, false, 1},
        {"warmup_type", Kind::string, "log"},
        {"last_batch_iteration", Kind::integer, -1, false, -1}}},
      {"WarmupCosineLR",
       {{"total_num_steps", Kind::integer, nullptr, true, 1},
        {"warmup_min_ratio", Kind::number, 0.0, false, 0, 1},
        {"warmup_num_steps", Kind::integer, 1000, false, 1},
        {"cos_min_ratio", Kind::number, 0.0001, false, 0, 1},
        {"warmup_type", Kind::string, "log"},
        {"last_batch_iteration", Kind::integer, -1, false, -1}}},
      {"OneCycle",
       {{"cycle_min_lr", Kind::number, nullptr, true},
        {"cycle_max_lr", Kind::number, nullptr, true},
        {"decay_lr_rate", Kind::number, 0.0},
        {"cycle_first_step_size", Kind::integer, 2000, false, 1},
        {"cycle_second_step_size", Kind::integer, nullptr, false, 1},  // = cycle_first_step_size
        {"cycle_first_stair_count", Kind::integer, 0},
        {"cycle_second_stair_count", Kind::integer, nullptr},  // = cycle_first_stair_count
        {"decay_step_size", Kind::integer, 0},
        {"cycle_momentum", Kind::boolean, true},
        {"cycle_min_mom", Kind::number, 0.8, false, 0, 1},
        {"cycle_max_mom", Kind::number, 0.9, false, 0, 1},
        {"decay_mom_rate", Kind::number, 0.0},
        {"last_batch_iteration", Kind::integer, -1, false, -1}}},
      {"LRRangeTest",
       {{"lr_range_test_min_lr", Kind::number, 0.001},
        {"lr_range_test_step_size", Kind::integer, 2000, false, 1},
        {"lr_range_test_step_rate", Kind::number, 1.0},
        {"lr_range_test_staircase", Kind::boolean, false},
        {"last_batch_iteration", Kind::integer, -1, false, -1, kInf}}},
  };
  return specs;
}

const ScheduleSpec* find_spec(std::string_view type) {
  for (const auto& s : schedule_specs())
    if (type == s.type) return &s;
  return nullptr;
}

// Reads one param into `out`; returns false when absent/"auto"/invalid.
bool read_param(Section& p, const ParamSpec& spec, json& out) {
  const json* v = p.find(spec.name);
  if (!v) return false;
  // Derived defaults (cycle_second_step_size, ...) may be written as null, DeepSpeed's None.
  if (v->is_null() && spec.def.is_null() && !spec.required) return false;
  const std::string path = p.path_of(spec.name);
  Context& ctx = p.ctx();
  switch (spec.kind) {
    case Kind::number: {
      std::optional<double> def = spec.def.is_number() ? std::optional<double>(spec.def.get<double>()) : std::nullopt;
      auto d = to_double(ctx, path, *v, DoubleRule{spec.min, spec.max}, def);
      if (d) out = *d;
      return d.has_value();
    }
    case Kind::integer: {
      IntRule rule{static_cast<int64_t>(spec.min)};
      std::optional<int64_t> def =
          spec.def.is_number() ? std::optional<int64_t>(spec.def.get<int64_t>()) : std::nullopt;
      auto i = to_int(ctx, path, *v, rule, def);
      if (i) out = *i;
      return i.has_value();
    }
    case Kind::boolean: {
      auto b = to_bool(ctx, path, *v);
      if (b) out = *b;
      return b.has_value();
    }
    case Kind::string: {
      auto s = to_string(ctx, path, *v);
      if (!s) return false;
      // warmup_type: DeepSpeed warns and falls back to "log" on anything else.
      if (*s != "log" && *s != "linear") {
        ctx.error(path + ": \"" + *s + "\" is not a warmup type: use \"log\" (DeepSpeed's default) or \"linear\"");
        return false;
      }
      out = *s;
      return true;
    }
  }
  return false;
}

}  // namespace

bool scheduler_param_required(std::string_view type, std::string_view param) {
  const ScheduleSpec* spec = find_spec(type);
  if (!spec) return false;
  for (const auto& p : spec->params)
    if (p.name == param) return p.required;
  return false;
}

SchedulerConfig parse_scheduler(Section s, const OptimizerConfig& optimizer,
                                std::vector<std::string>& not_supported) {
  SchedulerConfig out;
  const json* type = s.find("type");
  Section p = s.sub("params");
  if (!s.present()) return out;
  if (!type) {
    s.ctx().error(join_path(s.path(), "type") + ": missing: set it to one of " + supported_schedulers());
    p.accept_all_keys();
    return out;
  }
  auto name = to_string(s.ctx(), s.path_of("type"), *type);
  if (!name) {
    p.accept_all_keys();
    return out;
  }
  TypeName t = lookup_scheduler(*name);
  if (t.canonical.empty()) {
    s.ctx().error(s.path_of("type") + ": \"" + *name + "\" is not an LR schedule zerotrain knows: " +
                  (t.nearest.empty() ? "" : "did you mean " + t.nearest + "? ") + "use one of " +
                  supported_schedulers());
    p.accept_all_keys();
    return out;
  }
  out.type = t.canonical;
  if (!t.supported) {
    not_supported.push_back(s.path_of("type") + " \"" + t.canonical + "\" is not supported yet by zerotrain: use one of " +
                            supported_schedulers());
  }
  const ScheduleSpec* spec = find_spec(t.canonical);
  if (!spec) {  // a torch.optim.lr_scheduler class DeepSpeed would forward to
    p.accept_all_keys();
    return out;
  }

  json params = json::object();
  for (const auto& ps : spec->params) {
    json value;
    const json* raw = p.object() ? (p.object()->contains(ps.name) ? &(*p.object())[ps.name] : nullptr) : nullptr;
    if (read_param(p, ps, value)) {
      params[ps.name] = value;
    } else if (ps.required && raw && is_auto(*raw)) {
      s.ctx().error(p.path_of(ps.name) + ": \"auto\" has no default here: " + t.canonical +
                    " needs it; put the number in the config (the HF Trainer / zerotrain train fill it)");
    } else if (ps.required && !(raw && !raw->is_null())) {
      s.ctx().error(p.path_of(ps.name) + ": missing: " + t.canonical + " requires it" +
                    (std::string_view(ps.name) == "total_num_steps" ? " (the number of optimizer steps)" : ""));
    } else if (!ps.def.is_null()) {
      params[ps.name] = ps.def;
    }
  }
  // Derived defaults.
  if (t.canonical == "WarmupLR" && !params.contains("warmup_max_lr")) params["warmup_max_lr"] = optimizer.params.lr;
  if (t.canonical == "OneCycle") {
    if (!params.contains("cycle_second_step_size") && params.contains("cycle_first_step_size"))
      params["cycle_second_step_size"] = params["cycle_first_step_size"];
    if (!params.contains("cycle_second_stair_count") && params.contains("cycle_first_stair_count"))
      params["cycle_second_stair_count"] = params["cycle_first_stair_count"];
  }
  if (params.contains("last_batch_iteration") && params["last_batch_iteration"].get<int64_t>() != -1) {
    not_supported.push_back(p.path_of("last_batch_iteration") + " = " + params["last_batch_iteration"].dump() +
                            " is not supported yet by zerotrain: remove it (a resumed run restores the " +
                            "schedule from its checkpoint)");
  }
  out.params = std::move(params);
  return out;
}

}  // namespace zt::config
