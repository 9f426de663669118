#include "lora/qlora.h"

#include <ATen/CPUGeneratorImpl.h>

#include "zerotrain/error.h"

namespace zt::lora {
namespace F = torch::nn::functional;

namespace {

constexpr const char* kQloraAdapterChild = "lora";  // as lora.cpp registers it

// Builds an adapter like `from` without drawing from the global generator (LoraAdapterImpl
// draws A; the values are overwritten by from's here).
template <typename Impl, typename... Args>
std::shared_ptr<Impl> rebuild(const LoraAdapterImpl& from, Args&&... args) {
  auto gen = at::detail::getDefaultCPUGenerator();
  const auto state = gen.get_state();
  auto a = std::make_shared<Impl>(std::forward<Args>(args)...);
  gen.set_state(state);
  torch::NoGradGuard no_grad;
  a->lora_A.copy_(from.lora_A);
  a->lora_B.copy_(from.lora_B);
  a->lora_A.set_requires_grad(from.lora_A.requires_grad());
  a->lora_B.set_requires_grad(from.lora_B.requires_grad());
  a->train(from.is_training());
  return a;
}

}  // namespace

QLoraAdapterImpl::QLoraAdapterImpl(const LoraAdapterImpl& from, const torch::Tensor& weight, torch::Tensor bias)
    : LoraAdapterImpl(from.lora_A.size(1), from.lora_B.size(0), from.r(), from.scaling(), from.dropout(),
                      from.lora_A.options()),
      nf4_(std::make_shared<const quant::Nf4Tensor>(quant::quantize_nf4(weight))),
      bias_(std::move(bias)) {
  ZT_CHECK_T(weight.dim() == 2 && weight.size(0) == from.lora_B.size(0) && weight.size(1) == from.lora_A.size(1),
             ConfigError, "qlora: base weight of shape ", weight.sizes(), " does not fit the adapter (A ",
             from.lora_A.sizes(), ", B ", from.lora_B.sizes(), ")");
}

torch::Tensor QLoraAdapterImpl::base_weight() const { return quant::dequantize_nf4(*nf4_); }

int64_t QLoraAdapterImpl::nf4_bytes() const {
  return nf4_->packed.numel() + nf4_->qabsmax.numel() + 4 * nf4_->absmax2.numel() + 4;
}

torch::Tensor QLoraAdapterImpl::adapt(const torch::Tensor& x, const models::BaseLinearFn& /*base*/) {
  // [QLoRA Base]: the base from the NF4 weights; the Linear's own weight is a placeholder.
  return LoraAdapterImpl::adapt(x, [this](const torch::Tensor& t) {
    const auto w = base_weight().to(t.device(), t.scalar_type());  // (out, in)
    return F::linear(t, w, bias_.defined() ? bias_.to(t.scalar_type()) : torch::Tensor());
  });
}

int64_t quantize_lora_bases(LoraModel& lm) {
  int64_t bytes = 0;
  for (auto& a : lm.adapters) {
    ZT_CHECK_T(std::dynamic_pointer_cast<QLoraAdapterImpl>(a.adapter.ptr()) == nullptr, ConfigError, "qlora: '",
               a.site.path, "' is already quantized");
    torch::nn::LinearImpl& lin = *a.site.linear.ptr();
    ZT_CHECK_T(lin.weight.numel() == lin.options.in_features() * lin.options.out_features(), ConfigError,
               "qlora: '", a.site.path, "' holds a placeholder weight (", lin.weight.sizes(),
               "): build the base whole before quantizing it");
    auto q = rebuild<QLoraAdapterImpl>(*a.adapter, *a.adapter, lin.weight.detach(),
                                       lin.bias.defined() ? lin.bias : torch::Tensor());
    bytes += q->nf4_bytes();
    lin.unregister_module(kQloraAdapterChild);
    lin.register_module(kQloraAdapterChild, q);
    a.adapter = LoraAdapter(std::static_pointer_cast<LoraAdapterImpl>(q));
    torch::NoGradGuard no_grad;
    lin.weight.set_data(torch::empty({0}, lin.weight.options()));  // freed: the NF4 copy is the base now
  }
  return bytes;
}

void dequantize_lora_bases(LoraModel& lm) {
  for (auto& a : lm.adapters) {
    auto q = std::dynamic_pointer_cast<QLoraAdapterImpl>(a.adapter.ptr());
    if (!q) continue;
    torch::nn::LinearImpl& lin = *a.site.linear.ptr();
    {
      torch::NoGradGuard no_grad;
      lin.weight.set_data(q->base_weight().to(lin.weight.options()));
    }
    auto plain = rebuild<LoraAdapterImpl>(*q, q->lora_A.size(1), q->lora_B.size(0), q->r(), q->scaling(), q->dropout(),
                                          q->lora_A.options());
    lin.unregister_module(kQloraAdapterChild);
    lin.register_module(kQloraAdapterChild, plain);
    a.adapter = LoraAdapter(plain);
  }
}

void round_trip_nf4_bases(const LoraModel& lm) {
  torch::NoGradGuard no_grad;
  for (const auto& a : lm.adapters) {
    auto& w = a.site.linear.ptr()->weight;
    w.copy_(quant::dequantize_nf4(quant::quantize_nf4(w)).to(w.options()));
  }
}

}  // namespace zt::lora
