// The CNN of DeepSpeed's CIFAR-10 tutorial (itself PyTorch's "Training a classifier"):
// conv 3->6 k5, maxpool 2, conv 6->16 k5, maxpool 2, fc 400->120->84->10, ReLU between.
// 62,006 parameters; parameter names conv1.weight ... fc3.bias as in the tutorial.
#pragma once
#include <torch/torch.h>

#include "zerotrain/model.h"

namespace zt::models {

// Training FLOPs per image: 3 x (2 x the multiply-adds of the convolutions and the
// linear layers) = 3 x 2 x 651,720 (biases, ReLU and pooling not counted, as in 6N).
inline constexpr double kCifarNetFlopsPerSample = 3.0 * 2.0 * 651720.0;

// Implements zt::ZeroModel for its FLOPs only: one root unit, no placeholders.
struct CifarNetImpl : torch::nn::Module, zt::ZeroModel {
  CifarNetImpl();
  // A sample (image) counts as one token; seq is ignored.
  double flops_per_token(int64_t /*seq*/) const override { return kCifarNetFlopsPerSample; }
  // x (B, 3, 32, 32) float -> logits (B, 10) in the parameter dtype.
  torch::Tensor forward(const torch::Tensor& x);
  // Mean cross entropy in fp32; labels (B) int64 in [0, 10).
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& labels);

  torch::nn::Conv2d conv1{nullptr};  // weight (6, 3, 5, 5)
  torch::nn::Conv2d conv2{nullptr};  // weight (16, 6, 5, 5)
  torch::nn::Linear fc1{nullptr};    // weight (120, 400)
  torch::nn::Linear fc2{nullptr};    // weight (84, 120)
  torch::nn::Linear fc3{nullptr};    // weight (10, 84)
};
TORCH_MODULE(CifarNet);

}  // namespace zt::models
