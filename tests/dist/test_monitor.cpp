// The monitors through the engine (a Config with tensorboard and csv_monitor enabled
// given to zt::initialize), at world 1, 2 and 4: rank 0 alone writes, one event file,
// one CSV row per step per event with DeepSpeed's sample counts and rank 0's reports.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt_test_monitor {

namespace {

namespace fs = std::filesystem;
using zt::test_support::global_batch;
using zt::test_support::Mlp;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(EngineMonitor, RankZeroWritesTensorBoardAndCsvPerStep) {
  auto group = zt::comm::world_group();
  const int world = group->size(), rank = group->rank();
  zt::test_support::SharedTempDir dir(group, "monitor_dist");
  constexpr int64_t kMicro = 2;
  constexpr int kSteps = 4;
  const nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", 2},
      {"steps_per_print", 1000},
      {"fp16", {{"enabled", true}, {"initial_scale_power", 8}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
      {"zero_optimization", {{"stage", 2}}},
      {"tensorboard", {{"enabled", true}, {"output_path", dir.path}, {"job_name", "tb_job"}}},
      {"csv_monitor", {{"enabled", true}, {"output_path", dir.path + "/"}, {"job_name", "csv_job"}}},
  };
  const zt::Config cfg = zt::Config::from_json(j, world);
  torch::manual_seed(7);
  Mlp m;
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  std::vector<zt::StepReport> reports;
  {
    auto engine = zt::initialize(m.ptr(), cfg, o);
    const int64_t global = kMicro * 2 * world;
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = global_batch(s, global);
      for (int k = 0; k < 2; ++k) {
        const int64_t start = (static_cast<int64_t>(rank) * 2 + k) * kMicro;
        auto xb = x.narrow(0, start, kMicro).to(engine->compute_dtype());
        auto yb = y.narrow(0, start, kMicro);
        auto loss = engine->forward([&] { return torch::mse_loss(m->forward(xb).to(torch::kFloat), yb); });
        engine->backward(loss);
        engine->step();
      }
    }
    for (const auto& r : engine->take_reports(true)) reports.push_back(r);
  }
  ASSERT_EQ(reports.size(), static_cast<size_t>(kSteps));
  group->barrier();  // every rank's engine is gone: all files are written
  // One event file in DIR/tb_job, from rank 0 only.
  int event_files = 0;
  for (const auto& e : fs::directory_iterator(dir.path + "/tb_job"))
    event_files += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(event_files, 1);
  if (rank == 0) {
    // Rows: step = samples (steps x train_batch_size); values as rank 0's reports.
    const int64_t batch = cfg.train_batch_size;
    EXPECT_EQ(batch, kMicro * 2 * world);
    std::istringstream loss(read_file(dir.path + "/csv_job/Train_Samples_train_loss.csv"));
    std::istringstream scale(read_file(dir.path + "/csv_job/Train_Samples_loss_scale.csv"));
    std::string line;
    std::getline(loss, line);
    EXPECT_EQ(line, "step,train_loss\r");
    std::getline(scale, line);
    EXPECT_EQ(line, "step,loss_scale\r");
    for (int s = 0; s < kSteps; ++s) {
      std::getline(loss, line);
      const size_t comma = line.find(',');
      ASSERT_NE(comma, std::string::npos) << line;
      EXPECT_EQ(std::stoll(line.substr(0, comma)), s * batch) << line;
      EXPECT_EQ(std::stod(line.substr(comma + 1)), reports[s].loss) << line;  // shortest repr reads back exactly
      std::getline(scale, line);
      EXPECT_EQ(line, std::to_string((s + 1) * batch) + "," +
                          std::to_string(static_cast<int64_t>(reports[s].loss_scale)) + ".0\r");
    }
    EXPECT_FALSE(std::getline(loss, line)) << "one row per step: " << line;
  }
}

}  // namespace

}  // namespace zt_test_monitor
