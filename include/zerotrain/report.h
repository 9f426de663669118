// What the engine reports: per-phase time and memory, model-state bytes by kind, one
// step's report, one checkpoint save's report. Plain structs in their own header so the
// layers below the engine (src/zero, src/ckpt) fill them without including the engine;
// zerotrain/engine.h includes this header.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace zt {

// Memory and time of one phase of one step on this rank.
struct PhaseStats {
  double ms = 0;               // time (CUDA: between events on the compute stream; CPU: wall time)
  int64_t mem_after = 0;       // bytes allocated when the phase ended
  int64_t mem_peak = 0;        // peak bytes allocated during the phase
};

// Bytes of model state this rank holds, by kind (what the ZeRO formulas count).
struct ModelStateBytes {
  int64_t params = 0;     // compute-dtype parameters (full, or this rank's shard)
  int64_t grads = 0;      // gradient buffers (full, or this rank's shard)
  int64_t master = 0;     // fp32 master weights
  int64_t optimizer = 0;  // optimizer state (Adam: exp_avg + exp_avg_sq)
  // Stage 3: this rank's compute-dtype shard of the parameters without gradients (a LoRA
  // base; no gradient, master or optimizer state). At stages 0-2 they stay whole in the
  // model and are not counted here.
  int64_t frozen = 0;
  // Of `frozen`: this rank's shard of the frozen byte storage (EngineOptions::frozen_storage,
  // QLoRA's NF4 base at ZeRO-3).
  int64_t frozen_storage = 0;
  // Stage 3: full-size parameters gathered right now (not part of total(): they come and
  // go with the units; see StepReport::zero3 for the step's peak).
  int64_t gathered = 0;
  // Offload: bytes of the above (and of the host-side gradient / upload buffers) that live
  // in host memory instead of device memory.
  int64_t host = 0;
  // NVMe offload: bytes of the swap file that holds master + optimizer (each sub-group's
  // arrays padded to 4096 bytes); master and optimizer above are then on the drive, and
  // host counts only the gradient and staging buffers.
  int64_t nvme = 0;
  // Expert parallelism (EngineOptions::is_expert): the expert shard group's part of
  // master and optimizer above (partitioned over expert-dp at stages 1-2).
  int64_t expert_master = 0;
  int64_t expert_optimizer = 0;
  int64_t total() const { return params + grads + master + optimizer + frozen; }
};

// One published checkpoint save (Engine::last_checkpoint_save()). Times in ms, rank 0's
// view; write_ms is the slowest rank's.
struct CheckpointSaveReport {
  int64_t index = 0;          // 1 for the engine's first published save, then 2, ...
  std::string dir, tag;
  bool async = false;
  int64_t step = 0;           // global step the checkpoint holds
  int64_t published_step = 0; // global step at which `latest` was updated (async: later)
  double wait_ms = 0;         // the call first waited for the previous async save
  double snapshot_ms = 0;     // async: copying the state to host memory
  double stall_ms = 0;        // the whole save_checkpoint() call (sync: everything)
  double write_ms = 0;        // writing + fsync + CRC of the rank's file (max over ranks)
  double publish_ms = 0;      // agreement, manifest, rename, `latest`
  int64_t bytes = 0;          // all ranks' files
};

// Everything the engine knows about one optimizer step (one accumulation boundary).
struct StepReport {
  int64_t step = 0;           // global step after this one (skipped steps count, like DeepSpeed)
  int64_t micro_steps = 0;    // micro-batches in this step
  int64_t samples = 0;        // Engine::global_samples() after this step (DeepSpeed's global_samples)
  double loss = 0;            // mean loss over the step's micro-batches on this rank
  double lr = 0;
  double loss_scale = 1;
  bool skipped = false;       // overflow: parameters unchanged
  double grad_norm = 0;       // global norm before clipping (0 when not computed)
  PhaseStats forward, backward, step_phase;
  ModelStateBytes model_state;
  int64_t buckets = 0;                     // gradient buckets reduced in this step
  int64_t buckets_before_backward_end = 0; // of those, launched while backward still ran
  double exposed_comm_ms = 0;              // time the step waited for gradient communication
  // Stage 3: unit all-gathers in this step (of which prefetched), and the most parameter
  // bytes gathered at once.
  int64_t gathers = 0, gathers_prefetched = 0;
  int64_t gathered_peak_bytes = 0;
  // Stage 3 with frozen parameters: the most frozen bytes gathered at once in this step
  // (the frozen shard group's units, [Frozen Units]; plus the frozen storage group's).
  int64_t frozen_gathered_peak_bytes = 0;
  // NVMe offload: the step's swap of the optimizer state. Time the CPU step waited for reads
  // and writes of the swap file (what the overlap did not hide), the CPU Adam and uploads
  // (visit_ms), and the bytes moved. All 0 without NVMe offload or on a skipped step.
  struct Nvme {
    double read_wait_ms = 0, write_wait_ms = 0, visit_ms = 0;
    int64_t bytes_read = 0, bytes_written = 0;
  } nvme;
  // The model's own values for this step (EngineOptions::on_report fills them; an MoE
  // model under `zerotrain train`: moe_aux_loss, moe_dropped_fraction,
  // moe_tokens_per_expert, ... in docs/moe.md). Keys join the metrics line at the top
  // level; numbers, and arrays of numbers (as key/<i>), become monitor events.
  nlohmann::json extra = nlohmann::json::object();
  nlohmann::json to_json() const;
};

}  // namespace zt
