#include "models/linear_adapter.h"

namespace zt::models {

LinearAdapter* linear_adapter(const torch::nn::LinearImpl& l) {
  for (const auto& child : l.children()) {
    if (auto* a = dynamic_cast<LinearAdapter*>(child.get())) return a;
  }
  return nullptr;
}

torch::Tensor run_linear(const torch::nn::LinearImpl& l, const torch::Tensor& x, const BaseLinearFn& base) {
  LinearAdapter* a = linear_adapter(l);
  return a ? a->adapt(x, l, base) : base(x);
}

}  // namespace zt::models
