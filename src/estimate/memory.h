// `zerotrain estimate`: memory per GPU of a GPT-2 training job, by kind, before running it.
//
// The model (bytes per rank; Ψ parameters, N data-parallel ranks, d compute-dtype bytes,
// Adam K = 12 fp32 bytes of master + m + v per parameter, SGD 4 or 8):
//   stage 0   params dΨ, grads dΨ, master+optimizer KΨ
//   stage 1   params dΨ, grads dΨ, master+optimizer KΨ/N
//   stage 2   params dΨ, grads dΨ/N (from the first reduction to the step), KΨ/N
//   stage 3   grads dΨ/N, KΨ/N, plus gathered units (root + running + prefetched)
//   offload   KΨ/N (and stage 3 with offload_param the dΨ/N shard) move to the host, which
//             also holds the gradient and upload buffers (2 × dΨ/N); stage 3 without
//             offload_param keeps a dΨ/N compute shard on the device; the delayed update
//             adds a second dΨ/N gradient buffer on the host and a dΨ/N upload buffer on
//             the device
//   nvme      KΨ/N go to the swap file instead; the host keeps the gradient buffer dΨ/N
//             and min(buffer_count, sub-groups) staging buffers of (12 + d) bytes per
//             sub-group element; offload_param nvme (with either optimizer device) moves
//             the dΨ/N shard to its own file, and the host keeps offload_param.buffer_count
//             slots of the largest unit's shard
// Activations per token (what autograd keeps for one pre-LN GPT-2 block with fused
// attention, in the compute dtype): 16·C elements per layer (x, ln_1, qkv 3C, attention out,
// h1, ln_2, c_fc 4C, gelu 4C) = 16·C·d bytes; with activation checkpointing only the block
// input (C·d per layer) plus one block being recomputed. The loss (GPT-2's fused, chunked
// head + cross entropy, src/models/lm_head_loss.h) peaks at one chunk of logits in the
// compute dtype, fp32 and as gradient, plus the padded weight and fp32 dw; it keeps dw and
// dx for backward. fp16 (unfused) keeps the logits (Vp·d), their fp32 copy and the fp32
// log-softmax (8·Vp) per token, and backward adds the logits' gradient (Vp·d).
// Calibrated against GPT-2 Large on 2× H200 (bench/results/2026-11-22_*): every measured
// peak is within 5% (tests/unit/test_estimate.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "models/gpt2.h"
#include "zerotrain/config.h"

namespace zt::estimate {

struct Job {
  models::GPT2Config model;
  int64_t micro_batch = 1;
  int64_t seq = 1024;
  int gpus = 1;                     // data-parallel ranks
  bool checkpointing = false;
  // zerotrain's CUDA kernels run the job (a CUDA build with nvcc, on GPUs): the LM-head
  // loss works in place on each chunk's logits (no fp32 copy), and the Adam/AdamW step
  // reads the gradients as they are (no fp32 gradient group).
  bool cuda_kernels = false;
};

struct Memory {
  // Device, bytes per GPU.
  double params = 0, grads = 0, master = 0, optimizer = 0, gathered = 0;
  double activations = 0;  // kept for backward at the end of forward
  double loss = 0;         // logits and the fp32 loss workspace at the end of forward
  double backward_extra = 0;
  double forward_peak = 0, backward_peak = 0, step_peak = 0, peak = 0;
  // Host, bytes per rank (offload; with NVMe the gradient and staging buffers only).
  double host = 0;
  // NVMe offload: master + optimizer bytes per rank in the swap file.
  double nvme = 0;
  int64_t num_params = 0;
};

// Throws ConfigError for a job the engine would reject (e.g. micro batch 0).
Memory estimate_memory(const Job& job, const Config& config);

}  // namespace zt::estimate
