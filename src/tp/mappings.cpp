// See [TP Regions] in tp/mappings.h.
#include "tp/mappings.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>

#include "zerotrain/error.h"

namespace zt::tp {
namespace {

int64_t wrap_dim(const torch::Tensor& x, int64_t dim) {
  const int64_t n = x.dim();
  ZT_ASSERT(dim >= -n && dim < n, "tp: dim ", dim, " out of range for a tensor of ", n, " dims");
  return dim < 0 ? dim + n : dim;
}

void check_divides(const torch::Tensor& x, int64_t dim, int size, const char* what) {
  ZT_CHECK_T(x.size(dim) % size == 0, zt::ConfigError, "tensor parallelism (", what, "): dimension ", dim,
             " of size ", x.size(dim), " does not divide by the tp group size ", size,
             "; choose a tp degree that divides it");
}

// The backward of one mapping: a function of the incoming gradient, and the group it
// talks over (held here, so the group lives as long as the graph that needs it).
struct CommBackward : torch::autograd::Node {
  CommBackward(std::string name, std::function<torch::Tensor(const torch::Tensor&)> fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    ZT_ASSERT(grads.size() == 1, "tp: ", name_, " expects one gradient, got ", grads.size());
    if (!grads[0].defined()) return {torch::Tensor()};
    return {fn_(grads[0].contiguous())};
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  std::function<torch::Tensor(const torch::Tensor&)> fn_;
};

// y = the forward result (computed without autograd); attaches `backward` as its grad_fn
// when x needs a gradient. y must not share autograd history with x (a detached alias or
// a fresh tensor).
torch::Tensor attach(const torch::Tensor& x, torch::Tensor y, const char* name,
                     std::function<torch::Tensor(const torch::Tensor&)> backward) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return y;
  auto node = std::shared_ptr<CommBackward>(new CommBackward(name, std::move(backward)), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(y, node);
  return y;
}

torch::Tensor all_reduce_copy(const torch::Tensor& x, const comm::GroupPtr& g) {
  auto y = x.contiguous().clone();
  g->all_reduce(y, comm::ReduceOp::kSum);
  return y;
}

torch::Tensor reduce_scatter_dim(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim) {
  const int size = g->size();
  auto xt = x.movedim(dim, 0).contiguous();  // (n, ...)
  auto sizes = xt.sizes().vec();
  sizes[0] /= size;
  auto out = torch::empty(sizes, xt.options());
  g->reduce_scatter(out, xt, comm::ReduceOp::kSum);
  return out.movedim(0, dim).contiguous();
}

}  // namespace

torch::Tensor own_slice(const torch::Tensor& x, int64_t dim, int rank, int size) {
  dim = wrap_dim(x, dim);
  check_divides(x, dim, size, "slice");
  const int64_t n = x.size(dim) / size;
  return x.narrow(dim, rank * n, n).contiguous();
}

torch::Tensor all_gather_dim(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim) {
  dim = wrap_dim(x, dim);
  if (!active(g)) return x.contiguous();
  auto xt = x.movedim(dim, 0).contiguous();  // (n, ...)
  auto sizes = xt.sizes().vec();
  sizes[0] *= g->size();
  auto out = torch::empty(sizes, xt.options());
  g->all_gather(out, xt);
  return out.movedim(0, dim).contiguous();
}

torch::Tensor copy_to_region(const torch::Tensor& x, const comm::GroupPtr& g) {
  if (!active(g)) return x;
  return attach(x, x.detach(), "tp::CopyToRegionBackward", [g](const torch::Tensor& dy) { return all_reduce_copy(dy, g); });
}

torch::Tensor reduce_from_region(const torch::Tensor& x, const comm::GroupPtr& g) {
  if (!active(g)) return x;
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = all_reduce_copy(x, g);
  }
  return attach(x, y, "tp::ReduceFromRegionBackward", [](const torch::Tensor& dy) { return dy; });
}

torch::Tensor gather_from_region(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim) {
  if (!active(g)) return x;
  dim = wrap_dim(x, dim);
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = all_gather_dim(x, g, dim);
  }
  return attach(x, y, "tp::GatherFromRegionBackward",
                [g, dim](const torch::Tensor& dy) { return own_slice(dy, dim, g->rank(), g->size()); });
}

torch::Tensor scatter_to_region(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim) {
  if (!active(g)) return x;
  dim = wrap_dim(x, dim);
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = own_slice(x, dim, g->rank(), g->size());
  }
  return attach(x, y, "tp::ScatterToRegionBackward", [g, dim](const torch::Tensor& dy) { return all_gather_dim(dy, g, dim); });
}

torch::Tensor gather_from_sequence(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim, bool grad_is_partial) {
  if (!active(g)) return x;
  dim = wrap_dim(x, dim);
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = all_gather_dim(x, g, dim);
  }
  if (grad_is_partial) {
    return attach(x, y, "tp::GatherFromSequenceBackward",
                  [g, dim](const torch::Tensor& dy) { return reduce_scatter_dim(dy, g, dim); });
  }
  return attach(x, y, "tp::GatherFromSequenceBackward",
                [g, dim](const torch::Tensor& dy) { return own_slice(dy, dim, g->rank(), g->size()); });
}

torch::Tensor reduce_scatter_to_sequence(const torch::Tensor& x, const comm::GroupPtr& g, int64_t dim) {
  if (!active(g)) return x;
  dim = wrap_dim(x, dim);
  check_divides(x, dim, g->size(), "reduce-scatter along the sequence");
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = reduce_scatter_dim(x, g, dim);
  }
  return attach(x, y, "tp::ReduceScatterToSequenceBackward",
                [g, dim](const torch::Tensor& dy) { return all_gather_dim(dy, g, dim); });
}

}  // namespace zt::tp
