// `zerotrain bench`: the CPU sweep runs every configuration in real CPU ranks and writes
// its three outputs (JSON, Markdown, PNG charts); failure logs are classified.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/sweep.h"
#include "ckpt/fs.h"
#include "support/png_reader.h"

namespace zt_test_bench_sweep {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A PNG decodes with stb_image (tests/support/png_reader.h) as 8-bit RGB, is chart-sized,
// compressed (the charts are mostly flat colour) and not blank.
void expect_png(const std::string& path) {
  const std::string s = read_all(path);
  ASSERT_GT(s.size(), 8u + 25u + 12u) << path;
  zt::test::DecodedPng d;
  try {
    d = zt::test::decode_png(std::vector<uint8_t>(s.begin(), s.end()));
  } catch (const std::exception& e) {
    FAIL() << path << ": " << e.what();
  }
  EXPECT_EQ(d.channels, 3) << path;
  EXPECT_GE(d.img.width, 400) << path;
  EXPECT_GE(d.img.height, 200) << path;
  const size_t pixels = static_cast<size_t>(d.img.width) * static_cast<size_t>(d.img.height);
  EXPECT_LT(s.size(), pixels * 3 / 10) << path << ": not compressed";
  size_t inked = 0;
  for (size_t i = 0; i < pixels; ++i) {
    inked += d.img.rgb[3 * i] != 255 || d.img.rgb[3 * i + 1] != 255 || d.img.rgb[3 * i + 2] != 255 ? 1 : 0;
  }
  EXPECT_GT(inked, pixels / 100) << path << ": (almost) blank";
}

TEST(BenchSweep, CpuSweepWritesJsonMarkdownAndCharts) {
  const std::string out = ZT_BINARY_DIR "/bench_sweep_test";
  zt::ckpt::remove_tree(out);
  const std::string cmd = "timeout -k 5 600 " ZT_BINARY_DIR "/zerotrain bench --model gpt2-tiny --gpus 0 --steps 3 --out " +
                          out + " > " + out + ".log 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << read_all(out + ".log");

  const auto results = nlohmann::json::parse(read_all(out + "/results.json"));
  const auto& rows = results.at("rows");
  ASSERT_EQ(rows.size(), 11u);
  std::set<std::string> names;
  bool offload_opt = false, offload_param = false, delayed = false, fp16 = false;
  for (const auto& r : rows) {
    const std::string name = r.at("name");
    names.insert(name);
    EXPECT_EQ(r.at("status"), "ok") << name << ": " << r.dump();
    if (r.at("status") != "ok") continue;
    EXPECT_GT(r.at("ms_per_iter").get<double>(), 0) << name;
    EXPECT_GT(r.at("tokens_per_s").get<double>(), 0) << name;
    for (const char* p : {"forward", "backward", "step"}) {
      EXPECT_GE(r.at("phase_ms").at(p).get<double>(), 0) << name << " " << p;
      EXPECT_GT(r.at("phase_mem_gib").at(p).at("peak").get<double>(), 0) << name << " " << p;
    }
    EXPECT_GT(r.at("estimate_gib").at("peak").get<double>(), 0) << name;
    // Model states shrink with the stage on 2 ranks (CPU memory is the engine's accounting).
    offload_opt = offload_opt || r.at("offload") == "optimizer";
    offload_param = offload_param || r.at("offload") == "optimizer+params";
    delayed = delayed || r.at("offload") == "optimizer, delayed update";
    fp16 = fp16 || r.at("dtype") == "fp16";
  }
  EXPECT_TRUE(offload_opt && offload_param && delayed && fp16);
  EXPECT_EQ(names.size(), rows.size());
  auto state = [&](const std::string& n) {
    for (const auto& r : rows) {
      if (r.at("name") == n) return r.at("model_state_gib").get<double>();
    }
    return -1.0;
  };
  EXPECT_GT(state("z1-bf16"), state("z2-bf16"));
  EXPECT_GT(state("z2-bf16"), state("z3-bf16"));
  EXPECT_EQ(results.at("meta").at("gpus"), 0);
  EXPECT_EQ(results.at("meta").at("ranks"), 2);

  const std::string md = read_all(out + "/results.md");
  for (const auto& n : names) EXPECT_NE(md.find("| " + n + " |"), std::string::npos) << n << " missing in results.md";
  EXPECT_NE(md.find("|---|"), std::string::npos);
  expect_png(out + "/memory.png");
  expect_png(out + "/time.png");
  // Each run left its config, log and summary.
  for (const auto& n : names) {
    EXPECT_FALSE(read_all(out + "/configs/" + n + ".json").empty()) << n;
    EXPECT_FALSE(read_all(out + "/runs/" + n + ".json").empty()) << n;
  }
}

TEST(BenchSweep, UnknownConfigurationIsAClearError) {
  const std::string cmd = ZT_BINARY_DIR "/zerotrain bench --model gpt2-tiny --gpus 0 --only z9-bf16 --out " ZT_BINARY_DIR
                                        "/bench_sweep_bad 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) text += buf;
  const int rc = pclose(p);
  EXPECT_NE(rc, 0);
  EXPECT_NE(text.find("unknown configuration 'z9-bf16'"), std::string::npos) << text;
  EXPECT_NE(text.find("z3-offall"), std::string::npos) << text;  // lists the known ones
}

TEST(BenchSweep, OutOfMemoryIsAResultWithItsPhase) {
  const auto r = zt::bench::classify_failure(
      "[rank 0] Epoch 1, Step 0, Loss: 10.9\n[rank 1] zerotrain train: error: rank 1: out of device memory in the "
      "backward phase of step 2 (CUDA out of memory. Tried to allocate 2.00 GiB)\n[rank 0] zerotrain train: error: "
      "collective aborted\n",
      1, false);
  EXPECT_EQ(r.at("status"), "oom");
  EXPECT_EQ(r.at("phase"), "backward");
  EXPECT_NE(r.at("error").get<std::string>().find("rank 1"), std::string::npos);  // the root cause, not rank 0's echo
  const auto setup = zt::bench::classify_failure("torch.OutOfMemoryError: CUDA out of memory\n", 1, false);
  EXPECT_EQ(setup.at("status"), "oom");
  EXPECT_EQ(setup.at("phase"), "setup");
  const auto other = zt::bench::classify_failure("zerotrain train: error: bad key\n", 1, false);
  EXPECT_EQ(other.at("status"), "failed");
  EXPECT_EQ(other.at("error"), "zerotrain train: error: bad key");
  EXPECT_EQ(zt::bench::classify_failure("", 143, true).at("status"), "timeout");
}

}  // namespace

// The anchors each row is compared with and the ratios: PyTorch's counterpart by mode,
// DeepSpeed at the row's stage and offload (bf16 rows only), the compiled model beside
// stage 0; failed anchors give no ratio; each anchor names the first row compared with it.
TEST(BenchSweep, AnchorRatiosPairEachRowWithItsAnchors) {
  using zt::bench::SweepConfig;
  EXPECT_EQ(zt::bench::deepspeed_anchor(SweepConfig{"z2-bf16", 2, "bf16", false, false, "fsdp2"}), "deepspeed-z2");
  EXPECT_EQ(zt::bench::deepspeed_anchor(SweepConfig{"z2-offopt", 2, "bf16", true, false, "fsdp2_offload"}),
            "deepspeed-z2-offopt");
  EXPECT_EQ(zt::bench::deepspeed_anchor(SweepConfig{"z3-offall", 3, "bf16", true, true, "fsdp2_offload"}),
            "deepspeed-z3-offall");
  EXPECT_EQ(zt::bench::deepspeed_anchor(SweepConfig{"z2-fp16", 2, "fp16", false, false, "fsdp2"}), "");

  nlohmann::json rows = nlohmann::json::parse(R"([
    {"name": "z0-bf16", "status": "ok", "stage": 0, "ms_per_iter": 100.0, "peak_gib": 20.0, "anchor": "ddp",
     "ds_anchor": "deepspeed-z0"},
    {"name": "z2-bf16", "status": "ok", "stage": 2, "ms_per_iter": 50.0, "peak_gib": 10.0, "anchor": "fsdp2",
     "ds_anchor": "deepspeed-z2"},
    {"name": "z2-fp16", "status": "failed", "stage": 2, "anchor": "fsdp2", "ds_anchor": ""}])");
  nlohmann::json anchors = nlohmann::json::parse(R"([
    {"name": "torch-ddp", "mode": "ddp", "status": "ok", "ms_per_iter": 150.0, "peak_gib": 25.0},
    {"name": "torch-compile", "mode": "compile", "status": "ok", "ms_per_iter": 120.0, "peak_gib": 24.0},
    {"name": "deepspeed-z0", "mode": "deepspeed", "status": "failed"},
    {"name": "deepspeed-z2", "mode": "deepspeed", "status": "ok", "ms_per_iter": 200.0, "peak_gib": 8.0}])");
  zt::bench::add_anchor_ratios(rows, anchors);
  EXPECT_DOUBLE_EQ(rows[0]["speedup_vs_anchor"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(rows[0]["peak_vs_anchor"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(rows[0]["speedup_vs_compile"].get<double>(), 1.2);
  EXPECT_FALSE(rows[0].contains("speedup_vs_deepspeed"));  // its DeepSpeed run failed
  EXPECT_DOUBLE_EQ(rows[1]["speedup_vs_deepspeed"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(rows[1]["peak_vs_deepspeed"].get<double>(), 1.25);
  EXPECT_FALSE(rows[1].contains("speedup_vs_anchor"));  // no torch-fsdp2 run
  EXPECT_FALSE(rows[1].contains("speedup_vs_compile"));  // stage 2
  EXPECT_FALSE(rows[2].contains("speedup_vs_anchor"));
  EXPECT_EQ(anchors[0]["vs"], "z0-bf16");
  EXPECT_EQ(anchors[1]["vs"], "z0-bf16");
  EXPECT_DOUBLE_EQ(anchors[3]["speedup"].get<double>(), 4.0);
  EXPECT_FALSE(anchors[2].contains("speedup"));
}

}  // namespace zt_test_bench_sweep
