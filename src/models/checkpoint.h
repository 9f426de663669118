// Activation checkpointing for LibTorch, which has no torch.utils.checkpoint.
//
// checkpoint(fn, x) returns fn(x) but keeps only x for backward: forward runs fn with
// grad disabled (no activations saved); backward re-runs fn on a detached copy of x with
// grad enabled and back-propagates through it with torch::autograd::backward, so
// parameter .grad accumulate and parameter hooks fire exactly as without checkpointing
// (a ZeRO engine's gradient hooks rely on that). This is PyTorch's reentrant variant.
//
// Contract for fn: a deterministic function of x and module state (no dropout or other
// RNG: the RNG state is not replayed), returning one tensor; it is called once in forward
// and once more in backward, from the autograd engine's thread for that device.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>

namespace zt::models {

using CheckpointFn = std::function<torch::Tensor(const torch::Tensor&)>;

// y = fn(x), recomputed in backward. With cpu_checkpointing the saved x goes to pinned
// host memory (non_blocking copy on the current stream, brought back on the current
// stream in backward) when x is a CUDA tensor; on CPU it is kept as is.
// When grad mode is off this is just fn(x).
torch::Tensor checkpoint(const CheckpointFn& fn, const torch::Tensor& x, bool cpu_checkpointing = false);

// What checkpoint() keeps of x for backward when the caller decides how (partitioned over
// the tensor-parallel ranks, on the host, in a preallocated buffer: models/tp_checkpoint.h).
struct CheckpointStash {
  virtual ~CheckpointStash() = default;
  // x again (same values, sizes, dtype and device); called once, in backward, before fn
  // is re-run. May run collectives (the same on every rank of a group, in the same order).
  virtual torch::Tensor restore() = 0;
};
using StashFn = std::function<std::unique_ptr<CheckpointStash>(const torch::Tensor& x)>;

// As checkpoint() above, but x is kept as stash(x) returns it (called once, in forward);
// the stash is destroyed right after backward's restore(), or with the graph.
torch::Tensor checkpoint(const CheckpointFn& fn, const torch::Tensor& x, const StashFn& stash);

// [Checkpointed Aux] As checkpoint(fn, x), for a fn with a second output the caller adds to
// the loss besides y (an MoE block's load-balancing loss): fn2(x) returns {y, aux}. Forward
// runs fn2 without grad and returns both; their gradients reach this one node, whose
// backward re-runs fn2 and back-propagates from both recomputed outputs. So the aux of the
// first forward is the one in the loss, once, and its gradient still reaches the
// parameters (the recompute's aux is only the path for it, never added again).
using CheckpointFn2 = std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor&)>;
std::pair<torch::Tensor, torch::Tensor> checkpoint_with_aux(const CheckpointFn2& fn2, const torch::Tensor& x,
                                                            bool cpu_checkpointing = false);

// True while a checkpointed fn is being re-run inside backward, on this thread.
bool in_checkpoint_recompute();

}  // namespace zt::models
