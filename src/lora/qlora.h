// QLoRA (Dettmers et al. 2023): the adapted linears' frozen base weights stored as NF4
// (quant/nf4.h: bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64,
// compress_statistics=True)) and dequantized on the fly, on the activations' device, in
// each forward and again in each backward; the adapters stay in the compute dtype and
// train as with LoRA.
//
// [QLoRA Base]
// quantize_lora_bases swaps each adapter of a LoraModel for a QLoraAdapter holding the NF4
// form of its base weight (quantized on the CPU, blocks in parallel) and a reference to the
// base bias, and empties the base Linear's weight (a 0-element placeholder, so the fp32
// weight's memory is freed and nothing else can use it by mistake). The adapter computes
//   y = nf4_linear(x, W) (+ b) + (dropout(x) A^T) B^T * scaling
// where nf4_linear dequantizes W in x's dtype on x's device (quant::dequantize_nf4_as: the
// CUDA kernel on a GPU, torch ops on the CPU) and keeps no dequantized weight in the
// autograd graph: its backward (grad_x = grad_y W; the base has no gradient) dequantizes W
// again, so a layer's full-precision W lives only while its own matmul runs, as in
// bitsandbytes' MatMul4Bit.
// The NF4 tensors follow the activations: the first forward on a device moves them there
// once (to_device() does it ahead of time); the engine never sees them, because they are
// plain members, not registered buffers: the engine casts floating buffers to the compute
// dtype, which would change the fp32 double-quantization statistics. At ZeRO-3 the frozen
// shard group partitions the base's parameters, but the NF4 weights are not parameters:
// every rank holds all of them (0.52 bytes a weight).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lora/lora.h"
#include "quant/nf4.h"

namespace zt::lora {

class QLoraAdapterImpl : public LoraAdapterImpl {
 public:
  // Takes `from`'s adapter values and options; `weight` (out, in) is quantized here.
  QLoraAdapterImpl(const LoraAdapterImpl& from, const torch::Tensor& weight, torch::Tensor bias);
  // The same with the weight quantized already.
  QLoraAdapterImpl(const LoraAdapterImpl& from, std::shared_ptr<const quant::Nf4Tensor> nf4, torch::Tensor bias);
  torch::Tensor adapt(const torch::Tensor& x, const models::BaseLinearFn& base) override;
  // dequant(W) (out, in), fp32 on the CPU (the reference quant::dequantize_nf4).
  torch::Tensor base_weight() const;
  // Moves the NF4 tensors to `device` (no-op when there); adapt() does it on first use.
  void to_device(const torch::Device& device);
  const quant::Nf4Tensor& nf4() const { return *nf4_; }
  // Bytes of the NF4 storage: codes, 8-bit absmaxes, second-level absmaxes, offset.
  int64_t nf4_bytes() const;

 private:
  std::shared_ptr<const quant::Nf4Tensor> nf4_;
  torch::Tensor bias_;  // the base Linear's bias (shared), or undefined
};

// Quantizes every adapted linear's base weight to NF4 ([QLoRA Base]). Call after
// apply_lora / load_peft_adapter and before zt::initialize. Returns the NF4 bytes in all.
int64_t quantize_lora_bases(LoraModel& lm);

// [Layerwise QLoRA Base]
// quantize_lora_bases needs the whole base in fp32 first (Llama-3-8B: 32 GB on each rank's
// host, and minutes of drawing on one thread). For a random base the CLI instead builds the
// model as a skeleton (models::LlamaForCausalLMImpl::skeleton), selects the targets on it,
// and lets init_layerwise ([Layerwise Init]) hand each weight to a sink as soon as its
// decoder layer is drawn: a target's weight is quantized there (nf4_base_sink) and its fp32
// freed, so the host holds one layer in fp32 plus the NF4 of the rest. Then
// apply_lora(..., LoraBase::kWholeOrHeldElsewhere) draws the adapters (the generator stands
// where the whole construction leaves it, so they are the same) and attach_nf4_bases makes
// them QLoraAdapters on the NF4 made earlier: the model equals, bit for bit, the one
// quantize_lora_bases makes from the whole base (tested: QLora.LayerwiseBaseEqualsTheWholeBase).
using Nf4Bases = std::map<std::string, std::shared_ptr<const quant::Nf4Tensor>>;  // by "<site path>.weight"

// A sink for init_layerwise: quantizes the weights of the sites `targets` selects into
// `bases` and takes them; keeps every other parameter.
std::function<bool(const std::string&, const torch::Tensor&)> nf4_base_sink(const std::vector<LoraSite>& targets,
                                                                           Nf4Bases& bases);

// Gives each adapter of `lm` (made by apply_lora with LoraBase::kWholeOrHeldElsewhere, its
// base weight a 0-element placeholder) its NF4 base from `bases`, as quantize_lora_bases
// would. A missing base, or one left over, is a ConfigError. Returns the NF4 bytes in all.
int64_t attach_nf4_bases(LoraModel& lm, Nf4Bases bases);

// x (..., in) @ dequant(q)^T -> (..., out), in x's dtype, with q on x's device. Differentiable
// w.r.t. x only; the autograd node keeps q (the NF4 tensors, shared, not copied) and
// dequantizes again in backward, never a dequantized weight ([QLoRA Base]).
torch::Tensor nf4_linear(const torch::Tensor& x, const quant::Nf4Tensor& q);

// Restores each adapted linear's base weight as dequant(NF4) in its former dtype and swaps
// the QLoraAdapters back to plain LoraAdapters (e.g. before merge_lora or an HF export:
// the merged weight is then dequant(W) + scaling * B A, what the QLoRA model computed).
void dequantize_lora_bases(LoraModel& lm);

// W := dequant(quantize_nf4(W)) for the sites lm adapts, keeping plain adapters: the base a
// QLoRA adapter was trained against, in full precision (zerotrain merge --qlora).
void round_trip_nf4_bases(const LoraModel& lm);

}  // namespace zt::lora
