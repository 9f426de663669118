// LR schedules against hand-computed values. Step convention: lr(k) is the lr of the
// (k+1)-th applied optimizer step = DeepSpeed's get_lr() at last_batch_iteration k - 1.
// Schedules are built as the engine builds them: the config layer parses and validates
// scheduler.params once (defaults filled), src/optim reads the resolved values.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "optim/lr_schedule.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt_test_lr_schedule {

using nlohmann::json;

namespace {

// The schedule of a config with this scheduler section and optimizer lr (type "" or
// "none": no scheduler.type).
std::unique_ptr<zt::optim::LrSchedule> make_lr_schedule(const std::string& type, const json& params, double base_lr) {
  json j = {{"train_batch_size", 1}, {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", base_lr}}}}}};
  if (!type.empty() && type != "none") {
    j["scheduler"] = {{"type", type}, {"params", params}};
  } else if (!params.empty()) {
    j["scheduler"] = {{"params", params}};
  }
  const zt::Config cfg = zt::Config::from_json(j, 1);
  return zt::optim::make_lr_schedule(cfg.scheduler, cfg.optimizer.params.lr);
}

// Expects a ConfigError whose message contains `needle`.
template <typename F>
void expect_config_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError; expected one mentioning " << needle;
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(LrSchedule, ConstantWhenNoneOrEmpty) {
  for (const char* type : {"", "none"}) {
    auto s = make_lr_schedule(type, json::object(), 3e-4);
    EXPECT_EQ(s->type(), "none");
    for (int64_t k : {0, 1, 7, 1000000}) EXPECT_EQ(s->lr(k), 3e-4);
    EXPECT_FALSE(s->momentum(3).has_value());
  }
  expect_config_error([] { make_lr_schedule("none", json{{"warmup_num_steps", 3}}, 1e-3); }, "scheduler.type");
  expect_config_error([] { make_lr_schedule("Cosine", json::object(), 1e-3); }, "scheduler.type: \"Cosine\"");
}

TEST(LrSchedule, WarmupLrLog) {
  auto s = make_lr_schedule("WarmupLR", json{{"warmup_min_lr", 0.0}, {"warmup_max_lr", 0.1}, {"warmup_num_steps", 10}},
                            1.0);
  // lr(0): the constructor's value (min); lr(1): log(1) = 0; lr(k): 0.1 * log10(k) up to k = 10.
  EXPECT_EQ(s->lr(0), 0.0);
  EXPECT_EQ(s->lr(1), 0.0);
  EXPECT_NEAR(s->lr(2), 0.1 * 0.30102999566398120, 1e-15);
  EXPECT_NEAR(s->lr(5), 0.1 * 0.69897000433601880, 1e-15);
  EXPECT_NEAR(s->lr(10), 0.1, 1e-15);
  EXPECT_EQ(s->lr(11), 0.1);  // warmup over: gamma = 1 exactly
  EXPECT_EQ(s->lr(123456), 0.1);
  // Bit-identical to DeepSpeed's expression order: min + delta * (1/log(W) * log(lbi + 1)).
  EXPECT_EQ(s->lr(5), 0.0 + 0.1 * ((1.0 / std::log(10.0)) * std::log(5.0)));
}

TEST(LrSchedule, WarmupLrLinearAndDefaults) {
  auto s = make_lr_schedule(
      "WarmupLR",
      json{{"warmup_min_lr", 0.01}, {"warmup_max_lr", 0.11}, {"warmup_num_steps", 4}, {"warmup_type", "linear"}}, 1.0);
  EXPECT_DOUBLE_EQ(s->lr(0), 0.01);
  EXPECT_DOUBLE_EQ(s->lr(1), 0.01);   // lbi 0: 0/4
  EXPECT_DOUBLE_EQ(s->lr(2), 0.035);  // lbi 1: 1/4
  EXPECT_DOUBLE_EQ(s->lr(4), 0.085);  // lbi 3: 3/4
  EXPECT_DOUBLE_EQ(s->lr(5), 0.11);   // lbi 4: done
  // warmup_max_lr defaults to the optimizer's lr; warmup_num_steps = 1 is clamped to 2.
  auto d = make_lr_schedule("WarmupLR", json{{"warmup_num_steps", 1}, {"warmup_type", "linear"}}, 0.5);
  EXPECT_DOUBLE_EQ(d->lr(2), 0.25);  // lbi 1 of 2
  EXPECT_DOUBLE_EQ(d->lr(3), 0.5);
  EXPECT_EQ(d->resolved_params()["warmup_max_lr"], 0.5);
  EXPECT_EQ(d->resolved_params()["warmup_min_lr"], 0.0);
  // All defaults: min 0, max = base lr, 1000 log steps.
  auto z = make_lr_schedule("WarmupLR", json::object(), 2e-3);
  EXPECT_EQ(z->resolved_params()["warmup_num_steps"], 1000);
  EXPECT_EQ(z->resolved_params()["warmup_type"], "log");
  EXPECT_NEAR(z->lr(10), 2e-3 * std::log(10.0) / std::log(1000.0), 1e-18);  // = 2e-3 / 3
  EXPECT_EQ(z->lr(1001), 2e-3);
}

TEST(LrSchedule, WarmupDecayLr) {
  auto s = make_lr_schedule("WarmupDecayLR",
                            json{{"total_num_steps", 20},
                                 {"warmup_min_lr", 0.0},
                                 {"warmup_max_lr", 0.1},
                                 {"warmup_num_steps", 10},
                                 {"warmup_type", "linear"}},
                            1.0);
  EXPECT_DOUBLE_EQ(s->lr(5), 0.04);   // lbi 4: 4/10
  EXPECT_DOUBLE_EQ(s->lr(11), 0.1);   // lbi 10: (20-10)/(20-10)
  EXPECT_DOUBLE_EQ(s->lr(16), 0.05);  // lbi 15: 5/10
  EXPECT_DOUBLE_EQ(s->lr(20), 0.01);  // lbi 19: 1/10
  EXPECT_EQ(s->lr(21), 0.0);
  EXPECT_EQ(s->lr(500), 0.0);  // clamped at 0, never negative
  // Unlike WarmupLR, WarmupDecayLR's warmup_max_lr default stays DeepSpeed's 0.001.
  auto d = make_lr_schedule("WarmupDecayLR", json{{"total_num_steps", 100}, {"warmup_num_steps", 10}}, 0.5);
  EXPECT_EQ(d->resolved_params()["warmup_max_lr"], 0.001);
  EXPECT_DOUBLE_EQ(d->lr(11), 0.001);
  expect_config_error([] { make_lr_schedule("WarmupDecayLR", json{{"warmup_num_steps", 10}}, 1.0); },
                      "scheduler.params.total_num_steps: missing");
}

TEST(LrSchedule, WarmupCosineLr) {
  auto s = make_lr_schedule("WarmupCosineLR",
                            json{{"total_num_steps", 12},
                                 {"warmup_num_steps", 4},
                                 {"warmup_min_ratio", 0.1},
                                 {"cos_min_ratio", 0.0},
                                 {"warmup_type", "linear"}},
                            0.2);
  EXPECT_EQ(s->lr(0), 0.0);           // DeepSpeed: 0 before the first scheduler step
  EXPECT_DOUBLE_EQ(s->lr(1), 0.02);   // lbi 0: ratio 0.1
  EXPECT_DOUBLE_EQ(s->lr(3), 0.11);   // lbi 2: 0.1 + 0.5 * 0.9 = 0.55
  EXPECT_DOUBLE_EQ(s->lr(5), 0.2 * (1 + std::cos(std::numbers::pi / 8)) / 2);  // lbi 4: progress 1/8
  EXPECT_NEAR(s->lr(5), 0.2 * 0.96193976625564337, 1e-15);
  EXPECT_DOUBLE_EQ(s->lr(8), 0.1);    // lbi 7: progress 1/2
  EXPECT_NEAR(s->lr(12), 0.0, 1e-17);  // lbi 11: progress 1
  EXPECT_NEAR(s->lr(1000), 0.0, 1e-17);  // progress clamped at 1: no climb back up
  // Log warmup: ratio = log(lbi + 1) / log(W); defaults warmup_min_ratio 0, cos_min_ratio 1e-4.
  auto l = make_lr_schedule("WarmupCosineLR", json{{"total_num_steps", 10}, {"warmup_num_steps", 4}}, 0.2);
  EXPECT_DOUBLE_EQ(l->lr(2), 0.1);  // log 2 / log 4 = 1/2
  EXPECT_DOUBLE_EQ(l->lr(1000), 0.2 * 1e-4);
  EXPECT_EQ(l->resolved_params()["cos_min_ratio"], 0.0001);
  expect_config_error([] { make_lr_schedule("WarmupCosineLR", json::object(), 1.0); }, "total_num_steps");
}

TEST(LrSchedule, OneCycleLrAndMomentum) {
  auto s = make_lr_schedule("OneCycle",
                            json{{"cycle_min_lr", 0.1},
                                 {"cycle_max_lr", 1.0},
                                 {"cycle_first_step_size", 4},
                                 {"decay_lr_rate", 0.5},
                                 {"decay_step_size", 2}},
                            123.0);
  // Cycle of 8 steps (second half defaults to the first), peak at k = 4.
  EXPECT_DOUBLE_EQ(s->lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s->lr(2), 0.55);
  EXPECT_DOUBLE_EQ(s->lr(4), 1.0);
  EXPECT_DOUBLE_EQ(s->lr(6), 0.55);
  EXPECT_DOUBLE_EQ(s->lr(8), 0.1);
  // Decay: lbi - 8 + 1 decay iterations, interval = that / decay_step_size.
  EXPECT_DOUBLE_EQ(s->lr(9), 0.1 / 1.25);  // interval 0.5
  EXPECT_DOUBLE_EQ(s->lr(12), 0.05);       // interval 2
  // Momentum cycles inversely; k = 0 is the constructor's cycle_min_mom (DeepSpeed quirk).
  EXPECT_DOUBLE_EQ(*s->momentum(0), 0.8);
  EXPECT_DOUBLE_EQ(*s->momentum(1), 0.9 - 0.1 * 0.25);
  EXPECT_DOUBLE_EQ(*s->momentum(2), 0.85);
  EXPECT_DOUBLE_EQ(*s->momentum(4), 0.8);
  EXPECT_DOUBLE_EQ(*s->momentum(9), 0.9);  // decay_mom_rate 0: stays at cycle_max_mom
  EXPECT_DOUBLE_EQ(*s->beta2(3), 0.99);
  auto r = s->resolved_params();
  EXPECT_EQ(r["cycle_second_step_size"], 4);
  EXPECT_EQ(r["cycle_momentum"], true);

  auto nomom = make_lr_schedule("OneCycle", json{{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.0}, {"cycle_momentum", false}},
                                1.0);
  EXPECT_FALSE(nomom->momentum(5).has_value());
  EXPECT_FALSE(nomom->beta2(5).has_value());
  EXPECT_DOUBLE_EQ(nomom->lr(4000), 0.1);  // after the default 2000+2000 cycle, no decay: min lr
  EXPECT_DOUBLE_EQ(nomom->lr(2000), 1.0);

  // Momentum decay grows momentum (sic, DeepSpeed).
  auto md = make_lr_schedule("OneCycle",
                             json{{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.0}, {"cycle_first_step_size", 2},
                                  {"decay_step_size", 1}, {"decay_mom_rate", 0.1}},
                             1.0);
  EXPECT_DOUBLE_EQ(*md->momentum(6), 0.9 * (1 + 0.1 * 2));  // lbi 5: 5 - 4 + 1 = 2 decay steps
  EXPECT_DOUBLE_EQ(md->lr(6), 0.1);                        // decay_lr_rate 0: no lr decay
  expect_config_error([] { make_lr_schedule("OneCycle", json{{"cycle_max_lr", 1.0}}, 1.0); },
                      "scheduler.params.cycle_min_lr: missing");
}

TEST(LrSchedule, OneCycleStairs) {
  auto s = make_lr_schedule("OneCycle",
                            json{{"cycle_min_lr", 0.1},
                                 {"cycle_max_lr", 1.0},
                                 {"cycle_first_step_size", 4},
                                 {"cycle_first_stair_count", 2}},
                            1.0);
  // Two stairs per half: lr stays flat for two steps at a time.
  const double expect[] = {0.1, 0.1, 0.55, 0.55, 1.0, 0.55, 0.55, 0.1, 0.1};
  for (int k = 0; k <= 8; ++k) EXPECT_DOUBLE_EQ(s->lr(k), expect[k]) << "k=" << k;
  // Asymmetric cycle 3 up / 5 down, 3 stairs each: the peak must not lose a stair.
  auto a = make_lr_schedule("OneCycle",
                            json{{"cycle_min_lr", 0.0},
                                 {"cycle_max_lr", 3.0},
                                 {"cycle_first_step_size", 3},
                                 {"cycle_second_step_size", 5},
                                 {"cycle_first_stair_count", 3},
                                 {"cycle_momentum", false}},
                            1.0);
  EXPECT_DOUBLE_EQ(a->lr(3), 3.0);
  EXPECT_DOUBLE_EQ(a->lr(4), 2.0);  // (8-4)*3/5 = 2.4 -> 2 stairs
}

TEST(LrSchedule, LrRangeTest) {
  auto s = make_lr_schedule("LRRangeTest",
                            json{{"lr_range_test_min_lr", 0.01}, {"lr_range_test_step_size", 10},
                                 {"lr_range_test_step_rate", 2.0}},
                            1.0);
  EXPECT_DOUBLE_EQ(s->lr(0), 0.01);
  EXPECT_DOUBLE_EQ(s->lr(5), 0.02);
  EXPECT_DOUBLE_EQ(s->lr(10), 0.03);
  auto st = make_lr_schedule("LRRangeTest",
                             json{{"lr_range_test_min_lr", 0.01}, {"lr_range_test_step_size", 10},
                                  {"lr_range_test_step_rate", 2.0}, {"lr_range_test_staircase", true}},
                             1.0);
  EXPECT_DOUBLE_EQ(st->lr(9), 0.01);
  EXPECT_DOUBLE_EQ(st->lr(10), 0.03);
}

// The config layer's messages (src/config/scheduler.cpp): the schedule itself never sees
// an unvalidated value.
TEST(LrSchedule, BadParamsNameTheKey) {
  expect_config_error([] { make_lr_schedule("WarmupLR", json{{"warmup_max_lrr", 0.1}}, 1.0); },
                      "unknown key scheduler.params.warmup_max_lrr: did you mean warmup_max_lr?");
  expect_config_error([] { make_lr_schedule("WarmupLR", json{{"warmup_num_steps", 0}}, 1.0); },
                      "scheduler.params.warmup_num_steps: must be >= 1");
  expect_config_error([] { make_lr_schedule("WarmupLR", json{{"warmup_num_steps", 10.5}}, 1.0); },
                      "scheduler.params.warmup_num_steps: expected an integer");
  expect_config_error([] { make_lr_schedule("WarmupLR", json{{"warmup_min_lr", -1e-3}}, 1.0); },
                      "scheduler.params.warmup_min_lr: must be >= 0");
  expect_config_error([] { make_lr_schedule("WarmupLR", json{{"warmup_type", "cosine"}}, 1.0); },
                      "scheduler.params.warmup_type: \"cosine\" is not a warmup type");
  expect_config_error([] { make_lr_schedule("OneCycle", json{{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.0},
                                                             {"cycle_momentum", 1}}, 1.0); },
                      "scheduler.params.cycle_momentum: expected a boolean");
  expect_config_error([] { make_lr_schedule("WarmupLR", json{{"last_batch_iteration", 99}}, 1.0); },
                      "scheduler.params.last_batch_iteration");
  expect_config_error([] { make_lr_schedule("WarmupLR", json::array(), 1.0); }, "scheduler.params: expected an object");
  // "auto" takes the default, as DeepSpeed's HF integration fills it (the config notes it).
  EXPECT_EQ(make_lr_schedule("WarmupLR", json{{"warmup_max_lr", "auto"}}, 0.25)->resolved_params()["warmup_max_lr"],
            0.25);
  // Accepted: last_batch_iteration -1 and integers written as floats.
  auto s = make_lr_schedule("WarmupLR", json{{"last_batch_iteration", -1}, {"warmup_num_steps", 1e3}}, 1.0);
  EXPECT_EQ(s->resolved_params()["warmup_num_steps"], 1000);
}

// scheduler.params is parsed once, by the config layer: a SchedulerConfig that did not come
// from it (a key left out) is a bug, not a user error.
TEST(LrSchedule, ReadsOnlyResolvedParams) {
  zt::SchedulerConfig partial;
  partial.type = "WarmupLR";
  partial.params = json{{"warmup_min_lr", 0.0}};
  EXPECT_THROW(zt::optim::make_lr_schedule(partial, 1.0), zt::InternalError);
  // The config's own resolution builds it.
  json j = {{"train_batch_size", 1}, {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.0}}}}}};
  const zt::Config cfg = zt::Config::from_json(j, 1);
  EXPECT_EQ(zt::optim::make_lr_schedule(cfg.scheduler, cfg.optimizer.params.lr)->resolved_params(), cfg.scheduler.params);
}

}  // namespace zt_test_lr_schedule
