// Pipeline schedules as data. See [Pipeline Schedules] in pipe/schedule.h.
#include "pipe/schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "zerotrain/error.h"

namespace zt::pipe {

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved" || name == "interleaved-1f1b") return ScheduleKind::kInterleaved;
  if (name == "zb-h1" || name == "zbh1") return ScheduleKind::kZBH1;
  throw ConfigError("pipeline schedule \"" + name + "\" is not known: use gpipe, 1f1b, interleaved or zb-h1");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kZBH1: return "zb-h1";
  }
  return "?";
}

std::string Instr::str(bool with_chunk) const {
  const char* n = "?";
  switch (op) {
    case Op::kForward: n = "F"; break;
    case Op::kBackward: n = "B"; break;
    case Op::kBackwardInput: n = "B"; break;
    case Op::kBackwardWeight: n = "W"; break;
    case Op::kRecvAct: n = "ra"; break;
    case Op::kSendAct: n = "sa"; break;
    case Op::kRecvGrad: n = "rg"; break;
    case Op::kSendGrad: n = "sg"; break;
    case Op::kSendTiedGrad: return "st";
    case Op::kRecvTiedGrad: return "rt";
    case Op::kReduceGrads: return "R";
    case Op::kOptimizerStep: return "S";
    case Op::kSendTiedWeight: return "sw";
    case Op::kRecvTiedWeight: return "rw";
  }
  std::string s = n + std::to_string(mb);
  if (with_chunk) s += "." + std::to_string(chunk);
  return s;
}

namespace {

bool is_compute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput || op == Op::kBackwardWeight;
}
// The backward that produces the input gradient (and, unsplit, the weight gradient too).
bool is_input_backward(Op op) { return op == Op::kBackward || op == Op::kBackwardInput; }

// Appends the instructions of one forward / input backward of (mb, chunk) on `stage`, with
// the receive before and the send after; used by every schedule except DeepSpeed's 1F1B,
// which places its sends itself.
struct Builder {
  const ScheduleSpec& spec;
  int stage;
  std::vector<Instr>& out;
  int vs(int chunk) const { return chunk * spec.stages + stage; }
  int last_vs() const { return spec.stages * spec.virtual_stages - 1; }
  void forward(int mb, int chunk) {
    if (vs(chunk) > 0) out.push_back({Op::kRecvAct, mb, chunk});
    out.push_back({Op::kForward, mb, chunk});
    if (vs(chunk) < last_vs()) out.push_back({Op::kSendAct, mb, chunk});
  }
  void backward(int mb, int chunk, Op op) {
    if (vs(chunk) < last_vs()) out.push_back({Op::kRecvGrad, mb, chunk});
    out.push_back({op, mb, chunk});
    if (vs(chunk) > 0) out.push_back({Op::kSendGrad, mb, chunk});
  }
  void weight(int mb, int chunk) { out.push_back({Op::kBackwardWeight, mb, chunk}); }
};

void build_gpipe(const ScheduleSpec& spec, int s, std::vector<Instr>& out) {
  Builder b{spec, s, out};
  for (int j = 0; j < spec.micro_batches; ++j) b.forward(j, 0);
  for (int j = 0; j < spec.micro_batches; ++j) b.backward(j, 0, Op::kBackward);
}

// DeepSpeed's TrainSchedule.steps(): 2 (m + p - 1) steps; at each step a stage runs a
// forward or a backward of one micro-batch (or nothing), with the communication of the
// previous step's micro-batch in front of it.
void build_1f1b(const ScheduleSpec& spec, int s, std::vector<Instr>& out) {
  const int p = spec.stages, m = spec.micro_batches;
  const bool has_prev = s > 0, has_next = s < p - 1;
  auto valid = [&](int mb) { return mb >= 0 && mb < m; };
  auto step_to_mb = [&](int step, bool& fwd) {
    const bool even_step = step % 2 == 0, even_stage = s % 2 == 0;
    if (even_step && even_stage) {
      fwd = true;
      return step / 2 - s / 2;
    }
    if (!even_step && !even_stage) {
      fwd = true;
      return (step - 1) / 2 - s / 2;
    }
    if (even_step && !even_stage) {
      fwd = false;
      return step / 2 - p + (s + 1) / 2;
    }
    fwd = false;
    return (step - 1) / 2 - p + 1 + s / 2;
  };
  int prev = -1;
  const int total = 2 * (m + p - 1);
  for (int step = 0; step < total; ++step) {
    bool fwd = false;
    const int mb = step_to_mb(step, fwd);
    if (fwd) {
      if (valid(prev) && has_prev) out.push_back({Op::kSendGrad, prev, 0});
      if (valid(mb) && has_prev) out.push_back({Op::kRecvAct, mb, 0});
    } else {
      if (valid(mb) && has_next) out.push_back({Op::kRecvGrad, mb, 0});
      if (valid(prev) && has_next) out.push_back({Op::kSendAct, prev, 0});
    }
    if (valid(mb)) out.push_back({fwd ? Op::kForward : Op::kBackward, mb, 0});
    prev = mb;
  }
}

// Megatron-LM's forward_backward_pipelining_with_interleaving (get_model_chunk_id and the
// warmup count), without its communication batching.
void build_interleaved(const ScheduleSpec& spec, int s, std::vector<Instr>& out) {
  const int p = spec.stages, v = spec.virtual_stages, m = spec.micro_batches;
  const int total = m * v;
  const int warmup = std::min(total, (p - s - 1) * 2 + (v - 1) * p);
  auto chunk_of = [&](int k, bool fwd) {
    const int c = (k % (p * v)) / p;
    return fwd ? c : v - 1 - c;
  };
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  Builder b{spec, s, out};
  int f = 0, bw = 0;
  for (; f < warmup; ++f) b.forward(mb_of(f), chunk_of(f, true));
  for (; f < total; ++f, ++bw) {
    b.forward(mb_of(f), chunk_of(f, true));
    b.backward(mb_of(bw), chunk_of(bw, false), Op::kBackward);
  }
  for (; bw < total; ++bw) b.backward(mb_of(bw), chunk_of(bw, false), Op::kBackward);
}

void build_zbh1(const ScheduleSpec& spec, int s, std::vector<Instr>& out) {
  const int p = spec.stages, m = spec.micro_batches;
  // [ZB-H1 Pending Cap]: the paper lets stage s keep s weight passes pending.
  const int cap = spec.max_pending_w < 0 ? s : std::min(s, spec.max_pending_w);
  Builder b{spec, s, out};
  int f = 0, bi = 0, w = 0;
  for (; f < std::min(m, p - s - 1); ++f) b.forward(f, 0);
  while (bi < m) {
    if (f < m) b.forward(f++, 0);
    b.backward(bi++, 0, Op::kBackwardInput);
    if (bi - w > cap) b.weight(w++, 0);  // keep at most `cap` weight passes pending
  }
  while (w < m) b.weight(w++, 0);
}

// Tied weights and the step; see [Pipeline Schedules].
void add_batch_end(const ScheduleSpec& spec, int s, std::vector<Instr>& out) {
  const int p = spec.stages, v = spec.virtual_stages;
  if (p > 1 && s == p - 1) {
    // After the last input backward of the last chunk: the tied copy's gradient is complete.
    for (size_t i = out.size(); i-- > 0;) {
      if (is_input_backward(out[i].op) && out[i].chunk == v - 1) {
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(i) + 1, Instr{Op::kSendTiedGrad, -1, v - 1});
        break;
      }
    }
  }
  if (p > 1 && s == 0) {
    // Before the last backward that accumulates chunk 0's weight gradients.
    const Op acc = splits_backward(spec.kind) ? Op::kBackwardWeight : Op::kBackward;
    for (size_t i = out.size(); i-- > 0;) {
      if (out[i].op == acc && out[i].chunk == 0) {
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(i), Instr{Op::kRecvTiedGrad, -1, 0});
        break;
      }
    }
  }
  out.push_back({Op::kReduceGrads, -1, 0});
  out.push_back({Op::kOptimizerStep, -1, 0});
  if (p > 1 && s == 0) out.push_back({Op::kSendTiedWeight, -1, 0});
  if (p > 1 && s == p - 1) out.push_back({Op::kRecvTiedWeight, -1, v - 1});
}

std::string spec_name(const ScheduleSpec& spec) {
  return std::string("pipeline schedule ") + schedule_name(spec.kind) + " (stages " + std::to_string(spec.stages) +
         ", micro-batches " + std::to_string(spec.micro_batches) + ", virtual stages " +
         std::to_string(spec.virtual_stages) +
         (spec.max_pending_w >= 0 ? ", zb_max_pending_w " + std::to_string(spec.max_pending_w) : std::string()) + ")";
}

}  // namespace

std::string Schedule::line(int stage, bool with_comm) const {
  std::string out;
  for (const auto& in : stages.at(static_cast<size_t>(stage))) {
    if (!with_comm && !is_compute(in.op)) continue;
    if (!out.empty()) out += ' ';
    out += in.str(spec.virtual_stages > 1);
  }
  return out;
}

std::string Schedule::to_string(bool with_comm) const {
  std::string out;
  for (int s = 0; s < spec.stages; ++s) out += "stage " + std::to_string(s) + ": " + line(s, with_comm) + "\n";
  return out;
}

Schedule make_schedule(const ScheduleSpec& spec) {
  const std::string what = spec_name(spec);
  ZT_CHECK_T(spec.stages >= 1, ConfigError, what, ": stages must be >= 1");
  ZT_CHECK_T(spec.micro_batches >= 1, ConfigError, what,
             ": micro-batches (gradient_accumulation_steps) must be >= 1");
  ZT_CHECK_T(spec.virtual_stages >= 1, ConfigError, what, ": virtual stages must be >= 1");
  if (spec.kind != ScheduleKind::kInterleaved) {
    ZT_CHECK_T(spec.virtual_stages == 1, ConfigError, what, ": only the interleaved schedule has virtual stages; ",
               "set virtual stages to 1 or use the interleaved schedule");
  } else {
    ZT_CHECK_T(spec.stages >= 2, ConfigError, what, ": the interleaved schedule needs at least 2 stages");
    ZT_CHECK_T(spec.micro_batches % spec.stages == 0, ConfigError, what,
               ": the interleaved schedule needs micro-batches (gradient_accumulation_steps) to be a multiple "
               "of the stages (Megatron's rule); use ",
               (spec.micro_batches / spec.stages + 1) * spec.stages, " micro-batches");
  }
  ZT_CHECK_T(spec.max_pending_w >= -1, ConfigError, what, ": pipeline.zb_max_pending_w = ", spec.max_pending_w,
             " is negative: use 0 (each W right after its B) or more, or leave it out (the paper's ZB-H1)");
  ZT_CHECK_T(spec.max_pending_w < 0 || spec.kind == ScheduleKind::kZBH1, ConfigError, what,
             ": pipeline.zb_max_pending_w caps the zb-h1 schedule's pending weight passes; use schedule zb-h1 "
             "or remove it");
  if (spec.kind == ScheduleKind::kZBH1) {
    ZT_CHECK_T(spec.micro_batches >= spec.stages, ConfigError, what,
               ": zb-h1 needs at least as many micro-batches (gradient_accumulation_steps) as stages; use >= ",
               spec.stages, " micro-batches or the 1f1b schedule");
  }
  Schedule sch;
  sch.spec = spec;
  sch.stages.resize(static_cast<size_t>(spec.stages));
  for (int s = 0; s < spec.stages; ++s) {
    auto& out = sch.stages[static_cast<size_t>(s)];
    switch (spec.kind) {
      case ScheduleKind::kGPipe: build_gpipe(spec, s, out); break;
      case ScheduleKind::k1F1B: build_1f1b(spec, s, out); break;
      case ScheduleKind::kInterleaved: build_interleaved(spec, s, out); break;
      case ScheduleKind::kZBH1: build_zbh1(spec, s, out); break;
    }
    add_batch_end(spec, s, out);
  }
  validate(sch);
  return sch;
}

namespace {

// A message's identity on its channel: (virtual stage that receives it, micro-batch).
using Msg = std::pair<int, int>;
// (channel 0 act / 1 grad / 2 tied grad / 3 tied weight, src stage, dst stage)
using Chan = std::tuple<int, int, int>;

struct Comm {
  Chan chan;
  Msg msg;
  bool send;
};

// The channel and message of a communication instruction of `stage`, or false.
bool comm_of(const Schedule& s, int stage, const Instr& in, Comm& c) {
  const int p = s.spec.stages, vs = s.virtual_stage(stage, in.chunk);
  const int next = (stage + 1) % p, prev = (stage + p - 1) % p;
  switch (in.op) {
    case Op::kSendAct: c = {{0, stage, next}, {vs + 1, in.mb}, true}; return true;
    case Op::kRecvAct: c = {{0, prev, stage}, {vs, in.mb}, false}; return true;
    case Op::kSendGrad: c = {{1, stage, prev}, {vs - 1, in.mb}, true}; return true;
    case Op::kRecvGrad: c = {{1, next, stage}, {vs, in.mb}, false}; return true;
    case Op::kSendTiedGrad: c = {{2, stage, 0}, {0, -1}, true}; return true;
    case Op::kRecvTiedGrad: c = {{2, p - 1, stage}, {0, -1}, false}; return true;
    case Op::kSendTiedWeight: c = {{3, stage, p - 1}, {0, -1}, true}; return true;
    case Op::kRecvTiedWeight: c = {{3, 0, stage}, {0, -1}, false}; return true;
    default: return false;
  }
}

}  // namespace

void validate(const Schedule& sch) {
  const int p = sch.spec.stages, v = sch.spec.virtual_stages, m = sch.spec.micro_batches;
  const bool split = splits_backward(sch.spec.kind);
  std::map<Chan, std::vector<Msg>> sends, recvs;
  for (int s = 0; s < p; ++s) {
    // 0 none, 1 forward done, 2 input backward done, 3 weight backward done
    std::vector<int> state(static_cast<size_t>(m * v), 0);
    for (const auto& in : sch.stages[static_cast<size_t>(s)]) {
      Comm c;
      if (comm_of(sch, s, in, c)) (c.send ? sends : recvs)[c.chan].push_back(c.msg);
      if (!is_compute(in.op)) continue;
      ZT_ASSERT(in.mb >= 0 && in.mb < m && in.chunk >= 0 && in.chunk < v, "stage ", s, ": ", in.str(true));
      int& st = state[static_cast<size_t>(in.mb * v + in.chunk)];
      const int want = in.op == Op::kForward ? 0 : in.op == Op::kBackwardWeight ? 2 : 1;
      ZT_ASSERT(st == want, "stage ", s, ": ", in.str(true), " out of order");
      ZT_ASSERT(split == (in.op == Op::kBackwardInput || in.op == Op::kBackwardWeight) || in.op == Op::kForward,
                "stage ", s, ": ", in.str(true), " does not belong to ", schedule_name(sch.spec.kind));
      st = in.op == Op::kBackward ? 3 : want + 1;
    }
    for (int st : state) ZT_ASSERT(st == 3, "stage ", s, ": a micro-batch is not complete");
  }
  for (const auto& [chan, list] : sends) {
    auto it = recvs.find(chan);
    ZT_ASSERT(it != recvs.end() && it->second == list, "channel ", std::get<0>(chan), " from stage ",
              std::get<1>(chan), " to ", std::get<2>(chan), ": sends and receives do not pair in order");
  }
  for (const auto& [chan, list] : recvs) ZT_ASSERT(sends.count(chan), "a receive without a send");
}

UnitTimes default_unit_times(ScheduleKind kind) {
  return splits_backward(kind) ? UnitTimes{1, 1, 1} : UnitTimes{1, 2, 0};
}

Simulation simulate(const Schedule& sch, const UnitTimes& t) {
  return simulate(sch, std::vector<UnitTimes>(static_cast<size_t>(sch.spec.stages), t));
}

Simulation simulate(const Schedule& sch, const std::vector<UnitTimes>& per_stage) {
  const int p = sch.spec.stages;
  ZT_ASSERT(per_stage.size() == static_cast<size_t>(p), "simulate: ", per_stage.size(), " stage times for ", p,
            " stages");
  bool whole_units = true;  // the timeline has one character per unit
  for (const auto& t : per_stage) {
    for (double d : {t.f, t.b, t.w}) whole_units = whole_units && d >= 0 && d == std::floor(d) && d <= 1000;
  }
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0.0);
  Simulation sim;
  sim.busy.assign(static_cast<size_t>(p), 0.0);
  std::vector<std::string> tl(static_cast<size_t>(p));
  std::map<Chan, std::vector<double>> sent;        // time of each send on a channel
  std::map<std::pair<int, Chan>, size_t> n_recv;   // receives done per (stage, channel)
  auto duration = [&](int stage, Op op) {
    const UnitTimes& t = per_stage[static_cast<size_t>(stage)];
    switch (op) {
      case Op::kForward: return t.f;
      case Op::kBackward: return t.b + t.w;
      case Op::kBackwardInput: return t.b;
      case Op::kBackwardWeight: return t.w;
      default: return 0.0;
    }
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto& list = sch.stages[static_cast<size_t>(s)];
      auto& i = pc[static_cast<size_t>(s)];
      for (; i < list.size(); ++i) {
        const Instr& in = list[i];
        double& now = clock[static_cast<size_t>(s)];
        Comm c;
        if (comm_of(sch, s, in, c)) {
          if (c.send) {
            sent[c.chan].push_back(now);
          } else {
            size_t& k = n_recv[{s, c.chan}];
            const auto& times = sent[c.chan];
            if (k >= times.size()) break;  // blocked until the sender gets there
            now = std::max(now, times[k]);
            ++k;
          }
        }
        const double d = duration(s, in.op);
        if (d > 0 && whole_units) {
          const long idle = std::lround(now) - static_cast<long>(tl[static_cast<size_t>(s)].size());
          if (idle > 0) tl[static_cast<size_t>(s)].append(static_cast<size_t>(idle), '.');
          const char ch = in.op == Op::kForward ? 'F' : in.op == Op::kBackwardWeight ? 'W' : 'B';
          tl[static_cast<size_t>(s)].append(static_cast<size_t>(std::lround(d)), ch);
        }
        now += d;
        sim.busy[static_cast<size_t>(s)] += d;
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    ZT_ASSERT(pc[static_cast<size_t>(s)] == sch.stages[static_cast<size_t>(s)].size(), "schedule ",
              schedule_name(sch.spec.kind), " deadlocks: stage ", s, " waits at instruction ",
              pc[static_cast<size_t>(s)]);
  }
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  const double busy = *std::max_element(sim.busy.begin(), sim.busy.end());
  sim.bubble = busy > 0 ? (sim.makespan - busy) / busy : 0.0;
  if (whole_units) {
    for (int s = 0; s < p; ++s) sim.timeline += "stage " + std::to_string(s) + ": " + tl[static_cast<size_t>(s)] + "\n";
  }
  return sim;
}

double bubble_formula(const ScheduleSpec& spec) {
  const double p = spec.stages, m = spec.micro_batches, v = spec.virtual_stages;
  switch (spec.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B: return (p - 1) / m;
    case ScheduleKind::kInterleaved: return (p - 1) / (v * m);
    case ScheduleKind::kZBH1: {
      // [ZB-H1 Pending Cap]: each W the last stage cannot postpone past its last B adds one
      // unit; the paper's schedule (k = p - 1 on the last stage) gives (p-1)/(3m).
      const double k = spec.max_pending_w < 0 ? p - 1 : std::min<double>(spec.max_pending_w, p - 1);
      return (2 * (p - 1) - k) / (3 * m);
    }
  }
  return 0;
}

}  // namespace zt::pipe
