// [MoE Metrics] in src/cli/train.cpp: `zerotrain train` on an MoE GPT-2 writes the routing
// (aux loss, dropped fraction, tokens per expert) into every --metrics line, the --summary
// and the monitor, and with --moe-timing the all-to-all time (docs/moe.md, "What a run
// reports"). The values are checked against what the model computes, not only for presence.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/fs.h"
#include "support/run_shell.h"

namespace zt_test_moe_metrics {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Cmd {
  int rc = -1;
  std::string out;
};

Cmd run_cmd(const std::string& cmd) {
  const auto r = zt::test_support::run_shell("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 " + cmd);
  return {r.code, r.output};
}

std::vector<json> json_lines(const fs::path& p) {
  std::vector<json> v;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) v.push_back(json::parse(line));
  return v;
}

int64_t sum(const json& a) {
  int64_t s = 0;
  for (const auto& x : a) s += x.is_array() ? sum(x) : x.get<int64_t>();
  return s;
}

const std::string kZt = ZT_BINARY_DIR "/zerotrain";

// A scratch directory. Not std::filesystem::remove_all: it crashes in binaries linked to
// libtorch (see ckpt/fs.h).
struct Dir {
  fs::path path = fs::temp_directory_path() / ("zt_moe_metrics_" + std::to_string(::getpid()));
  Dir() {
    clear();
    fs::create_directories(path);
  }
  ~Dir() { clear(); }
  void clear() const { zt::ckpt::remove_tree(path.string()); }
};

// One rank, 2 MoE blocks (--moe-every 1) of 2 experts, top-1, capacity factor 0.5, micro-batch
// 2 x seq 32 = 64 tokens: C = ceil(64 / 2 x 0.5) = 16 per expert, so at step 1 (where every
// expert gets more than 16: the run prints "dropped 0.500") each block keeps exactly 16 per
// expert. The aux loss is the model's: the step-1 loss with --moe-aux-coef 0.1 minus the
// same run's with coefficient 0 is 0.1 x moe_aux_loss (the first forward sees the same
// weights and data). Every step: the kept assignments sum to blocks x tokens x k x (1 -
// dropped). The CSV monitor gets the same values; --summary the last step's.
TEST(MoeMetricsCli, MetricsAreTheModelsRouting) {
  Dir d;
  const fs::path cfg = d.path / "cfg.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1},
      "csv_monitor": {"enabled": true, "output_path": ")" + (d.path / "csv").string() + R"(", "job_name": "j"}})";
  const std::string flags = " train --config " + cfg.string() +
                            " --model gpt2-tiny --moe-experts 2 --moe-k 1 --moe-every 1 --moe-capacity-factor 0.5"
                            " --device cpu --steps 4 --warmup 1 --seq 32 --print-every 1 --data " +
                            std::string(ZT_SOURCE_DIR) + "/README.md";
  const Cmd a = run_cmd(kZt + flags + " --moe-aux-coef 0.1 --metrics " + (d.path / "a.jsonl").string() + " --summary " +
                        (d.path / "a.json").string());
  ASSERT_EQ(a.rc, 0) << a.out;
  const Cmd b = run_cmd(kZt + flags + " --moe-aux-coef 0 --metrics " + (d.path / "b.jsonl").string());
  ASSERT_EQ(b.rc, 0) << b.out;
  const auto ma = json_lines(d.path / "a.jsonl"), mb = json_lines(d.path / "b.jsonl");
  ASSERT_EQ(ma.size(), 4u);
  ASSERT_EQ(mb.size(), 4u);
  const json& s1 = ma[0];
  for (const char* k : {"moe_aux_loss", "moe_dropped_fraction", "moe_tokens_per_expert", "moe_tokens_per_expert_by_layer"})
    ASSERT_TRUE(s1.contains(k)) << k << " missing in " << s1.dump();
  EXPECT_FALSE(s1.contains("moe_all_to_all_ms")) << "only with --moe-timing";
  EXPECT_EQ(s1["moe_tokens_per_expert_by_layer"], json::parse("[[16, 16], [16, 16]]")) << s1.dump();
  EXPECT_EQ(s1["moe_tokens_per_expert"], json::parse("[32, 32]"));
  EXPECT_DOUBLE_EQ(s1["moe_dropped_fraction"].get<double>(), 0.5);
  EXPECT_TRUE(a.out.find("Step 1/4, Loss: ") != std::string::npos && a.out.find("dropped 0.500") != std::string::npos)
      << a.out;
  // The aux loss: 1e-6 (fp32 losses of about 5.5; both runs identical up to the aux term).
  const double aux = s1["moe_aux_loss"].get<double>();
  EXPECT_GT(aux, 0.5);
  EXPECT_NEAR(ma[0]["loss"].get<double>() - mb[0]["loss"].get<double>(), 0.1 * aux, 1e-6);
  EXPECT_NEAR(mb[0]["moe_aux_loss"].get<double>(), aux, 1e-6) << "the coefficient does not change the first routing";
  for (const auto& m : ma) {
    SCOPED_TRACE(m.dump());
    const double dropped = m["moe_dropped_fraction"].get<double>();
    EXPECT_NEAR(static_cast<double>(sum(m["moe_tokens_per_expert"])), 2 * 64 * 1 * (1 - dropped), 1e-9);
    EXPECT_EQ(sum(m["moe_tokens_per_expert_by_layer"]), sum(m["moe_tokens_per_expert"]));
    for (const auto& row : m["moe_tokens_per_expert_by_layer"])
      for (const auto& kept : row) EXPECT_LE(kept.get<int64_t>(), 16) << "the capacity";
  }
  // --summary: the last step's aux loss and tokens per expert; dropped = mean of the 3 timed steps.
  std::ifstream sf(d.path / "a.json");
  const json sj = json::parse(sf);
  EXPECT_EQ(sj["moe_aux_loss"], ma[3]["moe_aux_loss"]);
  EXPECT_EQ(sj["moe_tokens_per_expert"], ma[3]["moe_tokens_per_expert"]);
  const double mean = (ma[1]["moe_dropped_fraction"].get<double>() + ma[2]["moe_dropped_fraction"].get<double>() +
                       ma[3]["moe_dropped_fraction"].get<double>()) / 3;
  EXPECT_NEAR(sj["moe_dropped_fraction"].get<double>(), mean, 1e-12);
  // The CSV monitor: DeepSpeed's file per event, rows "samples,value"; step 1 at 2 samples.
  auto first_row = [&](const std::string& event) {
    std::ifstream f(d.path / "csv" / "j" / ("Train_Samples_" + event + ".csv"));
    std::string header, row;
    std::getline(f, header);
    std::getline(f, row);
    return row;
  };
  const std::string row = first_row("moe_aux_loss");
  ASSERT_FALSE(row.empty()) << "no Train_Samples_moe_aux_loss.csv";
  EXPECT_NEAR(std::stod(row.substr(row.find(',') + 1)), aux, 1e-12) << row;
  EXPECT_EQ(first_row("moe_tokens_per_expert_1").rfind("2,32.0", 0), 0u) << first_row("moe_tokens_per_expert_1");
}

// --ep 2 on 2 ranks with --moe-timing: rank 0's routing equals the same 2 ranks' without --ep
// (the gate counts every expert by global index), and each step has 4 all-to-alls per MoE
// block (dispatch and combine, forward and backward) with a time > 0, in the metrics and the
// summary.
TEST(MoeMetricsCli, ExpertParallelRoutingAndAllToAllTime) {
  Dir d;
  const fs::path cfg = d.path / "cfg.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}})";
  const std::string flags = " train --config " + cfg.string() +
                            " --model gpt2-tiny --moe-experts 4 --moe-every 1 --moe-capacity-factor 1.0"
                            " --device cpu --steps 3 --warmup 1 --seq 32 --print-every 1 --data " +
                            std::string(ZT_SOURCE_DIR) + "/README.md";
  const std::string launch = kZt + " launch -n 2 -- " + kZt + flags;
  const Cmd one = run_cmd(launch + " --metrics " + (d.path / "one.jsonl").string());
  ASSERT_EQ(one.rc, 0) << one.out;
  const Cmd ep = run_cmd(launch + " --ep 2 --moe-timing --metrics " + (d.path / "ep.jsonl").string() + " --summary " +
                         (d.path / "ep.json").string());
  ASSERT_EQ(ep.rc, 0) << ep.out;
  const auto m1 = json_lines(d.path / "one.jsonl"), m2 = json_lines(d.path / "ep.jsonl");
  ASSERT_EQ(m1.size(), 3u);
  ASSERT_EQ(m2.size(), 3u);
  // Step 1: the same weights and tokens on rank 0, so the same routing.
  EXPECT_EQ(m2[0]["moe_tokens_per_expert_by_layer"], m1[0]["moe_tokens_per_expert_by_layer"]);
  EXPECT_NEAR(m2[0]["moe_aux_loss"].get<double>(), m1[0]["moe_aux_loss"].get<double>(), 1e-6);
  EXPECT_EQ(m2[0]["moe_tokens_per_expert"].size(), 4u);
  EXPECT_FALSE(m1[0].contains("moe_all_to_all_ms"));
  for (const auto& m : m2) {
    SCOPED_TRACE(m.dump());
    EXPECT_EQ(m["moe_all_to_all_calls"].get<int64_t>(), 4 * 2) << "4 per MoE block (2 blocks), one micro-batch";
    EXPECT_GT(m["moe_all_to_all_ms"].get<double>(), 0.0);
    EXPECT_NEAR(static_cast<double>(sum(m["moe_tokens_per_expert"])),
                2 * 64 * 2 * (1 - m["moe_dropped_fraction"].get<double>()), 1e-9);
  }
  std::ifstream sf(d.path / "ep.json");
  const json sj = json::parse(sf);
  EXPECT_GT(sj.value("moe_all_to_all_ms", 0.0), 0.0) << sj.dump();
  EXPECT_EQ(sj.value("moe_all_to_all_calls", 0), 8);
  EXPECT_TRUE(sj.contains("moe_dropped_fraction"));
}

}  // namespace
}  // namespace zt_test_moe_metrics
