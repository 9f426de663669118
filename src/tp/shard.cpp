// See [TP Slices] in tp/shard.h.
#include "tp/shard.h"

#include <torch/torch.h>

#include "zerotrain/error.h"

namespace zt::tp {

torch::Tensor cut(const torch::Tensor& full, const SplitSpec& spec, int rank, int size) {
  if (!spec.split()) return full;
  ZT_ASSERT(spec.dim < full.dim(), "tp::cut: dim ", spec.dim, " of a ", full.dim(), "-d tensor");
  torch::Tensor t = full;
  if (spec.padded > full.size(spec.dim)) {
    auto pad_shape = full.sizes().vec();
    pad_shape[spec.dim] = spec.padded - full.size(spec.dim);
    t = torch::cat({full, torch::zeros(pad_shape, full.options())}, spec.dim);
  }
  const int64_t n = t.size(spec.dim);
  ZT_CHECK_T(n % (spec.blocks * size) == 0, zt::ConfigError, "tensor parallelism: a dimension of size ", n, " (",
             spec.blocks, " block(s)) does not divide by tp ", size, "; choose a tp degree that divides it");
  const int64_t block = n / spec.blocks, slice = block / size;
  std::vector<torch::Tensor> parts;
  for (int64_t b = 0; b < spec.blocks; ++b) parts.push_back(t.narrow(spec.dim, b * block + rank * slice, slice));
  return torch::cat(parts, spec.dim).contiguous();
}

torch::Tensor join(const std::vector<torch::Tensor>& slices, const SplitSpec& spec, int64_t full_size) {
  ZT_ASSERT(!slices.empty(), "tp::join of no slices");
  if (!spec.split()) return slices[0];
  const int64_t slice = slices[0].size(spec.dim) / spec.blocks;
  std::vector<torch::Tensor> parts;
  for (int64_t b = 0; b < spec.blocks; ++b)
    for (const auto& s : slices) parts.push_back(s.narrow(spec.dim, b * slice, slice));
  return torch::cat(parts, spec.dim).narrow(spec.dim, 0, full_size).contiguous();
}

torch::Tensor gather_full(const torch::Tensor& slice, const SplitSpec& spec, int64_t full_size,
                          const comm::GroupPtr& group) {
  if (!spec.split() || !group || group->size() == 1) return spec.split() ? join({slice}, spec, full_size) : slice;
  auto s = slice.contiguous();
  auto all = torch::empty({group->size() * s.numel()}, s.options());
  group->all_gather(all, s.view({-1}));
  std::vector<torch::Tensor> slices;
  for (int r = 0; r < group->size(); ++r) slices.push_back(all.narrow(0, r * s.numel(), s.numel()).view(s.sizes()));
  return join(slices, spec, full_size);
}

}  // namespace zt::tp
