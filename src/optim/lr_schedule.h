// Learning-rate schedules of DeepSpeed's `scheduler` config section, as pure functions of
// the step index (no hidden state: the engine checkpoints the step, not the schedule).
//
// [LR step index] lr(k) is the learning rate of the (k+1)-th *applied* optimizer step,
// k = 0, 1, 2, ... DeepSpeed builds the scheduler with last_batch_iteration = -1 (which
// sets the optimizer's lr once), then calls scheduler.step() after every optimizer step
// that was not skipped for overflow. So the (k+1)-th applied step runs with DeepSpeed's
// get_lr() at last_batch_iteration = k - 1; lr(k) returns exactly that value (computed
// with the same double-precision formulas and operation order). Consequences users
// notice, kept on purpose for parity:
//   - WarmupLR / WarmupDecayLR: lr(0) = lr(1) = warmup_min_lr with the log warmup.
//   - WarmupCosineLR: lr(0) = 0 (DeepSpeed returns 0.0 before its first step()).
//   - OneCycle momentum: momentum(0) = cycle_min_mom (set by the constructor), then the
//     cycle formula, which starts at cycle_max_mom.
// Steps skipped by the loss scaler do not advance k: pass the number of applied steps.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "zerotrain/config.h"

namespace zt::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // Learning rate of the (k+1)-th applied optimizer step. See [LR step index]. k >= 0.
  virtual double lr(int64_t step) const = 0;
  // Adam beta1 override for that step (OneCycle with cycle_momentum); nullopt = keep the
  // optimizer's own beta1.
  virtual std::optional<double> momentum(int64_t step) const { return std::nullopt; }
  // Adam beta2 override: DeepSpeed's OneCycle writes betas = (momentum, 0.99) whenever it
  // cycles momentum, replacing the configured beta2. nullopt = keep the optimizer's beta2.
  virtual std::optional<double> beta2(int64_t step) const { return std::nullopt; }
  // DeepSpeed's type name ("WarmupLR", ...; "none" for the constant schedule).
  virtual std::string type() const = 0;
  // Every parameter in force, defaults filled in (what check-config prints).
  virtual nlohmann::json resolved_params() const = 0;
};

// Builds the schedule of the config's `scheduler` section. The config layer
// (src/config/scheduler.cpp) parses and validates scheduler.params once, with DeepSpeed's
// defaults and derived defaults filled in; this only reads the resolved values (a
// SchedulerConfig not made by the config parser is a bug: InternalError). type "" is the
// constant base_lr. base_lr is the optimizer's lr (optimizer.params.lr): WarmupCosineLR
// scales it (WarmupLR's default warmup_max_lr was filled from it by the config).
std::unique_ptr<LrSchedule> make_lr_schedule(const SchedulerConfig& scheduler, double base_lr);

}  // namespace zt::optim
