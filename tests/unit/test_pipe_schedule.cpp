// Pipeline schedules as data (src/pipe/schedule.h): the instruction lists for small
// (stages, micro-batches, virtual stages) against the published schedules written out by
// hand, the simulated bubble against the formulas, and bad input as named errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipe/schedule.h"
#include "zerotrain/error.h"

namespace zt::pipe {
namespace test_pipe_schedule {
namespace {

std::vector<std::string> lines(const Schedule& s, bool with_comm) {
  std::vector<std::string> out;
  for (int i = 0; i < s.spec.stages; ++i) out.push_back(s.line(i, with_comm));
  return out;
}

// DeepSpeed's TrainSchedule for 2 stages and 2 micro-batches, traced by hand through
// runtime/pipe/schedule.py's step loop (4 steps per stage after the first): stage 0 sends
// micro-batch 0's activation at its next (backward) step and receives gradient 0 before
// sending activation 1, as DeepSpeed does.
TEST(PipeSchedule, OneFOneBMatchesDeepSpeedTrainScheduleWithComm) {
  auto s = make_schedule({ScheduleKind::k1F1B, 2, 2, 1});
  EXPECT_EQ(lines(s, true), (std::vector<std::string>{
                                "F0 sa0 F1 rg0 sa1 B0 rg1 rt B1 R S sw",
                                "ra0 F0 B0 sg0 ra1 F1 B1 st sg1 R S rw",
                            }));
}

// 1F1B (PipeDream-Flush; Narayanan et al. 2021, Figure 4 top: 4 stages, 8 micro-batches).
TEST(PipeSchedule, OneFOneBComputeOrderFourStages) {
  auto s = make_schedule({ScheduleKind::k1F1B, 4, 8, 1});
  EXPECT_EQ(lines(s, false), (std::vector<std::string>{
                                 "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
                                 "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
                                 "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
                                 "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
                             }));
}

TEST(PipeSchedule, GPipeAllForwardsThenAllBackwards) {
  auto s = make_schedule({ScheduleKind::kGPipe, 2, 3, 1});
  EXPECT_EQ(lines(s, true), (std::vector<std::string>{
                                "F0 sa0 F1 sa1 F2 sa2 rg0 B0 rg1 B1 rg2 rt B2 R S sw",
                                "ra0 F0 ra1 F1 ra2 F2 B0 sg0 B1 sg1 B2 st sg2 R S rw",
                            }));
}

// Megatron-LM's interleaved 1F1B, 2 stages x 2 chunks, 4 micro-batches: stage 0 warms up
// with (2-0-1)*2 + (2-1)*2 = 4 forwards, stage 1 with 2; forwards walk chunks in groups of
// p micro-batches (chunk = (k mod pv) / p), backwards the chunks in reverse.
TEST(PipeSchedule, InterleavedMatchesMegatronOrder) {
  auto s = make_schedule({ScheduleKind::kInterleaved, 2, 4, 2});
  EXPECT_EQ(lines(s, false),
            (std::vector<std::string>{
                "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0",
                "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0",
            }));
  // The last virtual stage (stage 1, chunk 1) sends its tied gradient after its last
  // backward; its activations wrap around to stage 0's chunk 1.
  const std::string l1 = s.line(1, true);
  EXPECT_NE(l1.find("B3.1 st sg3.1"), std::string::npos) << l1;
  EXPECT_NE(s.line(0, true).find("ra0.1 F0.1"), std::string::npos);
}

// ZB-H1 (Qi et al. 2024, Figure 3, 4 stages, 8 micro-batches): the warmup forwards of
// 1F1B, then F/B pairs; stage s lets s weight passes wait, so the first stage runs
// B W right away and the last stage postpones its W's to the tail.
TEST(PipeSchedule, ZeroBubbleH1MatchesPaper) {
  auto s = make_schedule({ScheduleKind::kZBH1, 4, 8, 1});
  EXPECT_EQ(lines(s, false),
            (std::vector<std::string>{
                "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7",
                "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7",
                "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7",
                "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7",
            }));
  // The first stage receives the tied gradient before its last weight pass.
  EXPECT_NE(s.line(0, true).find("rt W7 R S sw"), std::string::npos) << s.line(0, true);
}

TEST(PipeSchedule, OneStageHasNoCommunication) {
  auto s = make_schedule({ScheduleKind::k1F1B, 1, 3, 1});
  EXPECT_EQ(s.line(0, true), "F0 B0 F1 B1 F2 B2 R S");
}

// The simulated bubble (unit times: F = 1, B = 2; F = B = W = 1 for zb-h1) equals the
// published formula for every schedule over a grid of sizes.
TEST(PipeSchedule, SimulatedBubbleEqualsFormula) {
  int checked = 0;
  for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved, ScheduleKind::kZBH1}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 6, 8, 16, 24}) {
        for (int v : {1, 2, 3}) {
          ScheduleSpec spec{kind, p, m, v};
          if (v > 1 && kind != ScheduleKind::kInterleaved) continue;
          if (kind == ScheduleKind::kInterleaved && (p < 2 || m % p != 0)) continue;
          if (kind == ScheduleKind::kZBH1 && m < p) continue;
          auto s = make_schedule(spec);
          auto sim = simulate(s, default_unit_times(kind));
          EXPECT_NEAR(sim.bubble, bubble_formula(spec), 1e-12)
              << schedule_name(kind) << " p " << p << " m " << m << " v " << v << "\n" << sim.timeline;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
  // ZB-H1's bubble is a third of 1F1B's at the same stages and micro-batches.
  EXPECT_NEAR(simulate(make_schedule({ScheduleKind::kZBH1, 4, 8, 1}), {1, 1, 1}).bubble, 3.0 / 24, 1e-12);
  EXPECT_NEAR(simulate(make_schedule({ScheduleKind::k1F1B, 4, 8, 1}), {1, 2, 0}).bubble, 3.0 / 8, 1e-12);
}

TEST(PipeSchedule, TimelineShowsIdleTime) {
  auto sim = simulate(make_schedule({ScheduleKind::kGPipe, 2, 2, 1}), {1, 2, 0});
  EXPECT_EQ(sim.timeline, "stage 0: FF...BBBB\nstage 1: .FFBBBB\n");
  EXPECT_DOUBLE_EQ(sim.makespan, 9);
}

template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

TEST(PipeSchedule, BadInputIsANamedError) {
  EXPECT_NE(config_error([] { make_schedule({ScheduleKind::kInterleaved, 2, 3, 2}); }).find("multiple of the stages"),
            std::string::npos);
  EXPECT_NE(config_error([] { make_schedule({ScheduleKind::kInterleaved, 4, 2, 2}); }).find("use 4 micro-batches"),
            std::string::npos);
  EXPECT_NE(config_error([] { make_schedule({ScheduleKind::kInterleaved, 2, 4, 0}); }).find("virtual stages must be"),
            std::string::npos);
  EXPECT_NE(config_error([] { make_schedule({ScheduleKind::k1F1B, 2, 4, 2}); }).find("only the interleaved"),
            std::string::npos);
  EXPECT_NE(config_error([] { make_schedule({ScheduleKind::kZBH1, 4, 3, 1}); }).find("zb-h1 needs at least"),
            std::string::npos);
  EXPECT_NE(config_error([] { make_schedule({ScheduleKind::k1F1B, 0, 3, 1}); }).find("stages must be"),
            std::string::npos);
  EXPECT_NE(config_error([] { make_schedule({ScheduleKind::kGPipe, 2, 0, 1}); }).find("micro-batches"),
            std::string::npos);
  EXPECT_NE(config_error([] { parse_schedule_kind("zb-v"); }).find("gpipe, 1f1b, interleaved or zb-h1"),
            std::string::npos);
  EXPECT_EQ(parse_schedule_kind("zb-h1"), ScheduleKind::kZBH1);
  // DeepSpeed's 1F1B runs with fewer micro-batches than stages (its bubble is then larger).
  EXPECT_NO_THROW(make_schedule({ScheduleKind::k1F1B, 4, 2, 1}));
}

// validate() rejects a list whose sends and receives do not pair.
TEST(PipeSchedule, ValidateCatchesMismatchedMessages) {
  auto s = make_schedule({ScheduleKind::k1F1B, 2, 2, 1});
  std::swap(s.stages[1][0], s.stages[1][4]);  // ra0 <-> ra1
  EXPECT_THROW(validate(s), InternalError);
}

}  // namespace
}  // namespace test_pipe_schedule
}  // namespace zt::pipe
