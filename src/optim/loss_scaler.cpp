#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "zerotrain/error.h"

namespace zt::optim {

LossScaler::LossScaler(const LossScalerOptions& o) : options_(o) {
  ZT_CHECK_T(std::isfinite(o.static_scale) && o.static_scale >= 0, ConfigError,
             "fp16.loss_scale must be 0 (dynamic) or a finite positive static scale, got ", o.static_scale);
  // 2^126 is the largest power of two a float loss can be multiplied by without overflowing
  // by itself; DeepSpeed takes any power, which then fails on the first step.
  ZT_CHECK_T(o.initial_scale_power >= 0 && o.initial_scale_power <= 126, ConfigError,
             "fp16.initial_scale_power must be in [0, 126] (scale starts at 2^power), got ",
             o.initial_scale_power);
  ZT_CHECK_T(o.scale_window >= 1, ConfigError, "fp16.loss_scale_window must be >= 1, got ", o.scale_window);
  ZT_CHECK_T(o.hysteresis >= 1, ConfigError, "fp16.hysteresis must be >= 1, got ", o.hysteresis);
  ZT_CHECK_T(std::isfinite(o.min_scale) && o.min_scale > 0, ConfigError,
             "fp16.min_loss_scale must be a finite number > 0, got ", o.min_scale);
  scale_ = dynamic() ? std::ldexp(1.0, o.initial_scale_power) : o.static_scale;
  cur_hysteresis_ = o.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic()) {
    // The scale never moves; DeepSpeed skips overflowing steps forever. Bound that too.
    if (overflow) {
      ++skipped_steps_;
      ++skips_at_min_;
      ZT_CHECK_T(options_.max_skips_at_min <= 0 || skips_at_min_ < options_.max_skips_at_min || options_.unscaled,
                 TrainingError, "static loss scale (", scale_, ") and still overflowing for ", skips_at_min_,
                 " consecutive steps: gradients are inf/NaN — check the learning rate, the data, "
                 "lower fp16.loss_scale, set it to 0 (dynamic), or use bf16");
      ZT_CHECK_T(options_.max_skips_at_min <= 0 || skips_at_min_ < options_.max_skips_at_min, TrainingError,
                 "the run diverged: gradients were inf/NaN for ", skips_at_min_,
                 " consecutive steps (each skipped); stopping instead of skipping forever — lower the learning "
                 "rate, set gradient_clipping, check the data, or resume from an earlier checkpoint (the limit is "
                 "EngineOptions::max_skipped_steps, zerotrain train --max-skipped-steps)");
    } else {
      skips_at_min_ = 0;
    }
    ++cur_iter_;
    return overflow;
  }

  if (overflow) {
    ++skipped_steps_;
    // Counted against the scale this step ran with: only overflows *at* the floor count.
    skips_at_min_ = scale_ <= options_.min_scale ? skips_at_min_ + 1 : 0;
    ZT_CHECK_T(options_.max_skips_at_min <= 0 || skips_at_min_ < options_.max_skips_at_min, TrainingError,
               "loss scale at minimum (", options_.min_scale, ") and still overflowing for ", skips_at_min_,
               " consecutive steps: gradients are inf/NaN — check the learning rate, the data, or use bf16");
    if (options_.hysteresis == 1 || cur_hysteresis_ == 1) {
      scale_ = std::max(scale_ / 2, options_.min_scale);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    skips_at_min_ = 0;
    if (options_.consecutive_hysteresis) cur_hysteresis_ = options_.hysteresis;
    int64_t stable_interval = cur_iter_ - last_overflow_iter_ - 1;
    if (stable_interval > 0 && stable_interval % options_.scale_window == 0) {
      if (!options_.consecutive_hysteresis) cur_hysteresis_ = options_.hysteresis;
      scale_ *= 2;
    }
  }
  ++cur_iter_;
  return overflow;
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"cur_hysteresis", cur_hysteresis_},
          {"skipped_steps", skipped_steps_},
          {"skips_at_min", skips_at_min_}};
}

void LossScaler::load_state(const nlohmann::json& s) {
  ZT_CHECK_T(s.is_object(), CheckpointError, "loss scaler state must be an object, got ", s.dump());
  for (const char* key : {"scale", "cur_iter", "last_overflow_iter", "cur_hysteresis", "skipped_steps",
                          "skips_at_min"})
    ZT_CHECK_T(s.contains(key) && s.at(key).is_number(), CheckpointError, "loss scaler state: \"", key,
               "\" missing or not a number in ", s.dump());
  double scale = s.at("scale").get<double>();
  ZT_CHECK_T(std::isfinite(scale) && scale > 0, CheckpointError, "loss scaler state: bad scale ", scale);
  if (!dynamic())
    ZT_CHECK_T(scale == options_.static_scale, CheckpointError, "loss scaler state has scale ", scale,
               " but fp16.loss_scale is the static scale ", options_.static_scale,
               "; use the config the checkpoint was written with");
  int hyst = s.at("cur_hysteresis").get<int>();
  ZT_CHECK_T(hyst >= 1, CheckpointError, "loss scaler state: bad cur_hysteresis ", hyst);
  scale_ = scale;
  cur_iter_ = s.at("cur_iter").get<int64_t>();
  last_overflow_iter_ = s.at("last_overflow_iter").get<int64_t>();
  // A config with a smaller hysteresis than the checkpoint's must not leave more slack.
  cur_hysteresis_ = std::min(hyst, options_.hysteresis);
  skipped_steps_ = s.at("skipped_steps").get<int64_t>();
  skips_at_min_ = s.at("skips_at_min").get<int64_t>();
}

}  // namespace zt::optim
