// Internal: reading a DeepSpeed JSON config key by key while collecting every error.
//
// A Context is one parse. A Section is one JSON object at a key path ("" for the top,
// "zero_optimization.offload_optimizer", ...). Typed getters return DeepSpeed's
// default when a key is absent or "auto", record a precise error (path, expected and
// found type, the fix) and return the default when it is wrong, and remember which keys
// the object was asked for. Context::check_unknown_keys() then reports every key nobody
// asked for, with the nearest known key. Nothing here throws; config.cpp throws once.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace zt::config {

using json = nlohmann::json;
using Aliases = std::initializer_list<std::string_view>;

// Bounds of an integer key. `round` accepts non-integral numbers by rounding them
// (stage3_prefetch_bucket_size is often written as 0.9 * hidden^2).
struct IntRule {
  int64_t min = 0;
  int64_t max = std::numeric_limits<int64_t>::max();
  bool round = false;
};

// Bounds of a floating-point key.
struct DoubleRule {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
};

// One parse of a config: every error, the "auto" keys that fell back to defaults, and
// the keys each object was asked for.
class Context {
 public:
  void error(std::string message) { errors_.push_back(std::move(message)); }
  const std::vector<std::string>& errors() const { return errors_; }
  void note_auto(std::string path) { auto_defaulted_.push_back(std::move(path)); }
  const std::vector<std::string>& auto_defaulted() const { return auto_defaulted_; }

  // Registers an object whose keys must all be known at the end; returns its id.
  size_t track(const std::string& path, const json* object);
  void mark_known(size_t id, std::string_view key);
  void accept_all(size_t id) { tracked_[id].accept_all = true; }
  // One error per key that no getter asked for, with a suggestion.
  void check_unknown_keys();

 private:
  struct Tracked {
    std::string path;
    const json* object = nullptr;
    std::set<std::string, std::less<>> known;
    bool accept_all = false;
  };
  std::string suggestion(const Tracked& section, const std::string& key) const;

  std::vector<Tracked> tracked_;
  std::vector<std::string> errors_;
  std::vector<std::string> auto_defaulted_;
};

std::string join_path(std::string_view parent, std::string_view key);
// "boolean", "integer", "number", "string", "array", "object", "null".
std::string type_name(const json& value);
// Compact JSON text of a value, shortened for messages.
std::string show(const json& value);
size_t edit_distance(std::string_view a, std::string_view b);
bool is_auto(const json& value);
std::string lower(std::string_view s);
// Formats a double without trailing noise (1e-08, 0.001, 500000000).
std::string fmt(double v);

// Conversions of one value at `path`; on error they record it and return nullopt.
std::optional<bool> to_bool(Context& ctx, const std::string& path, const json& value);
std::optional<int64_t> to_int(Context& ctx, const std::string& path, const json& value,
                              const IntRule& rule, std::optional<int64_t> def = std::nullopt);
std::optional<double> to_double(Context& ctx, const std::string& path, const json& value,
                                const DoubleRule& rule, std::optional<double> def = std::nullopt);
std::optional<std::string> to_string(Context& ctx, const std::string& path, const json& value);

// A JSON object at a key path. A null or absent object reads as empty (all defaults).
class Section {
 public:
  Section(Context& ctx, std::string path, const json* object);

  const std::string& path() const { return path_; }
  Context& ctx() const { return *ctx_; }
  // Given in the config as an object.
  bool present() const { return object_ != nullptr; }
  // The raw object (nullptr when absent).
  const json* object() const { return object_; }
  // Given (under key or an alias) with a value other than "auto".
  bool has(std::string_view key, Aliases aliases = {}) const;
  // Path of the spelling actually used (key or one of its aliases).
  std::string path_of(std::string_view key, Aliases aliases = {}) const;

  // The value under key or one of its aliases, marking them all known; nullptr when
  // absent or "auto" (then the default applies and the key is noted as auto-defaulted).
  // Two spellings with different values are an error.
  const json* find(std::string_view key, Aliases aliases = {});
  // The value under key as written ("auto" included), marking it known.
  const json* raw(std::string_view key);

  bool get_bool(std::string_view key, bool def, Aliases aliases = {});
  int64_t get_int(std::string_view key, int64_t def, IntRule rule = {}, Aliases aliases = {});
  std::optional<int64_t> get_opt_int(std::string_view key, IntRule rule = {}, Aliases aliases = {});
  double get_double(std::string_view key, double def, DoubleRule rule = {}, Aliases aliases = {});
  // `allowed` (matched case-insensitively, returned in the listed spelling); empty = any.
  std::string get_string(std::string_view key, std::string def, Aliases allowed = {},
                         Aliases aliases = {});
  // Nested object; reports a non-object value and reads it as absent.
  Section sub(std::string_view key, Aliases aliases = {});

  // Keys of this object are not checked (free-form sections that are off).
  void accept_all_keys() { ctx_->accept_all(id_); }

 private:
  Context* ctx_;
  std::string path_;
  const json* object_;
  size_t id_;
};

}  // namespace zt::config
