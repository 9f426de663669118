// QLoRA (Dettmers et al. 2023) on the CPU: the adapted linears' frozen base weights stored
// as NF4 (quant/nf4.h: bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64,
// compress_statistics=True)) and dequantized on the fly in each forward; the adapters stay
// in the compute dtype and train as with LoRA.
//
// [QLoRA Base]
// quantize_lora_bases swaps each adapter of a LoraModel for a QLoraAdapter holding the NF4
// form of its base weight (and a reference to the base bias), and empties the base Linear's
// weight (a 0-element placeholder, so the fp32 weight's memory is freed and nothing else can
// use it by mistake). The adapter computes
//   y = x dequant(W)^T (+ b) + (dropout(x) A^T) B^T * scaling
// dequant(W) in fp32 on the CPU, then cast to x's dtype and device per call (no CUDA kernel
// yet: on a GPU this is correct but slow). The NF4 tensors are plain members, not
// registered buffers: the engine casts floating buffers to the compute dtype, which would
// change the fp32 double-quantization statistics.
#pragma once
#include <memory>

#include "lora/lora.h"
#include "quant/nf4.h"

namespace zt::lora {

class QLoraAdapterImpl : public LoraAdapterImpl {
 public:
  // Takes `from`'s adapter values and options; `weight` (out, in) is quantized here.
  QLoraAdapterImpl(const LoraAdapterImpl& from, const torch::Tensor& weight, torch::Tensor bias);
  torch::Tensor adapt(const torch::Tensor& x, const models::BaseLinearFn& base) override;
  // dequant(W) (out, in), fp32 on the CPU.
  torch::Tensor base_weight() const;
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

// Restores each adapted linear's base weight as dequant(NF4) in its former dtype and swaps
// the QLoraAdapters back to plain LoraAdapters (e.g. before merge_lora or an HF export:
// the merged weight is then dequant(W) + scaling * B A, what the QLoRA model computed).
void dequantize_lora_bases(LoraModel& lm);

// W := dequant(quantize_nf4(W)) for the sites lm adapts, keeping plain adapters: the base a
// QLoRA adapter was trained against, in full precision (zerotrain merge --qlora).
void round_trip_nf4_bases(const LoraModel& lm);

}  // namespace zt::lora
