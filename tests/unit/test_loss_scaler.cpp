// Dynamic loss scaler: DeepSpeed's update_scale semantics as overflow/clean sequences with
// the expected scale after each update, plus zerotrain's bounded skips at the minimum.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "optim/loss_scaler.h"
#include "zerotrain/error.h"

namespace zt_test_loss_scaler {

using zt::optim::LossScaler;
using zt::optim::LossScalerOptions;

namespace {

struct Row {
  char event;    // 'O' overflow, '.' clean
  double scale;  // expected scale() after update()
  int hysteresis;  // expected hysteresis_left() after update()
};

void run_table(LossScaler& s, const std::vector<Row>& rows) {
  int i = 0;
  for (const auto& r : rows) {
    bool skip = s.update(r.event == 'O');
    EXPECT_EQ(skip, r.event == 'O') << "row " << i;
    EXPECT_EQ(s.scale(), r.scale) << "row " << i << " (" << r.event << ")";
    EXPECT_EQ(s.hysteresis_left(), r.hysteresis) << "row " << i << " (" << r.event << ")";
    ++i;
  }
}

LossScalerOptions small_options() {
  LossScalerOptions o;
  o.initial_scale_power = 4;  // 16
  o.scale_window = 3;
  o.hysteresis = 2;
  o.min_scale = 1;
  return o;
}

}  // namespace

TEST(LossScaler, DefaultsAreDeepSpeeds) {
  LossScaler s;
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);
  // hysteresis 2: the first overflow only uses up hysteresis, the second halves.
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.skipped_steps(), 2);
}

TEST(LossScaler, HysteresisAndWindowSequence) {
  LossScaler s(small_options());
  run_table(s, {
                   {'O', 16, 1},  // hysteresis 2 -> 1, scale kept
                   {'O', 8, 1},   // used up: halve; the counter is not refilled...
                   {'O', 4, 1},   // ...so the next overflow halves again
                   {'.', 4, 1},   // clean steps since the overflow: 0
                   {'.', 4, 1},   // 1
                   {'.', 4, 1},   // 2
                   {'.', 8, 2},   // 3 = window: double, refill hysteresis
                   {'.', 8, 2},
                   {'.', 8, 2},
                   {'.', 16, 2},  // every window clean steps after that
                   {'O', 16, 1},
                   {'.', 16, 1},  // no refill without consecutive_hysteresis
                   {'O', 8, 1},
               });
  EXPECT_EQ(s.skipped_steps(), 5);
}

TEST(LossScaler, FirstDoublingAfterWindowPlusOneCleanSteps) {
  LossScalerOptions o = small_options();
  LossScaler s(o);
  // From a fresh start DeepSpeed counts clean steps from iteration -1: the 4th clean step
  // (window 3) doubles.
  run_table(s, {{'.', 16, 2}, {'.', 16, 2}, {'.', 16, 2}, {'.', 32, 2}, {'.', 32, 2}, {'.', 32, 2}, {'.', 64, 2}});
}

TEST(LossScaler, ConsecutiveHysteresis) {
  LossScalerOptions o = small_options();
  o.consecutive_hysteresis = true;
  LossScaler s(o);
  run_table(s, {
                   {'O', 16, 1},
                   {'.', 16, 2},  // refilled by any clean step
                   {'O', 16, 1},  // so isolated overflows never halve
                   {'O', 8, 1},   // two in a row do
                   {'.', 8, 2},
                   {'.', 8, 2},
                   {'.', 8, 2},
                   {'.', 16, 2},
               });
}

TEST(LossScaler, HysteresisOneHalvesEveryOverflowDownToMin) {
  LossScalerOptions o = small_options();
  o.hysteresis = 1;
  o.min_scale = 4;
  LossScaler s(o);
  run_table(s, {{'O', 8, 1}, {'O', 4, 1}, {'O', 4, 1}, {'.', 4, 1}});
}

TEST(LossScaler, ThrowsAfterBoundedSkipsAtMinimum) {
  LossScalerOptions o;
  o.initial_scale_power = 2;  // 4
  o.hysteresis = 1;
  o.max_skips_at_min = 5;
  LossScaler s(o);
  EXPECT_TRUE(s.update(true));  // ran at 4 -> 2
  EXPECT_TRUE(s.update(true));  // ran at 2 -> 1
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(s.update(true));  // 4 skips at the minimum
  EXPECT_FALSE(s.update(false));                           // a clean step resets the count
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(s.update(true));
  try {
    s.update(true);  // the 5th consecutive one
    FAIL() << "expected TrainingError";
  } catch (const zt::TrainingError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("loss scale at minimum (1) and still overflowing for 5 consecutive steps"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("use bf16"), std::string::npos) << msg;
  }
}

TEST(LossScaler, UnboundedWhenDisabled) {
  LossScalerOptions o;
  o.initial_scale_power = 0;
  o.max_skips_at_min = 0;  // DeepSpeed's behaviour: skip forever
  LossScaler s(o);
  for (int i = 0; i < 500; ++i) ASSERT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.skipped_steps(), 500);
}

TEST(LossScaler, StaticScaleNeverMovesButSkips) {
  LossScalerOptions o;
  o.static_scale = 128;
  o.scale_window = 2;
  o.max_skips_at_min = 3;
  LossScaler s(o);
  EXPECT_FALSE(s.dynamic());
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 128.0);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.skipped_steps(), 3);
  EXPECT_THROW(s.update(true), zt::TrainingError);
}

TEST(LossScaler, StateRoundTrip) {
  LossScaler a(small_options());
  const std::string seq = "OO..O....O.";
  for (char c : seq) a.update(c == 'O');
  // Through text, as a checkpoint would store it.
  auto saved = nlohmann::json::parse(a.state().dump());
  LossScaler b(small_options());
  b.load_state(saved);
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.skipped_steps(), a.skipped_steps());
  EXPECT_EQ(b.hysteresis_left(), a.hysteresis_left());
  const std::string more = "...O.......OOO......";
  for (char c : more) {
    a.update(c == 'O');
    b.update(c == 'O');
    ASSERT_EQ(a.scale(), b.scale());
    ASSERT_EQ(a.hysteresis_left(), b.hysteresis_left());
  }
  EXPECT_EQ(a.state(), b.state());
  EXPECT_THROW(b.load_state(nlohmann::json{{"scale", 2.0}}), zt::CheckpointError);
  auto bad = saved;
  bad["scale"] = -1.0;
  EXPECT_THROW(b.load_state(bad), zt::CheckpointError);
}

TEST(LossScaler, BadOptionsNameTheKey) {
  auto expect = [](LossScalerOptions o, const std::string& key) {
    try {
      LossScaler s(o);
      ADD_FAILURE() << "no ConfigError for " << key;
    } catch (const zt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  LossScalerOptions o;
  o.scale_window = 0;
  expect(o, "fp16.loss_scale_window");
  o = {};
  o.hysteresis = 0;
  expect(o, "fp16.hysteresis");
  o = {};
  o.min_scale = 0;
  expect(o, "fp16.min_loss_scale");
  o = {};
  o.static_scale = -2;
  expect(o, "fp16.loss_scale");
  o = {};
  o.initial_scale_power = 200;
  expect(o, "fp16.initial_scale_power");
}

}  // namespace zt_test_loss_scaler
