#include "lora/lora.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include "lora/lora_linear.h"
#include "zerotrain/error.h"

namespace zt::lora {
namespace F = torch::nn::functional;

namespace {

constexpr const char* kAdapterChild = "lora";

// peft: key == target or key.endswith("." + target).
bool suffix_match(const std::string& path, const std::string& name) {
  if (path == name) return true;
  return path.size() > name.size() && path.compare(path.size() - name.size(), name.size(), name) == 0 &&
         path[path.size() - name.size() - 1] == '.';
}

std::regex compile(const std::string& re) {
  try {
    return std::regex(re, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ConfigError(detail::cat("lora: target_modules regex '", re, "' is not a valid regex: ", e.what()));
  }
}

// The adaptable linears' names for an error message: the distinct last components
// ("c_attn, c_fc, c_proj") and one full path as an example.
std::string available(const std::vector<LoraSite>& sites) {
  if (sites.empty()) return "(the model has no adaptable linear layer)";
  std::set<std::string> last;
  for (const auto& s : sites) last.insert(s.hf_path.substr(s.hf_path.rfind('.') + 1));
  std::string out;
  for (const auto& n : last) out += (out.empty() ? "" : ", ") + n;
  return out + " (full paths such as '" + sites.front().hf_path + "')";
}

}  // namespace

double LoraOptions::scaling() const {
  validate();
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

void LoraOptions::validate() const {
  ZT_CHECK_T(r > 0, ConfigError, "lora: r = ", r, " must be > 0");
  ZT_CHECK_T(std::isfinite(alpha) && alpha > 0, ConfigError, "lora: alpha (lora_alpha) = ", alpha,
             " must be finite and > 0");
  ZT_CHECK_T(dropout >= 0.0 && dropout < 1.0, ConfigError, "lora: dropout (lora_dropout) = ", dropout,
             " must be in [0, 1)");
  ZT_CHECK_T(!target_modules.empty() || !target_regex.empty(), ConfigError,
             "lora: no target modules: name the linear layers to adapt (e.g. targets=q_proj|v_proj) or give a regex");
  ZT_CHECK_T(target_modules.empty() || target_regex.empty(), ConfigError,
             "lora: target_modules is either a list of names or one regex, not both");
  for (const auto& t : target_modules)
    ZT_CHECK_T(!t.empty(), ConfigError, "lora: an entry of target_modules is empty");
  if (!target_regex.empty()) compile(target_regex);
}

// ---- the adapter -----------------------------------------------------------------------

LoraAdapterImpl::LoraAdapterImpl(int64_t in, int64_t out, int64_t r, double scaling, double dropout,
                                 const torch::TensorOptions& options)
    : scaling_(scaling), dropout_(dropout) {
  ZT_CHECK_T(r > 0 && in > 0 && out > 0, ConfigError, "lora: adapter sizes must be positive (r=", r, ", in=", in,
             ", out=", out, ")");
  torch::NoGradGuard no_grad;
  auto a = torch::empty({r, in}, torch::kFloat);
  // peft: nn.init.kaiming_uniform_(lora_A.weight, a=math.sqrt(5)) -> U(-1/sqrt(in), 1/sqrt(in)).
  torch::nn::init::kaiming_uniform_(a, std::sqrt(5.0));
  lora_A = register_parameter("lora_A", a.to(options));
  lora_B = register_parameter("lora_B", torch::zeros({out, r}, options));
}

bool LoraAdapterImpl::fusable(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) const {
  const auto dt = x.scalar_type();
  return fused_ && (dropout_ == 0 || !is_training()) && lora_A.scalar_type() == dt && lora_B.scalar_type() == dt &&
         (!weight.defined() || (!weight.requires_grad() && weight.scalar_type() == dt)) &&
         (!bias.defined() || !bias.requires_grad());
}

torch::Tensor LoraAdapterImpl::adapt(const torch::Tensor& x, const torch::nn::LinearImpl& layer,
                                     const models::BaseLinearFn& base) {
  const auto& w = layer.weight;  // (out, in); at ZeRO-3 gathered while the unit runs
  if (w.defined() && w.dim() == 2 && w.size(0) == lora_B.size(0) && w.size(1) == lora_A.size(1) &&
      fusable(x, w, layer.bias)) {
    const auto& b = layer.bias;
    return lora_linear(x, w, b.defined() && b.scalar_type() != x.scalar_type() ? b.to(x.scalar_type()) : b, lora_A,
                       lora_B, scaling_);
  }
  auto y = base(x);
  auto h = x.to(lora_A.scalar_type());
  if (dropout_ > 0 && is_training()) h = F::dropout(h, F::DropoutFuncOptions().p(dropout_).training(true));
  // peft's order: lora_B(lora_A(dropout(x))) * scaling, added to the base output.
  auto d = F::linear(F::linear(h, lora_A), lora_B) * scaling_;
  return y + d.to(y.scalar_type());
}

torch::Tensor LoraAdapterImpl::delta_weight() const {
  torch::NoGradGuard no_grad;
  // peft: transpose(B @ A, fan_in_fan_out) * scaling; zerotrain's weights are (out, in).
  return torch::matmul(lora_B.to(torch::kFloat), lora_A.to(torch::kFloat)) * scaling_;
}

// ---- sites and targets -----------------------------------------------------------------

std::vector<LoraSite> linear_sites(torch::nn::Module& model, const std::string& hf_prefix,
                                   const std::vector<std::string>& excluded) {
  std::vector<LoraSite> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& path = item.key();
    if (path.find("." + std::string(kAdapterChild) + ".") != std::string::npos) continue;
    auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value());
    if (!lin || std::find(excluded.begin(), excluded.end(), path) != excluded.end()) continue;
    out.push_back({path, hf_prefix + path, torch::nn::Linear(lin)});
  }
  return out;
}

std::vector<LoraSite> select_targets(const std::vector<LoraSite>& sites, const LoraOptions& o) {
  o.validate();
  std::vector<LoraSite> out;
  if (!o.target_regex.empty()) {
    const std::regex re = compile(o.target_regex);
    for (const auto& s : sites)
      if (std::regex_match(s.hf_path, re)) out.push_back(s);
    ZT_CHECK_T(!out.empty(), ConfigError, "lora: target_modules regex '", o.target_regex,
               "' matches no adaptable linear layer (it must match the whole module path); the linear layers are ",
               available(sites));
    return out;
  }
  std::vector<bool> chosen(sites.size(), false);
  for (const auto& name : o.target_modules) {
    bool hit = false;
    for (size_t i = 0; i < sites.size(); ++i) {
      if (suffix_match(sites[i].hf_path, name)) chosen[i] = hit = true;
    }
    ZT_CHECK_T(hit, ConfigError, "lora: target_modules entry '", name,
               "' matches no adaptable linear layer (an entry matches a module path equal to it or ending in '.",
               name, "'); the linear layers are ", available(sites));
  }
  for (size_t i = 0; i < sites.size(); ++i)
    if (chosen[i]) out.push_back(sites[i]);
  return out;
}

// ---- attach, merge, export -------------------------------------------------------------

int64_t LoraModel::trainable_params() const {
  int64_t n = 0;
  for (const auto& a : adapters) n += a.adapter->lora_A.numel() + a.adapter->lora_B.numel();
  return n;
}

std::vector<torch::Tensor> LoraModel::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& a : adapters) {
    out.push_back(a.adapter->lora_A);
    out.push_back(a.adapter->lora_B);
  }
  return out;
}

LoraModel apply_lora(torch::nn::Module& model, const std::vector<LoraSite>& sites, const LoraOptions& o,
                     LoraBase base) {
  const auto targets = select_targets(sites, o);
  const double scaling = o.scaling();
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  LoraModel lm;
  lm.options = o;
  for (const auto& s : targets) {
    torch::nn::LinearImpl& lin = *s.linear.ptr();
    ZT_CHECK_T(models::linear_adapter(lin) == nullptr, ConfigError, "lora: '", s.path,
               "' already carries an adapter (apply_lora twice?)");
    const auto& w = lin.weight;  // (out, in)
    const bool held_elsewhere = base == LoraBase::kWholeOrHeldElsewhere && w.numel() == 0;
    ZT_CHECK_T(held_elsewhere || (w.dim() == 2 && w.numel() == lin.options.out_features() * lin.options.in_features()),
               ConfigError,
               "lora: '", s.path, "' holds a placeholder weight of shape ", w.sizes(),
               " (a model built with deferred_init): build the base model whole before applying LoRA");
    LoraAdapter a(lin.options.in_features(), lin.options.out_features(), o.r, scaling, o.dropout, w.options());
    lin.register_module(kAdapterChild, a);
    lm.adapters.push_back({s, a});
  }
  return lm;
}

void merge_lora(LoraModel& lm) {
  torch::NoGradGuard no_grad;
  for (auto& a : lm.adapters) {
    auto& lin = *a.site.linear;
    auto& w = lin.weight;
    ZT_CHECK_T(w.sizes() == c10::IntArrayRef({a.adapter->lora_B.size(0), a.adapter->lora_A.size(1)}), ConfigError,
               "lora: cannot merge into '", a.site.path, "': its weight has shape ", w.sizes(),
               " (partitioned? gather the parameters first)");
    // peft: weight += delta in the weight's dtype; in fp32 here, rounded once.
    w.copy_((w.to(torch::kFloat) + a.adapter->delta_weight().to(w.device())).to(w.scalar_type()));
    lin.unregister_module(kAdapterChild);
  }
  lm.adapters.clear();
}

std::string peft_key(const std::string& hf_path, const char* which) {
  return "base_model.model." + hf_path + "." + which + ".weight";
}

std::map<std::string, torch::Tensor> peft_state_dict(const LoraModel& lm, at::ScalarType dtype) {
  std::map<std::string, torch::Tensor> sd;
  for (const auto& a : lm.adapters) {
    sd[peft_key(a.site.hf_path, "lora_A")] = a.adapter->lora_A.detach().to(torch::kCPU, dtype).contiguous();
    sd[peft_key(a.site.hf_path, "lora_B")] = a.adapter->lora_B.detach().to(torch::kCPU, dtype).contiguous();
  }
  return sd;
}

}  // namespace zt::lora
