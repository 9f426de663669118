#include "tp/cross_entropy.h"

#include <torch/torch.h>

#include <limits>

#include "zerotrain/error.h"

namespace zt::tp {
namespace {

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  // `group` is used in forward only (backward is local), so a raw pointer is enough here.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab_size, comm::Group* group) {
    const int size = group ? group->size() : 1, rank = group ? group->rank() : 0;
    const int64_t N = logits.size(0), Vl = logits.size(1);
    const int64_t start = rank * Vl;
    auto lg = logits.to(torch::kFloat).clone();  // (N, Vl), fp32, ours to modify
    if (start + Vl > vocab_size) {  // padding columns of a vocabulary that does not divide
      const int64_t first = std::clamp<int64_t>(vocab_size - start, 0, Vl);
      lg.narrow(1, first, Vl - first).fill_(-std::numeric_limits<float>::infinity());
    }
    auto mx = std::get<0>(lg.max(1));  // (N)
    if (size > 1) group->all_reduce(mx, comm::ReduceOp::kMax);
    lg.sub_(mx.unsqueeze(1));
    const auto valid = targets >= 0;
    const auto mine = valid & (targets >= start) & (targets < start + Vl);
    const auto local = (targets - start).masked_fill(~mine, 0);  // (N)
    auto sums = torch::empty({2, N}, lg.options());                // [target logit; sum exp]
    sums[0].copy_(lg.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(~mine, 0.0));
    lg.exp_();  // lg is now exp(logit - max)
    sums[1].copy_(lg.sum(1));
    if (size > 1) group->all_reduce(sums, comm::ReduceOp::kSum);
    const auto per_row = (sums[1].log() - sums[0]).masked_fill(~valid, 0.0);  // (N)
    const auto count = valid.sum().to(torch::kFloat).clamp_min(1.0);
    lg.div_(sums[1].unsqueeze(1));  // softmax over the full vocabulary, our columns
    ctx->save_for_backward({lg, local, mine, valid, count});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return per_row.sum() / count;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto s = ctx->get_saved_variables();
    const auto &softmax = s[0], &local = s[1], &mine = s[2], &valid = s[3], &count = s[4];
    auto g = softmax.clone();  // (N, Vl)
    g.scatter_add_(1, local.unsqueeze(1), -mine.to(g.scalar_type()).unsqueeze(1));
    g.mul_(valid.to(g.scalar_type()).unsqueeze(1));
    g.mul_(grad_out[0].to(torch::kFloat) / count);
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {g.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_size, const comm::GroupPtr& group) {
  ZT_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0), "vocab_parallel_cross_entropy: ",
           "logits must be (N, V/tp) and targets (N), got ", logits.sizes(), " and ", targets.sizes());
  ZT_CHECK(targets.scalar_type() == torch::kLong, "vocab_parallel_cross_entropy: targets must be int64, got ",
           targets.scalar_type());
  const int size = group ? group->size() : 1;
  ZT_CHECK_T(logits.size(1) * size >= vocab_size, zt::ConfigError, "vocab_parallel_cross_entropy: ", size,
             " ranks x ", logits.size(1), " columns do not cover the vocabulary of ", vocab_size);
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_size, group.get());
}

}  // namespace zt::tp
