// Pipeline schedules as data: per stage, the list of instructions it executes for one
// training batch of `micro_batches` micro-batches (DeepSpeed's runtime/pipe/schedule.py
// idea, without generators). A schedule is printed and tested without running anything;
// pipe/pipe_engine.h executes one. Pure functions: no ranks, no tensors.
//
// [Pipeline Schedules]
//  * p stages (ranks of the pp group), m micro-batches, v model chunks per stage (virtual
//    stages; 1 except for interleaved). Chunk c of stage s is virtual stage c*p + s
//    (Megatron's interleaving): activations go from virtual stage k to k+1, which for the
//    last stage's chunk c is stage 0's chunk c+1 (the pipeline wraps around).
//  * Schedules:
//      gpipe        all forwards, then all backwards (Huang et al. 2019; backwards in
//                   micro-batch order, as torch.distributed.pipelining's ScheduleGPipe).
//      1f1b         DeepSpeed's TrainSchedule: the step loop of runtime/pipe/schedule.py,
//                   including where it places its sends (a micro-batch's activation is
//                   sent at the stage's next step). Any m >= 1.
//      interleaved  Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_
//                   interleaving): warmup (p - s - 1) * 2 + (v - 1) * p forwards, then
//                   one forward + one backward, then the remaining backwards. m must be a
//                   multiple of p.
//      zb-h1        Qi et al. 2024 (arXiv 2401.10241) ZB-H1: 1F1B with the backward split
//                   into B (input gradient) and W (weight gradient); stage s runs p - s - 1
//                   warmup forwards, then F B pairs, running a W after a B only while more
//                   than s W's are pending, and the postponed W's at the end. The last
//                   stage postpones the most, so B's travel back without waiting behind
//                   W's and the W's fill the tail. m >= p.
//                   [ZB-H1 Pending Cap] max_pending_w = k >= 0 keeps at most min(s, k) W's
//                   pending on stage s (pipeline.zb_max_pending_w): each pending W holds its
//                   micro-batch's weight-gradient state (every linear's input and output
//                   gradient), so the last stage of the paper's schedule holds p - 1 of them
//                   more than 1F1B's activations. k = 0 runs each W right after its B on every
//                   stage: 1F1B's activation memory per stage, and still the split backward's
//                   shorter B chain (at p = 2 with F = B = W the same makespan as k = 1, the
//                   paper's; for p > 2 deferral shortens the tail, see simulate()). -1 (the
//                   default) is the paper's min(s, s) = s.
//  * Communication instructions sit where the stage executes them. A send never blocks
//    the stage (the executor posts it and waits at the end of the batch); a receive blocks
//    until the data is there. Activations and gradients travel on separate channels, and
//    on each (sender, receiver, channel) the k-th send pairs with the k-th receive
//    ([P2P Rules] in zerotrain/comm.h); validate() checks that for every schedule.
//  * Tied weights (GPT-2's embedding, used again as the LM head on the last stage): the
//    last stage sends its accumulated gradient of the tied copy after its last backward
//    of the last chunk (SendTiedGrad), the first stage receives it right before its last
//    backward that reaches chunk 0 (RecvTiedGrad) and folds it into that backward, so the
//    first stage's engine reduces and steps the whole gradient; after the step the first
//    stage sends the updated weights back (SendTiedWeight / RecvTiedWeight). Present
//    whenever p > 1; the executor skips them for a model without tied weights.
//  * ReduceGrads and OptimizerStep close every stage's list (DeepSpeed's names); the data-
//    parallel reduction itself runs inside the ZeRO engine's step (and during backward at
//    stages 0 and 2).
#pragma once

#include <string>
#include <vector>

namespace zt::pipe {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved, kZBH1 };
// "gpipe" | "1f1b" | "interleaved" | "zb-h1" (also "zbh1"); ConfigError naming the choices.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* schedule_name(ScheduleKind kind);
// Whether the schedule splits the backward into BackwardInput and BackwardWeight.
inline bool splits_backward(ScheduleKind k) { return k == ScheduleKind::kZBH1; }

enum class Op {
  kForward,         // F: forward of (mb, chunk)
  kBackward,        // B: full backward (input and weight gradients)
  kBackwardInput,   // B: input gradient only (zb-h1)
  kBackwardWeight,  // W: weight gradient (zb-h1)
  kRecvAct,         // ra: activation of (mb, chunk)'s input from the previous virtual stage
  kSendAct,         // sa: output of (mb, chunk) to the next virtual stage
  kRecvGrad,        // rg: gradient of (mb, chunk)'s output from the next virtual stage
  kSendGrad,        // sg: gradient of (mb, chunk)'s input to the previous virtual stage
  kSendTiedGrad,    // st: last stage -> first stage, the tied copy's gradient
  kRecvTiedGrad,    // rt
  kReduceGrads,     // R: data-parallel reduction (inside the engine's step)
  kOptimizerStep,   // S
  kSendTiedWeight,  // sw: first stage -> last stage, the updated tied weights
  kRecvTiedWeight,  // rw
};

struct Instr {
  Op op = Op::kForward;
  int mb = -1;     // micro-batch, -1 for the batch-level ops
  int chunk = 0;   // local model chunk (0 .. v-1)
  // "F3", "B0", "W2", "ra1", "sg0", "st", "S"; with chunks (v > 1) "F3.1" = chunk 1.
  std::string str(bool with_chunk = false) const;
  bool operator==(const Instr&) const = default;
};

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;          // p
  int micro_batches = 1;   // m
  int virtual_stages = 1;  // v (interleaved only; 1 otherwise)
  // zb-h1 only: W's a stage may keep pending, min(s, max_pending_w) on stage s; -1 = s (the
  // paper's ZB-H1). See [ZB-H1 Pending Cap].
  int max_pending_w = -1;
};

struct Schedule {
  ScheduleSpec spec;
  std::vector<std::vector<Instr>> stages;  // stages[s]: stage s's instructions in order

  int num_virtual() const { return spec.stages * spec.virtual_stages; }
  int virtual_stage(int stage, int chunk) const { return chunk * spec.stages + stage; }
  // One stage's list, e.g. "F0 F1 B0 F2 B1 B2" (compute only) or with every instruction.
  std::string line(int stage, bool with_comm = false) const;
  // Every stage's line, "stage s: ..." each.
  std::string to_string(bool with_comm = false) const;
};

// Builds the schedule. ConfigError (naming the schedule, the value and the fix) for p < 1,
// m < 1, v < 1, v != 1 for a schedule without virtual stages, interleaved with m not a
// multiple of p, zb-h1 with m < p, max_pending_w < -1, max_pending_w >= 0 with a schedule
// other than zb-h1.
Schedule make_schedule(const ScheduleSpec& spec);

// Checks a schedule's consistency: every (mb, chunk) has exactly one F and one backward
// (B, or B and W) per stage in a valid order, and for each pair of stages and channel the
// sends of one match the receives of the other in order. Throws InternalError naming the
// first violation. make_schedule runs it.
void validate(const Schedule& s);

// Time of each compute op, in units (communication free): the paper's accounting.
struct UnitTimes {
  double f = 1, b = 2, w = 0;  // b = whole backward when w = 0; input-gradient part otherwise
};
// F = B = W = 1 for split-backward schedules, F = 1 and B = 2 otherwise.
UnitTimes default_unit_times(ScheduleKind kind);

struct Simulation {
  double makespan = 0;         // time at which the last stage's last op ends
  std::vector<double> busy;    // per stage, compute time
  double bubble = 0;           // (makespan - busy) / busy of the busiest stage
  std::string timeline;        // per stage, one character per unit ('.' idle), for printing;
                               // empty when an op's time is not a whole number of units
};
// Runs the schedule as a list scheduler: each stage executes its list in order, an op
// starting when the stage is free and its inputs exist (F after the previous virtual
// stage's F of the micro-batch, B after the next virtual stage's B and its own F, W after
// its own B, a tied-gradient receive after the matching send). Throws InternalError on a
// deadlock (a schedule that cannot run). The bubble is the one PipeEngine measures:
// (makespan - largest busy) / largest busy.
Simulation simulate(const Schedule& s, const UnitTimes& t);
// The same with each stage's own times (per_stage[s] for stage s, e.g. the per-micro-batch
// F / B / W that PipeReport measured on that stage; PipeEngine's first stage runs no B in
// zb-h1, its W is the whole backward). InternalError unless there is one entry per stage.
Simulation simulate(const Schedule& s, const std::vector<UnitTimes>& per_stage);

// The published bubble fraction (idle / compute per stage): (p-1)/m for gpipe and 1f1b,
// (p-1)/(v*m) for interleaved, (p-1)/(3m) for zb-h1 (F = B = W); zb-h1 with max_pending_w
// k >= 0: (2(p-1) - min(k, p-1))/(3m) (the simulator's value, checked over a grid; k = 0 at
// p = 2 is 2/(3m), two thirds of 1F1B's).
double bubble_formula(const ScheduleSpec& spec);

}  // namespace zt::pipe
