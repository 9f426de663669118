// StepOverlap: the fused Adam step of a shard group on a side CUDA stream, so that the next
// forward's units run while later units' parameters are still being updated. Internal to
// ZeroOptimizer (owner) and DeviceStep (launcher); the engine drives the waits.
//
// [Step Overlap] (docs/engine.md, "Step overlap")
//  * Where: CUDA, ZeRO stages 0-2 where this rank owns whole buckets (stage 0, or one rank),
//    the deferred fused step (bf16/fp32 with Adam/AdamW, DeviceStep::use_kernel()), a model
//    with units (zero_units() or EngineOptions.units) that it runs through the engine's unit
//    hooks / run_unit. Not with fp16 (the dynamic scale is decided on the host), experts,
//    pipeline stages or offload. ZT_STEP_OVERLAP=0 turns it off: the step's kernels then
//    run on the compute stream exactly as before.
//  * Order: the side stream first waits for an event of the compute stream recorded after
//    the gradient norm and the device clip/overflow tensors. It then updates, in FORWARD
//    order, slot 0 = every parameter in no unit (embeddings, a tied or untied head, the
//    final norm: the forward may use them anywhere), slot 1 + u = unit u, and last the
//    bucket padding; after each slot it records that slot's event. The gradients are zeroed
//    on the side stream after the update (ZeroOptimizer::zero_grad), then the LAST event.
//  * Waits (compute stream on an event, never the host): begin_forward on slot 0, each
//    unit's first pre-forward of the step on its slot, everything else on the last event
//    (fence()): end of forward, backward, step, checkpoints, gathers, master reads,
//    reports that wait, the engine's destructor. A recompute in backward comes after the
//    backward's fence.
//  * Memory: tensors made on the compute stream and read on the side stream (the device
//    clip/overflow scalars, the gradient shard of stage 2) are marked used by the side
//    stream (record_stream) before they are let go.
//  * Same kernels, same per-element order: only the launches are cut at parameter
//    boundaries, so the weights are bit for bit those of the compute-stream step.
//  * Priority: the side stream is created with the least priority CUDA offers
//    (cudaDeviceGetStreamPriorityRange); that is also the default streams' priority, so it
//    does not outrank the forward.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "zero/partition.h"

namespace zt::zero {

// One piece of the owned buffer the step updates in one go: bucket b's owned elements
// [at, at + len) (relative to the bucket's owned part), in slot `slot`.
struct StepSegment {
  int bucket = 0;
  int64_t at = 0, len = 0;
  int slot = 0;
};

// The launch order of a layout whose every bucket this rank owns whole: each parameter's
// elements in the slot slot_of[layout index] (0: no unit, 1 + u: unit u), the bucket padding
// in slot num_units + 1; sorted by slot, then bucket and offset; neighbours of one slot in
// one bucket merged into one segment. Covers every element of every bucket exactly once.
std::vector<StepSegment> plan_step_segments(const FlatLayout& layout, const std::vector<int>& slot_of, int num_units);

class StepOverlap {
 public:
  // slots: 1 (no unit) + units + 1 (padding). CUDA device only.
  StepOverlap(torch::Device device, int num_units);
  ~StepOverlap();  // waits for the side stream (the host does), then destroys it
  StepOverlap(const StepOverlap&) = delete;
  StepOverlap& operator=(const StepOverlap&) = delete;

  int num_units() const { return num_units_; }
  int num_slots() const { return num_units_ + 2; }
  int priority() const { return priority_; }

  // The side stream waits for the compute stream's work so far; a new step's waits begin.
  void begin_step();
  // The side stream waits for the compute stream's work so far (nothing else changes).
  void side_waits_main();
  // fn with the side stream as the current stream of the device.
  void on_side(const std::function<void()>& fn);
  // Marks t's memory as used by the side stream (record_stream).
  void use(const torch::Tensor& t);
  // On the side stream: slot `slot`'s updates are issued (records its event).
  void end_slot(int slot);
  // On the side stream: everything of the step is issued (records the last event; the
  // step is in flight until fence()).
  void end_step();

  bool in_flight() const { return in_flight_; }
  // The compute stream waits for slot 0 / unit u's slot, once per step (no-ops when no step
  // is in flight or it already waited).
  void wait_first();
  void wait_unit(int unit);
  // The compute stream waits for everything of the step in flight.
  void fence();
  // Unit waits issued so far (each unit at most once per step).
  int64_t unit_waits() const { return unit_waits_; }

 private:
  void wait_slot(int slot);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int num_units_ = 0;
  int priority_ = 0;
  bool in_flight_ = false;
  std::vector<char> waited_;  // per slot, in the step in flight
  int64_t unit_waits_ = 0;
};

}  // namespace zt::zero
