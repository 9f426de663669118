// ZeroOptimizer's checkpoint state: export as per-parameter element ranges, import from
// any such tiling (any world size, any stage). See zero_optimizer.h and docs/checkpoints.md.
#include "zero/zero_optimizer.h"

#include <string>

#include "zerotrain/error.h"

namespace zt::zero {

std::vector<std::string> ZeroOptimizer::state_kinds() const { return rule_.state_kinds(); }

std::vector<torch::Tensor> ZeroOptimizer::user_params() const {
  std::vector<torch::Tensor> out(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) out[user_index_[i]] = params_[i];
  return out;
}

std::vector<std::vector<int64_t>> ZeroOptimizer::user_param_shapes() const {
  std::vector<std::vector<int64_t>> out(params_.size());
  // Stage 3: a released parameter is empty; its shape is the recorded one.
  for (size_t i = 0; i < params_.size(); ++i) {
    out[user_index_[i]] = opt_.stage == 3 ? shapes_[i] : params_[i].sizes().vec();
  }
  return out;
}

std::vector<ZeroOptimizer::StateFragment> ZeroOptimizer::state_fragments() {
  flush_delayed_update();  // a delayed CPU step still writing the master: finish it first
  // NVMe: a host copy of the state read back from the swap file; the fragments are views
  // into it and keep it alive until the checkpoint is written.
  const auto bufs = backend_->state_buffers(/*master_only=*/false);
  std::vector<StateFragment> out;
  for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
    const Bucket& B = L_.flat.buckets[b];
    const Range write{B.shard_offset(rank_), B.shard_offset(rank_) + B.shard_numel};
    const int64_t own_base = L_.owns_all ? B.offset : B.shard_offset(rank_);
    for (int i = B.first_param; i < B.first_param + B.num_params; ++i) {
      const ParamSlot& s = L_.flat.params[i];
      const Range piece = intersect(write, {s.offset, s.offset + s.numel});
      if (piece.size() == 0) continue;
      StateFragment f;
      f.param = user_index_[i];
      f.begin = piece.begin - s.offset;
      f.end = piece.end - s.offset;
      for (const auto& t : bufs) f.state.push_back(L_.owned_view(t, b).narrow(0, piece.begin - own_base, piece.size()));
      out.push_back(std::move(f));
    }
  }
  return out;
}

void ZeroOptimizer::import_state(const StateFetch& fetch) {
  torch::NoGradGuard no_grad;
  backend_->drop_in_flight();  // a delayed step's update is replaced by the loaded state
  // NVMe: sub-group by sub-group through the staging buffers.
  if (backend_->import_state([&](int li, int64_t begin, int64_t end, const std::string& kind) {
        return fetch(user_index_[li], begin, end, kind);
      })) {
    return;
  }
  const auto kinds = state_kinds();
  const auto bufs = state_.buffers();
  for (size_t b = 0; b < L_.flat.buckets.size(); ++b) {
    const Bucket& B = L_.flat.buckets[b];
    const Range own = L_.owns_all ? Range{B.offset, B.offset + B.numel}
                                : Range{B.shard_offset(rank_), B.shard_offset(rank_) + B.shard_numel};
    for (int i = B.first_param; i < B.first_param + B.num_params; ++i) {
      const ParamSlot& s = L_.flat.params[i];
      const Range piece = intersect(own, {s.offset, s.offset + s.numel});
      if (piece.size() == 0) continue;
      for (size_t k = 0; k < kinds.size(); ++k) {
        torch::Tensor v = fetch(user_index_[i], piece.begin - s.offset, piece.end - s.offset, kinds[k]);
        ZT_ASSERT(v.numel() == piece.size(), "state fetch returned ", v.numel(), " values for ", piece.size());
        L_.owned_view(bufs[k], b).narrow(0, piece.begin - own.begin, piece.size()).copy_(v.reshape(-1));
      }
    }
  }
}

void ZeroOptimizer::finish_state_import() {
  torch::NoGradGuard no_grad;
  // Offload: the step writes the compute-dtype copy itself (refresh_params does not cast
  // the master); the backend brings this rank's copy in line with the loaded master.
  backend_->finish_import();
  // The last step's fused kernel wrote the parameters (params_written_); the loaded master
  // has not been: refresh_params casts it in (stages 0-2 on the device).
  params_written_ = false;
  refresh_params();
}

}  // namespace zt::zero
