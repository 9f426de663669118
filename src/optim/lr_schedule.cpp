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

#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::optim {
namespace {

constexpr const char* kLog = "log";

// Reads scheduler.params as the config layer resolved them (src/config/scheduler.cpp):
// every key present, validated and with DeepSpeed's defaults filled, derived defaults
// resolved. A missing or mistyped key here is a bug (InternalError), not a user error.
class Params {
 public:
  Params(const nlohmann::json& j, std::string type) : j_(j), type_(std::move(type)) {
    ZT_ASSERT(j_.is_object(), "scheduler.params of ", type_, " must be the config's resolved object, got ", j_.dump());
  }
  double number(const char* key) const {
    const auto& v = at(key);
    ZT_ASSERT(v.is_number(), "scheduler.params.", key, " is not a number: ", v.dump());
    return v.get<double>();
  }
  int64_t integer(const char* key) const {
    const auto& v = at(key);
    ZT_ASSERT(v.is_number_integer(), "scheduler.params.", key, " is not an integer: ", v.dump());
    return v.get<int64_t>();
  }
  bool boolean(const char* key) const {
    const auto& v = at(key);
    ZT_ASSERT(v.is_boolean(), "scheduler.params.", key, " is not a boolean: ", v.dump());
    return v.get<bool>();
  }
  bool log_warmup() const {
    const auto& v = at("warmup_type");
    ZT_ASSERT(v.is_string(), "scheduler.params.warmup_type is not a string: ", v.dump());
    return v.get<std::string>() == kLog;
  }

 private:
  const nlohmann::json& at(const char* key) const {
    ZT_ASSERT(j_.contains(key), "scheduler.params.", key, " of ", type_,
              " is missing: the config layer fills every parameter (build the schedule from Config::scheduler)");
    return j_.at(key);
  }

  const nlohmann::json& j_;
  std::string type_;
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
  WarmupLr(const nlohmann::json& j, bool decay) : decay_(decay), resolved_(j) {
    Params p(j, decay ? "WarmupDecayLR" : "WarmupLR");
    if (decay) total_ = p.integer("total_num_steps");
    min_lr_ = p.number("warmup_min_lr");
    // Recent DeepSpeed: WarmupLR's warmup_max_lr defaults to the optimizer's lr (filled
    // by the config), while WarmupDecayLR keeps its historical default of 0.001.
    max_lr_ = p.number("warmup_max_lr");
    int64_t configured = p.integer("warmup_num_steps");
    log_ = p.log_warmup();
    // DeepSpeed clamps to 2 so that 1 / log(warmup_num_steps) is finite.
    warmup_ = std::max<int64_t>(2, configured);
    inverse_log_ = 1.0 / std::log(static_cast<double>(warmup_));
    if (decay_ && total_ < warmup_)
      log::warn("scheduler.params.total_num_steps (%lld) < warmup_num_steps (%lld): "
                "the lr drops to 0 right after warmup (DeepSpeed accepts this too)",
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
  WarmupCosineLr(const nlohmann::json& j, double base_lr) : base_lr_(base_lr), resolved_(j) {
    Params p(j, "WarmupCosineLR");
    total_ = p.integer("total_num_steps");
    warmup_min_ratio_ = p.number("warmup_min_ratio");
    int64_t configured = p.integer("warmup_num_steps");
    cos_min_ratio_ = p.number("cos_min_ratio");
    log_ = p.log_warmup();
    warmup_ = std::max<int64_t>(2, configured);
    inverse_log_ = 1.0 / std::log(static_cast<double>(warmup_));
    if (total_ < warmup_)
      log::warn("scheduler.params.total_num_steps (%lld) < warmup_num_steps (%lld): "
                "the lr ratio stays at cos_min_ratio after warmup",
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
  explicit OneCycle(const nlohmann::json& j) : resolved_(j) {
    Params p(j, "OneCycle");
    min_lr_ = p.number("cycle_min_lr");
    max_lr_ = p.number("cycle_max_lr");
    decay_lr_rate_ = p.number("decay_lr_rate");
    first_ = static_cast<double>(p.integer("cycle_first_step_size"));
    second_ = static_cast<double>(p.integer("cycle_second_step_size"));  // the config: = first when absent
    first_stairs_ = p.integer("cycle_first_stair_count");
    second_stairs_ = p.integer("cycle_second_stair_count");
    decay_step_size_ = static_cast<double>(p.integer("decay_step_size"));
    cycle_momentum_ = p.boolean("cycle_momentum");
    min_mom_ = p.number("cycle_min_mom");
    max_mom_ = p.number("cycle_max_mom");
    decay_mom_rate_ = p.number("decay_mom_rate");
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
  explicit LrRangeTest(const nlohmann::json& j) : resolved_(j) {
    Params p(j, "LRRangeTest");
    min_lr_ = p.number("lr_range_test_min_lr");
    step_size_ = static_cast<double>(p.integer("lr_range_test_step_size"));
    step_rate_ = p.number("lr_range_test_step_rate");
    staircase_ = p.boolean("lr_range_test_staircase");
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

std::unique_ptr<LrSchedule> make_lr_schedule(const SchedulerConfig& scheduler, double base_lr) {
  ZT_ASSERT(std::isfinite(base_lr) && base_lr >= 0, "optimizer.params.lr ", base_lr,
            " reached the schedule unvalidated (the config layer checks it)");
  const std::string& type = scheduler.type;
  const nlohmann::json& params = scheduler.params;
  if (type.empty() || type == "none") {
    ZT_ASSERT(params.is_null() || params.empty(), "scheduler.params without a scheduler.type (the config layer "
              "rejects it)");
    return std::make_unique<ConstantLr>(base_lr);
  }
  if (type == "WarmupLR") return std::make_unique<WarmupLr>(params, false);
  if (type == "WarmupDecayLR") return std::make_unique<WarmupLr>(params, true);
  if (type == "WarmupCosineLR") return std::make_unique<WarmupCosineLr>(params, base_lr);
  if (type == "OneCycle") return std::make_unique<OneCycle>(params);
  if (type == "LRRangeTest") return std::make_unique<LrRangeTest>(params);
  // The config layer lists a type it knows but zerotrain does not run in not_supported_yet.
  throw ConfigError(zt::detail::cat("scheduler.type \"", type, "\" is not supported yet by zerotrain: use WarmupLR, "
                                "WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest"));
}

}  // namespace zt::optim
