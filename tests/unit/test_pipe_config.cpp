// The pipeline section's keys (src/config/pipeline_options.h): DeepSpeed's keys and
// zerotrain's schedule keys take effect or are named errors, never silently ignored.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "config/pipeline_options.h"
#include "pipe/pipe_engine.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt {
namespace test_pipe_config {
namespace {

using nlohmann::json;

std::string all_problems(const json& j, int world) {
  try {
    auto c = Config::parse(j, world);
    std::string s;
    for (const auto& m : c.not_supported_yet) s += m + "\n";
    return s;
  } catch (const ConfigError& e) {
    return e.what();
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(PipeConfig, KeysAreRead) {
  auto o = config::pipeline_options(json::parse(R"({"pipeline": {"stages": 4, "partition": "type:block",
      "activation_checkpoint_interval": 2, "schedule": "interleaved", "virtual_stages": 2,
      "seed_layers": false, "pipe_partitioned": true, "grad_partitioned": true}})"));
  EXPECT_EQ(o.stages, 4);
  EXPECT_EQ(o.partition, "type:block");
  EXPECT_EQ(o.activation_checkpoint_interval, 2);
  EXPECT_EQ(o.schedule, "interleaved");
  EXPECT_EQ(o.virtual_stages, 2);
  // Defaults: DeepSpeed's config default partition "best" is PipelineModule's "parameters".
  auto d = config::pipeline_options(json::parse(R"({"pipeline": {"stages": 2, "partition": "best"}})"));
  EXPECT_EQ(d.partition, "parameters");
  EXPECT_EQ(d.schedule, "1f1b");
  EXPECT_EQ(d.virtual_stages, 1);
  EXPECT_EQ(d.zb_max_pending_w, -1);  // not set: the paper's ZB-H1
  EXPECT_EQ(config::pipeline_options(json::object()).stages, 1);
  // [ZB-H1 Pending Cap]
  auto z = config::pipeline_options(
      json::parse(R"({"pipeline": {"stages": 4, "schedule": "zb-h1", "zb_max_pending_w": 0}})"));
  EXPECT_EQ(z.zb_max_pending_w, 0);
  EXPECT_EQ(config::pipeline_options(
                json::parse(R"({"pipeline": {"stages": 4, "schedule": "zb-h1", "zb_max_pending_w": 2}})"))
                .zb_max_pending_w,
            2);
}

TEST(PipeConfig, BadValuesAreNamedErrors) {
  auto err = [](const char* text) {
    try {
      config::pipeline_options(json::parse(text));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "partition": "profile"}})"),
                       "pipeline.partition = \"profile\" is not a partition method"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "schedule": "zb-v"}})"), "pipeline.schedule"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "virtual_stages": 2}})"),
                       "needs pipeline.schedule = \"interleaved\""));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "seed_layers": true}})"), "pipeline.seed_layers = true"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "pipe_partitioned": false}})"),
                       "pipeline.pipe_partitioned = false"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "grad_partitioned": false}})"),
                       "pipeline.grad_partitioned = false"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "schedule": "zb-h1", "activation_checkpoint_interval": 1}})"),
                       "cannot run with the zb-h1 schedule"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "activation_checkpoint_interval": -1}})"),
                       "pipeline.activation_checkpoint_interval"));
  // Without a pipeline (stages 1) a pipeline key has nothing to act on.
  EXPECT_TRUE(contains(err(R"({"pipeline": {"schedule": "gpipe"}})"), "takes effect only with pipeline.stages > 1"));
  // zb_max_pending_w: zb-h1 only (1f1b is the default schedule), not negative, needs stages > 1.
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "zb_max_pending_w": 0}})"),
                       "pipeline.zb_max_pending_w = 0 caps the pending weight passes of the zb-h1 schedule only, "
                       "but pipeline.schedule = \"1f1b\""));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "schedule": "interleaved", "virtual_stages": 2,
      "zb_max_pending_w": 1}})"),
                       "set the schedule to \"zb-h1\" or remove zb_max_pending_w"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "schedule": "zb-h1", "zb_max_pending_w": -1}})"),
                       "pipeline.zb_max_pending_w"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"stages": 2, "schedule": "zb-h1", "zb_max_pending_w": "all"}})"),
                       "pipeline.zb_max_pending_w"));
  EXPECT_TRUE(contains(err(R"({"pipeline": {"schedule": "zb-h1", "zb_max_pending_w": 0}})"),
                       "pipeline.zb_max_pending_w is set but takes effect only with pipeline.stages > 1"));
}

// Config::parse validates the same keys (check-config shows them), and the data-parallel
// engine refuses a pipeline; pipe::pipeline_config accepts it.
TEST(PipeConfig, ConfigParseAndPipelineConfig) {
  const json j = json::parse(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "pipeline": {"stages": 2, "schedule": "zb-h1", "partition": "uniform"}})");
  const std::string plain = all_problems(j, 4);
  EXPECT_TRUE(contains(plain, "pipeline.stages = 2 is not supported yet by zerotrain: pipeline parallelism (pp 2) "
                              "runs through zt::pipe::PipeEngine and zerotrain train"))
      << plain;
  EXPECT_FALSE(contains(plain, "partition")) << plain;
  EXPECT_THROW(Config::from_json(j, 4), ConfigError);
  auto pc = pipe::pipeline_config(j, 4);
  EXPECT_EQ(pc.config.dp_world_size, 2);
  EXPECT_EQ(pc.config.train_batch_size, 16);
  EXPECT_EQ(pc.pipeline.schedule, "zb-h1");
  EXPECT_EQ(pc.pipeline.partition, "uniform");
  EXPECT_EQ(pc.pipeline.zb_max_pending_w, -1);
  json capped = j;
  capped["pipeline"]["zb_max_pending_w"] = 0;
  EXPECT_EQ(pipe::pipeline_config(capped, 4).pipeline.zb_max_pending_w, 0);
  capped["pipeline"]["schedule"] = "1f1b";  // check-config (Config::parse) names it too
  EXPECT_TRUE(contains(all_problems(capped, 4), "caps the pending weight passes of the zb-h1 schedule only"));
  // Other unsupported settings still throw through pipeline_config.
  json bad = j;
  bad["pipeline"]["seed_layers"] = true;
  EXPECT_THROW(pipe::pipeline_config(bad, 4), ConfigError);
  // A typo in the section is an unknown key, as before.
  json typo = j;
  typo["pipeline"]["schedul"] = "gpipe";
  EXPECT_TRUE(contains(all_problems(typo, 4), "unknown key pipeline.schedul"));
}

}  // namespace
}  // namespace test_pipe_config
}  // namespace zt
