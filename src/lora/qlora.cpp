#include "lora/qlora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <set>

#include "lora/lora_linear.h"
#include "zerotrain/error.h"

namespace zt::lora {
namespace F = torch::nn::functional;

namespace {

// y = x dequant(W)^T; saves the NF4 storage only ([QLoRA Base]).
struct Nf4LinearFunction : public torch::autograd::Function<Nf4LinearFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const quant::Nf4Tensor& q) {
    save_nf4(ctx, q);
    return at::linear(x, quant::dequantize_nf4_as(q, x.scalar_type()));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!ctx->needs_input_grad(0)) return {torch::Tensor(), torch::Tensor()};
    const quant::Nf4Tensor q = load_nf4(ctx);
    const torch::Tensor& gy = grads[0];  // (..., out)
    return {at::matmul(gy, quant::dequantize_nf4_as(q, gy.scalar_type())), torch::Tensor()};
  }
};

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

// Puts q in place of a's adapter and empties the base Linear's weight (a 0-element
// placeholder: the NF4 copy is the base now). Returns q's NF4 bytes.
int64_t install_qlora_adapter(LoraModel::Adapted& a, const std::shared_ptr<QLoraAdapterImpl>& q) {
  torch::nn::LinearImpl& lin = *a.site.linear.ptr();
  lin.unregister_module(kQloraAdapterChild);
  lin.register_module(kQloraAdapterChild, q);
  a.adapter = LoraAdapter(std::static_pointer_cast<LoraAdapterImpl>(q));
  torch::NoGradGuard no_grad;
  if (lin.weight.numel() != 0) lin.weight.set_data(torch::empty({0}, lin.weight.options()));
  return q->nf4_bytes();
}

}  // namespace

QLoraAdapterImpl::QLoraAdapterImpl(const LoraAdapterImpl& from, const torch::Tensor& weight, torch::Tensor bias)
    : QLoraAdapterImpl(from, std::make_shared<const quant::Nf4Tensor>(quant::quantize_nf4(weight)), std::move(bias)) {}

QLoraAdapterImpl::QLoraAdapterImpl(const LoraAdapterImpl& from, std::shared_ptr<const quant::Nf4Tensor> nf4,
                                   torch::Tensor bias)
    : LoraAdapterImpl(from.lora_A.size(1), from.lora_B.size(0), from.r(), from.scaling(), from.dropout(),
                      from.lora_A.options()),
      nf4_(std::move(nf4)),
      bias_(std::move(bias)) {
  ZT_CHECK_T(nf4_->shape.size() == 2 && nf4_->shape[0] == from.lora_B.size(0) && nf4_->shape[1] == from.lora_A.size(1),
             ConfigError, "qlora: base weight of shape ", c10::IntArrayRef(nf4_->shape), " does not fit the adapter (A ",
             from.lora_A.sizes(), ", B ", from.lora_B.sizes(), ")");
}

torch::Tensor QLoraAdapterImpl::base_weight() const { return quant::dequantize_nf4(nf4()); }

int64_t QLoraAdapterImpl::nf4_bytes() const {
  if (storage_.defined()) return n_packed_ + n_qabsmax_ + 4 * n_absmax2_ + 4;
  return nf4_->packed.numel() + nf4_->qabsmax.numel() + 4 * nf4_->absmax2.numel() + 4;
}

quant::Nf4Tensor QLoraAdapterImpl::nf4() const {
  if (!storage_.defined()) return *nf4_;
  // [NF4 At ZeRO-3]: views of the storage's current bytes (absmax2 first: 4-byte aligned).
  const int64_t used = 4 * n_absmax2_ + n_packed_ + n_qabsmax_;
  ZT_CHECK_T(storage_.numel() >= used, ConfigError, "qlora: the NF4 base of shape ", c10::IntArrayRef(nf4_->shape),
             " is partitioned by ZeRO-3 and not gathered now (", storage_.numel(), " of ", used,
             " bytes here): run the model through the engine (its unit hooks gather it) or call "
             "Engine::gather_params() first");
  quant::Nf4Tensor q;
  q.shape = nf4_->shape;
  q.numel = nf4_->numel;
  q.offset = nf4_->offset;
  q.absmax2 = storage_.narrow(0, 0, 4 * n_absmax2_).view(at::kFloat);
  q.packed = storage_.narrow(0, 4 * n_absmax2_, n_packed_);
  q.qabsmax = storage_.narrow(0, 4 * n_absmax2_ + n_packed_, n_qabsmax_);
  return q;
}

torch::Tensor QLoraAdapterImpl::share_storage() {
  if (storage_.defined()) return storage_;
  torch::NoGradGuard no_grad;
  const quant::Nf4Tensor& q = *nf4_;
  n_packed_ = q.packed.numel();
  n_qabsmax_ = q.qabsmax.numel();
  n_absmax2_ = q.absmax2.numel();
  const int64_t used = 4 * n_absmax2_ + n_packed_ + n_qabsmax_;
  auto buf = torch::zeros({(used + 3) / 4 * 4}, torch::TensorOptions().dtype(at::kByte).device(q.packed.device()));
  buf.narrow(0, 0, 4 * n_absmax2_).view(at::kFloat).copy_(q.absmax2.contiguous());
  buf.narrow(0, 4 * n_absmax2_, n_packed_).copy_(q.packed.reshape(-1));
  buf.narrow(0, 4 * n_absmax2_ + n_packed_, n_qabsmax_).copy_(q.qabsmax.reshape(-1));
  storage_ = buf;
  // Keep the shape, numel and offset; the tensors are the storage's now.
  auto meta = std::make_shared<quant::Nf4Tensor>();
  meta->shape = q.shape;
  meta->numel = q.numel;
  meta->offset = q.offset;
  nf4_ = std::move(meta);
  return storage_;
}

void QLoraAdapterImpl::to_device(const torch::Device& device) {
  if (storage_.defined()) return;  // [NF4 At ZeRO-3]: the engine places the storage
  if (!quant::nf4_on(*nf4_, device)) nf4_ = std::make_shared<const quant::Nf4Tensor>(quant::nf4_to(*nf4_, device));
}

torch::Tensor QLoraAdapterImpl::adapt(const torch::Tensor& x, const torch::nn::LinearImpl& layer,
                                      const models::BaseLinearFn& /*base*/) {
  // [QLoRA Base]: the base from the NF4 weights; the Linear's own weight is a placeholder.
  to_device(x.device());
  if (fusable(x, torch::Tensor(), bias_)) {
    const auto b = bias_.defined() ? bias_.to(x.device(), x.scalar_type()) : bias_;
    return lora_nf4_linear(x, nf4(), b, lora_A, lora_B, scaling());
  }
  return LoraAdapterImpl::adapt(x, layer, [this](const torch::Tensor& t) {
    auto y = nf4_linear(t, nf4());  // (..., out)
    return bias_.defined() ? y + bias_.to(t.device(), t.scalar_type()) : y;
  });
}

int64_t partition_nf4_bases(LoraModel& lm, EngineOptions& eo) {
  int64_t bytes = 0;
  for (auto& a : lm.adapters) {
    auto q = std::dynamic_pointer_cast<QLoraAdapterImpl>(a.adapter.ptr());
    if (!q) continue;
    eo.frozen_storage.push_back({a.site.path + ".nf4", q->share_storage(), q->lora_A});
    bytes += q->nf4_bytes();
  }
  return bytes;
}

torch::Tensor nf4_linear(const torch::Tensor& x, const quant::Nf4Tensor& q) {
  ZT_CHECK_T(q.shape.size() == 2 && x.dim() >= 1 && x.size(-1) == q.shape[1], ConfigError,
             "qlora: input of shape ", x.sizes(), " does not fit an NF4 weight of shape ", q.shape);
  ZT_CHECK_T(quant::nf4_on(q, x.device()), ConfigError, "qlora: the NF4 weight is on ", q.packed.device(),
             ", the input on ", x.device());
  return Nf4LinearFunction::apply(x, q);
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
    bytes += install_qlora_adapter(a, q);
  }
  return bytes;
}

std::function<bool(const std::string&, const torch::Tensor&)> nf4_base_sink(const std::vector<LoraSite>& targets,
                                                                           Nf4Bases& bases) {
  std::set<std::string> names;
  for (const auto& s : targets) names.insert(s.path + ".weight");
  return [names = std::move(names), &bases](const std::string& name, const torch::Tensor& t) {
    if (!names.contains(name)) return false;
    bases[name] = std::make_shared<const quant::Nf4Tensor>(quant::quantize_nf4(t));
    return true;
  };
}

int64_t attach_nf4_bases(LoraModel& lm, Nf4Bases bases) {
  int64_t bytes = 0;
  for (auto& a : lm.adapters) {
    ZT_CHECK_T(std::dynamic_pointer_cast<QLoraAdapterImpl>(a.adapter.ptr()) == nullptr, ConfigError, "qlora: '",
               a.site.path, "' is already quantized");
    auto it = bases.find(a.site.path + ".weight");
    ZT_CHECK_T(it != bases.end(), ConfigError, "qlora: no NF4 base was made for '", a.site.path,
               "' (the sink's targets and the adapters' differ)");
    torch::nn::LinearImpl& lin = *a.site.linear.ptr();
    ZT_CHECK_T(lin.weight.numel() == 0, ConfigError, "qlora: '", a.site.path, "' holds a weight of shape ",
               lin.weight.sizes(), " beside the NF4 base made for it");
    auto q = rebuild<QLoraAdapterImpl>(*a.adapter, *a.adapter, it->second,
                                       lin.bias.defined() ? lin.bias : torch::Tensor());
    bytes += install_qlora_adapter(a, q);
    bases.erase(it);
  }
  ZT_CHECK_T(bases.empty(), ConfigError, "qlora: an NF4 base was made for '", bases.empty() ? "" : bases.begin()->first,
             "', which carries no adapter (its weight is gone); select the same targets for both");
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
