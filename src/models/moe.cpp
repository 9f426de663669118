#include "models/moe.h"

#include <cmath>
#include <limits>

#include "zerotrain/error.h"

namespace zt::models {
namespace {

void check_logits(const torch::Tensor& logits, const GateOptions& opt, int64_t k) {
  ZT_CHECK_T(logits.dim() == 2 && logits.size(0) > 0 && logits.size(1) > 0, ConfigError,
             "MoE gating: logits must be [tokens > 0, experts > 0], got ", logits.sizes());
  ZT_CHECK_T(opt.capacity_factor > 0.0, ConfigError, "MoE gating: capacity_factor must be > 0, got ",
             opt.capacity_factor);
  ZT_CHECK_T(opt.min_capacity >= 0, ConfigError, "MoE gating: min_capacity must be >= 0, got ",
             opt.min_capacity);
  ZT_CHECK_T(k == 1 || logits.size(1) >= 2, ConfigError,
             "MoE gating: top-2 needs at least 2 experts, got ", logits.size(1));
}

// [Expert Parallel]: every rank of the ep group uses the largest rank's capacity.
int64_t agree_capacity(int64_t c, const GateOptions& opt) {
  if (!opt.ep_group || opt.ep_group->size() == 1) return c;
  auto t = torch::full({1}, c, torch::kLong);
  opt.ep_group->all_reduce(t, comm::ReduceOp::kMax);
  return t.item<int64_t>();
}

GateResult finish(GateResult r, const torch::Tensor& routed, const torch::Tensor& kept) {
  r.tokens_per_expert = routed;
  r.kept_per_expert = kept;
  // One copy to the host for both counters (the routing needs it anyway: the dropped
  // fraction is a host number).
  const auto host = torch::stack({routed, kept}).to(torch::kCPU, torch::kLong).contiguous();
  const int64_t E = host.size(1);
  const int64_t* h = host.data_ptr<int64_t>();
  r.routed_counts.assign(h, h + E);
  r.kept_counts.assign(h + E, h + 2 * E);
  int64_t total = 0, k = 0;
  for (int64_t e = 0; e < E; ++e) {
    total += h[e];
    k += h[E + e];
  }
  r.dropped_fraction = total > 0 ? static_cast<double>(total - k) / static_cast<double>(total) : 0.0;
  return r;
}

}  // namespace

NoisyGatePolicy parse_noisy_gate_policy(const std::string& s) {
  if (s.empty() || s == "None" || s == "none") return NoisyGatePolicy::None;
  if (s == "Jitter") return NoisyGatePolicy::Jitter;
  if (s == "RSample") return NoisyGatePolicy::RSample;
  throw ConfigError("noisy_gate_policy: unknown value '" + s + "'; use None, Jitter or RSample");
}

int64_t moe_capacity(int64_t tokens, int64_t experts, double capacity_factor, int64_t min_capacity) {
  ZT_CHECK_T(tokens >= 0 && experts > 0, ConfigError, "moe_capacity: tokens ", tokens, ", experts ",
             experts);
  const auto c = static_cast<int64_t>(
      std::ceil(static_cast<double>(tokens) / static_cast<double>(experts) * capacity_factor));
  return std::max(c, min_capacity);
}

torch::Tensor multiplicative_jitter(const torch::Tensor& x, double eps, std::optional<torch::Generator> gen) {
  auto u = torch::empty_like(x).uniform_(1.0 - eps, 1.0 + eps, gen);
  return x * u;
}

torch::Tensor gumbel_sample(at::IntArrayRef shape, const torch::TensorOptions& o,
                            std::optional<torch::Generator> gen) {
  // -log(Exp(1)) is Gumbel(0, 1).
  return torch::empty(shape, o).exponential_(1.0, gen).log().neg();
}

GateResult top1_gating(const torch::Tensor& logits, const GateOptions& opt, std::optional<torch::Generator> gen) {
  check_logits(logits, opt, 1);
  const auto lg = logits.to(torch::kFloat);
  const int64_t T = lg.size(0), E = lg.size(1);
  const auto gates = torch::softmax(lg, 1);
  const auto choice = opt.noisy_gate_policy == NoisyGatePolicy::RSample
                          ? lg.detach() + gumbel_sample(lg.sizes(), lg.options(), gen)
                          : gates.detach();
  const auto e1 = choice.argmax(1);                  // [T]
  auto mask1 = torch::one_hot(e1, E);                // [T, E] int64
  const auto routed = mask1.sum(0);
  GateResult r;
  r.capacity = agree_capacity(opt.drop_tokens ? moe_capacity(T, E, opt.capacity_factor, opt.min_capacity)
                                              : routed.max().item<int64_t>(),
                              opt);
  const auto me = gates.mean(0);
  const auto ce = mask1.to(torch::kFloat).mean(0);
  r.aux_loss = (me * ce).sum() * static_cast<double>(E);
  if (opt.drop_tokens && r.capacity < T) {
    // Priority per (token, expert): random under use_rts, else earlier tokens first.
    const auto prio = opt.use_rts
                          ? mask1.to(torch::kFloat) * torch::rand({T, E}, gen, lg.options())
                          : mask1.to(torch::kFloat) *
                                torch::arange(T, 0, -1, lg.options()).unsqueeze(1);
    const auto top = std::get<1>(prio.topk(r.capacity, 0));
    mask1 = mask1 * torch::zeros_like(mask1).scatter_(0, top, 1);
  }
  // [Sparse Dispatch]: per token its expert, slot, kept flag and weight (the gate value,
  // 0 when dropped), as [T, 1].
  const auto kept1 = mask1.sum(1);  // [T] 0/1
  r.expert_index = e1.unsqueeze(1);
  r.slot = ((mask1.cumsum(0) - 1) * mask1).sum(1).unsqueeze(1);
  r.kept = kept1.to(torch::kBool).unsqueeze(1);
  r.weights = gates.gather(1, r.expert_index) * kept1.to(torch::kFloat).unsqueeze(1);
  return finish(std::move(r), routed, mask1.sum(0));
}

GateResult top2_gating(const torch::Tensor& logits, const GateOptions& opt, std::optional<torch::Generator> gen) {
  check_logits(logits, opt, 2);
  ZT_CHECK_T(opt.noisy_gate_policy != NoisyGatePolicy::RSample, ConfigError,
             "noisy_gate_policy RSample applies to top-1 gating only (DeepSpeed ignores it for k=2); "
             "for k=2 use None or Jitter (second_expert_sampling adds Gumbel noise to the second choice)");
  const auto lg = logits.to(torch::kFloat);
  const int64_t T = lg.size(0), E = lg.size(1);
  const auto gates = torch::softmax(lg, 1);
  const auto e1 = gates.detach().argmax(1);  // [T]
  auto mask1 = torch::one_hot(e1, E);
  auto lg2 = lg.detach();
  if (opt.second_expert_sampling) lg2 = lg2 + gumbel_sample(lg.sizes(), lg.options(), gen);
  const auto e2 = lg2.masked_fill(mask1.to(torch::kBool), -std::numeric_limits<float>::infinity()).argmax(1);
  auto mask2 = torch::one_hot(e2, E);
  const auto loc1 = mask1.cumsum(0) - 1;
  const auto loc2 = mask2.cumsum(0) - 1 + mask1.sum(0, /*keepdim=*/true);
  const auto me = gates.mean(0);
  const auto ce = mask1.to(torch::kFloat).mean(0);
  GateResult r;
  r.aux_loss = (me * ce).mean() * static_cast<double>(E * E);
  const auto routed = (mask1 + mask2).sum(0);
  if (opt.drop_tokens) {
    r.capacity = agree_capacity(moe_capacity(T, E, 2.0 * opt.capacity_factor, opt.min_capacity), opt);
    mask1 = mask1 * loc1.lt(r.capacity);
    mask2 = mask2 * loc2.lt(r.capacity);
  } else {
    r.capacity = agree_capacity(routed.max().item<int64_t>(), opt);
  }
  const auto loc1_s = (loc1 * mask1).sum(1);
  const auto loc2_s = (loc2 * mask2).sum(1);
  // [Sparse Dispatch]: [T, 2], column 0 the first choice, column 1 the second.
  const auto kept1 = mask1.sum(1), kept2 = mask2.sum(1);  // [T] 0/1
  r.expert_index = torch::stack({e1, e2}, 1);
  r.slot = torch::stack({loc1_s, loc2_s}, 1);
  r.kept = torch::stack({kept1, kept2}, 1).to(torch::kBool);
  auto g1 = gates.gather(1, e1.unsqueeze(1)).squeeze(1) * kept1.to(torch::kFloat);
  auto g2 = gates.gather(1, e2.unsqueeze(1)).squeeze(1) * kept2.to(torch::kFloat);
  const auto denom = (g1 + g2).clamp_min(std::numeric_limits<float>::epsilon());
  r.weights = torch::stack({g1 / denom, g2 / denom}, 1);
  return finish(std::move(r), routed, (mask1 + mask2).sum(0));
}

GateResult mixtral_gating(const torch::Tensor& logits, const GateOptions& opt) {
  ZT_CHECK_T(logits.dim() == 2 && logits.size(0) > 0 && logits.size(1) > 0, ConfigError,
             "MoE gating: logits must be [tokens > 0, experts > 0], got ", logits.sizes());
  const int64_t T = logits.size(0), E = logits.size(1), k = opt.k;
  ZT_CHECK_T(k >= 1 && k <= E, ConfigError, "MoE (Mixtral routing): num_experts_per_tok must be in 1..", E,
             " (the number of experts), got ", k);
  const auto probs = torch::softmax(logits.to(torch::kFloat), 1);  // [T, E]
  const auto top = probs.topk(k, 1);
  const auto vals = std::get<0>(top);  // [T, k], differentiable
  const auto idx = std::get<1>(top);   // [T, k]
  GateResult r;
  r.expert_index = idx;
  r.weights = vals / vals.sum(1, /*keepdim=*/true);
  const auto masks = torch::one_hot(idx, E);  // [T, k, E] int64
  std::vector<torch::Tensor> slots;
  auto before = torch::zeros({E}, masks.options());  // assignments of earlier choices per expert
  for (int64_t j = 0; j < k; ++j) {
    const auto m = masks.select(1, j);  // [T, E]
    slots.push_back(((m.cumsum(0) - 1 + before.unsqueeze(0)) * m).sum(1));
    before = before + m.sum(0);
  }
  r.slot = torch::stack(slots, 1);
  r.kept = torch::ones({T, k}, torch::TensorOptions().dtype(torch::kBool).device(logits.device()));
  r.choice_fraction = masks.to(torch::kFloat).mean(0);  // [k, E]
  r.prob_mean = probs.mean(0);                          // [E]
  r.aux_loss = (r.choice_fraction * r.prob_mean.unsqueeze(0)).sum() * static_cast<double>(E);
  r.capacity = agree_capacity(before.max().item<int64_t>(), opt);
  return finish(std::move(r), before, before);
}

GateResult topk_gating(const torch::Tensor& logits, const GateOptions& opt, std::optional<torch::Generator> gen) {
  if (opt.routing == GateRouting::Mixtral) return mixtral_gating(logits, opt);
  ZT_CHECK_T(opt.k == 1 || opt.k == 2, ConfigError, "MoE: k must be 1 or 2, got ", opt.k);
  return opt.k == 1 ? top1_gating(logits, opt, gen) : top2_gating(logits, opt, gen);
}

namespace {

// all_to_all_dim0 as an autograd function. The group travels as a raw pointer in the
// saved data: the MoE layer that calls it holds the group for as long as its graph lives.
struct AllToAll : torch::autograd::Function<AllToAll> {
  static torch::Tensor run(const torch::Tensor& x, comm::Group* g, SpanLog* sink) {
    auto in = x.contiguous();
    auto out = torch::empty_like(in);
    DeviceSpan span = sink ? DeviceSpan::start(in.device()) : DeviceSpan();  // [MoE Timing]
    g->all_to_all(out, in);
    if (sink) {
      span.stop();
      sink->add(std::move(span));
    }
    return out;
  }
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t group,
                               int64_t sink) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["sink"] = sink;
    return run(x, reinterpret_cast<comm::Group*>(group), reinterpret_cast<SpanLog*>(sink));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* g = reinterpret_cast<comm::Group*>(ctx->saved_data["group"].toInt());
    auto* sink = reinterpret_cast<SpanLog*>(ctx->saved_data["sink"].toInt());
    return {run(grad[0], g, sink), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_to_all_dim0(const torch::Tensor& x, const comm::GroupPtr& g, SpanLog* sink) {
  ZT_CHECK_T(g != nullptr, InternalError, "all_to_all_dim0 without a group");
  if (g->size() == 1) return x;
  ZT_CHECK_T(x.dim() >= 1 && x.size(0) % g->size() == 0, ConfigError, "all_to_all over ", g->size(),
             " ranks: dim 0 of shape ", x.sizes(), " does not divide into equal chunks");
  return AllToAll::apply(x, static_cast<int64_t>(reinterpret_cast<intptr_t>(g.get())),
                         static_cast<int64_t>(reinterpret_cast<intptr_t>(sink)));
}

namespace {

// all_to_all_rows as an autograd function; backward sends the gradient back with the
// splits swapped. The group travels as in AllToAll.
struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static torch::Tensor run(const torch::Tensor& x, comm::Group* g, const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, SpanLog* sink) {
    auto in = x.contiguous();
    int64_t width = 1;  // elements per row (from the shape: a rank may send no rows)
    for (int64_t i = 1; i < in.dim(); ++i) width *= in.size(i);
    int64_t total = 0;
    std::vector<int64_t> sc, rc;
    for (size_t p = 0; p < send_rows.size(); ++p) {
      sc.push_back(send_rows[p] * width);
      rc.push_back(recv_rows[p] * width);
      total += recv_rows[p];
    }
    auto shape = in.sizes().vec();
    shape[0] = total;
    auto out = torch::empty(shape, in.options());
    DeviceSpan span = sink ? DeviceSpan::start(in.device()) : DeviceSpan();  // [MoE Timing]
    g->all_to_all_v(out, in, sc, rc);
    if (sink) {
      span.stop();
      sink->add(std::move(span));
    }
    return out;
  }
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t group,
                               int64_t sink, std::vector<int64_t> send_rows, std::vector<int64_t> recv_rows) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["sink"] = sink;
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return run(x, reinterpret_cast<comm::Group*>(group), send_rows, recv_rows, reinterpret_cast<SpanLog*>(sink));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* g = reinterpret_cast<comm::Group*>(ctx->saved_data["group"].toInt());
    auto* sink = reinterpret_cast<SpanLog*>(ctx->saved_data["sink"].toInt());
    const auto send = ctx->saved_data["send"].toIntVector(), recv = ctx->saved_data["recv"].toIntVector();
    return {run(grad[0], g, recv, send, sink), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_to_all_rows(const torch::Tensor& x, const comm::GroupPtr& g, const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows, SpanLog* sink) {
  ZT_CHECK_T(g != nullptr, InternalError, "all_to_all_rows without a group");
  ZT_CHECK_T(static_cast<int>(send_rows.size()) == g->size() && static_cast<int>(recv_rows.size()) == g->size(),
             InternalError, "all_to_all_rows: one send and one receive count per rank of ", g->size());
  int64_t sent = 0;
  for (int64_t n : send_rows) sent += n;
  ZT_CHECK_T(x.dim() >= 1 && sent == x.size(0), InternalError, "all_to_all_rows: send counts sum to ", sent,
             " for ", x.sizes());
  return AllToAllRows::apply(x, static_cast<int64_t>(reinterpret_cast<intptr_t>(g.get())),
                             static_cast<int64_t>(reinterpret_cast<intptr_t>(sink)), send_rows, recv_rows);
}

MoEImpl::MoEImpl(MoEOptions opt, const ExpertFactory& make_expert) : opt_(std::move(opt)) {
  ZT_CHECK_T(opt_.hidden > 0, ConfigError, "MoE: hidden must be > 0, got ", opt_.hidden);
  ZT_CHECK_T(opt_.num_experts >= 1, ConfigError, "MoE: num_experts must be >= 1, got ", opt_.num_experts);
  const bool mixtral = opt_.gate.routing == GateRouting::Mixtral;  // [Mixtral Routing]: 1 <= k <= E
  ZT_CHECK_T(!mixtral || (opt_.gate.k >= 1 && opt_.gate.k <= opt_.num_experts), ConfigError,
             "MoE (Mixtral routing): num_experts_per_tok must be in 1..num_local_experts (", opt_.num_experts,
             "), got ", opt_.gate.k);
  ZT_CHECK_T(!mixtral || (!opt_.use_residual && opt_.gate.noisy_gate_policy == NoisyGatePolicy::None), ConfigError,
             "MoE (Mixtral routing): no residual expert and no noisy gate policy (Mixtral has neither)");
  ZT_CHECK_T(mixtral || opt_.gate.k == 1 || opt_.gate.k == 2, ConfigError, "MoE: k must be 1 or 2, got ", opt_.gate.k);
  ZT_CHECK_T(opt_.gate.k == 1 || opt_.num_experts >= 2, ConfigError,
             "MoE: k=2 needs num_experts >= 2, got ", opt_.num_experts);
  ZT_CHECK_T(opt_.gate.k == 1 || opt_.gate.noisy_gate_policy != NoisyGatePolicy::RSample, ConfigError,
             "MoE: noisy_gate_policy RSample applies to k=1 only; use None or Jitter with k=2");
  ZT_CHECK_T(opt_.eval_capacity_factor > 0.0, ConfigError, "MoE: eval_capacity_factor must be > 0, got ",
             opt_.eval_capacity_factor);
  if (opt_.ep_group && opt_.ep_group->size() > 1) {
    ep_size_ = opt_.ep_group->size();
    ZT_CHECK_T(opt_.num_experts % ep_size_ == 0, ConfigError, "MoE: num_experts ", opt_.num_experts,
               " does not divide by the expert-parallel size ", ep_size_,
               ": choose an ep size that divides the experts (expert_parallel.autoep_size, --ep)");
    first_expert_ = opt_.num_experts / ep_size_ * opt_.ep_group->rank();
  }
  opt_.gate.ep_group = ep_size_ > 1 ? opt_.ep_group : nullptr;
  gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(opt_.hidden, opt_.num_experts).bias(false)));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < opt_.num_experts / ep_size_; ++e) {
    auto m = make_expert();
    ZT_CHECK_T(!m.is_empty(), ConfigError, "MoE: the expert factory returned an empty module");
    experts->push_back(m.ptr());
    expert_fns.push_back(std::move(m));
  }
  if (opt_.use_residual) {
    mlp = make_expert();
    register_module("mlp", mlp.ptr());
    coefficient = register_module("coefficient", torch::nn::Linear(opt_.hidden, 2));
  }
}

// [Expert Parallel] with [Sparse Dispatch]: `rows` [N, d] packed by global expert, so the
// rows for rank j's experts are one contiguous run. The counts go first (one all-to-all of
// E int64: rank j learns how many rows of each of its experts every rank sends), then the
// rows (all_to_all_rows, uneven). Received rows come by (source rank, local expert); they are
// regrouped by expert, each expert runs once on all ranks' rows, and the outputs go back
// in the received order by the reverse exchange.
torch::Tensor MoEImpl::run_experts_parallel(const torch::Tensor& rows, const torch::Tensor& kept_per_expert,
                                            const std::vector<int64_t>& kept_counts) {
  const int64_t P = ep_size_, El = local_experts(), d = rows.size(1);
  auto counts_in = kept_per_expert.to(rows.device(), torch::kLong).contiguous();
  auto counts_out = torch::empty_like(counts_in);
  opt_.ep_group->all_to_all(counts_out, counts_in);
  const auto recv_host = counts_out.to(torch::kCPU).contiguous();
  const int64_t* rc = recv_host.data_ptr<int64_t>();  // [P, El]: rows of my expert i from rank p
  std::vector<int64_t> send_rows(static_cast<size_t>(P), 0), recv_rows(static_cast<size_t>(P), 0);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < El; ++i) {
      send_rows[static_cast<size_t>(p)] += kept_counts[static_cast<size_t>(p * El + i)];
      recv_rows[static_cast<size_t>(p)] += rc[p * El + i];
    }
  SpanLog* sink = timing_ ? a2a_log_.get() : nullptr;  // [MoE Timing]
  const auto received = all_to_all_rows(rows, opt_.ep_group, send_rows, recv_rows, sink);  // by (p, i)
  // by_expert[j] = received row that goes j-th in (i, p) order; block (p, i) starts at start[p][i].
  std::vector<int64_t> start(static_cast<size_t>(P * El)), by_expert, expert_rows(static_cast<size_t>(El), 0);
  by_expert.reserve(static_cast<size_t>(received.size(0)));
  for (int64_t b = 0, off = 0; b < P * El; ++b) {
    start[static_cast<size_t>(b)] = off;
    off += rc[b];
  }
  for (int64_t i = 0; i < El; ++i)
    for (int64_t p = 0; p < P; ++p) {
      const int64_t b = p * El + i;
      for (int64_t r = 0; r < rc[b]; ++r) by_expert.push_back(start[static_cast<size_t>(b)] + r);
      expert_rows[static_cast<size_t>(i)] += rc[b];
    }
  const auto perm = torch::tensor(by_expert, torch::kLong).to(rows.device());
  const auto grouped = El == 1 ? received : received.index_select(0, perm);
  std::vector<torch::Tensor> outs;
  int64_t off = 0;
  for (int64_t i = 0; i < El; ++i) {
    const int64_t n = expert_rows[static_cast<size_t>(i)];
    outs.push_back(expert_fns[static_cast<size_t>(i)].forward(grouped.narrow(0, off, n)));
    off += n;
  }
  auto done = torch::cat(outs);  // [M, d] by (i, p)
  if (El > 1) done = torch::zeros({done.size(0), d}, done.options()).index_copy(0, perm, done);  // back to (p, i)
  return all_to_all_rows(done, opt_.ep_group, recv_rows, send_rows, sink);  // [N, d] of this rank's rows
}

MoEOutput MoEImpl::forward(const torch::Tensor& x) {
  ZT_CHECK_T(x.dim() >= 1 && x.size(-1) == opt_.hidden, ConfigError, "MoE: input's last dim must be ",
             opt_.hidden, ", got shape ", x.sizes());
  const auto flat = x.reshape({-1, opt_.hidden});  // [S, d]
  GateOptions g = opt_.gate;
  // The gate runs in fp32 (DeepSpeed's TopKGate); noise only in training.
  auto gin = flat.to(torch::kFloat);
  if (!is_training()) {
    g.capacity_factor = opt_.eval_capacity_factor;
    g.noisy_gate_policy = NoisyGatePolicy::None;
  } else if (g.noisy_gate_policy == NoisyGatePolicy::Jitter) {
    gin = multiplicative_jitter(gin, 1e-2, gen_);
  }
  const auto logits = torch::nn::functional::linear(gin, gate->weight.to(torch::kFloat));
  MoEOutput out;
  out.gate = topk_gating(logits, g, gen_);
  out.aux_loss = out.gate.aux_loss;
  // [Sparse Dispatch]. The kept assignments: token, expert, slot, weight, each [N].
  const GateResult& gr = out.gate;
  const int64_t k = gr.expert_index.size(1), d = opt_.hidden;
  const auto sel = gr.kept.reshape({-1}).nonzero().squeeze(1);        // assignment ids t * k + j
  const auto tok = sel.div(k, "floor");
  const auto ex = gr.expert_index.reshape({-1}).index_select(0, sel);
  const auto weight = gr.weights.reshape({-1}).index_select(0, sel).to(x.dtype());
  // Row of each assignment: packed by expert, base = exclusive prefix sum of the kept counts.
  const auto kept_dev = gr.kept_per_expert.to(ex.device());
  const auto row = (kept_dev.cumsum(0) - kept_dev).index_select(0, ex) + gr.slot.reshape({-1}).index_select(0, sel);
  const int64_t N = sel.size(0);
  const auto dispatched = torch::zeros({N, d}, flat.options()).index_copy(0, row, flat.index_select(0, tok));
  std::vector<torch::Tensor> outs;
  outs.reserve(expert_fns.size());
  torch::Tensor expert_out;  // [N, d], rows as dispatched
  if (ep_size_ == 1) {
    int64_t off = 0;  // each expert on its contiguous slice (an empty one too, so every
    for (size_t e = 0; e < expert_fns.size(); ++e) {  // expert gets a defined gradient)
      const int64_t n = gr.kept_counts[e];
      outs.push_back(expert_fns[e].forward(dispatched.narrow(0, off, n)));
      off += n;
    }
    expert_out = torch::cat(outs);
  } else {
    expert_out = run_experts_parallel(dispatched, gr.kept_per_expert, gr.kept_counts);
  }
  auto y = torch::zeros({flat.size(0), d}, expert_out.options())
               .index_add(0, tok, expert_out.index_select(0, row) * weight.unsqueeze(1))
               .reshape(x.sizes());
  if (opt_.use_residual) {
    const auto mlp_out = mlp.forward(x);
    const auto coef = torch::softmax(coefficient(x), -1);
    y = y * coef.narrow(-1, 0, 1) + mlp_out * coef.narrow(-1, 1, 1);
  }
  out.output = y;
  return out;
}

std::string expert_global_name(const std::string& name, const std::string& prefix, const std::string& key,
                               const std::function<std::optional<int64_t>(int64_t layer)>& first_expert_of,
                               const std::string& model) {
  const size_t at = name.find(key);
  if (name.rfind(prefix, 0) != 0 || at == std::string::npos) return name;
  const size_t layer_end = name.find('.', prefix.size());
  const size_t from = at + key.size(), dot = name.find('.', from);
  ZT_CHECK_T(layer_end == at && dot != std::string::npos, ConfigError, "'", name, "' is not an expert parameter of ",
             model);
  const std::optional<int64_t> first = first_expert_of(std::stoll(name.substr(prefix.size(), layer_end - prefix.size())));
  ZT_CHECK_T(first.has_value(), ConfigError, "'", name, "' is not an expert parameter of ", model);
  const int64_t local = std::stoll(name.substr(from, dot - from));
  return name.substr(0, from) + std::to_string(*first + local) + name.substr(dot);
}

}  // namespace zt::models
