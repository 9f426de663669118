#include "zerotrain/models/cifar_moe_net.h"

#include <map>

#include "models/moe.h"
#include "parallel/topology.h"
#include "zerotrain/error.h"
#include "zerotrain/models/cifar_net.h"

namespace zt::models {
namespace F = torch::nn::functional;

namespace {

constexpr int64_t kCifarMoEHidden = 84;
const std::string kCifarMoEPrefix = "moe_layer_list.";
const std::string kCifarMoEExperts = ".experts.";

}  // namespace

void check_cifar_moe_options(const CifarMoEOptions& o, int ep) {
  ZT_CHECK_T(ep >= 1, ConfigError, "CIFAR MoE: --ep must be >= 1, got ", ep);
  ZT_CHECK_T(!o.num_experts.empty(), ConfigError,
             "CIFAR MoE: --num-experts needs at least one entry (one MoE layer each, e.g. --num-experts 2 4)");
  for (size_t l = 0; l < o.num_experts.size(); ++l) {
    const int64_t e = o.num_experts[l];
    ZT_CHECK_T(e >= 1, ConfigError, "CIFAR MoE: --num-experts entry ", l, " is ", e, "; every MoE layer needs >= 1 expert");
    ZT_CHECK_T(e % ep == 0, ConfigError, "CIFAR MoE: --num-experts entry ", l, " (", e,
               " experts) does not divide by the expert-parallel size --ep ", ep,
               ": every layer's experts are split evenly over ep; use an --ep that divides each entry, "
               "or entries that are multiples of ", ep);
  }
  ZT_CHECK_T(o.top_k == 1 || o.top_k == 2, ConfigError, "CIFAR MoE: --top-k must be 1 or 2, got ", o.top_k);
  if (o.top_k == 2)
    for (size_t l = 0; l < o.num_experts.size(); ++l)
      ZT_CHECK_T(o.num_experts[l] >= 2, ConfigError, "CIFAR MoE: --top-k 2 needs >= 2 experts per layer; "
                 "--num-experts entry ", l, " is ", o.num_experts[l]);
  const NoisyGatePolicy policy = parse_noisy_gate_policy(o.noisy_gate_policy);
  ZT_CHECK_T(o.top_k == 1 || policy != NoisyGatePolicy::RSample, ConfigError,
             "CIFAR MoE: --noisy-gate-policy RSample applies to --top-k 1 only; use None or Jitter with --top-k 2");
  ZT_CHECK_T(o.capacity_factor > 0.0 && o.eval_capacity_factor > 0.0, ConfigError,
             "CIFAR MoE: --capacity-factor and the eval capacity factor must be > 0, got ", o.capacity_factor, " and ",
             o.eval_capacity_factor);
  ZT_CHECK_T(o.min_capacity >= 0, ConfigError, "CIFAR MoE: --min-capacity must be >= 0, got ", o.min_capacity);
  ZT_CHECK_T(o.aux_loss_coef >= 0.0, ConfigError, "CIFAR MoE: --moe-aux-coef must be >= 0, got ", o.aux_loss_coef);
}

CifarMoEGroups cifar_moe_groups(const comm::GroupPtr& world, int ep) {
  ZT_CHECK_T(world, ConfigError, "CIFAR MoE: no world group");
  const int n = world->size();
  ZT_CHECK_T(ep >= 1 && n % ep == 0, ConfigError, "CIFAR MoE: --ep ", ep, " must be >= 1 and divide the ", n,
             " ranks (each ep group is ep consecutive ranks); launch a multiple of ", ep, " ranks or pick another --ep");
  parallel::Topology topo(world, parallel::ParallelDims::make(n, n, 1, 1, ep));
  return {topo.ep(), topo.expert_dp()};
}

CifarMoENetImpl::CifarMoENetImpl(CifarMoEOptions o) : opt_(std::move(o)) {
  const int ep = opt_.ep_group ? opt_.ep_group->size() : 1;
  check_cifar_moe_options(opt_, ep);
  // [CIFAR MoE]: at ep > 1 the ep-1 net first, from the caller's seed.
  std::optional<CifarMoENet> whole;
  if (ep > 1) {
    CifarMoEOptions w = opt_;
    w.ep_group = nullptr;
    whole.emplace(w);
  }
  // torch::nn defaults (Kaiming-uniform), as the tutorial's nn.Conv2d / nn.Linear.
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 5)));
  conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)));
  fc1 = register_module("fc1", torch::nn::Linear(16 * 5 * 5, 120));
  fc2 = register_module("fc2", torch::nn::Linear(120, kCifarMoEHidden));
  moe_layer_list = register_module("moe_layer_list", torch::nn::ModuleList());
  for (const int64_t e : opt_.num_experts) {
    MoEOptions mo;
    mo.hidden = kCifarMoEHidden;
    mo.num_experts = e;
    mo.gate.k = opt_.top_k;
    mo.gate.capacity_factor = opt_.capacity_factor;
    mo.gate.min_capacity = opt_.min_capacity;
    mo.gate.drop_tokens = opt_.drop_tokens;
    mo.gate.noisy_gate_policy = parse_noisy_gate_policy(opt_.noisy_gate_policy);
    mo.eval_capacity_factor = opt_.eval_capacity_factor;
    mo.use_residual = opt_.use_residual;
    mo.ep_group = ep > 1 ? opt_.ep_group : nullptr;
    moe_layer_list->push_back(
        MoE(mo, [] { return torch::nn::AnyModule(torch::nn::Linear(kCifarMoEHidden, kCifarMoEHidden)); }));
  }
  fc4 = register_module("fc4", torch::nn::Linear(kCifarMoEHidden, 10));
  if (whole) {
    torch::NoGradGuard no_grad;
    std::map<std::string, torch::Tensor> src;
    for (const auto& kv : (*whole)->named_parameters()) src[kv.key()] = kv.value();
    for (auto& kv : named_parameters()) kv.value().copy_(src.at(global_param_name(kv.key())));
  }
}

double CifarMoENetImpl::flops_per_token(int64_t /*seq*/) const {
  constexpr double d = kCifarMoEHidden;
  double macs = kCifarNetFlopsPerSample / 6.0;  // the plain net; fc3 (84 x 10) is fc4's size
  for (const int64_t e : opt_.num_experts) {
    macs += d * static_cast<double>(e) + static_cast<double>(opt_.top_k) * d * d;
    if (opt_.use_residual) macs += d * d + d * 2.0;
  }
  return 6.0 * macs;
}

torch::Tensor CifarMoENetImpl::forward(const torch::Tensor& x) {
  ZT_CHECK(x.dim() == 4 && x.size(1) == 3 && x.size(2) == 32 && x.size(3) == 32,
           "CifarMoENet: input must be (B, 3, 32, 32), got ", x.sizes());
  auto h = F::max_pool2d(torch::relu(conv1(x)), F::MaxPool2dFuncOptions(2));  // (B, 6, 14, 14)
  h = F::max_pool2d(torch::relu(conv2(h)), F::MaxPool2dFuncOptions(2));       // (B, 16, 5, 5)
  h = torch::relu(fc1(h.flatten(1)));                                        // (B, 120)
  h = torch::relu(fc2(h));                                                   // (B, 84)
  torch::Tensor aux;
  double dropped = 0.0;
  for (size_t l = 0; l < moe_layer_list->size(); ++l) {
    MoEOutput out = moe_layer_list->ptr(l)->as<MoEImpl>()->forward(h);    // (B, 84)
    h = out.output;
    aux = aux.defined() ? aux + out.aux_loss : out.aux_loss;
    dropped += out.gate.dropped_fraction;
  }
  last_aux_ = aux;
  last_dropped_ = dropped / static_cast<double>(moe_layer_list->size());
  return fc4(h);  // (B, 10)
}

torch::Tensor CifarMoENetImpl::loss(const torch::Tensor& x, const torch::Tensor& labels) {
  auto ce = F::cross_entropy(forward(x).to(torch::kFloat), labels);
  return opt_.aux_loss_coef == 0.0 ? ce : ce + opt_.aux_loss_coef * last_aux_;
}

void CifarMoENetImpl::set_generator(std::optional<torch::Generator> gen) {
  for (size_t l = 0; l < moe_layer_list->size(); ++l) moe_layer_list->ptr(l)->as<MoEImpl>()->set_generator(gen);
}

bool CifarMoENetImpl::is_expert(const std::string& name) {
  return name.rfind(kCifarMoEPrefix, 0) == 0 && name.find(kCifarMoEExperts) != std::string::npos;
}

int64_t CifarMoENetImpl::local_experts(size_t layer) const {
  ZT_CHECK(layer < moe_layer_list->size(), "CifarMoENet: no MoE layer ", layer);
  return moe_layer_list->ptr(layer)->as<MoEImpl>()->local_experts();
}

int64_t CifarMoENetImpl::first_expert(size_t layer) const {
  ZT_CHECK(layer < moe_layer_list->size(), "CifarMoENet: no MoE layer ", layer);
  return moe_layer_list->ptr(layer)->as<MoEImpl>()->first_expert();
}

std::string CifarMoENetImpl::global_param_name(const std::string& name) const {
  return expert_global_name(name, kCifarMoEPrefix, kCifarMoEExperts, [this](int64_t layer) -> std::optional<int64_t> {
    if (layer < 0 || layer >= static_cast<int64_t>(moe_layer_list->size())) return std::nullopt;
    return first_expert(static_cast<size_t>(layer));
  }, "the CIFAR MoE net");
}

}  // namespace zt::models
