// [Deferred Weight Gradients] (deferred_grad.h).
#include "models/deferred_grad.h"

#include <atomic>
#include <cstdint>

#include "zerotrain/error.h"

namespace zt::models {
namespace {

// Process-wide on purpose: see [Deferred Weight Gradients] (autograd's device thread).
std::atomic<WeightGradCollector*> g_active{nullptr};

// A 0-dim zero that depends on p; its backward (with gradient 1) is p's deferred gradient.
struct DeferredGradFn : torch::autograd::Function<DeferredGradFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& p, int64_t collector) {
    ctx->saved_data["p"] = p;  // the parameter itself (the collector's key)
    ctx->saved_data["c"] = collector;
    return at::zeros({}, p.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list /*grad_out*/) {
    auto* c = reinterpret_cast<WeightGradCollector*>(ctx->saved_data["c"].toInt());  // NOLINT
    return {c->run_for(ctx->saved_data["p"].toTensor()), torch::Tensor()};
  }
};

}  // namespace

void WeightGradCollector::add(const std::vector<torch::Tensor>& params, Fn fn) {
  auto rec = std::make_shared<Record>();
  rec->params = params;
  rec->fn = std::move(fn);
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.defined() || !p.requires_grad()) continue;
    by_param_[p.unsafeGetTensorImpl()].push_back(Entry{rec, i});
  }
}

bool WeightGradCollector::covers(const torch::Tensor& p) const {
  std::lock_guard<std::mutex> lk(mu_);
  return by_param_.count(p.unsafeGetTensorImpl()) > 0;
}

size_t WeightGradCollector::num_covered() const {
  std::lock_guard<std::mutex> lk(mu_);
  return by_param_.size();
}

bool WeightGradCollector::empty() const {
  std::lock_guard<std::mutex> lk(mu_);
  return by_param_.empty();
}

std::vector<torch::Tensor> WeightGradCollector::roots(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  const auto self = reinterpret_cast<int64_t>(this);  // NOLINT
  for (const auto& p : params) {
    if (!p.requires_grad() || !covers(p)) continue;
    out.push_back(DeferredGradFn::apply(p, self));
  }
  return out;
}

torch::Tensor WeightGradCollector::run_for(const torch::Tensor& p) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_param_.find(p.unsafeGetTensorImpl());
  if (it == by_param_.end()) return {};
  torch::Tensor sum;
  for (auto& e : it->second) {
    Record& r = *e.rec;
    if (!r.done) {
      r.results = r.fn();
      r.fn = nullptr;  // drops what it captured once every result is taken (below)
      r.done = true;
      ++runs_;
      ZT_ASSERT(r.results.size() == r.params.size(), "deferred weight gradient: ", r.results.size(), " results for ",
                r.params.size(), " parameters");
    }
    torch::Tensor g = std::move(r.results[e.index]);
    r.results[e.index] = torch::Tensor();
    if (!g.defined()) continue;
    sum = sum.defined() ? sum + g : g;
  }
  by_param_.erase(it);
  return sum;
}

void WeightGradCollector::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  by_param_.clear();
}

WeightGradCollector* active_weight_grad_collector() { return g_active.load(std::memory_order_acquire); }

CollectWeightGrads::CollectWeightGrads(WeightGradCollector* c) : prev_(g_active.exchange(c)) {}
CollectWeightGrads::~CollectWeightGrads() { g_active.store(prev_); }

bool defer_weight_grads(const std::vector<torch::Tensor>& params, WeightGradCollector::Fn fn) {
  WeightGradCollector* c = active_weight_grad_collector();
  if (c == nullptr) return false;
  bool any = false;
  for (const auto& p : params) any = any || (p.defined() && p.requires_grad());
  if (!any) return false;
  c->add(params, std::move(fn));
  return true;
}

}  // namespace zt::models
