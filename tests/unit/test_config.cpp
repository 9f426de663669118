// DeepSpeed JSON config: checked-in configs parse, bad configs fail with messages that
// name the key and the fix, defaults/aliases/"auto" behave like DeepSpeed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt_test_config {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kConfigs = fs::path(ZT_SOURCE_DIR) / "configs";

// The error message of parsing `j` (the "not supported yet" check included when
// `full`); a test failure when it parses.
std::string error_of(const json& j, int world = 1, bool full = false) {
  try {
    if (full) {
      zt::Config::from_json(j, world);
    } else {
      zt::Config::parse(j, world);
    }
  } catch (const zt::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for " << j.dump();
  return "";
}

fs::path write_temp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("zt_test_config_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

// ---- checked-in configs -----------------------------------------------------------------

// Configs that use features the engine cannot run yet: they parse, and from_file names them.
// (Every checked-in config runs today; the map stays for the next feature that lands.)
const std::map<std::string, std::vector<std::string>> kNotSupportedYet = {};

TEST(ConfigFiles, CheckedInConfigsParse) {
  std::set<std::string> seen;
  for (const auto& entry : fs::directory_iterator(kConfigs)) {
    if (entry.path().extension() != ".json") continue;
    const std::string name = entry.path().filename().string();
    seen.insert(name);
    SCOPED_TRACE(name);
    json j = zt::Config::read_json_file(entry.path().string());
    zt::Config c = zt::Config::parse(j, 2, name);
    EXPECT_GT(c.train_batch_size, 0);
    // to_json is a complete DeepSpeed config: it parses back to the same thing.
    EXPECT_EQ(zt::Config::parse(c.to_json(), 2).to_json(), c.to_json());
    auto it = kNotSupportedYet.find(name);
    if (it == kNotSupportedYet.end()) {
      EXPECT_TRUE(c.not_supported_yet.empty()) << c.not_supported_yet.front();
      EXPECT_NO_THROW(zt::Config::from_file(entry.path().string(), 2));
    } else {
      try {
        zt::Config::from_file(entry.path().string(), 2);
        ADD_FAILURE() << "expected not supported yet";
      } catch (const zt::ConfigError& e) {
        std::string what = e.what();
        EXPECT_NE(what.find(entry.path().string()), std::string::npos) << what;
        for (const auto& m : it->second) EXPECT_NE(what.find(m), std::string::npos) << what;
      }
    }
  }
  for (const char* expected : {"cifar10_tutorial.json", "cifar10_ds_config.json", "zero0.json", "zero1.json",
                               "zero2.json", "demo_zero2.json", "zero2_offload.json", "zero3_offload.json",
                               "zero3_nvme.json"})
    EXPECT_TRUE(seen.count(expected)) << expected;
}

TEST(ConfigFiles, ValuesOfCheckedInConfigs) {
  auto tutorial = zt::Config::from_file((kConfigs / "cifar10_tutorial.json").string(), 1);
  EXPECT_EQ(tutorial.train_batch_size, 4);
  EXPECT_EQ(tutorial.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(tutorial.gradient_accumulation_steps, 1);
  EXPECT_EQ(tutorial.steps_per_print, 2000);
  EXPECT_EQ(tutorial.optimizer.type, "Adam");
  EXPECT_TRUE(tutorial.optimizer.params.adam_w_mode);  // DeepSpeed's "Adam" is AdamW unless told
  EXPECT_DOUBLE_EQ(tutorial.optimizer.params.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(tutorial.optimizer.params.weight_decay, 3e-7);
  EXPECT_EQ(tutorial.scheduler.params.at("warmup_type"), "log");
  EXPECT_EQ(tutorial.compute_dtype(), at::kFloat);

  auto cifar = zt::Config::from_file((kConfigs / "cifar10_ds_config.json").string(), 4);
  EXPECT_EQ(cifar.train_micro_batch_size_per_gpu, 4);  // 16 / 4 ranks
  EXPECT_EQ(cifar.compute_dtype(), at::kBFloat16);
  EXPECT_TRUE(cifar.zero_optimization.overlap_comm);
  EXPECT_EQ(cifar.zero_optimization.reduce_bucket_size, 50000000);
  EXPECT_EQ(cifar.fp16.initial_scale_power, 15);

  auto demo = zt::Config::from_file((kConfigs / "demo_zero2.json").string(), 2);
  EXPECT_EQ(demo.zero_optimization.stage, 2);
  EXPECT_EQ(demo.compute_dtype(), at::kFloat);
  EXPECT_FALSE(demo.mixed_precision());
  EXPECT_EQ(demo.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(demo.optimizer.params.lr, 3e-3);
  EXPECT_EQ(demo.scheduler.type, "WarmupLR");
  EXPECT_EQ(demo.scheduler.params.at("warmup_num_steps"), 20);
  EXPECT_EQ(demo.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(demo.train_batch_size, 16);
  EXPECT_DOUBLE_EQ(demo.gradient_clipping, 1.0);

  auto z1 = zt::Config::from_file((kConfigs / "zero1.json").string(), 3);
  EXPECT_EQ(z1.zero_optimization.stage, 1);
  EXPECT_EQ(z1.train_batch_size, 24);  // micro 8 x 3 ranks: valid at any world size
  EXPECT_TRUE(z1.mixed_precision());

  auto z3 = zt::Config::parse(zt::Config::read_json_file((kConfigs / "zero3_offload.json").string()), 1);
  EXPECT_EQ(z3.zero_optimization.stage3_prefetch_bucket_size, 15099494);  // 15099494.4 rounded
  EXPECT_EQ(z3.zero_optimization.offload_param.device, zt::OffloadDevice::cpu);
  EXPECT_TRUE(z3.zero_optimization.offload_param.pin_memory);
  EXPECT_TRUE(z3.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(z3.scheduler.params.at("warmup_min_ratio"), 0.0);  // default filled
}

// ---- bad configs ----------------------------------------------------------------------

struct BadCase {
  const char* name;
  const char* config;
  int world;
  bool full;  // include the "not supported yet" check (from_json)
  std::vector<std::string> expect;
};

const BadCase kBadCases[] = {
    {"inconsistent_batch",
     R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1})", 1, false,
     {"train_batch_size (8) != train_micro_batch_size_per_gpu (2) * gradient_accumulation_steps (1) * world size "
      "(1) = 2: set train_batch_size to 2",
      "or gradient_accumulation_steps to 4", "or train_micro_batch_size_per_gpu to 8"}},
    {"inconsistent_batch_world",
     R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1})", 2, false,
     {"* world size (2) = 4: set train_batch_size to 4", "or gradient_accumulation_steps to 2"}},
    {"batch_not_divisible", R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})", 1, false,
     {"train_batch_size (10) is not a multiple of train_micro_batch_size_per_gpu (4) * world size (1) = 4",
      "set train_batch_size to a multiple of 4"}},
    {"no_batch", R"({"gradient_accumulation_steps": 2})", 1, false,
     {"neither train_batch_size nor train_micro_batch_size_per_gpu is set", "set train_micro_batch_size_per_gpu"}},
    {"unknown_top_key", R"({"train_batch_size": 8, "steps_per_prnt": 10})", 1, false,
     {"unknown key steps_per_prnt: did you mean steps_per_print?"}},
    {"top_key_of_other_section", R"({"train_batch_size": 8, "stage": 2})", 1, false,
     {"unknown key stage: did you mean zero_optimization.stage?"}},
    {"nested_typo",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "stage3_param_persitence_threshold": 1e4}})", 1,
     false,
     {"unknown key zero_optimization.stage3_param_persitence_threshold: did you mean "
      "stage3_param_persistence_threshold?"}},
    {"offload_typo",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none", "pin_memmory": true}}})",
     1, false, {"unknown key zero_optimization.offload_optimizer.pin_memmory: did you mean pin_memory?"}},
    {"bf16_with_fp16_keys", R"({"train_batch_size": 8, "bf16": {"enabled": true, "loss_scale": 0}})", 1, false,
     {"unknown key bf16.loss_scale: did you mean fp16.loss_scale?"}},
    {"fp16_and_bf16", R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})", 1, false,
     {"fp16.enabled and bf16.enabled are both true: enable one of them"}},
    {"negative_bucket", R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": -1}})", 1, false,
     {"zero_optimization.reduce_bucket_size: must be >= 0, found -1",
      "(DeepSpeed's default is 500000000)"}},
    {"unknown_optimizer", R"({"train_batch_size": 8, "optimizer": {"type": "Adamm"}})", 1, false,
     {"optimizer.type: \"Adamm\" is not an optimizer zerotrain knows: did you mean Adam? use one of Adam, AdamW, SGD"}},
    {"unknown_scheduler", R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosine"}})", 1, false,
     {"scheduler.type: \"WarmupCosine\" is not an LR schedule zerotrain knows: did you mean WarmupCosineLR? use one "
      "of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest"}},
    {"truncated_key", R"({"train_batch_size": 8, "wall_clock": true})", 1, false,
     {"unknown key wall_clock: did you mean wall_clock_breakdown?"}},
    {"optimizer_without_type", R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 1e-3}}})", 1, false,
     {"optimizer.type: missing: set it to one of Adam, AdamW, SGD"}},
    {"string_for_int", R"({"train_batch_size": 8, "zero_optimization": {"stage": "2"}})", 1, false,
     {"zero_optimization.stage: expected an integer, found string \"2\": write 2 without quotes"}},
    {"string_for_bool", R"({"train_batch_size": 8, "fp16": {"enabled": "true"}})", 1, false,
     {"fp16.enabled: expected a boolean (true or false), found string \"true\": write true without quotes"}},
    {"section_not_object", R"({"train_batch_size": 8, "fp16": true})", 1, false,
     {"fp16: expected an object ({...}), found boolean true"}},
    {"stage_5", R"({"train_batch_size": 8, "zero_optimization": {"stage": 5}})", 1, false,
     {"zero_optimization.stage: 5 is not a ZeRO stage: use 0 (off), 1 (optimizer states), 2 (+ gradients) or 3"}},
    {"auto_batch_left", R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})", 1, false,
     {"train_batch_size, train_micro_batch_size_per_gpu: \"auto\" is left for the launcher to fill",
      "put numbers there before Config::from_json"}},
    {"auto_clipping_left", R"({"train_batch_size": 8, "gradient_clipping": "auto"})", 1, false,
     {"gradient_clipping: \"auto\" is left for the launcher"}},
    {"scheduler_param_typo",
     R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_rl": 0.01}}})", 1, false,
     {"unknown key scheduler.params.warmup_max_rl: did you mean warmup_max_lr?"}},
    {"scheduler_missing_required",
     R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})", 1,
     false, {"scheduler.params.total_num_steps: missing: WarmupDecayLR requires it"}},
    {"scheduler_bad_warmup_type",
     R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})", 1, false,
     {"scheduler.params.warmup_type: \"cosine\" is not a warmup type: use \"log\""}},
    {"scheduler_zero_warmup",
     R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})", 1, false,
     {"scheduler.params.warmup_num_steps: must be >= 1, found 0"}},
    {"non_integral_micro_batch", R"({"train_micro_batch_size_per_gpu": 2.5})", 1, false,
     {"train_micro_batch_size_per_gpu: expected an integer, found 2.5: use a whole number such as 2 or 3"}},
    {"zero_micro_batch", R"({"train_micro_batch_size_per_gpu": 0})", 1, false,
     {"train_micro_batch_size_per_gpu: must be >= 1, found 0"}},
    {"nvme_without_path",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})", 1,
     false, {"zero_optimization.offload_optimizer.nvme_path is required for device \"nvme\""}},
    {"bad_offload_device",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}})", 1,
     false, {"zero_optimization.offload_optimizer.device: \"gpu\" is not one of \"none\", \"cpu\", \"nvme\""}},
    {"offload_param_stage2",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})", 1, false,
     {"zero_optimization.offload_param needs stage 3 (found stage 2): set zero_optimization.stage to 3"}},
    {"deprecated_and_new_offload",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
     1, false, {"zero_optimization.cpu_offload (deprecated) and zero_optimization.offload_optimizer are both given"}},
    {"conflicting_alias",
     R"({"train_batch_size": 8, "zero_optimization": {"stage3_max_live_parameters": 1e9, "max_live_parameters": 5}})",
     1, false,
     {"zero_optimization.stage3_max_live_parameters (1000000000.0) and zero_optimization.max_live_parameters (5) "
      "are the same setting under two names: keep one"}},
    {"adamw_without_w_mode",
     R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})", 1, false,
     {"optimizer.params.adam_w_mode: false has no effect with type AdamW"}},
    {"adam_param_on_sgd", R"({"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})",
     1, false, {"unknown key optimizer.params.betas: known keys here are dampening, lr, momentum, nesterov"}},
    {"bad_betas", R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})", 1, false,
     {"optimizer.params.betas: expected an array of two numbers such as [0.9, 0.999]"}},
    {"max_grad_norm_in_optimizer",
     R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})", 1, false,
     {"optimizer.params.max_grad_norm: DeepSpeed ignores clipping set here",
      "set the top-level \"gradient_clipping\": 1"}},
    // Not supported yet: the config is valid DeepSpeed, the engine cannot run it.
    {"not_supported_aio_use_gds", R"({"train_batch_size": 8, "aio": {"use_gds": true}})", 1, true,
     {"aio.use_gds = true is not supported yet by zerotrain: set it false"}},
    {"aio_block_size_not_page_multiple", R"({"train_batch_size": 8, "aio": {"block_size": 1000000}})", 1, false,
     {"aio.block_size = 1000000 is not a multiple of 4096 bytes up to 1 GiB",
      "use a multiple of 4096 such as 1048576"}},
    {"aio_block_size_over_1gib", R"({"train_batch_size": 8, "aio": {"block_size": 2147483648}})", 1, false,
     {"aio.block_size = 2147483648 is not a multiple of 4096 bytes up to 1 GiB"}},
    {"nvme_zero_buffers",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 0}}})",
     1, false, {"zero_optimization.offload_optimizer.buffer_count = 0: device \"nvme\" needs at least 1 staging buffer"}},
    {"nvme_delayed_update",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "delayed_param_update": true}}})",
     1, false,
     {"zero_optimization.offload_optimizer.delayed_param_update", "it is not supported with \"nvme\"",
      "remove delayed_param_update or use device \"cpu\""}},
    {"not_supported_offload_ratio",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
     1, true, {"zero_optimization.offload_optimizer.ratio = 0.5"}},
    {"not_supported_lamb", R"({"train_batch_size": 8, "optimizer": {"type": "lamb", "params": {"lr": 1e-3}}})", 1,
     true, {"optimizer.type \"Lamb\" is not supported yet by zerotrain: use one of Adam, AdamW, SGD"}},
    {"not_supported_monitor", R"({"train_batch_size": 8, "comet": {"enabled": true, "project": "x"}})", 1, true,
     {"comet.enabled = true is not supported yet by zerotrain"}},
    {"tensorboard_unknown_key", R"({"train_batch_size": 8, "tensorboard": {"enabled": true, "job": "x"}})", 1, false,
     {"unknown key tensorboard.job: known keys here are enabled, job_name, output_path"}},
    {"csv_monitor_empty_job_name", R"({"train_batch_size": 8, "csv_monitor": {"enabled": true, "job_name": ""}})", 1,
     false, {"csv_monitor.job_name: empty"}},
    {"wandb_bad_team", R"({"train_batch_size": 8, "wandb": {"enabled": true, "team": 3}})", 1, false,
     {"wandb.team: expected a string, found integer 3"}},
    {"not_supported_partition_activations",
     R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": true}})", 1, true,
     {"activation_checkpointing.partition_activations = true is not supported yet by zerotrain"}},
    {"not_supported_amsgrad",
     R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"amsgrad": true}}})", 1, true,
     {"optimizer.params.amsgrad = true is not supported yet by zerotrain"}},
    {"not_supported_mics", R"({"train_batch_size": 8, "zero_optimization": {"mics_shard_size": 8}})", 1, true,
     {"zero_optimization.mics_shard_size = 8 is not supported yet by zerotrain: remove it or use DeepSpeed's "
      "default -1"}},
    {"not_supported_torch_scheduler",
     R"({"train_batch_size": 8, "scheduler": {"type": "StepLR", "params": {"step_size": 10}}})", 1, true,
     {"scheduler.type \"StepLR\" is not supported yet by zerotrain: use one of WarmupLR, WarmupDecayLR, "
      "WarmupCosineLR, OneCycle, LRRangeTest"}},
};

TEST(ConfigErrors, BadConfigsNameTheKeyAndTheFix) {
  for (const auto& c : kBadCases) {
    SCOPED_TRACE(c.name);
    std::string what = error_of(json::parse(c.config), c.world, c.full);
    for (const auto& e : c.expect) EXPECT_NE(what.find(e), std::string::npos) << "missing: " << e << "\nin: " << what;
  }
}

TEST(ConfigDefaults, Monitors) {
  // DeepSpeed's defaults (deepspeed/monitor/config.py): off, output_path "", job
  // "DeepSpeedJobName", wandb project "deepspeed", team and group null.
  auto d = zt::Config::from_json(json::parse(R"({"train_batch_size": 8})"), 1);
  for (const auto* m : {&d.tensorboard, &d.csv_monitor}) {
    EXPECT_FALSE(m->enabled);
    EXPECT_EQ(m->output_path, "");
    EXPECT_EQ(m->job_name, "DeepSpeedJobName");
  }
  EXPECT_FALSE(d.wandb.enabled);
  EXPECT_EQ(d.wandb.project, "deepspeed");
  EXPECT_EQ(d.wandb.team, "");
  // Enabled monitors are honoured (no "not supported yet"), every key read.
  auto c = zt::Config::from_json(json::parse(R"({"train_batch_size": 8,
      "tensorboard": {"enabled": true, "output_path": "out/ds_logs/", "job_name": "train_bert"},
      "csv_monitor": {"enabled": true, "output_path": "csv/", "job_name": "job"},
      "wandb": {"enabled": true, "team": "my_team", "group": "my_group", "project": "my_project"}})"),
                                 1);
  EXPECT_TRUE(c.not_supported_yet.empty());
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.output_path, "out/ds_logs/");
  EXPECT_EQ(c.tensorboard.job_name, "train_bert");
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "csv/");
  EXPECT_EQ(c.csv_monitor.job_name, "job");
  EXPECT_TRUE(c.wandb.enabled);
  EXPECT_EQ(c.wandb.team, "my_team");
  EXPECT_EQ(c.wandb.group, "my_group");
  EXPECT_EQ(c.wandb.project, "my_project");
  EXPECT_EQ(c.to_json()["wandb"]["team"], "my_team");
  EXPECT_TRUE(d.to_json()["wandb"]["team"].is_null());
  EXPECT_EQ(zt::Config::parse(c.to_json(), 1).to_json(), c.to_json());
}

TEST(ConfigDefaults, NvmeOffloadAndAio) {
  auto c = zt::Config::from_json(json::parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 6}},
      "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 2, "single_submit": true,
              "overlap_events": false}})"),
                                 1);
  EXPECT_TRUE(c.not_supported_yet.empty());
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, zt::OffloadDevice::nvme);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.buffer_count, 6);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 16);
  EXPECT_EQ(c.aio.thread_count, 2);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
}

TEST(ConfigErrors, NotSupportedYetIsCollectedByParse) {
  auto c = zt::Config::parse(
      json::parse(
          R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}, "aio": {"use_gds": true}})"),
      1);
  ASSERT_EQ(c.not_supported_yet.size(), 1u);
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_TRUE(c.zero_optimization.overlap_comm);  // DeepSpeed's code: on for stage 3 when not given
}

TEST(ConfigErrors, AllErrorsInOnePass) {
  std::string what = error_of(json::parse(R"({
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 7, "reduce_bucket_size": -5},
    "fp16": {"enabled": true}, "bf16": {"enabled": true},
    "wall_clck": true})"));
  EXPECT_NE(what.find("5 errors in the DeepSpeed config:"), std::string::npos) << what;
  for (const char* e : {"\n  - train_batch_size (8) != ", "\n  - zero_optimization.stage: 7 is not a ZeRO stage",
                        "\n  - zero_optimization.reduce_bucket_size: must be >= 0",
                        "\n  - fp16.enabled and bf16.enabled are both true", "\n  - unknown key wall_clck"})
    EXPECT_NE(what.find(e), std::string::npos) << e << "\nin: " << what;
}

TEST(ConfigErrors, WorldSizeMustBePositive) {
  EXPECT_NE(error_of(json::parse(R"({"train_batch_size": 8})"), 0).find("world size must be >= 1"),
            std::string::npos);
}

TEST(ConfigErrors, FileErrorsNameThePath) {
  try {
    zt::Config::from_file("/nonexistent/ds.json", 1);
    ADD_FAILURE();
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open config file '/nonexistent/ds.json'"), std::string::npos);
  }
  fs::path bad = write_temp("syntax.json", "{\n  \"train_batch_size\": 8,\n  \"fp16\": {\"enabled\": true,}\n}\n");
  try {
    zt::Config::from_file(bad.string(), 1);
    ADD_FAILURE();
  } catch (const zt::ConfigError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(bad.string() + ": invalid JSON: "), std::string::npos) << what;
    EXPECT_NE(what.find("line 3, column"), std::string::npos) << what;
  }
  fs::path dup = write_temp("dup.json", R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 2}})");
  try {
    zt::Config::from_file(dup.string(), 1);
    ADD_FAILURE();
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key zero_optimization.stage"), std::string::npos) << e.what();
  }
  fs::path comments = write_temp("comments.json", "{\n  // hjson-style comment\n  \"train_batch_size\": 8\n}\n");
  EXPECT_EQ(zt::Config::from_file(comments.string(), 2).train_micro_batch_size_per_gpu, 4);
  fs::path unknown = write_temp("unknown.json", R"({"train_batch_size": 8, "fp17": {}})");
  try {
    zt::Config::from_file(unknown.string(), 1);
    ADD_FAILURE();
  } catch (const zt::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(unknown.string() + ": 1 error in the DeepSpeed config:", 0), 0u)
        << e.what();
  }
  for (const auto& p : {bad, dup, comments, unknown}) fs::remove(p);
}

// ---- defaults, numbers, "auto", aliases -----------------------------------------------

TEST(ConfigDefaults, DeepSpeedDefaultsAreFilled) {
  auto c = zt::Config::from_json(json::parse(R"({"train_micro_batch_size_per_gpu": 4})"), 2);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.dp_world_size, 2);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_TRUE(c.zero_force_ds_cpu_optimizer);
  EXPECT_TRUE(c.optimizer.type.empty());
  EXPECT_TRUE(c.scheduler.type.empty());
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_EQ(z.allgather_bucket_size, 500000000);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(z.offload_optimizer.device, zt::OffloadDevice::none);
  EXPECT_FALSE(z.offload_optimizer.pin_memory);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_DOUBLE_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
  EXPECT_EQ(c.compute_dtype(), at::kFloat);
  EXPECT_FALSE(c.mixed_precision());
  json j = c.to_json();
  EXPECT_EQ(j.at("zero_optimization").at("offload_optimizer").at("device"), "none");
  EXPECT_TRUE(j.at("zero_optimization").at("offload_optimizer").at("nvme_path").is_null());
  EXPECT_EQ(j.at("train_batch_size"), 8);
  EXPECT_FALSE(j.contains("dp_world_size"));  // to_json holds DeepSpeed keys only
}

TEST(ConfigDefaults, BatchRule) {
  auto only_train = zt::Config::from_json(json::parse(R"({"train_batch_size": 32})"), 4);
  EXPECT_EQ(only_train.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(only_train.gradient_accumulation_steps, 1);
  auto train_micro = zt::Config::from_json(json::parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2})"), 4);
  EXPECT_EQ(train_micro.gradient_accumulation_steps, 4);
  auto train_gas = zt::Config::from_json(json::parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})"), 4);
  EXPECT_EQ(train_gas.train_micro_batch_size_per_gpu, 4);
  auto micro_gas = zt::Config::from_json(json::parse(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})"), 2);
  EXPECT_EQ(micro_gas.train_batch_size, 30);
}

TEST(ConfigDefaults, IntegersWrittenAsFloats) {
  auto c = zt::Config::from_json(json::parse(R"({"train_batch_size": 8.0, "zero_optimization": {"stage": 2,
      "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8, "stage3_prefetch_bucket_size": 15099494.4,
      "sub_group_size": 1e14}})"), 1);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200000000);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 15099494);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 100000000000000);
  // Only the stage-3 prefetch bucket rounds; other integers must be whole.
  EXPECT_NE(error_of(json::parse(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 12.5}})"))
                .find("zero_optimization.reduce_bucket_size: expected an integer, found 12.5"),
            std::string::npos);
}

TEST(ConfigDefaults, AutoInSectionsMeansDefault) {
  json j = json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "overlap_comm": "auto"}})");
  auto c = zt::Config::from_json(j, 1);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_DOUBLE_EQ(c.optimizer.params.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.params.betas[1], 0.999);
  EXPECT_EQ(c.scheduler.params.at("warmup_num_steps"), 1000);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  std::set<std::string> defaulted(c.auto_defaulted.begin(), c.auto_defaulted.end());
  for (const char* k : {"bf16.enabled", "optimizer.params.lr", "optimizer.params.betas",
                        "scheduler.params.warmup_num_steps", "zero_optimization.reduce_bucket_size",
                        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.overlap_comm"})
    EXPECT_TRUE(defaulted.count(k)) << k;

  // auto_keys tells which ones the launcher must fill.
  json hf = json::parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_clipping": "auto", "zero_optimization": {"reduce_bucket_size": "auto"},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_max_lr": "auto"}}})");
  std::map<std::string, bool> autos;
  for (const auto& a : zt::Config::auto_keys(hf)) autos[a.path] = a.needs_value;
  EXPECT_EQ(autos, (std::map<std::string, bool>{{"gradient_clipping", true},
                                                {"scheduler.params.total_num_steps", true},
                                                {"scheduler.params.warmup_max_lr", false},
                                                {"train_batch_size", true},
                                                {"train_micro_batch_size_per_gpu", true},
                                                {"zero_optimization.reduce_bucket_size", false}}));
  std::string what = error_of(hf);
  EXPECT_NE(what.find("scheduler.params.total_num_steps: \"auto\" has no default here"), std::string::npos) << what;
}

TEST(ConfigDefaults, Aliases) {
  auto c = zt::Config::parse(json::parse(R"({"train_batch_size": 8, "bfloat16": {"enabled": true},
      "zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000, "max_live_parameters": 7,
        "max_reuse_distance": 9, "param_persistence_threshold": 11, "stage3_gather_fp16_weights_on_model_save": true},
      "aio": {"intra_op_parallelism": 4}})"), 1);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.compute_dtype(), at::kBFloat16);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 1000);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 7);
  EXPECT_EQ(c.zero_optimization.stage3_max_reuse_distance, 9);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 11);
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.aio.thread_count, 4);

  auto old = zt::Config::parse(json::parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "cpu_offload": true, "cpu_offload_param": true, "cpu_offload_use_pin_memory": true}})"), 1);
  EXPECT_EQ(old.zero_optimization.offload_optimizer.device, zt::OffloadDevice::cpu);
  EXPECT_TRUE(old.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_EQ(old.zero_optimization.offload_param.device, zt::OffloadDevice::cpu);

  auto fp16 = zt::Config::from_json(json::parse(R"({"train_batch_size": 8, "zero_optimization": true,
      "fp16": {"enabled": true, "loss_scale": 128}})"), 1);
  EXPECT_EQ(fp16.zero_optimization.stage, 1);  // DeepSpeed's old boolean format
  EXPECT_EQ(fp16.compute_dtype(), at::kHalf);
  EXPECT_DOUBLE_EQ(fp16.fp16.loss_scale, 128.0);
}

TEST(ConfigDefaults, OptimizerAndSchedulerTypes) {
  auto adam = zt::Config::from_json(json::parse(R"({"train_batch_size": 8,
      "optimizer": {"type": "adam", "params": {"lr": 3e-3, "adam_w_mode": false}},
      "scheduler": {"type": "warmuplr"}})"), 1);
  EXPECT_EQ(adam.optimizer.type, "Adam");
  EXPECT_FALSE(adam.optimizer.params.adam_w_mode);
  EXPECT_EQ(adam.scheduler.type, "WarmupLR");
  EXPECT_EQ(adam.scheduler.params, json::parse(R"({"warmup_min_lr": 0.0, "warmup_max_lr": 0.003,
      "warmup_num_steps": 1000, "warmup_type": "log", "last_batch_iteration": -1})"));

  auto sgd = zt::Config::from_json(json::parse(R"({"train_batch_size": 8,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1,
                    "cycle_first_step_size": 500, "cycle_second_step_size": null}}})"), 1);
  EXPECT_EQ(sgd.optimizer.type, "SGD");
  EXPECT_TRUE(sgd.optimizer.params.nesterov);
  EXPECT_EQ(sgd.scheduler.params.at("cycle_second_step_size"), 500);
  EXPECT_EQ(sgd.scheduler.params.at("cycle_second_stair_count"), 0);
  EXPECT_EQ(sgd.scheduler.params.at("cycle_max_mom"), 0.9);
  EXPECT_EQ(zt::Config::parse(sgd.to_json(), 1).to_json(), sgd.to_json());

  auto range = zt::Config::from_json(json::parse(R"({"train_batch_size": 8, "scheduler": {"type": "LRRangeTest"}})"), 1);
  EXPECT_EQ(range.scheduler.params, json::parse(R"({"lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 2000,
      "lr_range_test_step_rate": 1.0, "lr_range_test_staircase": false, "last_batch_iteration": -1})"));

  auto cosine = zt::Config::from_json(json::parse(R"({"train_batch_size": 8,
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1e4}}})"), 1);
  EXPECT_EQ(cosine.scheduler.params.at("total_num_steps"), 10000);
  EXPECT_EQ(cosine.scheduler.params.at("cos_min_ratio"), 0.0001);
}

}  // namespace

// ---- strict inputs (issue 23): checked sizes, JSON limits, wrapped library errors -----

namespace {

std::string file_error_of(const std::string& path) {
  try {
    zt::Config::read_json_file(path);
  } catch (const zt::ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a ConfigError: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError reading " << path;
  return "";
}

}  // namespace

TEST(ConfigStrict, BatchProductsThatOverflowAreErrorsNamingTheKeys) {
  // micro 2^62 x world 4 wrapped to 0 (check-config then died of SIGFPE).
  std::string what = error_of(json{{"train_micro_batch_size_per_gpu", int64_t{1} << 62}}, 4);
  EXPECT_NE(what.find("train_micro_batch_size_per_gpu (4611686018427387904) * world size (4)"), std::string::npos)
      << what;
  EXPECT_NE(what.find("does not fit a 64-bit integer"), std::string::npos) << what;
  // 2^32 x 2^32 was reported valid with train_batch_size 0.
  what = error_of(json{{"train_micro_batch_size_per_gpu", int64_t{1} << 32}, {"gradient_accumulation_steps", int64_t{1} << 32}});
  EXPECT_NE(what.find("gradient_accumulation_steps (4294967296)"), std::string::npos) << what;
  EXPECT_NE(what.find("does not fit a 64-bit integer"), std::string::npos) << what;
  // All three given, their product overflowing: not "!= <wrapped number>".
  what = error_of(json{{"train_batch_size", 8},
                       {"train_micro_batch_size_per_gpu", int64_t{1} << 40},
                       {"gradient_accumulation_steps", int64_t{1} << 40}});
  EXPECT_NE(what.find("does not fit a 64-bit integer"), std::string::npos) << what;
  // train + micro with micro * world overflowing: no division by a wrapped 0.
  what = error_of(json{{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", int64_t{1} << 62}}, 4);
  EXPECT_NE(what.find("train_batch_size (8) is not a multiple of train_micro_batch_size_per_gpu"), std::string::npos)
      << what;
  what = error_of(json{{"train_batch_size", 8}, {"gradient_accumulation_steps", int64_t{1} << 62}}, 4);
  EXPECT_NE(what.find("is not a multiple of gradient_accumulation_steps"), std::string::npos) << what;
  // The largest product that fits still resolves exactly.
  auto c = zt::Config::parse(json{{"train_micro_batch_size_per_gpu", int64_t{1} << 60}}, 4);
  EXPECT_EQ(c.train_batch_size, int64_t{1} << 62);
}

TEST(ConfigStrict, DeepNestingIsAnErrorNotAStackOverflow) {
  // ~60 000 levels overflowed the stack inside the JSON parser (SIGSEGV).
  fs::path deep = write_temp("deep.json", "{\"train_batch_size\": 8, \"x\": " + std::string(60000, '[') +
                                              std::string(60000, ']') + "}");
  std::string what = file_error_of(deep.string());
  EXPECT_NE(what.find(deep.string() + ": JSON nested deeper than 64 levels (line 1)"), std::string::npos) << what;
  // Brackets inside strings and comments do not count.
  fs::path quoted = write_temp("quoted.json", "// [[[[ {{{{\n{\"train_batch_size\": 8, /* [[[ */ \"x\": \"" +
                                                  std::string(100, '[') + "\\\"" + std::string(100, '{') + "\"}");
  EXPECT_EQ(zt::Config::read_json_file(quoted.string())["train_batch_size"], 8);
  // In memory too (Config::parse's input), naming the key path.
  json v = 1;
  for (int i = 0; i < 100; ++i) v = json{{"k", v}};
  what = error_of(json{{"train_batch_size", 8}, {"fp16", v}});
  EXPECT_NE(what.find("fp16.k.k."), std::string::npos) << what;
  EXPECT_NE(what.find("nested deeper than 64 levels"), std::string::npos) << what;
  for (const auto& p : {deep, quoted}) fs::remove(p);
}

TEST(ConfigStrict, OversizedFileIsAnError) {
  fs::path big = write_temp("big.json", "{\"train_batch_size\": 8, \"x\": \"" +
                                            std::string(zt::Config::kMaxJsonBytes, 'a') + "\"}");
  std::string what = file_error_of(big.string());
  EXPECT_NE(what.find(big.string() + ": the config is larger than 16 MiB"), std::string::npos) << what;
  fs::remove(big);
}

TEST(ConfigStrict, LibraryErrorsAreRewrittenWithTheFileAndTheKey) {
  // A directory read as "unexpected end of input".
  fs::path dir = fs::temp_directory_path() / ("zt_test_config_dir_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string what = file_error_of(dir.string());
  EXPECT_NE(what.find("config file '" + dir.string() + "' is a directory: give the DeepSpeed JSON file inside it"),
            std::string::npos)
      << what;
  fs::remove(dir);
  // 1e400 surfaced as out_of_range.406 "number overflow parsing" (not even a parse_error).
  fs::path huge = write_temp("huge.json", R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 1e400}})");
  what = file_error_of(huge.string());
  EXPECT_NE(what.find(huge.string() + ": "), std::string::npos) << what;
  EXPECT_NE(what.find("zero_optimization.reduce_bucket_size"), std::string::npos) << what;
  EXPECT_NE(what.find("beyond the range of a double"), std::string::npos) << what;
  EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;
  // A syntax error names the key being read and the fix.
  fs::path syntax = write_temp("syntax2.json", R"({"train_batch_size": 8, "fp16": {"enabled": tru}})");
  what = file_error_of(syntax.string());
  EXPECT_NE(what.find("(in the value of fp16.enabled)"), std::string::npos) << what;
  EXPECT_NE(what.find(": fix the JSON there"), std::string::npos) << what;
  // An empty file.
  fs::path empty = write_temp("empty.json", "  \n");
  what = file_error_of(empty.string());
  EXPECT_NE(what.find(empty.string() + ": the file is empty"), std::string::npos) << what;
  for (const auto& p : {huge, syntax, empty}) fs::remove(p);
}

TEST(ConfigStrict, TypeErrorsNameTheKey) {
  // Wrong types anywhere are messages naming the key, never type_error.302.
  const std::vector<std::pair<json, std::string>> cases = {
      {json{{"train_batch_size", "eight"}}, "train_batch_size: expected an integer, found string \"eight\""},
      {json{{"train_batch_size", 8}, {"optimizer", {{"type", "Adam"}, {"params", {{"lr", "fast"}}}}}},
       "optimizer.params.lr: expected a number, found string"},
      {json{{"train_batch_size", 8}, {"optimizer", {{"type", 7}}}}, "optimizer.type: expected a string"},
      {json{{"train_batch_size", 8}, {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", json::array()}}}}}},
       "scheduler.params.warmup_num_steps: expected an integer, found array"},
      {json{{"train_batch_size", 8}, {"zero_optimization", {{"stage", 2}, {"offload_optimizer", "cpu"}}}},
       "zero_optimization.offload_optimizer: expected an object"},
      {json{{"train_batch_size", 8}, {"fp16", {{"enabled", std::string("\xff")}}}}, "fp16.enabled: expected a boolean"},
      {json{{"train_batch_size", 8}, {"gradient_clipping", std::numeric_limits<double>::quiet_NaN()}},
       "gradient_clipping: must be a finite number"},
  };
  for (const auto& [j, expect] : cases) {
    std::string what = error_of(j);
    EXPECT_NE(what.find(expect), std::string::npos) << what;
    EXPECT_EQ(what.find("type_error"), std::string::npos) << what;
  }
}

}  // namespace zt_test_config
