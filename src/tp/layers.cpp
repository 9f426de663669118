#include "tp/layers.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <cmath>

#include "tp/mappings.h"
#include "zerotrain/error.h"

namespace zt::tp {
namespace F = torch::nn::functional;

namespace {

int group_size(const comm::GroupPtr& g) { return g ? g->size() : 1; }
int group_rank(const comm::GroupPtr& g) { return g ? g->rank() : 0; }

// [Sequence-Parallel Linear] y = all_gather_seq(x) W^T + b keeping only x (this rank's
// T/tp positions) for backward, not the gathered input: backward all-gathers x again for
// the weight gradient and reduce-scatters the input gradient (Korthikanti et al. 2022,
// section 4.2.2). Saving the gathered input, as autograd through gather_from_sequence and
// a plain linear would, keeps tp times more activation bytes per column-parallel layer.
struct SequenceParallelLinearBackward : torch::autograd::Node {
  comm::GroupPtr group;
  int64_t seq_dim = 1;
  torch::Tensor x_local, weight;  // detached: x's slice of the sequence, W (out/tp, in)
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list out(3);
    if (!grads[0].defined()) return out;
    const auto dy = grads[0].contiguous();  // (..., T, ..., out/tp)
    const int64_t n_out = dy.size(-1), n_in = weight.size(1);
    const auto dy2 = dy.reshape({-1, n_out});
    if (should_compute_output(0)) {
      auto dx_full = at::matmul(dy, weight);  // this rank's share of dL/dX
      auto xt = dx_full.movedim(seq_dim, 0).contiguous();
      auto sizes = xt.sizes().vec();
      sizes[0] /= group->size();
      auto dx = torch::empty(sizes, xt.options());
      group->reduce_scatter(dx, xt, comm::ReduceOp::kSum);
      out[0] = dx.movedim(0, seq_dim).contiguous();
    }
    if (should_compute_output(1)) {
      const auto X = all_gather_dim(x_local, group, seq_dim);  // re-gathered, not kept
      out[1] = at::mm(dy2.t(), X.reshape({-1, n_in}));
    }
    if (should_compute_output(2)) out[2] = dy2.sum(0);
    return out;
  }
  std::string name() const override { return "tp::SequenceParallelLinearBackward"; }
  void release_variables() override {
    x_local.reset();
    weight.reset();
  }
};

torch::Tensor sequence_parallel_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                       const comm::GroupPtr& g, int64_t seq_dim) {
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = F::linear(all_gather_dim(x, g, seq_dim), w, b);
  }
  const bool needs = torch::GradMode::is_enabled() &&
                     (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  if (!needs) return y;
  auto node = std::shared_ptr<SequenceParallelLinearBackward>(new SequenceParallelLinearBackward(),
                                                              torch::autograd::deleteNode);
  node->group = g;
  node->seq_dim = seq_dim < 0 ? seq_dim + x.dim() : seq_dim;
  node->x_local = x.detach();
  node->weight = w.detach();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace

torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                     const comm::GroupPtr& g, bool sequence_parallel, int64_t seq_dim) {
  if (sequence_parallel && active(g)) return sequence_parallel_linear(x, w, b, g, seq_dim);
  return F::linear(copy_to_region(x, g), w, b);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, comm::GroupPtr g, ColumnParallelOptions o)
    : in_features(in), out_features(out), options(o), group(std::move(g)) {
  const int n = group_size(group);
  ZT_CHECK_T(o.blocks >= 1 && out % o.blocks == 0 && (out / o.blocks) % n == 0, zt::ConfigError,
             "ColumnParallelLinear: output features ", out, " (", o.blocks, " block(s) of ", out / std::max<int64_t>(1, o.blocks),
             ") do not divide by tensor-parallel size ", n, "; choose a tp degree that divides them");
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", torch::empty({out / n, in}).uniform_(-bound, bound));
  if (o.bias) bias = register_parameter("bias", torch::empty({out / n}).uniform_(-bound, bound));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  // See [TP Regions]: entering the region copies x (its gradient is summed over the
  // group), or with sequence parallelism all-gathers the sequence (reduce-scattered back).
  auto y = column_parallel_linear(x, weight, bias, group, options.sequence_parallel, options.seq_dim);
  return options.gather_output ? gather_from_region(y, group, -1) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, comm::GroupPtr g, RowParallelOptions o)
    : in_features(in), out_features(out), options(o), group(std::move(g)) {
  const int n = group_size(group);
  ZT_CHECK_T(in % n == 0, zt::ConfigError, "RowParallelLinear: input features ", in,
             " do not divide by tensor-parallel size ", n, "; choose a tp degree that divides them");
  ZT_CHECK_T(!(o.sequence_parallel && !o.input_is_parallel), zt::ConfigError,
             "RowParallelLinear: sequence_parallel needs input_is_parallel (Megatron's rule: the input comes "
             "from a column-parallel layer)");
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", torch::empty({out, in / n}).uniform_(-bound, bound));
  if (o.bias) bias = register_parameter("bias", torch::empty({out}).uniform_(-bound, bound));
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  const auto xin = options.input_is_parallel ? x : scatter_to_region(x, group, -1);
  auto partial = F::linear(xin, weight);  // (..., out), this rank's share of the sum
  auto y = options.sequence_parallel ? reduce_scatter_to_sequence(partial, group, options.seq_dim)
                                     : reduce_from_region(partial, group);
  if (!bias.defined()) return y;
  // Under sequence parallelism the bias meets only this rank's rows: its gradient is
  // partial and is summed over the group (see [TP Regions]).
  return y + (options.sequence_parallel ? copy_to_region(bias, group) : bias);
}

int64_t padded_vocab(int64_t vocab, int size, int64_t pad_multiple) {
  const int64_t m = static_cast<int64_t>(size) * std::max<int64_t>(1, pad_multiple);
  return (vocab + m - 1) / m * m;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, comm::GroupPtr g,
                                                       int64_t pad_multiple, bool sp, int64_t sdim)
    : vocab_size(vocab), embedding_dim(dim), sequence_parallel(sp), seq_dim(sdim), group(std::move(g)) {
  const int n = group_size(group);
  padded_size = padded_vocab(vocab, n, pad_multiple);
  const int64_t rows = padded_size / n;
  vocab_start = group_rank(group) * rows;
  vocab_end = vocab_start + rows;
  weight = register_parameter("weight", torch::empty({rows, dim}).normal_());
  // Padding rows (ids >= vocab) start at zero; no id selects them and the vocab-parallel
  // cross entropy masks their logits, so they get no gradient and stay zero.
  if (vocab_end > vocab) {
    torch::NoGradGuard no_grad;
    const int64_t first = std::max<int64_t>(0, vocab - vocab_start);
    weight.narrow(0, first, rows - first).zero_();
  }
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& idx) {
  if (!active(group)) return F::embedding(idx, weight);
  const auto outside = (idx < vocab_start) | (idx >= vocab_end);
  const auto local = (idx - vocab_start).masked_fill(outside, 0);
  auto partial = F::embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0);
  return sequence_parallel ? reduce_scatter_to_sequence(partial, group, seq_dim) : reduce_from_region(partial, group);
}

}  // namespace zt::tp
