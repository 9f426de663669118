// fp16 loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py,
// DynamicLossScaler.update_scale), plus a bounded number of skips at the minimum scale.
//
// Contract: the engine multiplies the loss by scale() before backward, reduces an
// "any inf/NaN in any rank's gradients" flag, then calls update(overflow) exactly once per
// optimizer step (every rank with the same flag, so every rank keeps the same state).
// update() returns true when the step must be skipped; the new scale applies to the next
// step. Overflowing steps are skipped for static scales too (DeepSpeed checks overflow
// whatever the scale kind).
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

namespace zt::optim {

// Mirrors DeepSpeed's fp16 section; the field comments give the config key.
struct LossScalerOptions {
  double static_scale = 0;          // fp16.loss_scale: > 0 = static scale, 0 = dynamic
  int initial_scale_power = 16;     // fp16.initial_scale_power: dynamic scale starts at 2^power
  int64_t scale_window = 1000;      // fp16.loss_scale_window: clean steps before scale *= 2
  int hysteresis = 2;               // fp16.hysteresis: overflows tolerated before scale /= 2
  bool consecutive_hysteresis = false;  // fp16.consecutive_hysteresis: refill on every clean step
  double min_scale = 1;             // fp16.min_loss_scale
  // zerotrain only: consecutive skipped steps tolerated at min_scale (or at a static scale)
  // before update() throws zt::TrainingError; <= 0 disables the check (DeepSpeed's endless
  // "reducing to 1" loop).
  int max_skips_at_min = 50;
  // zerotrain only: bf16/fp32 (static scale 1, no fp16): the limit's message speaks of a
  // diverged run instead of fp16's loss scale.
  bool unscaled = false;
};

class LossScaler {
 public:
  // Throws zt::ConfigError naming the fp16.* key of a bad option.
  explicit LossScaler(const LossScalerOptions& options = {});

  double scale() const { return scale_; }
  bool dynamic() const { return options_.static_scale == 0; }

  // Call once per optimizer step with the globally reduced overflow flag. Returns true when
  // the step must be skipped (overflow == true). Dynamic scale, as DeepSpeed:
  //  - overflow with the hysteresis used up (counter == 1, or hysteresis == 1):
  //    scale = max(scale / 2, min_scale); the counter is NOT refilled, so the next overflow
  //    halves again;
  //  - overflow otherwise: the counter drops by one, the scale stays;
  //  - clean step: with consecutive_hysteresis the counter refills; when the number of clean
  //    steps since the last overflow (not counting this one) is a positive multiple of
  //    scale_window, scale *= 2 and (without consecutive_hysteresis) the counter refills.
  //    From a fresh start or an overflow, the first doubling comes on the
  //    (scale_window + 1)-th clean step, then every scale_window clean steps.
  // Throws zt::TrainingError once max_skips_at_min consecutive steps overflowed while the
  // scale was already at min_scale (static: at the static scale).
  bool update(bool overflow);

  int64_t skipped_steps() const { return skipped_steps_; }
  // Hysteresis overflows left before the next halving (DeepSpeed's cur_hysteresis).
  int hysteresis_left() const { return cur_hysteresis_; }

  // Checkpoint state (the options are config, not state). load_state throws
  // zt::CheckpointError on a malformed object.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t cur_iter_ = 0;             // update() calls so far
  int64_t last_overflow_iter_ = -1;  // cur_iter_ of the last overflow
  int cur_hysteresis_;
  int64_t skipped_steps_ = 0;
  int64_t skips_at_min_ = 0;         // consecutive overflows seen at the minimum scale
};

}  // namespace zt::optim
