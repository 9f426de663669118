#include "config/reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace zt::config {

std::string join_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  std::string out(parent);
  out += '.';
  out += key;
  return out;
}

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::null: return "null";
    default: return "value";
  }
}

std::string show(const json& v) {
  // replace: a string built in memory may hold invalid UTF-8, which dump() would throw on.
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + cost});
      diag = up;
    }
  }
  return row[b.size()];
}

bool is_auto(const json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  return buf;
}

namespace {

// A string holding a JSON literal of the wanted kind ("2", "true"): the fix is to unquote.
bool quoted_literal(const json& v, bool want_number) {
  if (!v.is_string()) return false;
  json parsed = json::parse(v.get_ref<const std::string&>(), nullptr, false);
  if (parsed.is_discarded()) return false;
  return want_number ? parsed.is_number() : parsed.is_boolean();
}

std::string type_error(const std::string& path, const char* expected, const json& v, bool want_number) {
  std::string msg = path + ": expected " + expected + ", found " + type_name(v) + " " + show(v);
  if (quoted_literal(v, want_number)) {
    msg += ": write " + v.get_ref<const std::string&>() + " without quotes";
  }
  return msg;
}

std::string default_note(std::optional<double> def) {
  if (!def.has_value()) return "";
  return " (DeepSpeed's default is " + fmt(def.value()) + ")";
}
std::string default_note(std::optional<int64_t> def) {
  if (!def.has_value()) return "";
  return " (DeepSpeed's default is " + std::to_string(def.value()) + ")";
}

}  // namespace

std::optional<bool> to_bool(Context& ctx, const std::string& path, const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  ctx.error(type_error(path, "a boolean (true or false)", v, false));
  return std::nullopt;
}

std::optional<int64_t> to_int(Context& ctx, const std::string& path, const json& v, const IntRule& rule,
                              std::optional<int64_t> def) {
  int64_t out = 0;
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      ctx.error(path + ": " + show(v) + " is too large for a 64-bit integer");
      return std::nullopt;
    }
    out = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    double f = v.get<double>();
    if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) {
      ctx.error(path + ": " + show(v) + " is not a usable integer");
      return std::nullopt;
    }
    if (rule.round) {
      out = std::llround(f);
    } else if (f != std::floor(f)) {
      ctx.error(path + ": expected an integer, found " + show(v) + ": use a whole number such as " +
                fmt(std::floor(f)) + " or " + fmt(std::ceil(f)));
      return std::nullopt;
    } else {
      out = static_cast<int64_t>(f);  // integral float such as 5e8
    }
  } else {
    ctx.error(type_error(path, "an integer", v, true) + (quoted_literal(v, true) ? "" : default_note(def)));
    return std::nullopt;
  }
  if (out < rule.min) {
    ctx.error(path + ": must be >= " + std::to_string(rule.min) + ", found " + show(v) + ": use a value >= " +
              std::to_string(rule.min) + default_note(def));
    return std::nullopt;
  }
  if (out > rule.max) {
    ctx.error(path + ": must be <= " + std::to_string(rule.max) + ", found " + show(v) + ": use a value <= " +
              std::to_string(rule.max) + default_note(def));
    return std::nullopt;
  }
  return out;
}

std::optional<double> to_double(Context& ctx, const std::string& path, const json& v, const DoubleRule& rule,
                                std::optional<double> def) {
  if (!v.is_number()) {
    ctx.error(type_error(path, "a number", v, true) + (quoted_literal(v, true) ? "" : default_note(def)));
    return std::nullopt;
  }
  double f = v.get<double>();
  if (!std::isfinite(f)) {
    ctx.error(path + ": must be a finite number, found " + show(v));
    return std::nullopt;
  }
  bool low = rule.min_exclusive ? f <= rule.min : f < rule.min;
  if (low) {
    ctx.error(path + ": must be " + (rule.min_exclusive ? "> " : ">= ") + fmt(rule.min) + ", found " + show(v) +
              ": use a value " + (rule.min_exclusive ? "> " : ">= ") + fmt(rule.min) + default_note(def));
    return std::nullopt;
  }
  if (f > rule.max) {
    ctx.error(path + ": must be <= " + fmt(rule.max) + ", found " + show(v) + ": use a value <= " +
              fmt(rule.max) + default_note(def));
    return std::nullopt;
  }
  return f;
}

std::optional<std::string> to_string(Context& ctx, const std::string& path, const json& v) {
  if (v.is_string()) return v.get<std::string>();
  ctx.error(path + ": expected a string, found " + type_name(v) + " " + show(v) + ": put the value in quotes");
  return std::nullopt;
}

// ---- Context -------------------------------------------------------------------------

size_t Context::track(const std::string& path, const json* object) {
  tracked_.push_back(Tracked{path, object, {}, false});
  return tracked_.size() - 1;
}

void Context::mark_known(size_t id, std::string_view key) { tracked_[id].known.emplace(key); }

std::string Context::suggestion(const Tracked& section, const std::string& key) const {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& k : section.known) {
    size_t d = edit_distance(lower(key), lower(k));
    if (d < best_d) best_d = d, best = k;
  }
  if (best_d <= 1) return ": did you mean " + best + "?";
  // The exact key of another section ("stage" at the top, "loss_scale" in bf16).
  for (const auto& other : tracked_) {
    if (&other == &section || other.path == section.path) continue;
    if (other.known.count(key)) return ": did you mean " + join_path(other.path, key) + "?";
  }
  if (!best.empty() && best_d <= std::max<size_t>(3, key.size() / 3)) return ": did you mean " + best + "?";
  // A truncated key ("wall_clock" for wall_clock_breakdown).
  if (key.size() >= 4) {
    for (const auto& k : section.known)
      if (lower(k).rfind(lower(key), 0) == 0) return ": did you mean " + k + "?";
  }
  if (section.known.empty()) return ": this object takes no keys";
  if (section.known.size() <= 24) {
    std::string list;
    for (const auto& k : section.known) list += (list.empty() ? "" : ", ") + k;
    return ": known keys here are " + list;
  }
  return ": see docs/config.md for the keys zerotrain knows";
}

void Context::check_unknown_keys() {
  for (const auto& t : tracked_) {
    if (!t.object || t.accept_all || !t.object->is_object()) continue;
    for (auto it = t.object->begin(); it != t.object->end(); ++it) {
      if (t.known.count(it.key())) continue;
      error("unknown key " + join_path(t.path, it.key()) + suggestion(t, it.key()));
    }
  }
}

// ---- Section -------------------------------------------------------------------------

Section::Section(Context& ctx, std::string path, const json* object)
    : ctx_(&ctx), path_(std::move(path)), object_(object) {
  if (object_ && object_->is_null()) object_ = nullptr;
  if (object_ && !object_->is_object()) {
    ctx.error(path_ + ": expected an object ({...}), found " + type_name(*object_) + " " + show(*object_));
    object_ = nullptr;
  }
  id_ = ctx.track(path_, object_);
}

bool Section::has(std::string_view key, Aliases aliases) const {
  if (!object_) return false;
  auto given = [&](std::string_view k) {
    auto it = object_->find(std::string(k));
    return it != object_->end() && !is_auto(*it) && !it->is_null();
  };
  if (given(key)) return true;
  for (auto a : aliases)
    if (given(a)) return true;
  return false;
}

std::string Section::path_of(std::string_view key, Aliases aliases) const {
  if (object_) {
    if (object_->contains(std::string(key))) return join_path(path_, key);
    for (auto a : aliases)
      if (object_->contains(std::string(a))) return join_path(path_, a);
  }
  return join_path(path_, key);
}

const json* Section::find(std::string_view key, Aliases aliases) {
  ctx_->mark_known(id_, key);
  for (auto a : aliases) ctx_->mark_known(id_, a);
  if (!object_) return nullptr;
  const json* found = nullptr;
  std::string found_key;
  auto consider = [&](std::string_view k) {
    auto it = object_->find(std::string(k));
    if (it == object_->end()) return;
    if (!found) {
      found = &*it;
      found_key = std::string(k);
    } else if (*found != *it) {
      ctx_->error(join_path(path_, found_key) + " (" + show(*found) + ") and " + join_path(path_, k) + " (" +
                  show(*it) + ") are the same setting under two names: keep one");
    }
  };
  consider(key);
  for (auto a : aliases) consider(a);
  if (!found) return nullptr;
  if (is_auto(*found)) {
    ctx_->note_auto(join_path(path_, found_key));
    return nullptr;
  }
  return found;
}

const json* Section::raw(std::string_view key) {
  ctx_->mark_known(id_, key);
  if (!object_) return nullptr;
  auto it = object_->find(std::string(key));
  return it == object_->end() ? nullptr : &*it;
}

bool Section::get_bool(std::string_view key, bool def, Aliases aliases) {
  const json* v = find(key, aliases);
  if (!v) return def;
  return to_bool(*ctx_, path_of(key, aliases), *v).value_or(def);
}

int64_t Section::get_int(std::string_view key, int64_t def, IntRule rule, Aliases aliases) {
  const json* v = find(key, aliases);
  if (!v) return def;
  return to_int(*ctx_, path_of(key, aliases), *v, rule, def).value_or(def);
}

std::optional<int64_t> Section::get_opt_int(std::string_view key, IntRule rule, Aliases aliases) {
  const json* v = find(key, aliases);
  if (!v || v->is_null()) return std::nullopt;
  return to_int(*ctx_, path_of(key, aliases), *v, rule);
}

double Section::get_double(std::string_view key, double def, DoubleRule rule, Aliases aliases) {
  const json* v = find(key, aliases);
  if (!v) return def;
  return to_double(*ctx_, path_of(key, aliases), *v, rule, def).value_or(def);
}

std::string Section::get_string(std::string_view key, std::string def, Aliases allowed, Aliases aliases) {
  const json* v = find(key, aliases);
  if (!v) return def;
  std::string path = path_of(key, aliases);
  auto s = to_string(*ctx_, path, *v);
  if (!s) return def;
  if (allowed.size() == 0) return *s;
  for (auto a : allowed)
    if (lower(a) == lower(*s)) return std::string(a);
  std::string list;
  for (auto a : allowed) list += (list.empty() ? "\"" : ", \"") + std::string(a) + "\"";
  ctx_->error(path + ": \"" + *s + "\" is not one of " + list + ": use one of them (DeepSpeed's default is \"" +
              def + "\")");
  return def;
}

Section Section::sub(std::string_view key, Aliases aliases) {
  const json* v = find(key, aliases);
  return Section(*ctx_, path_of(key, aliases), v);
}

}  // namespace zt::config
