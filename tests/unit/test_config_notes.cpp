// [Config Notes] (src/config/notes.h): keys that change no result in zerotrain are
// accepted, and each one set to a non-default value gets a line naming it.
#include <gtest/gtest.h>

#include <string>

#include "config/notes.h"
#include "zerotrain/config.h"

namespace zt_test_config_notes {

namespace {

using nlohmann::json;

bool has(const std::vector<std::string>& notes, const std::string& prefix) {
  for (const auto& n : notes)
    if (n.rfind(prefix, 0) == 0) return true;
  return false;
}

TEST(ConfigNotes, DefaultsAndAbsentKeysGiveNoNotes) {
  json j = {{"train_micro_batch_size_per_gpu", 2},
            {"zero_optimization", {{"stage", 2}, {"contiguous_gradients", true}, {"overlap_comm", true}}}};
  EXPECT_TRUE(zt::config::config_notes(j, zt::Config::from_json(j, 1)).empty());
}

TEST(ConfigNotes, EveryFormerlySilentKeyIsNamedAndTheConfigRuns) {
  json j = json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 3, "contiguous_gradients": false, "overlap_comm": false,
      "reduce_bucket_size": 1000, "stage3_model_persistence_threshold": 5, "round_robin_gradients": true,
      "memory_efficient_linear": false,
      "offload_optimizer": {"device": "cpu", "pipeline_read": true, "pipeline_write": true, "fast_init": true}},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": true}},
    "zero_allow_untested_optimizer": true, "zero_force_ds_cpu_optimizer": false,
    "timers": {"throughput": {"enabled": true}},
    "seq_parallel_communication_data_type": "fp32"})");
  const zt::Config c = zt::Config::from_json(j, 1);  // accepted: no "not supported yet"
  const auto notes = zt::config::config_notes(j, c);
  for (const char* k : {"zero_optimization.contiguous_gradients = false", "zero_optimization.overlap_comm = false: no effect at stage 3",
                        "zero_optimization.reduce_bucket_size = 1000", "zero_optimization.stage3_model_persistence_threshold = 5",
                        "zero_optimization.round_robin_gradients = true", "zero_optimization.memory_efficient_linear = false",
                        "zero_optimization.offload_optimizer.pipeline_read = true",
                        "zero_optimization.offload_optimizer.pipeline_write = true",
                        "zero_optimization.offload_optimizer.fast_init = true", "optimizer.params.torch_adam = true",
                        "zero_allow_untested_optimizer = true", "zero_force_ds_cpu_optimizer = false", "timers = "}) {
    EXPECT_TRUE(has(notes, k)) << k;
  }
  EXPECT_EQ(notes.size(), 13u);
}

TEST(ConfigNotes, OverlapCommMattersAtStageOneOnly) {
  json j = {{"train_micro_batch_size_per_gpu", 2}, {"zero_optimization", {{"stage", 1}, {"overlap_comm", false}}}};
  EXPECT_TRUE(zt::config::config_notes(j, zt::Config::from_json(j, 1)).empty());
  j["zero_optimization"]["stage"] = 0;
  EXPECT_TRUE(has(zt::config::config_notes(j, zt::Config::from_json(j, 1)), "zero_optimization.overlap_comm = false: no effect at stage 0"));
}

}  // namespace

}  // namespace zt_test_config_notes
