// Mixture of Experts with DeepSpeed-MoE's gating semantics (deepspeed/moe/sharded_moe.py
// top1gating / top2gating, moe/layer.py MoE), with expert parallelism over an ep group
// ([Expert Parallel] below; docs/moe.md says what is left).
//
// [Gating Rules] (T tokens, E experts, C capacity)
// - gates = softmax(logits) in fp32. Top-1 picks argmax (of logits + Gumbel noise under
//   RSample; the gate values stay softmax(logits)). Top-2 picks argmax(gates) first, then
//   argmax of the logits with the first choice masked to -inf (plus Gumbel noise on the
//   logits when second_expert_sampling, DeepSpeed's top2_2nd_expert_sampling).
// - capacity = ceil(T / E * f), at least min_capacity, f = capacity_factor for top-1 and
//   2 * capacity_factor for top-2 (DeepSpeed doubles it). drop_tokens = false: C = the
//   most (token, choice) assignments routed to any expert, nothing drops.
// - Slots: a token's slot in expert e is its position among the tokens routed to e, in
//   token order; top-2 second choices take the slots after all first choices of e.
//   Assignments whose slot would be >= C drop. Top-1 with use_rts keeps a random subset
//   of C tokens per expert instead (random token selection, uniform priorities from the
//   generator), then slots are again in token order among the kept ones.
// - aux loss = E * sum_e me_e * ce_e, me = mean over tokens of gates[:, e], ce = fraction
//   of tokens whose FIRST choice is e, counted before drops (top-2 writes it as
//   mean(me*ce)*E*E, the same number). Only me carries gradient.
// - Top-2 combine weights: the kept choices' gates divided by their sum (clamped below
//   by fp32 eps), so a token whose second choice dropped gets weight 1 on its first.
//
// [Expert Parallel] (ep = the ep group's size P, E experts, E_l = E / P per rank)
// - Rank r of the ep group holds experts r*E_l .. (r+1)*E_l - 1; every rank holds the gate.
// - Each rank gates its own tokens. The capacity C is agreed across the group (the largest
//   rank's, one all-reduce): with drop_tokens it is the same on every rank whose token
//   count is the same, and without it DeepSpeed agrees on the largest count the same way.
// - The kept rows, packed by global expert ([Sparse Dispatch]), so the rows for rank j's
//   experts are one contiguous run: an all-to-all of the E kept counts tells rank j how many
//   rows of each of its experts every rank sends, then one uneven all-to-all
//   (all_to_all_rows, Group::all_to_all_v) moves exactly the kept rows, no padding. Rank j
//   regroups what it received (by source rank, local expert) by expert, runs local expert i
//   once on every rank's rows for it, restores the received order, and the reverse uneven
//   all-to-all returns each rank its rows, which it combines. Backward runs the same
//   exchanges with the splits swapped. So each rank's output equals the one-process layer's
//   on its tokens, and an expert's gradient on its owner is the sum over every rank's tokens.
//
// [Sparse Dispatch] The layer moves token rows by index, never through [T, E, C] one-hot
// tensors (DeepSpeed's einsum dispatch, which made dropless routing cost T x E x C; the
// dense path survives as a test reference, tests/support/moe_dense_reference.h).
// - A kept assignment (token t, expert e, slot s) gets row base[e] + s of the dispatch
//   buffer. Kept slots of an expert are 0 .. kept_e - 1 (the gate's slot rules above), so at
//   every ep base = the exclusive prefix sum of kept_per_expert and the buffer is the packed
//   [sum_e kept_e, d]: expert e runs on its contiguous slice, no padding. The same packed
//   buffer goes to the experts' owners at ep > 1 ([Expert Parallel]: uneven all-to-all).
// - dispatch = zeros[R, d].index_copy(rows, x.index_select(tokens)); combine:
//   y = zeros[T, d].index_add(tokens, expert_out.index_select(rows) * weight). Autograd
//   differentiates these (index_select <-> index_add), so no custom function is needed.
//   With k <= 2 a token's output sums at most two terms starting from 0, so index_add's
//   order (CUDA atomics) cannot change the result ([Mixtral Routing] with k > 2 on CUDA
//   may sum in any order: fp32 rounding only).
// - Saved for backward, beyond the experts' own activations: the N = kept assignments'
//   gathered output rows [N, d] and weights, int64 indices [N], and the gate's [T, E]
//   softmax; O((T k) d + T E) instead of the dense O(T E C) (C ~ T k / E with drops,
//   dropless at least that and up to T). docs/moe.md has the formula;
//   MoESparse.SavedBytesAreProportionalToAssignments checks it.
#pragma once
#include <torch/torch.h>

#include "common/phase_timer.h"
#include "zerotrain/comm.h"

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace zt::models {

enum class NoisyGatePolicy { None, Jitter, RSample };
// "None" / "none" / "" , "Jitter", "RSample"; ConfigError naming the value otherwise.
NoisyGatePolicy parse_noisy_gate_policy(const std::string& s);

// [Mixtral Routing] GateRouting::Mixtral is Hugging Face's MixtralSparseMoeBlock and
// load_balancing_loss_func instead of DeepSpeed's gating:
// - probs = softmax(logits) over all E experts in fp32; the k largest (torch.topk, 1 <= k
//   <= E) are the choices; weights = their probs / their sum (renormalised: the same as a
//   softmax over the top-k logits). Dropless: no capacity, nothing drops, no noise.
// - Slots: expert e holds first all first choices for e (token order), then all second
//   choices, ... (as top-2 above, for any k).
// - aux loss = E * sum_{j,e} ce[j, e] * me[e]: ce[j, e] = fraction of tokens whose j-th choice
//   is e, me = mean over tokens of probs (HF's tokens_per_expert [k, E] x
//   router_prob_per_expert, summed, times E). Only me carries gradient. GateResult's
//   choice_fraction (ce) and prob_mean (me) let a model apply HF's formula to all its
//   layers' tokens at once (HF concatenates the layers' logits before the means).
enum class GateRouting { DeepSpeed, Mixtral };

struct GateOptions {
  GateRouting routing = GateRouting::DeepSpeed;
  int64_t k = 1;                 // 1 or 2 (DeepSpeed); 1..E (Mixtral)
  double capacity_factor = 1.0;  // > 0
  int64_t min_capacity = 4;      // >= 0 (DeepSpeed's MoE default)
  bool drop_tokens = true;
  bool use_rts = true;           // top-1 only (DeepSpeed ignores it for top-2, so do we)
  // RSample: Gumbel noise on the logits for the top-1 choice (top-2 rejects it: DeepSpeed
  // would silently ignore it). Jitter acts on the gate's input (multiplicative_jitter),
  // so the gating functions treat it as None.
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::None;
  bool second_expert_sampling = true;  // top-2 only; DeepSpeed's default
  // Expert parallelism: the capacity is agreed (max) over this group ([Expert Parallel]).
  comm::GroupPtr ep_group;
};

// The routing of T tokens as k assignments each ([Sparse Dispatch]): column j is a token's
// j-th choice (first, second). No [T, E, C] tensor exists; tests/support/moe_dense_reference.h
// turns this into DeepSpeed's combine weights / dispatch mask for inspection.
struct GateResult {
  torch::Tensor expert_index;        // [T, k] int64: the chosen expert (global index)
  torch::Tensor slot;                // [T, k] int64: the slot in that expert (valid where kept)
  torch::Tensor kept;                // [T, k] bool: false = dropped (slot >= C)
  torch::Tensor weights;             // [T, k] fp32 combine weight, 0 where dropped;
                                     // differentiable w.r.t. the logits
  torch::Tensor aux_loss;            // scalar fp32
  torch::Tensor tokens_per_expert;   // [E] int64: assignments routed, before drops
  torch::Tensor kept_per_expert;     // [E] int64: assignments kept
  std::vector<int64_t> routed_counts, kept_counts;  // the two above on the host (one copy)
  int64_t capacity = 0;
  double dropped_fraction = 0.0;     // dropped assignments / routed assignments
  // [Mixtral Routing] only (undefined otherwise): ce [k, E] and me [E] of the aux loss.
  torch::Tensor choice_fraction, prob_mean;
};

int64_t moe_capacity(int64_t tokens, int64_t experts, double capacity_factor, int64_t min_capacity);

// logits [T, E]; gen is used for RSample, use_rts and second_expert_sampling (the
// default CPU/CUDA generator when absent).
GateResult top1_gating(const torch::Tensor& logits, const GateOptions& opt,
                       std::optional<torch::Generator> gen = std::nullopt);
GateResult top2_gating(const torch::Tensor& logits, const GateOptions& opt,
                       std::optional<torch::Generator> gen = std::nullopt);
// [Mixtral Routing].
GateResult mixtral_gating(const torch::Tensor& logits, const GateOptions& opt);
// By opt.routing: Mixtral, else top-1 / top-2 by opt.k.
GateResult topk_gating(const torch::Tensor& logits, const GateOptions& opt,
                       std::optional<torch::Generator> gen = std::nullopt);

// x * U(1 - eps, 1 + eps), elementwise (DeepSpeed's multiplicative_jitter, eps 1e-2).
torch::Tensor multiplicative_jitter(const torch::Tensor& x, double eps,
                                    std::optional<torch::Generator> gen = std::nullopt);
// Standard Gumbel(0, 1) samples of `shape`.
torch::Tensor gumbel_sample(at::IntArrayRef shape, const torch::TensorOptions& o,
                            std::optional<torch::Generator> gen = std::nullopt);

struct MoEOptions {
  int64_t hidden = 0;
  int64_t num_experts = 1;
  GateOptions gate;                    // capacity_factor is the training one
  double eval_capacity_factor = 1.0;   // used when !is_training()
  bool use_residual = false;           // PR-MoE
  // Expert parallelism ([Expert Parallel]): null or size 1 = every expert on this rank.
  // num_experts must divide by its size (ConfigError naming both).
  comm::GroupPtr ep_group;
};

struct MoEOutput {
  torch::Tensor output;   // shape of the input
  torch::Tensor aux_loss; // scalar
  GateResult gate;        // routing of this call (counters, capacity, dropped fraction)
};

// Builds one expert: a module whose forward maps [..., hidden] -> [..., hidden].
using ExpertFactory = std::function<torch::nn::AnyModule()>;

// [MoE Timing] The all-to-alls of an MoE layer, each a DeviceSpan on the current stream
// (common/phase_timer.h: two CUDA events around the collective, whose wait orders the
// stream after it; wall time on the CPU), read once the step is done, so timing adds no
// synchronization. Spans come from forward and from backward, which may run on autograd's
// device thread: hence the lock. Off (MoEImpl::set_timing(false), the default): no log,
// no event.
class SpanLog {
 public:
  void add(DeviceSpan s) {
    std::lock_guard<std::mutex> lock(mu_);
    spans_.push_back(std::move(s));
  }
  std::vector<DeviceSpan> take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<DeviceSpan> out;
    out.swap(spans_);
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<DeviceSpan> spans_;
};

// The all-to-all of equal chunks along dim 0 over `g`, differentiable (its backward is
// the same all-to-all of the gradient). x.size(0) must divide by g's size. With `sink`
// each call (forward and backward) adds its span there; `sink` must outlive the graph.
torch::Tensor all_to_all_dim0(const torch::Tensor& x, const comm::GroupPtr& g, SpanLog* sink = nullptr);
// The uneven all-to-all of rows (dim 0) over `g` (Group::all_to_all_v), differentiable (its
// backward sends the gradient back with the splits swapped): send_rows[r] rows of x, in rank
// order, go to rank r; recv_rows[r] rows come from rank r (it must equal r's send_rows[me]).
torch::Tensor all_to_all_rows(const torch::Tensor& x, const comm::GroupPtr& g, const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows, SpanLog* sink = nullptr);

// DeepSpeed's MoE layer. Parameters: gate.weight [E, hidden] (no bias), experts.<i>.* for
// this rank's experts (i local; global index first_expert() + i), and with use_residual mlp.* (one more expert) and
// coefficient.{weight,bias} (Linear(hidden, 2)). In training Jitter/RSample apply and
// capacity_factor is used; in eval no noise and eval_capacity_factor.
struct MoEImpl : torch::nn::Module {
  MoEImpl(MoEOptions opt, const ExpertFactory& make_expert);
  MoEOutput forward(const torch::Tensor& x);
  // Generator for the gate's noise and random token selection (default when unset).
  void set_generator(std::optional<torch::Generator> gen) { gen_ = std::move(gen); }
  // Experts on this rank, and the global index of the first ([Expert Parallel]).
  int64_t local_experts() const { return static_cast<int64_t>(expert_fns.size()); }
  int64_t first_expert() const { return first_expert_; }
  // [MoE Timing]: time each all-to-all of this layer (forward and backward; expert
  // parallelism only: at ep 1 there is none); take_all_to_all_spans() hands over the
  // spans recorded since the last take.
  void set_timing(bool on) { timing_ = on; }
  std::vector<DeviceSpan> take_all_to_all_spans() { return a2a_log_->take(); }

  MoEOptions opt_;
  torch::nn::Linear gate{nullptr};
  torch::nn::ModuleList experts{nullptr};
  std::vector<torch::nn::AnyModule> expert_fns;
  torch::nn::AnyModule mlp;
  torch::nn::Linear coefficient{nullptr};

 private:
  // [Expert Parallel] of [Sparse Dispatch]: rows [N, d] packed by global expert in, this
  // rank's experts' outputs for them out (same order).
  torch::Tensor run_experts_parallel(const torch::Tensor& rows, const torch::Tensor& kept_per_expert,
                                     const std::vector<int64_t>& kept_counts);
  std::optional<torch::Generator> gen_;
  int64_t first_expert_ = 0;
  int ep_size_ = 1;
  bool timing_ = false;
  std::shared_ptr<SpanLog> a2a_log_ = std::make_shared<SpanLog>();
};
TORCH_MODULE(MoE);

// [Expert Names] The ep-1 name of an expert parameter, as checkpoints store experts by global
// index: `name` is "<prefix><layer><key><local>.<rest>" (key begins with '.'), and the result
// has first_expert_of(layer) + local in place of local (first_expert_of: that layer's first
// global expert; nullopt when the layer has no MoE or does not exist). A name without prefix
// or key comes back unchanged; one with both that does not parse is a ConfigError naming
// `model`. Used by GPT-2's, the Llama (Mixtral)'s and the CIFAR MoE net's global_param_name.
std::string expert_global_name(const std::string& name, const std::string& prefix, const std::string& key,
                               const std::function<std::optional<int64_t>(int64_t layer)>& first_expert_of,
                               const std::string& model);

}  // namespace zt::models
