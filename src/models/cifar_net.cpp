#include "zerotrain/models/cifar_net.h"

#include "zerotrain/error.h"

namespace zt::models {
namespace F = torch::nn::functional;

CifarNetImpl::CifarNetImpl() {
  // torch::nn defaults (Kaiming-uniform) match the tutorial's nn.Conv2d / nn.Linear init.
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 5)));
  conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)));
  fc1 = register_module("fc1", torch::nn::Linear(16 * 5 * 5, 120));
  fc2 = register_module("fc2", torch::nn::Linear(120, 84));
  fc3 = register_module("fc3", torch::nn::Linear(84, 10));
}

torch::Tensor CifarNetImpl::forward(const torch::Tensor& x) {
  ZT_CHECK(x.dim() == 4 && x.size(1) == 3 && x.size(2) == 32 && x.size(3) == 32,
           "CifarNet: input must be (B, 3, 32, 32), got ", x.sizes());
  auto h = F::max_pool2d(torch::relu(conv1(x)), F::MaxPool2dFuncOptions(2));  // (B, 6, 14, 14)
  h = F::max_pool2d(torch::relu(conv2(h)), F::MaxPool2dFuncOptions(2));       // (B, 16, 5, 5)
  h = h.flatten(1);                                                          // (B, 400)
  h = torch::relu(fc1(h));                                                   // (B, 120)
  h = torch::relu(fc2(h));                                                   // (B, 84)
  return fc3(h);                                                             // (B, 10)
}

torch::Tensor CifarNetImpl::loss(const torch::Tensor& x, const torch::Tensor& labels) {
  return F::cross_entropy(forward(x).to(torch::kFloat), labels);
}

}  // namespace zt::models
