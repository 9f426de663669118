// zerotrain estimate against what was measured on the GPU machine. The reference peaks are
// copied from the committed results (each row names its file); the estimate must be within
// 5% of every one of them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "estimate/memory.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt_test_estimate {

namespace {

struct Measured {
  const char* config;       // bench/configs/NAME.json
  const char* model;
  int64_t layers, embd, heads;  // 0 = the named size
  int gpus;
  int64_t micro;
  bool checkpointing;
  double forward_peak_gib, backward_peak_gib;
  const char* source;
};

const Measured kMeasured[] = {
    {"gpt2_bf16_z0", "gpt2-large", 0, 0, 0, 2, 8, false, 0, 27.51, "2026-11-22_h200x2 (zerotrain ZeRO-0)"},
    {"gpt2_bf16_z1", "gpt2-large", 0, 0, 0, 2, 8, false, 0, 23.19, "2026-11-22_h200x2 (zerotrain ZeRO-1)"},
    {"gpt2_bf16_z2", "gpt2-large", 0, 0, 0, 2, 8, false, 21.70, 22.47, "2026-11-22_z3_h200x2 first call, zt_z2"},
    {"gpt2_bf16_z3_reshard", "gpt2-large", 0, 0, 0, 2, 8, false, 19.70, 20.47, "2026-11-22_z3_h200x2/zt_z3_reshard"},
    {"gpt2_bf16_z3", "gpt2-large", 0, 0, 0, 2, 8, false, 20.63, 21.39, "2026-11-22_z3_h200x2/zt_z3"},
    {"gpt2_bf16_z2_offload", "gpt2-large", 0, 0, 0, 2, 8, false, 16.66, 17.42, "2026-11-22_offload_h200x2/run5"},
    {"gpt2_bf16_z3_offload", "gpt2-large", 0, 0, 0, 2, 8, false, 16.10, 16.86, "2026-11-22_offload_h200x2/run5"},
    {"gpt2_10b_bf16_z3", "gpt2", 50, 4096, 32, 2, 1, true, 59.22, 69.63, "2026-11-22_z3_h200x2/zt_10b"},
    {"cap_z3", "gpt2", 44, 4096, 32, 1, 1, true, 103.29, 120.84, "2026-11-22_capacity_h200 (44 layers)"},
};

TEST(Estimate, WithinFivePercentOfEveryMeasuredPeak) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  for (const auto& m : kMeasured) {
    SCOPED_TRACE(std::string(m.config) + " from " + m.source);
    std::string path = ZT_SOURCE_DIR "/bench/configs/";
    path.append(m.config).append(".json");
    auto cfg = zt::Config::from_file(path, m.gpus);
    zt::estimate::Job job;
    job.model = zt::models::named_gpt2(m.model);
    if (m.layers) job.model.n_layer = m.layers;
    if (m.embd) job.model.n_embd = m.embd;
    if (m.heads) job.model.n_head = m.heads;
    job.gpus = m.gpus;
    job.micro_batch = m.micro;
    job.seq = 1024;
    job.checkpointing = m.checkpointing;
    // Measured before the padded, fused LM head and loss (commits up to 1d8f466).
    job.model.lm_head_pad_multiple = 1;
    job.model.fused_lm_head_loss = false;
    const auto r = zt::estimate::estimate_memory(job, cfg);
    if (m.forward_peak_gib > 0) EXPECT_NEAR(r.forward_peak / gib / m.forward_peak_gib, 1.0, 0.05);
    EXPECT_NEAR(r.backward_peak / gib / m.backward_peak_gib, 1.0, 0.05);
    EXPECT_NEAR(r.peak / gib / m.backward_peak_gib, 1.0, 0.05);
  }
}

// The committed `zerotrain bench` sweeps on the GPU machine: every configuration that ran,
// re-estimated now from the config it ran with, against the peak it measured (the issue
// asks for 10%; the calibration holds 5%). The first ran on ATen's kernels, the second on
// zerotrain's own (in-place LM-head loss, Adam without an fp32 gradient copy).
void check_sweep(const std::string& name, bool cuda_kernels, int expect_rows) {
  const std::string dir = std::string(ZT_SOURCE_DIR) + "/bench/results/" + name + "/gpt2-large";
  std::ifstream f(dir + "/results.json");
  ASSERT_TRUE(f.good()) << dir;
  std::stringstream ss;
  ss << f.rdbuf();
  const auto results = nlohmann::json::parse(ss.str());
  const auto& meta = results.at("meta");
  const double gib = 1024.0 * 1024.0 * 1024.0;
  int checked = 0;
  for (const auto& row : results.at("rows")) {
    if (row.at("status") != "ok") continue;
    SCOPED_TRACE(name + " " + row.at("name").get<std::string>());
    const int ranks = meta.at("ranks").get<int>();
    auto cfg = zt::Config::from_file(dir + "/" + row.at("config").get<std::string>(), ranks);
    zt::estimate::Job job;
    job.model = zt::models::named_gpt2(meta.at("model").get<std::string>());
    job.gpus = ranks;
    job.micro_batch = meta.at("micro_batch").get<int64_t>();
    job.seq = meta.at("seq").get<int64_t>();
    job.cuda_kernels = cuda_kernels;
    const auto r = zt::estimate::estimate_memory(job, cfg);
    EXPECT_NEAR(r.peak / gib / row.at("peak_gib").get<double>(), 1.0, 0.05);
    ++checked;
  }
  EXPECT_EQ(checked, expect_rows);
}

TEST(Estimate, WithinFivePercentOfEveryPeakOfTheCommittedSweeps) {
  check_sweep("2026-11-22_final_h200x2", /*cuda_kernels=*/false, 10);
  check_sweep("2026-11-22_async_h200x2", /*cuda_kernels=*/true, 9);  // z3-offall failed there
  // The offload rows with the delayed update (its device upload buffer) and the fixed z3-offall.
  check_sweep("2026-11-22_offload_final_h200x2", /*cuda_kernels=*/true, 5);
}

TEST(Estimate, StagesShrinkModelStatesAsZeroSays) {
  auto job = zt::estimate::Job{};
  job.model = zt::models::named_gpt2("gpt2-large");
  job.gpus = 4;
  job.micro_batch = 1;
  double last = 1e300;
  for (int stage = 0; stage <= 3; ++stage) {
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1}, {"bf16", {{"enabled", true}}},
                        {"zero_optimization", {{"stage", stage}}}};
    auto r = zt::estimate::estimate_memory(job, zt::Config::from_json(j, 4));
    const double states = r.params + r.grads + r.master + r.optimizer;
    EXPECT_LT(states, last) << "stage " << stage;
    last = states;
    const double psi = static_cast<double>(r.num_params);
    const double expect[] = {16 * psi, 4 * psi + 12 * psi / 4, 2 * psi + 14 * psi / 4, 14 * psi / 4};
    EXPECT_NEAR(states / expect[stage], 1.0, 1e-9) << "stage " << stage;
  }
  EXPECT_THROW(zt::estimate::estimate_memory(zt::estimate::Job{job.model, 0, 1024, 1, false},
                                             zt::Config::from_json({{"train_batch_size", 1}}, 1)),
               zt::ConfigError);
}

// NVMe offload: the device is as with CPU offload; master + Adam state (12 bytes per owned
// parameter) move from host memory to the swap file, and the host keeps the gradient
// buffer and the staging buffers: min(buffer_count, sub-groups) x sub-group x (12 + 2).
TEST(Estimate, NvmeMovesTheOptimizerStateFromHostToDrive) {
  auto job = zt::estimate::Job{};
  job.model = zt::models::named_gpt2("gpt2-large");
  job.gpus = 2;
  auto config = [](const nlohmann::json& offload, int64_t sub_group) {
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1}, {"bf16", {{"enabled", true}}},
                        {"zero_optimization", {{"stage", 2}, {"sub_group_size", sub_group}, {"offload_optimizer", offload}}}};
    return zt::Config::from_json(j, 2);
  };
  const auto cpu = zt::estimate::estimate_memory(job, config({{"device", "cpu"}}, 100000000));
  const auto nvme = zt::estimate::estimate_memory(
      job, config({{"device", "nvme"}, {"nvme_path", "/local_nvme"}, {"buffer_count", 3}}, 100000000));
  const double owned = static_cast<double>(cpu.num_params) / 2;
  EXPECT_EQ(cpu.nvme, 0.0);
  EXPECT_NEAR(cpu.host, 12 * owned + 2 * 2 * owned, 1.0);
  EXPECT_NEAR(nvme.nvme, 12 * owned, 1.0);
  EXPECT_NEAR(nvme.host, 2 * owned + 3 * 1e8 * 14, 1.0);  // 387M owned: 4 sub-groups, 3 buffers
  EXPECT_EQ(nvme.peak, cpu.peak);                        // nothing changes on the device
  EXPECT_EQ(nvme.master + nvme.optimizer, 0.0);
  // One sub-group (sub_group_size above the shard): one staging buffer of the whole shard.
  const auto one = zt::estimate::estimate_memory(job, config({{"device", "nvme"}, {"nvme_path", "/x"}}, 1000000000));
  EXPECT_NEAR(one.host, 2 * owned + 14 * owned, 1.0);
}

// Host memory with offload against the capacity runs on one H200 (the --summary records of
// bench/results/2026-11-22_capacity_final_h200x2/zerotrain.jsonl, whose model_state_bytes.host
// is what the engine held): CPU offload of optimizer and parameters (16 bytes per parameter),
// and the parameters on NVMe (14 bytes, plus the parameter slots and the step's scratch).
// Within 1% of every record, matched by parameter count.
TEST(Estimate, HostMemoryWithinOnePercentOfTheCapacityRuns) {
  std::ifstream f(std::string(ZT_SOURCE_DIR) + "/bench/results/2026-11-22_capacity_final_h200x2/zerotrain.jsonl");
  ASSERT_TRUE(f.good());
  int checked = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    const auto rec = nlohmann::json::parse(line);
    const int64_t n = rec.at("n_params").get<int64_t>();
    const auto& ms = rec.at("last_step").at("model_state_bytes");
    const double host = ms.at("host").get<double>(), nvme = ms.at("nvme").get<double>();
    const char* config = nvme > 0 ? "cap_z3_offload_paramnvme" : "cap_z3_offload_pinned";
    zt::estimate::Job job;
    job.model = zt::models::named_gpt2("gpt2");
    job.model.n_embd = 4096;
    job.model.n_head = 32;
    for (job.model.n_layer = 1; job.model.n_layer < 200 && zt::models::gpt2_num_params(job.model) < n;) {
      ++job.model.n_layer;
    }
    ASSERT_EQ(zt::models::gpt2_num_params(job.model), n) << "no layer count gives " << n << " parameters";
    SCOPED_TRACE(::testing::Message() << config << " " << job.model.n_layer << " layers");
    job.gpus = 1;
    job.micro_batch = 1;
    job.checkpointing = true;
    job.cuda_kernels = true;
    auto cfg = zt::Config::from_file(std::string(ZT_SOURCE_DIR) + "/bench/configs/" + config + ".json", 1);
    const auto r = zt::estimate::estimate_memory(job, cfg);
    EXPECT_NEAR(r.host / host, 1.0, 0.01) << "estimated " << r.host << " measured " << host;
    if (nvme > 0) EXPECT_NEAR(r.nvme / nvme, 1.0, 0.01) << "estimated " << r.nvme << " measured " << nvme;
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

}  // namespace

}  // namespace zt_test_estimate
