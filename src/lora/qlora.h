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
// bitsandbytes' MatMul4Bit. Without dropout in training the whole sum is one function,
// lora_nf4_linear ([Fused LoRA Linear] in lora/lora_linear.h), dequantizing and saving the
// same way.
// The NF4 tensors follow the activations: the first forward on a device moves them there
// once (to_device() does it ahead of time); the engine never sees them, because they are
// plain members, not registered buffers: the engine casts floating buffers to the compute
// dtype, which would change the fp32 double-quantization statistics. At ZeRO-3 the frozen
// shard group partitions the base's parameters; the NF4 weights, not parameters, are
// partitioned too when partition_nf4_bases hands them to the engine ([NF4 At ZeRO-3]);
// otherwise every rank holds all of them (0.52 bytes a weight).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lora/lora.h"
#include "quant/nf4.h"
#include "zerotrain/engine.h"

namespace zt::lora {

class QLoraAdapterImpl : public LoraAdapterImpl {
 public:
  // Takes `from`'s adapter values and options; `weight` (out, in) is quantized here.
  QLoraAdapterImpl(const LoraAdapterImpl& from, const torch::Tensor& weight, torch::Tensor bias);
  // The same with the weight quantized already.
  QLoraAdapterImpl(const LoraAdapterImpl& from, std::shared_ptr<const quant::Nf4Tensor> nf4, torch::Tensor bias);
  // The base from the NF4 weights (layer's weight is a placeholder); fused with the update
  // when fusable() ([Fused LoRA Linear] in lora/lora_linear.h).
  torch::Tensor adapt(const torch::Tensor& x, const torch::nn::LinearImpl& layer,
                      const models::BaseLinearFn& base) override;
  // dequant(W) (out, in), fp32 on the CPU (the reference quant::dequantize_nf4).
  torch::Tensor base_weight() const;
  // Moves the NF4 tensors to `device` (no-op when there); adapt() does it on first use.
  // No-op once the storage is shared: the engine places it.
  void to_device(const torch::Device& device);
  // The NF4 weight (views of the shared storage once share_storage() ran: valid only while
  // the engine has it gathered; an error otherwise).
  quant::Nf4Tensor nf4() const;
  // Bytes of the NF4 storage: codes, 8-bit absmaxes, second-level absmaxes, offset (whole,
  // whatever the engine partitions).
  int64_t nf4_bytes() const;

  // [NF4 At ZeRO-3]: moves the NF4 tensors into one uint8 buffer (absmax2's fp32 bytes,
  // the packed codes, the 8-bit absmaxes, zero padding to a multiple of 4 bytes; the offset
  // stays a float member) and returns it; from then on nf4() reads views of that buffer's
  // current data, so an owner that swaps it (the ZeRO-3 engine: empty between gathers, the
  // gathered bytes while the unit runs) decides where they are. Idempotent.
  torch::Tensor share_storage();
  bool storage_shared() const { return storage_.defined(); }

 private:
  std::shared_ptr<const quant::Nf4Tensor> nf4_;  // the weight; shape/numel/offset only once shared
  torch::Tensor storage_;                        // share_storage()'s buffer (swapped by its owner)
  int64_t n_packed_ = 0, n_qabsmax_ = 0, n_absmax2_ = 0;  // element counts inside storage_
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

// [NF4 At ZeRO-3]
// At ZeRO-3 the engine partitions the base's parameters, but an adapted linear's NF4 weight
// is not a parameter. partition_nf4_bases hands each QLoRA adapter's NF4 storage (one uint8
// buffer, share_storage()) to the engine as EngineOptions::frozen_storage, in the unit of
// the adapter's lora_A (its decoder layer / block): the engine keeps 1/N of each unit's
// bytes on each of the N data-parallel ranks (each unit padded to a multiple of 64 N bytes),
// all-gathers a unit's NF4 just before its forward, and again before its backward and a
// checkpointed recompute, and frees it after, as for the bf16 base ([Frozen Units]). The
// bytes are those quantize_nf4 made (partitioned after quantizing), so the math is the
// whole base's bit for bit. Call after quantizing, before zt::initialize at ZeRO stage 3
// (a ConfigError below). Returns the NF4 bytes handed over (whole). A model without QLoRA
// adapters hands nothing.
int64_t partition_nf4_bases(LoraModel& lm, EngineOptions& eo);

// Restores each adapted linear's base weight as dequant(NF4) in its former dtype and swaps
// the QLoraAdapters back to plain LoraAdapters (e.g. before merge_lora or an HF export:
// the merged weight is then dequant(W) + scaling * B A, what the QLoRA model computed).
void dequantize_lora_bases(LoraModel& lm);

// W := dequant(quantize_nf4(W)) for the sites lm adapts, keeping plain adapters: the base a
// QLoRA adapter was trained against, in full precision (zerotrain merge --qlora).
void round_trip_nf4_bases(const LoraModel& lm);

}  // namespace zt::lora
