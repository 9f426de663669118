// DeepSpeed's activation checkpointing under tensor parallelism: which layers recompute in
// backward, and how each keeps its input meanwhile (GPT2TP and LlamaTP share it).
//
// [TP Activation Checkpointing]
// A checkpointed layer runs forward without saving activations and keeps only its input x
// (models/checkpoint.h); backward restores x, re-runs the layer (its tp collectives
// included, on every tp rank in the same order) and back-propagates through it. The
// config's activation_checkpointing keys (DeepSpeed's runtime/activation_checkpointing):
//  - number_checkpoints n: layers [0, n) are checkpointed (n checkpoints per forward, as
//    DeepSpeed counts them; Megatron's "block" recompute method); unset = every layer.
//  - partition_activations: x is the same on every tp rank (outside the split regions), so
//    rank r keeps only part r of x flattened: ceil(numel / tp) elements, the last part
//    zero-padded when numel does not divide; restore() all-gathers the parts over tp and
//    drops the padding. Under sequence parallelism x is already this rank's 1/tp of the
//    sequence (different on every rank): nothing is partitioned further, and a note says so.
//  - cpu_checkpointing: the kept x (or its part) lives in host memory (pinned, copied
//    without a host wait on CUDA) and comes back to x's device in restore(); CPU tensors are
//    already there (a note says so once).
//  - contiguous_memory_optimization: the kept inputs are copied into one buffer of n slots
//    (n = number_checkpoints, or the layers), allocated at the first forward and reused,
//    instead of one allocation each (fragmentation on a GPU). A slot still held by an
//    earlier graph (two forwards without a backward between) is an error, never overwritten.
//  - synchronize_checkpoint_boundary: a device synchronize before and after each
//    checkpointed forward and recompute on CUDA; on the CPU ops are synchronous and a note
//    says the key has nothing to wait for.
//  - profile: per checkpoint, the forward, restore (gather, host copy) and recompute times,
//    one info line per backward (CUDA synchronized before each clock read, as DeepSpeed's
//    timers do).
// bytes_held() counts the bytes the store keeps at this moment: measured at the end of
// forward it is the checkpointed activation memory per rank.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/checkpoint.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"

namespace zt::models {

// The activation_checkpointing section as the tp models use it (field meanings: the note).
struct TpCheckpointOptions {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;  // nullopt: every layer
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;

  static TpCheckpointOptions from_config(const ActivationCheckpointingConfig& c);
};

struct TpCheckpointState;  // the store: counters, the contiguous buffer, the profile

class TpCheckpointer {
 public:
  // tp: the tensor-parallel group (null = one rank); n_layers: the model's layers;
  // sequence_parallel: the layer inputs are split along the sequence. Throws ConfigError
  // for a number_checkpoints outside [0, n_layers].
  TpCheckpointer(comm::GroupPtr tp, int64_t n_layers, TpCheckpointOptions o, bool sequence_parallel);
  ~TpCheckpointer();

  // Whether layer i recomputes in backward (i < number_checkpoints).
  bool checkpoints(int64_t layer) const { return layer < count_; }
  // fn(x) for layer i, checkpointed per the options when grad mode is on and checkpoints(i).
  torch::Tensor run(int64_t layer, const CheckpointFn& fn, const torch::Tensor& x);

  // Bytes of checkpointed inputs the store holds now (this rank), and the most it held.
  int64_t bytes_held() const;
  int64_t peak_bytes_held() const;
  void reset_peak();
  // What the options do here, one line each (logged once at construction, tp rank 0).
  const std::vector<std::string>& notes() const { return notes_; }
  const TpCheckpointOptions& options() const { return opts_; }
  // Whether partition_activations takes effect (tp > 1 and no sequence parallelism).
  bool partitions() const { return partition_; }

 private:
  comm::GroupPtr group_;
  TpCheckpointOptions opts_;
  int64_t count_ = 0;
  bool partition_ = false;
  std::vector<std::string> notes_;
  std::shared_ptr<TpCheckpointState> state_;
};

}  // namespace zt::models
