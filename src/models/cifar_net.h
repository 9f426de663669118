// The CNN of DeepSpeed's CIFAR-10 tutorial (itself PyTorch's "Training a classifier"):
// conv 3->6 k5, maxpool 2, conv 6->16 k5, maxpool 2, fc 400->120->84->10, ReLU between.
// 62,006 parameters; parameter names conv1.weight ... fc3.bias as in the tutorial.
#pragma once
#include <torch/torch.h>

namespace zt::models {

struct CifarNetImpl : torch::nn::Module {
  CifarNetImpl();
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
