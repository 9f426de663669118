// DeepSpeed's LR schedules (deepspeed/runtime/lr_schedules.py) re-derived as functions of
// the step index. Each get_lr below is written with DeepSpeed's operation order in double
// precision so that the values are bit-identical to the Python ones. See [LR step index]
// in lr_schedule.h for the step convention.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <vector>

#include "config/reader.h"
#include "zerotrain/error.h"

namespace zt::optim {
namespace {

constexpr const char* kLog = "log";
constexpr const char* kLinear = "linear";

using config::edit_distance;  // the config reader's, for "did you mean" suggestions

// Typed, validated access to scheduler.params. Every error names the full key path.
class Params {
 public:
  Params(const nlohmann::json& j, std::string type, std::vector<std::string> known)
      : j_(j), type_(std::move(type)), known_(std::move(known)) {
    known_.push_back("last_batch_iteration");
    ZT_CHECK_T(j_.is_null() || j_.is_object(), ConfigError,
               "scheduler.params must be an object, got ", j_.dump());
    if (j_.is_null()) return;
    for (const auto& [key, value] : j_.items()) {
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      std::string best;
      size_t best_d = SIZE_MAX;
      for (const auto& k : known_) {
        size_t d = edit_distance(key, k);
        if (d < best_d) best_d = d, best = k;
      }
      std::string known_list;
      for (const auto& k : known_) known_list += (known_list.empty() ? "" : ", ") + k;
      ZT_CHECK_T(false, ConfigError, "scheduler.params.", key, " is not a ", type_, " parameter",
                 best_d <= 3 ? "; did you mean " + best + "?" : std::string("."),
                 " Known: ", known_list);
    }
    // DeepSpeed takes last_batch_iteration as a resume offset; zerotrain resumes the step
    // count from its checkpoint instead, so only the fresh-start value is meaningful.
    if (has("last_batch_iteration")) {
      int64_t lbi = integer("last_batch_iteration", -1, INT64_MIN);
      ZT_CHECK_T(lbi == -1, ConfigError, "scheduler.params.last_batch_iteration = ", lbi,
                 ": only -1 (start from the beginning) is supported; a resumed run takes its "
                 "step from the checkpoint. Remove the key or set it to -1.");
    }
  }

  bool has(const char* key) const { return j_.is_object() && j_.contains(key); }

  // A finite number >= lo. No default (nullopt) = required.
  double number(const char* key, std::optional<double> def, double lo = 0.0) {
    if (!has(key)) {
      ZT_CHECK_T(def.has_value(), ConfigError, "scheduler.params.", key, " is required by ", type_,
                 " (no default in DeepSpeed either)");
      resolved_[key] = *def;
      return *def;
    }
    const auto& v = value(key);
    ZT_CHECK_T(v.is_number(), ConfigError, "scheduler.params.", key, " must be a number, got ", v.dump());
    double d = v.get<double>();
    ZT_CHECK_T(std::isfinite(d) && d >= lo, ConfigError, "scheduler.params.", key,
               " must be a finite number >= ", lo, ", got ", v.dump());
    resolved_[key] = d;
    return d;
  }

  // An integer >= lo; integral floats (2e3) are accepted because configs in the wild use them.
  int64_t integer(const char* key, std::optional<int64_t> def, int64_t lo) {
    if (!has(key)) {
      ZT_CHECK_T(def.has_value(), ConfigError, "scheduler.params.", key, " is required by ", type_,
                 " (no default in DeepSpeed either)");
      resolved_[key] = *def;
      return *def;
    }
    const auto& v = value(key);
    ZT_CHECK_T(v.is_number(), ConfigError, "scheduler.params.", key, " must be an integer, got ", v.dump());
    double d = v.get<double>();
    ZT_CHECK_T(std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15, ConfigError,
               "scheduler.params.", key, " must be an integer, got ", v.dump());
    auto i = static_cast<int64_t>(d);
    ZT_CHECK_T(i >= lo, ConfigError, "scheduler.params.", key, " must be >= ", lo, ", got ", v.dump());
    resolved_[key] = i;
    return i;
  }

  bool boolean(const char* key, bool def) {
    if (!has(key)) {
      resolved_[key] = def;
      return def;
    }
    const auto& v = value(key);
    ZT_CHECK_T(v.is_boolean(), ConfigError, "scheduler.params.", key, " must be true or false, got ", v.dump());
    resolved_[key] = v.get<bool>();
    return v.get<bool>();
  }

  std::string warmup_type() {
    constexpr const char* key = "warmup_type";
    if (!has(key)) {
      resolved_[key] = kLog;
      return kLog;
    }
    const auto& v = value(key);
    // DeepSpeed logs a warning and falls back to "log" for an unknown type; a typo here
    // silently changes the schedule, so zerotrain stops instead.
    ZT_CHECK_T(v.is_string() && (v.get<std::string>() == kLog || v.get<std::string>() == kLinear),
               ConfigError, "scheduler.params.warmup_type must be \"log\" or \"linear\", got ", v.dump());
    resolved_[key] = v.get<std::string>();
    return v.get<std::string>();
  }

  nlohmann::json resolved() const { return resolved_; }

 private:
  const nlohmann::json& value(const char* key) const {
    const auto& v = j_.at(key);
    ZT_CHECK_T(!(v.is_string() && v.get<std::string>() == "auto"), ConfigError, "scheduler.params.", key,
               " is \"auto\": the Hugging Face trainer fills it before DeepSpeed sees the config; "
               "`zerotrain train` fills it from its flags. Give a number when using the config directly.");
    return v;
  }

  const nlohmann::json& j_;
  std::string type_;
  std::vector<std::string> known_;
  nlohmann::json resolved_ = nlohmann::json::object();
};

void check_step(int64_t step) {
  ZT_ASSERT(step >= 0, "LR schedule step must be >= 0, got ", step);
}

class ConstantLr final : public LrSchedule {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double lr(int64_t step) const override {
    check_step(step);
    return lr_;
  }
  std::string type() const override { return "none"; }
  nlohmann::json resolved_params() const override { return nlohmann::json::object(); }

 private:
  double lr_;
};

// Log or linear warmup fraction at DeepSpeed's last_batch_iteration (lbi >= 0, lbi < steps).
double warmup_gamma(bool log_warmup, int64_t lbi, int64_t warmup_steps, double inverse_log) {
  if (log_warmup) return inverse_log * std::log(static_cast<double>(lbi + 1));
  return static_cast<double>(lbi) / static_cast<double>(warmup_steps);
}

// WarmupLR, and WarmupDecayLR when total_num_steps is set.
class WarmupLr final : public LrSchedule {
 public:
  WarmupLr(const nlohmann::json& j, double base_lr, bool decay)
      : decay_(decay) {
    Params p(j, decay ? "WarmupDecayLR" : "WarmupLR",
             decay ? std::vector<std::string>{"total_num_steps", "warmup_min_lr", "warmup_max_lr",
                                               "warmup_num_steps", "warmup_type"}
                   : std::vector<std::string>{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                              "warmup_type"});
    if (decay) total_ = p.integer("total_num_steps", std::nullopt, 1);
    min_lr_ = p.number("warmup_min_lr", 0.0);
    // Recent DeepSpeed: WarmupLR's warmup_max_lr defaults to the optimizer's lr, while
    // WarmupDecayLR keeps its historical default of 0.001.
    max_lr_ = p.number("warmup_max_lr", decay ? 0.001 : base_lr);
    int64_t configured = p.integer("warmup_num_steps", 1000, 1);
    log_ = p.warmup_type() == kLog;
    resolved_ = p.resolved();
    // DeepSpeed clamps to 2 so that 1 / log(warmup_num_steps) is finite.
    warmup_ = std::max<int64_t>(2, configured);
    inverse_log_ = 1.0 / std::log(static_cast<double>(warmup_));
    if (decay_ && total_ < warmup_)
      std::fprintf(stderr,
                   "zerotrain: warning: scheduler.params.total_num_steps (%lld) < warmup_num_steps (%lld): "
                   "the lr drops to 0 right after warmup (DeepSpeed accepts this too)\n",
                   static_cast<long long>(total_), static_cast<long long>(warmup_));
  }

  double lr(int64_t step) const override {
    check_step(step);
    int64_t lbi = step - 1;
    if (lbi < 0) return min_lr_;  // DeepSpeed: get_lr() before the first step() is min_lr
    return min_lr_ + (max_lr_ - min_lr_) * gamma(lbi);
  }
  std::string type() const override { return decay_ ? "WarmupDecayLR" : "WarmupLR"; }
  nlohmann::json resolved_params() const override { return resolved_; }

 private:
  double gamma(int64_t lbi) const {
    if (lbi < warmup_) return warmup_gamma(log_, lbi, warmup_, inverse_log_);
    if (!decay_) return 1.0;
    return std::max(0.0, static_cast<double>(total_ - lbi) /
                             std::max(1.0, static_cast<double>(total_ - warmup_)));
  }

  bool decay_;
  int64_t total_ = 0;
  double min_lr_ = 0, max_lr_ = 0;
  int64_t warmup_ = 2;
  bool log_ = true;
  double inverse_log_ = 0;
  nlohmann::json resolved_;
};

class WarmupCosineLr final : public LrSchedule {
 public:
  WarmupCosineLr(const nlohmann::json& j, double base_lr) : base_lr_(base_lr) {
    Params p(j, "WarmupCosineLR",
             {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type"});
    total_ = p.integer("total_num_steps", std::nullopt, 1);
    warmup_min_ratio_ = p.number("warmup_min_ratio", 0.0);
    int64_t configured = p.integer("warmup_num_steps", 1000, 1);
    cos_min_ratio_ = p.number("cos_min_ratio", 0.0001);
    log_ = p.warmup_type() == kLog;
    resolved_ = p.resolved();
    warmup_ = std::max<int64_t>(2, configured);
    inverse_log_ = 1.0 / std::log(static_cast<double>(warmup_));
    if (total_ < warmup_)
      std::fprintf(stderr,
                   "zerotrain: warning: scheduler.params.total_num_steps (%lld) < warmup_num_steps (%lld): "
                   "the lr ratio stays at cos_min_ratio after warmup\n",
                   static_cast<long long>(total_), static_cast<long long>(warmup_));
  }

  double lr(int64_t step) const override {
    check_step(step);
    int64_t lbi = step - 1;
    if (lbi < 0) return 0.0;  // DeepSpeed: get_lr() before the first step() is 0.0
    return base_lr_ * ratio(lbi);
  }
  std::string type() const override { return "WarmupCosineLR"; }
  nlohmann::json resolved_params() const override { return resolved_; }

 private:
  double ratio(int64_t lbi) const {
    if (lbi < warmup_) {
      double r = warmup_gamma(log_, lbi, warmup_, inverse_log_);
      double delta = 1.0 - warmup_min_ratio_;
      return warmup_min_ratio_ + r * delta;
    }
    double real_last_step = static_cast<double>(lbi - warmup_ + 1);
    double real_total_steps = static_cast<double>(std::max<int64_t>(1, total_ - warmup_));
    // Recent DeepSpeed clamps the progress so the ratio stays at cos_min_ratio past the end
    // instead of climbing back up the cosine.
    double progress = std::min(1.0, real_last_step / real_total_steps);
    double delta = 1.0 - cos_min_ratio_;
    double r = (1 + std::cos(std::numbers::pi * progress)) / 2;
    return std::max(0.0, cos_min_ratio_ + delta * r);
  }

  double base_lr_;
  int64_t total_ = 0;
  double warmup_min_ratio_ = 0, cos_min_ratio_ = 0;
  int64_t warmup_ = 2;
  bool log_ = true;
  double inverse_log_ = 0;
  nlohmann::json resolved_;
};

class OneCycle final : public LrSchedule {
 public:
  explicit OneCycle(const nlohmann::json& j) {
    Params p(j, "OneCycle",
             {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
              "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
              "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"});
    min_lr_ = p.number("cycle_min_lr", std::nullopt);
    max_lr_ = p.number("cycle_max_lr", std::nullopt);
    decay_lr_rate_ = p.number("decay_lr_rate", 0.0);
    first_ = static_cast<double>(p.integer("cycle_first_step_size", 2000, 1));
    second_ = p.has("cycle_second_step_size")
                  ? static_cast<double>(p.integer("cycle_second_step_size", std::nullopt, 1))
                  : first_;
    first_stairs_ = p.integer("cycle_first_stair_count", 0, 0);
    second_stairs_ = p.has("cycle_second_stair_count")
                         ? p.integer("cycle_second_stair_count", std::nullopt, 0)
                         : first_stairs_;
    decay_step_size_ = static_cast<double>(p.integer("decay_step_size", 0, 0));
    cycle_momentum_ = p.boolean("cycle_momentum", true);
    min_mom_ = p.number("cycle_min_mom", 0.8);
    max_mom_ = p.number("cycle_max_mom", 0.9);
    decay_mom_rate_ = p.number("decay_mom_rate", 0.0);
    resolved_ = p.resolved();
    resolved_["cycle_second_step_size"] = static_cast<int64_t>(second_);
    resolved_["cycle_second_stair_count"] = second_stairs_;
    total_ = first_ + second_;
    step_ratio_ = first_ / total_;
    // DeepSpeed skips a decay when its step size or its rate is (close to) zero.
    skip_lr_decay_ = decay_step_size_ == 0.0 || decay_lr_rate_ == 0.0;
    skip_mom_decay_ = decay_step_size_ == 0.0 || decay_mom_rate_ == 0.0;
  }

  double lr(int64_t step) const override {
    check_step(step);
    int64_t lbi = step - 1;  // lbi = -1 gives cycle_min_lr, what DeepSpeed's constructor sets
    if (static_cast<double>(lbi) < total_) return min_lr_ + (max_lr_ - min_lr_) * scale_factor(lbi);
    if (skip_lr_decay_) return min_lr_;
    double interval = static_cast<double>(lbi - static_cast<int64_t>(total_) + 1) / decay_step_size_;
    return min_lr_ / (1 + decay_lr_rate_ * interval);
  }

  std::optional<double> momentum(int64_t step) const override {
    check_step(step);
    if (!cycle_momentum_) return std::nullopt;
    int64_t lbi = step - 1;
    // DeepSpeed's constructor sets betas[0] = cycle_min_mom, although the formula at
    // lbi = -1 would give cycle_max_mom; the first step runs with the constructor's value.
    if (lbi < 0) return min_mom_;
    if (static_cast<double>(lbi) < total_) return max_mom_ - (max_mom_ - min_mom_) * scale_factor(lbi);
    if (skip_mom_decay_) return max_mom_;
    double interval = static_cast<double>(lbi - static_cast<int64_t>(total_) + 1) / decay_step_size_;
    return max_mom_ * (1 + decay_mom_rate_ * interval);  // sic: DeepSpeed grows momentum here
  }

  std::optional<double> beta2(int64_t step) const override {
    check_step(step);
    if (!cycle_momentum_) return std::nullopt;
    return 0.99;
  }

  std::string type() const override { return "OneCycle"; }
  nlohmann::json resolved_params() const override { return resolved_; }

 private:
  double scale_factor(int64_t lbi) const {
    double b = static_cast<double>(lbi + 1);
    double cycle = std::floor(1 + b / total_);
    double x = 1. + b / total_ - cycle;
    double scale;
    int64_t stairs;
    if (x <= step_ratio_) {
      scale = x / step_ratio_;
      stairs = first_stairs_;
    } else {
      scale = (x - 1) / (step_ratio_ - 1);
      stairs = second_stairs_;
    }
    if (stairs > 0) {
      // Stairs are counted from the integer position in the cycle (DeepSpeed's current
      // code), so a float scale a hair under 1.0 cannot drop a whole stair at the peak.
      double s = static_cast<double>(stairs);
      double ci = std::fmod(b, total_);
      double pos = ci <= first_ ? ci * s / first_ : (total_ - ci) * s / second_;
      scale = std::floor(pos) / s;
    }
    return scale;
  }

  double min_lr_ = 0, max_lr_ = 0, decay_lr_rate_ = 0;
  double first_ = 0, second_ = 0, total_ = 0, step_ratio_ = 0;
  int64_t first_stairs_ = 0, second_stairs_ = 0;
  double decay_step_size_ = 0;
  bool cycle_momentum_ = true;
  double min_mom_ = 0, max_mom_ = 0, decay_mom_rate_ = 0;
  bool skip_lr_decay_ = true, skip_mom_decay_ = true;
  nlohmann::json resolved_;
};

class LrRangeTest final : public LrSchedule {
 public:
  explicit LrRangeTest(const nlohmann::json& j) {
    Params p(j, "LRRangeTest",
             {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
              "lr_range_test_staircase"});
    min_lr_ = p.number("lr_range_test_min_lr", 1e-3);
    step_size_ = static_cast<double>(p.integer("lr_range_test_step_size", 2000, 1));
    step_rate_ = p.number("lr_range_test_step_rate", 1.0);
    staircase_ = p.boolean("lr_range_test_staircase", false);
    resolved_ = p.resolved();
  }
  double lr(int64_t step) const override {
    check_step(step);
    double x = static_cast<double>(step) / step_size_;  // DeepSpeed: (lbi + 1) / step_size
    double interval = staircase_ ? std::floor(x) : x;
    return min_lr_ * (1 + step_rate_ * interval);
  }
  std::string type() const override { return "LRRangeTest"; }
  nlohmann::json resolved_params() const override { return resolved_; }

 private:
  double min_lr_ = 0, step_size_ = 1, step_rate_ = 0;
  bool staircase_ = false;
  nlohmann::json resolved_;
};

}  // namespace

std::unique_ptr<LrSchedule> make_lr_schedule(const std::string& type, const nlohmann::json& params,
                                             double base_lr) {
  ZT_CHECK_T(std::isfinite(base_lr) && base_lr >= 0, ConfigError,
             "optimizer.params.lr must be a finite number >= 0, got ", base_lr);
  if (type.empty() || type == "none") {
    ZT_CHECK_T(params.is_null() || params.empty(), ConfigError,
               "scheduler.params given without a scheduler.type: set scheduler.type (WarmupLR, "
               "WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest) or remove the params");
    return std::make_unique<ConstantLr>(base_lr);
  }
  if (type == "WarmupLR") return std::make_unique<WarmupLr>(params, base_lr, false);
  if (type == "WarmupDecayLR") return std::make_unique<WarmupLr>(params, base_lr, true);
  if (type == "WarmupCosineLR") return std::make_unique<WarmupCosineLr>(params, base_lr);
  if (type == "OneCycle") return std::make_unique<OneCycle>(params);
  if (type == "LRRangeTest") return std::make_unique<LrRangeTest>(params);
  throw ConfigError(detail::cat("scheduler.type \"", type,
                                "\" is not a DeepSpeed schedule: use WarmupLR, WarmupDecayLR, "
                                "WarmupCosineLR, OneCycle or LRRangeTest"));
}

}  // namespace zt::optim
