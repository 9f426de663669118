// Defaults of zt::ZeroModel (include/zerotrain/model.h) and the unit runner.
#include "zerotrain/model.h"

#include "zerotrain/error.h"

namespace zt {

torch::Tensor run_unit(const UnitHooks& hooks, int64_t unit,
                       const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x) {
  if (hooks.pre_forward) hooks.pre_forward(unit, /*recompute=*/false);
  auto y = fn(x);
  if (hooks.post_forward) hooks.post_forward(unit, /*recompute=*/false);
  return hooks.wrap_output ? hooks.wrap_output(unit, y) : y;
}

std::vector<int64_t> ZeroModel::param_shape(const std::string& name) const {
  throw ConfigError(detail::cat("the model declares deferred_init() but does not implement param_shape() (asked for '",
                                name, "'): override ZeroModel::param_shape and init_parameter, or pass "
                                "EngineOptions.param_shape / param_init"));
}

void ZeroModel::init_parameter(const std::string& name, torch::Tensor& /*t*/) const {
  throw ConfigError(detail::cat("the model declares deferred_init() but does not implement init_parameter() (asked "
                                "for '", name, "'): override ZeroModel::init_parameter, or pass "
                                "EngineOptions.param_init"));
}

}  // namespace zt
