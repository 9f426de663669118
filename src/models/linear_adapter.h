// The hook through which an adapter (LoRA, QLoRA: src/lora/) takes over a model's linear
// layer without replacing it.
//
// [Linear Adapters]
// GPT-2 and the Llama family hold their linears as torch::nn::Linear members and call them
// through their own functions (gpt2.cpp linear(), llama.cpp proj()). Replacing a child with
// Module::replace_module would not reach those members (the holder keeps the old module),
// and would rename the base weights away from Hugging Face's names, which the loaders,
// param_shape and checkpoints use. Instead an adapter is registered as a child module of
// the Linear itself (LoRA: "<path>.lora"), and the models' linear calls go through
// run_linear(), which hands the call to the adapter when one is there. The base Linear
// keeps its parameters and names ("model.layers.0.self_attn.q_proj.weight"); the adapter's
// parameters are named under it ("...q_proj.lora.lora_A.weight"), so they belong to the
// same ZeRO-3 unit (the layer) as the base. A Linear without children costs one empty
// children() lookup per call.
#pragma once
#include <torch/torch.h>

#include <functional>

namespace zt::models {

// The base layer's own computation, y = x W^T (+ b), as the model does it.
using BaseLinearFn = std::function<torch::Tensor(const torch::Tensor&)>;

class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  // The adapted output for input x (..., in) of `layer` (the Linear the adapter hangs on).
  // `base` computes the frozen layer as the model would without the adapter; an adapter
  // may compute it its own way instead: from layer's weight and bias (LoRA's fused path,
  // [Fused LoRA Linear] in lora/lora_linear.h) or from base weights it stores itself
  // (QLoRA's NF4 weights).
  virtual torch::Tensor adapt(const torch::Tensor& x, const torch::nn::LinearImpl& layer, const BaseLinearFn& base) = 0;
};

// The adapter registered on `l` (its first child implementing LinearAdapter), or null.
LinearAdapter* linear_adapter(const torch::nn::LinearImpl& l);

// base(x), or the adapter's output when `l` carries one. [Linear Adapters]
torch::Tensor run_linear(const torch::nn::LinearImpl& l, const torch::Tensor& x, const BaseLinearFn& base);

}  // namespace zt::models
