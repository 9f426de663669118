#include "zero/optimizer_state.h"

#include <algorithm>
#include <cctype>

#include "zerotrain/error.h"

namespace zt::zero {
namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
int64_t nbytes(const torch::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
}  // namespace

OptimizerRule::OptimizerRule(OptimizerConfig config, std::vector<ParamGroupSpec> groups)
    : config_(std::move(config)), groups_(std::move(groups)) {
  if (groups_.empty()) groups_.push_back({"", 1.0, config_.params.weight_decay});
  const std::string type = lower(config_.type);
  sgd_ = type == "sgd";
  adamw_ = type == "adamw" || config_.params.adam_w_mode;
}

std::vector<std::string> OptimizerRule::state_kinds() const {
  std::vector<std::string> k{"master"};
  if (!sgd_) k.insert(k.end(), {"exp_avg", "exp_avg_sq"});
  if (momentum_buffer()) k.push_back("momentum");
  return k;
}

void OptimizerRule::build_group_runs(const ShardLayout& L, const std::function<int(int)>& group_of) {
  runs_.clear();
  const int64_t owned = L.owned_numel();
  if (groups_.size() == 1) {
    runs_.push_back({0, owned, 0});
    return;
  }
  // Each parameter's owned part, in owned order (buckets in order, parameters in order).
  for (int b = 0; b < L.num_buckets(); ++b) {
    const Bucket& B = L.flat.buckets[b];
    const Range own = L.owned_flat_range(b);
    const int64_t ob = L.owned_begin(b);
    for (int k = 0; k < B.num_params; ++k) {
      const int i = B.first_param + k;
      const ParamSlot& s = L.flat.params[i];
      const Range r = intersect({s.offset, s.offset + s.numel}, own);
      if (r.size() == 0) continue;
      const int g = group_of(i);
      const int64_t at = ob + r.begin - own.begin;
      if (!runs_.empty() && runs_.back().group == g) {
        runs_.back().len = at + r.size() - runs_.back().begin;  // across padding
      } else {
        runs_.push_back({at, r.size(), g});
      }
    }
  }
  if (runs_.empty()) {  // this rank's shards are all padding
    runs_.push_back({0, owned, 0});
    return;
  }
  // Padding (zeros that stay zero) joins the run before it; the first run starts at 0.
  runs_.front().len += runs_.front().begin;
  runs_.front().begin = 0;
  for (size_t k = 0; k + 1 < runs_.size(); ++k) runs_[k].len = runs_[k + 1].begin - runs_[k].begin;
  runs_.back().len = owned - runs_.back().begin;
}

void OptimizerRule::for_group_runs(int64_t begin, int64_t n,
                                   const std::function<void(int64_t at, int64_t len, int group)>& fn) const {
  for (const GroupRun& run : runs_) {
    const Range r = intersect({begin, begin + n}, {run.begin, run.begin + run.len});
    if (r.size() > 0) fn(r.begin - begin, r.size(), run.group);
  }
}

optim::AdamHyper OptimizerRule::adam_hyper(double factor, const StepInputs& in, int group) const {
  const auto& P = config_.params;
  optim::AdamHyper h;
  h.lr = static_cast<float>(in.lr * groups_[group].lr_scale);
  h.beta1 = static_cast<float>(in.momentum.value_or(P.betas[0]));
  h.beta2 = static_cast<float>(P.betas[1]);
  h.eps = static_cast<float>(P.eps);
  h.weight_decay = static_cast<float>(groups_[group].weight_decay);
  h.adamw = adamw_;
  h.bias_correction = P.bias_correction;
  h.step = in.step;
  h.grad_scale = static_cast<float>(factor);
  return h;
}

std::vector<torch::Tensor> OwnedState::buffers() const {
  std::vector<torch::Tensor> b{master};
  if (exp_avg.defined()) b.insert(b.end(), {exp_avg, exp_avg_sq});
  if (momentum.defined()) b.push_back(momentum);
  return b;
}

int64_t OwnedState::master_bytes() const { return nbytes(master); }
int64_t OwnedState::moment_bytes() const { return nbytes(exp_avg) + nbytes(exp_avg_sq) + nbytes(momentum); }

}  // namespace zt::zero
