#include "estimate/memory.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "zerotrain/error.h"

namespace zt::estimate {

Memory estimate_memory(const Job& job, const Config& cfg) {
  ZT_CHECK_T(job.micro_batch >= 1 && job.seq >= 1 && job.gpus >= 1, ConfigError,
             "estimate: micro batch, sequence length and GPUs must be at least 1");
  const auto& m = job.model;
  const double psi = static_cast<double>(models::gpt2_num_params(m));
  const double N = job.gpus;
  const at::ScalarType dt = cfg.compute_dtype();
  const double d = dt == at::kFloat ? 4.0 : 2.0;
  std::string type = cfg.optimizer.type;
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool sgd = type == "sgd";
  const double opt_bytes = sgd ? (cfg.optimizer.params.momentum != 0 ? 4.0 : 0.0) : 8.0;
  const auto& z = cfg.zero_optimization;
  const int stage = static_cast<int>(z.stage);
  const bool nvme = z.offload_optimizer.device == OffloadDevice::nvme;
  const bool off = z.offload_optimizer.device == OffloadDevice::cpu || nvme;
  const bool param_nvme = z.offload_param.device == OffloadDevice::nvme;  // with nvme above (the engine's rule)
  const bool off_param = z.offload_param.device == OffloadDevice::cpu || param_nvme;

  Memory r;
  r.num_params = static_cast<int64_t>(psi);
  const double shard = stage == 0 ? 1.0 : 1.0 / N;
  r.master = 4.0 * psi * shard;
  r.optimizer = opt_bytes * psi * shard;
  r.params = stage <= 2 ? d * psi : 0.0;
  r.grads = stage <= 1 ? d * psi : d * psi / N;
  if (stage == 3 && off && !off_param) r.params = d * psi / N;  // standing compute shard for the step to write
  if (off && !nvme) {
    // Master + optimizer, the gradient buffer, and the compute-dtype shard the step writes:
    // an upload buffer of its own, or with offload_param cpu the host-resident shard itself
    // (with offload_param nvme a bucket-sized scratch, below).
    r.host = r.master + r.optimizer + d * psi / N + (param_nvme ? 0.0 : d * psi / N);
    r.master = r.optimizer = 0.0;
    if (z.offload_optimizer.delayed_param_update) {
      // A second gradient buffer on the host, and the device buffer the worker uploads into.
      r.host += d * psi / N;
      r.params += d * psi / N;
    }
  }
  if (nvme) {
    // Master + optimizer in the swap file; the host keeps the gradient buffer and
    // min(buffer_count, sub-groups) staging buffers of one sub-group's master + m + v (12
    // bytes per element) plus its compute-dtype copy for the upload (not with offload_param,
    // whose host shard the step writes directly). Page padding is ignored.
    r.nvme = r.master + r.optimizer;
    const double owned = psi / N;
    const double sub = std::min<double>(owned, static_cast<double>(std::max<int64_t>(1, z.sub_group_size)));
    const double groups = std::ceil(owned / sub);
    const double buffers = std::min<double>(static_cast<double>(z.offload_optimizer.buffer_count), groups);
    const double scratch = d == 4.0 || (off_param && !param_nvme) ? 0.0 : d;
    r.host = d * owned + buffers * sub * (12.0 + scratch) + (off_param && !param_nvme ? d * owned : 0.0);
    r.master = r.optimizer = 0.0;
  }
  if (off && param_nvme) {
    // The compute-dtype shard in its own swap file; the host keeps buffer_count slots of the
    // largest unit's shard (the root: token and position tables), and with the CPU optimizer
    // the step's scratch of that size (the NVMe step writes from its staging buffers).
    const double root = (static_cast<double>(m.vocab_size) + static_cast<double>(m.n_positions)) *
                        static_cast<double>(m.n_embd);
    r.nvme += d * psi / N;
    r.host += static_cast<double>(z.offload_param.buffer_count + (nvme ? 0 : 1)) * d * root / N;
  }
  // Stage 3: the root unit (embeddings) for the whole step, plus the running unit and the
  // prefetch window (bounded by max_live).
  const double C = static_cast<double>(m.n_embd), V = static_cast<double>(m.vocab_size);
  const double block = 12.0 * C * C + 13.0 * C;
  if (stage == 3) {
    const double root = V * C + static_cast<double>(m.n_positions) * C;
    const double window = std::min<double>(static_cast<double>(z.stage3_prefetch_bucket_size),
                                           static_cast<double>(z.stage3_max_live_parameters));
    // At the end of forward the units whose backward comes within stage3_max_reuse_distance
    // parameters stay gathered: block i's next use is 2 (L - 1 - i) blocks later, so the
    // last floor(distance / 2 block) + 1 blocks are kept, up to stage3_max_live_parameters.
    const double L_blocks = static_cast<double>(m.n_layer);
    const double reuse = static_cast<double>(z.stage3_max_reuse_distance);
    const double kept = std::min({L_blocks, std::floor(reuse / (2.0 * block)) + 1.0,
                                  std::max(1.0, std::floor(static_cast<double>(z.stage3_max_live_parameters) / block))});
    const double running = block + std::min(window, block * L_blocks);
    r.gathered = d * (root + std::max(running, kept * block));
  }

  const double tokens = static_cast<double>(job.micro_batch * job.seq);
  const double L = static_cast<double>(m.n_layer);
  const double per_layer = 16.0 * C * d * tokens;
  r.activations = job.checkpointing ? L * C * d * tokens + per_layer : L * per_layer;
  // The LM head runs over the vocabulary padded to lm_head_pad_multiple (Vp columns).
  const double Vp = static_cast<double>(models::gpt2_padded_vocab(m));
  double loss_peak = 0;  // the loss's own bytes at its peak, inside forward
  if (m.fused_lm_head_loss && dt != at::kHalf) {
    // Chunked head + loss (src/models/lm_head_loss.h): per chunk of `rows` tokens the logits
    // in the compute dtype, in fp32 and the gradient in the compute dtype; the padded weight,
    // a (Vp, C) product per chunk and the fp32 dw; dx. Kept for backward: dw and dx.
    // With zerotrain's kernel the chunk's logits become their gradient in place.
    const double rows = std::min(tokens, static_cast<double>(models::gpt2_loss_chunk_rows(m)));
    const double chunk = job.cuda_kernels ? rows * Vp * d : rows * Vp * (2.0 * d + 4.0);
    loss_peak = chunk + Vp * C * (2.0 * d + 4.0) + tokens * C * d;
    r.loss = Vp * C * 4.0 + tokens * C * d;
    r.backward_extra = tokens * C * 4.0 + V * C * (4.0 + d);  // the scaled dx and dw
  } else {
    r.loss = tokens * Vp * (d + 8.0);  // logits, their fp32 copy, the fp32 log-softmax
    loss_peak = r.loss;
    r.backward_extra = tokens * Vp * d;  // the logits' gradient
  }

  // Resident in forward: params (stage 0-2), master/optimizer on the device, gathered units.
  // The gradient buffers of stages 0-1 are standing; those of stages 2-3 appear in backward.
  const double standing = r.params + r.master + r.optimizer + r.gathered + (stage <= 1 ? r.grads : 0.0);
  r.forward_peak = standing + r.activations + loss_peak;
  r.backward_peak = standing + r.activations + r.loss + r.backward_extra + (stage >= 2 ? r.grads : 0.0);
  // Step: states + gradients + one group of fp32 gradients (at most 2^27 elements) or, with
  // offload, the upload buffers only.
  const double group = 4.0 * std::min<double>(psi * shard, static_cast<double>(int64_t{1} << 27));
  const bool fused_step = job.cuda_kernels && !sgd;  // zerotrain's Adam kernel: no fp32 copy
  r.step_peak = standing + r.grads + (off || fused_step ? 0.0 : group);
  r.peak = std::max({r.forward_peak, r.backward_peak, r.step_peak});
  return r;
}

}  // namespace zt::estimate
