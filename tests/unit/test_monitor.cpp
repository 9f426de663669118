// src/monitor: TensorBoard event files (byte-exact against protobuf's encoding, decoded
// back record by record with their CRCs, and read by TensorBoard's own EventAccumulator),
// DeepSpeed's CSV layout, the events of a step, and the MFU peak table.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/file_util.h"
#include "ckpt/crc32c.h"
#include "ckpt/fs.h"
#include "monitor/csv_monitor.h"
#include "monitor/device_peak.h"
#include "monitor/monitor.h"
#include "monitor/tfevents.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt_test_monitor {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using zt::test_support::hex;
using zt::test_support::read_file;
struct TempDir : zt::test_support::BuildTempDir {
  TempDir() : BuildTempDir("monitor_test_") {}
};

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- a decoder of its own for the records (independent of the encoder) ----------------

uint64_t le(const std::string& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Splits a TFRecord file into its records, checking both CRCs of each.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_LE(at + 12, file.size()) << "truncated header";
    const uint64_t len = le(file, at, 8);
    EXPECT_EQ(le(file, at + 8, 4), mask(zt::ckpt::crc32c(0, file.data() + at, 8))) << "length CRC at " << at;
    EXPECT_LE(at + 12 + len + 4, file.size()) << "truncated record";
    std::string data = file.substr(at + 12, len);
    EXPECT_EQ(le(file, at + 12 + len, 4), mask(zt::ckpt::crc32c(0, data.data(), data.size()))) << "data CRC at " << at;
    out.push_back(data);
    at += 12 + len + 4;
  }
  return out;
}

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version, tag;
  float value = 0;
  bool has_value = false;
};

uint64_t varint(const std::string& b, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto c = static_cast<unsigned char>(b.at(at++));
    v |= uint64_t(c & 0x7f) << shift;
    if (!(c & 0x80)) return v;
  }
}

// Walks a message: calls f(field, wire type, value bytes or number) for each field.
template <class F>
void fields(const std::string& m, F&& f) {
  size_t at = 0;
  while (at < m.size()) {
    const uint64_t key = varint(m, at);
    const int field = static_cast<int>(key >> 3), wt = static_cast<int>(key & 7);
    if (wt == 0) {
      f(field, wt, std::string(), varint(m, at));
    } else if (wt == 1 || wt == 5) {
      const int n = wt == 1 ? 8 : 4;
      f(field, wt, m.substr(at, n), le(m, at, n));
      at += n;
    } else if (wt == 2) {
      const uint64_t n = varint(m, at);
      f(field, wt, m.substr(at, n), 0);
      at += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << wt;
      return;
    }
  }
}

DecodedEvent decode_event(const std::string& data) {
  DecodedEvent e;
  fields(data, [&](int f, int wt, const std::string& bytes, uint64_t num) {
    if (f == 1 && wt == 1) std::memcpy(&e.wall_time, &num, 8);
    else if (f == 2 && wt == 0) e.step = static_cast<int64_t>(num);
    else if (f == 3 && wt == 2) e.file_version = bytes;
    else if (f == 5 && wt == 2) {
      fields(bytes, [&](int sf, int swt, const std::string& value, uint64_t) {
        ASSERT_TRUE(sf == 1 && swt == 2) << "Summary.value";
        fields(value, [&](int vf, int vwt, const std::string& vb, uint64_t vn) {
          if (vf == 1 && vwt == 2) e.tag = vb;
          else if (vf == 2 && vwt == 5) {
            const auto bits = static_cast<uint32_t>(vn);
            std::memcpy(&e.value, &bits, 4);
            e.has_value = true;
          } else ADD_FAILURE() << "unexpected Summary.Value field " << vf;
        });
      });
    } else ADD_FAILURE() << "unexpected Event field " << f;
  });
  return e;
}

zt::StepReport report(int64_t step, double loss, double lr) {
  zt::StepReport r;
  r.step = step;
  r.samples = step * 32;  // the engine's global_samples at train_batch_size 32
  r.loss = loss;
  r.lr = lr;
  r.loss_scale = 65536.0 / static_cast<double>(step);
  r.grad_norm = 0.5 * static_cast<double>(step);
  r.forward.ms = 10.0 + static_cast<double>(step);
  r.backward.ms = 20.0 + static_cast<double>(step);
  r.step_phase.ms = 5.0;
  r.forward.mem_peak = 3 * 1024 * 1024;
  r.backward.mem_peak = 5 * 1024 * 1024;
  r.step_phase.mem_peak = 4 * 1024 * 1024;
  r.model_state.params = 1024 * 1024;
  return r;
}

zt::Config monitor_config(const std::string& dir, bool tb, bool csv, bool fp16) {
  json j = {{"train_batch_size", 32},
            {"tensorboard", {{"enabled", tb}, {"output_path", dir + "/tb"}, {"job_name", "job"}}},
            {"csv_monitor", {{"enabled", csv}, {"output_path", dir + "/csv/"}, {"job_name", "job"}}}};
  if (fp16) j["fp16"] = {{"enabled", true}};
  return zt::Config::from_json(j, 2);
}

// ---- TensorBoard records ---------------------------------------------------------------

TEST(TfEvents, EncodingMatchesProtobufByteForByte) {
  // Expected bytes from tensorboard.compat.proto.event_pb2 (protobuf 7.36):
  //   Event(wall_time=1.5, step=42, summary=Summary(value=[Value(tag="Train/Samples/lr",
  //   simple_value=0.25)])).SerializeToString(), and the file_version / step 0 events.
  EXPECT_EQ(hex(zt::monitor::encode_scalar_event(1.5, 42, "Train/Samples/lr", 0.25f)),
            "09000000000000f83f102a2a190a170a10547261696e2f53616d706c65732f6c72150000803e");
  EXPECT_EQ(hex(zt::monitor::encode_file_version_event(1700000000.25)), "0900001040fc54d9411a0d627261696e2e4576656e743a32");
  EXPECT_EQ(hex(zt::monitor::encode_scalar_event(2.0, 0, "x", -3.5f)), "0900000000000000402a0a0a080a017815000060c0");
  // TensorFlow's masked CRC-32C (tensorboard.compat.tensorflow_stub.pywrap_tensorflow).
  EXPECT_EQ(zt::monitor::masked_crc32c("", 0), 0xa282ead8u);
  EXPECT_EQ(zt::monitor::masked_crc32c("123456789", 9), 0xc78ab0e5u);
  const std::string e = zt::monitor::encode_scalar_event(1.5, 42, "Train/Samples/lr", 0.25f);
  EXPECT_EQ(zt::monitor::masked_crc32c(e.data(), e.size()), 0x9e67194bu);
  // Framing: length 38, its masked CRC, the data, the data's masked CRC.
  const std::string rec = zt::monitor::frame_record(e);
  EXPECT_EQ(hex(rec.substr(0, 12)), "2600000000000000" "734fe300");
  EXPECT_EQ(rec.substr(12, e.size()), e);
  EXPECT_EQ(hex(rec.substr(12 + e.size())), "4b19679e");
}

TEST(TfEvents, WriterFileDecodesRecordByRecord) {
  TempDir t;
  std::string path;
  {
    zt::monitor::EventFileWriter w(t.path + "/run/a");
    path = w.path();
    w.add_scalar("Train/Samples/train_loss", 2.5, 0, 100.25);
    w.add_scalar("Train/Samples/lr", 1e-3, 64, 100.5);
    w.add_scalar("Train/Samples/train_loss", 2.25, 64, 101.0);
    w.flush();
  }
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(fs::path(path).parent_path().string(), t.path + "/run/a");
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(name.substr(20, 10).find_first_not_of("0123456789"), std::string::npos) << "10-digit time: " << name;
  const auto recs = records(read_file(path));
  ASSERT_EQ(recs.size(), 4u);
  const DecodedEvent first = decode_event(recs[0]);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_GT(first.wall_time, 1.6e9);  // now, in seconds
  const DecodedEvent a = decode_event(recs[1]), b = decode_event(recs[2]), c = decode_event(recs[3]);
  EXPECT_EQ(a.tag, "Train/Samples/train_loss");
  EXPECT_EQ(a.step, 0);
  EXPECT_EQ(a.value, 2.5f);
  EXPECT_EQ(a.wall_time, 100.25);
  EXPECT_EQ(b.tag, "Train/Samples/lr");
  EXPECT_EQ(b.step, 64);
  EXPECT_EQ(b.value, 1e-3f);  // simple_value is a float
  EXPECT_EQ(c.step, 64);
  EXPECT_EQ(c.value, 2.25f);
  // A second writer in the same second and directory gets its own file.
  zt::monitor::EventFileWriter w2(t.path + "/run/a");
  EXPECT_NE(w2.path(), path);
  EXPECT_EQ(files_in(t.path + "/run/a").size(), 2u);
}

TEST(TfEvents, UnwritableDirectoryIsNamed) {
  TempDir t;
  std::ofstream(t.path + "/file") << "x";
  try {
    zt::monitor::EventFileWriter w(t.path + "/file/sub");
    FAIL() << "expected an error";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(t.path + "/file/sub"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensorboard.output_path"), std::string::npos) << e.what();
  }
}

// ---- the events of a step ----------------------------------------------------------------

TEST(MonitorEvents, DeepSpeedNamesAndSampleCounts) {
  TempDir t;
  const zt::Config fp16 = monitor_config(t.path, false, false, true);
  const auto ev = zt::monitor::step_events(report(3, 2.0, 1e-4), fp16);
  std::map<std::string, zt::monitor::Event> by;
  for (const auto& e : ev) by[e.name] = e;
  ASSERT_EQ(by.size(), ev.size()) << "names are unique";
  EXPECT_EQ(ev[0].name, "Train/Samples/train_loss");  // DeepSpeed writes it first, in backward
  // train_loss at the samples before the step (DeepSpeed logs it before global_samples
  // grows), the rest after: train_batch_size 32, step 3.
  EXPECT_EQ(by["Train/Samples/train_loss"].samples, 64);
  EXPECT_EQ(by["Train/Samples/train_loss"].value, 2.0);
  EXPECT_EQ(by["Train/Samples/lr"].samples, 96);
  EXPECT_EQ(by["Train/Samples/lr"].value, 1e-4);
  EXPECT_EQ(by["Train/Samples/loss_scale"].value, 65536.0 / 3);
  EXPECT_EQ(by["Train/Samples/elapsed_time_ms_forward"].value, 13.0);
  EXPECT_EQ(by["Train/Samples/elapsed_time_ms_backward"].value, 23.0);
  EXPECT_EQ(by["Train/Samples/elapsed_time_ms_step"].value, 5.0);
  EXPECT_EQ(by["Train/Samples/peak_memory_MiB_backward"].value, 5.0);
  EXPECT_EQ(by["Train/Samples/model_states_MiB"].value, 1.0);
  EXPECT_EQ(by["Train/Samples/grad_norm"].value, 1.5);
  // loss_scale only with fp16, as DeepSpeed.
  const auto bf = zt::monitor::step_events(report(3, 2.0, 1e-4), monitor_config(t.path, false, false, false));
  for (const auto& e : bf) EXPECT_NE(e.name, "Train/Samples/loss_scale");
  EXPECT_EQ(bf.size() + 1, ev.size());
}

// The x axis is the engine's global_samples, not step x the current batch: step 4 of a run
// resumed at batch 32 from 3 steps of batch 8 is at 3 x 8 + 32 = 56 samples (loss at 24).
TEST(MonitorEvents, SamplesFollowTheEngineAcrossABatchSizeChange) {
  TempDir t;
  zt::StepReport r = report(4, 2.0, 1e-4);
  r.samples = 3 * 8 + 32;
  std::map<std::string, zt::monitor::Event> by;
  for (const auto& e : zt::monitor::step_events(r, monitor_config(t.path, false, false, false))) by[e.name] = e;
  EXPECT_EQ(by["Train/Samples/train_loss"].samples, 24);
  EXPECT_EQ(by["Train/Samples/lr"].samples, 56);
  EXPECT_EQ(by["Train/Samples/grad_norm"].samples, 56);
}

TEST(MonitorEvents, NothingEnabledMeansNoMonitor) {
  TempDir t;
  EXPECT_EQ(zt::monitor::Monitor::create(monitor_config(t.path, false, false, false)), nullptr);
  EXPECT_TRUE(files_in(t.path).empty()) << "nothing created";
  // An enabled "wandb" section makes a monitor too: tests/unit/test_wandb.cpp.
}

// ---- CSV ---------------------------------------------------------------------------------

TEST(CsvMonitor, PythonReprOfFloats) {
  // Each expectation is Python 3's repr() of the same double.
  const std::vector<std::pair<double, std::string>> cases = {
      {2.5, "2.5"}, {65536.0, "65536.0"}, {1e-05, "1e-05"}, {0.0001, "0.0001"}, {1e16, "1e+16"},
      {1.5e16, "1.5e+16"}, {0.1 + 0.2, "0.30000000000000004"}, {-0.0, "-0.0"}, {123456.789, "123456.789"},
      {1e-300, "1e-300"}, {5e-324, "5e-324"}, {3e15, "3000000000000000.0"}, {1234567890123456.0, "1234567890123456.0"},
      {12345678901234567.0, "1.2345678901234568e+16"}, {0.001, "0.001"}, {6.103515625e-05, "6.103515625e-05"},
      {-2.0, "-2.0"}, {std::numeric_limits<double>::infinity(), "inf"}, {std::nan(""), "nan"}};
  for (const auto& [v, s] : cases) EXPECT_EQ(zt::monitor::python_repr(v), s) << v;
}

TEST(CsvMonitor, DeepSpeedLayout) {
  TempDir t;
  {
    zt::monitor::CsvMonitor m(t.path + "/out/job");
    m.write("Train/Samples/train_loss", 2.5, 0);
    m.write("Train/Samples/lr", 0.001, 32);
    m.write("Train/Samples/train_loss", 2.25, 32);
    m.write("my metric", 1.0, 5);
  }
  EXPECT_EQ(files_in(t.path + "/out/job"),
            (std::vector<std::string>{"Train_Samples_lr.csv", "Train_Samples_train_loss.csv", "my_metric.csv"}));
  // Python's csv.writer: "\r\n" line ends; header "step,<last part of the name>".
  EXPECT_EQ(read_file(t.path + "/out/job/Train_Samples_train_loss.csv"), "step,train_loss\r\n0,2.5\r\n32,2.25\r\n");
  EXPECT_EQ(read_file(t.path + "/out/job/Train_Samples_lr.csv"), "step,lr\r\n32,0.001\r\n");
  EXPECT_EQ(read_file(t.path + "/out/job/my_metric.csv"), "step,my metric\r\n5,1.0\r\n");
  // Like DeepSpeed (open 'a+', header once per process): a second run appends.
  zt::monitor::CsvMonitor again(t.path + "/out/job");
  again.write("Train/Samples/lr", 0.002, 64);
  EXPECT_EQ(read_file(t.path + "/out/job/Train_Samples_lr.csv"), "step,lr\r\n32,0.001\r\nstep,lr\r\n64,0.002\r\n");
}

TEST(CsvMonitor, MonitorWritesEveryEventOfEveryStep) {
  TempDir t;
  const zt::Config c = monitor_config(t.path, false, true, true);
  auto m = zt::monitor::Monitor::create(c);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->csv_dir(), t.path + "/csv/job");  // os.path.join("csv/", "job")
  EXPECT_EQ(m->tensorboard_file(), "");
  for (int s = 1; s <= 3; ++s) m->write(report(s, 3.0 - 0.5 * s, 1e-3 * s));
  const auto names = zt::monitor::step_events(report(1, 0, 0), c);
  EXPECT_EQ(files_in(t.path + "/csv/job").size(), names.size());
  EXPECT_EQ(read_file(t.path + "/csv/job/Train_Samples_train_loss.csv"), "step,train_loss\r\n0,2.5\r\n32,2.0\r\n64,1.5\r\n");
  EXPECT_EQ(read_file(t.path + "/csv/job/Train_Samples_lr.csv"), "step,lr\r\n32,0.001\r\n64,0.002\r\n96,0.003\r\n");
  EXPECT_EQ(read_file(t.path + "/csv/job/Train_Samples_loss_scale.csv"),
            "step,loss_scale\r\n32,65536.0\r\n64,32768.0\r\n96,21845.333333333332\r\n");
}

// ---- TensorBoard's own reader ----------------------------------------------------------

const auto run = zt::test_support::run_stdout;

TEST(TfEvents, TensorBoardEventAccumulatorReadsEveryScalar) {
  const std::string py = ZT_PYTHON;
  if (run(py + " -c 'import tensorboard' 2>/dev/null").second != 0) {
    GTEST_SKIP() << py << " has no tensorboard package, so TensorBoard's reader cannot check the event file "
                 << "(scripts/setup.sh installs it: pip install tensorboard)";
  }
  TempDir t;
  const zt::Config c = monitor_config(t.path, true, false, true);
  std::map<std::string, std::vector<std::pair<int64_t, float>>> want;
  {
    auto m = zt::monitor::Monitor::create(c);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(fs::path(m->tensorboard_file()).parent_path().string(), t.path + "/tb/job");
    for (int s = 1; s <= 5; ++s) {
      const zt::StepReport r = report(s, 4.0 / s, 1e-3 * s);
      m->write(r);
      for (const auto& e : zt::monitor::step_events(r, c))
        want[e.name].push_back({e.samples, static_cast<float>(e.value)});
    }
  }
  const auto [out, rc] = run(py + " " ZT_SOURCE_DIR "/tests/support/read_tfevents.py " + t.path + "/tb/job");
  ASSERT_EQ(rc, 0) << out;
  const json got = json::parse(out);
  ASSERT_EQ(got.size(), want.size()) << out;
  for (const auto& [tag, points] : want) {
    SCOPED_TRACE(tag);
    ASSERT_TRUE(got.contains(tag)) << out;
    const json& g = got[tag];
    ASSERT_EQ(g.size(), points.size());
    for (size_t i = 0; i < points.size(); ++i) {
      EXPECT_EQ(g[i][0].get<int64_t>(), points[i].first) << "step of point " << i;
      EXPECT_EQ(g[i][1].get<float>(), points[i].second) << "value of point " << i;  // float32 both sides
    }
  }
  EXPECT_EQ(got["Train/Samples/lr"][4][0].get<int64_t>(), 5 * 32);
  EXPECT_EQ(got["Train/Samples/train_loss"][0][0].get<int64_t>(), 0);
}

// ---- MFU peak table ----------------------------------------------------------------------

TEST(DevicePeak, TableByDeviceName) {
  // Names as cudaDeviceProp::name reports them.
  const std::vector<std::pair<std::string, double>> known = {
      {"NVIDIA H100 80GB HBM3", 989},   {"NVIDIA H100 PCIe", 756},      {"NVIDIA H100 NVL", 835},
      {"NVIDIA H200", 989},             {"NVIDIA H200 NVL", 835},       {"NVIDIA GH200 480GB", 989},
      {"NVIDIA A100-SXM4-40GB", 312},   {"NVIDIA A100-SXM4-80GB", 312}, {"NVIDIA A100-PCIE-40GB", 312},
      {"NVIDIA A100 80GB PCIe", 312},   {"NVIDIA L40S", 362},           {"NVIDIA L40", 181},
      {"NVIDIA L4", 121},               {"NVIDIA A10", 125},            {"NVIDIA A40", 149.7},
      {"NVIDIA B200", 2250},            {"NVIDIA H800", 989},           {"NVIDIA H800 PCIe", 756}};
  for (const auto& [name, tflops] : known) {
    const auto p = zt::monitor::dense_bf16_peak(name);
    ASSERT_TRUE(p.has_value()) << name;
    EXPECT_EQ(p->tflops, tflops) << name << " (" << p->model << ")";
  }
  for (const char* unknown : {"Tesla V100-SXM2-32GB", "NVIDIA GeForce RTX 4090", "AMD Instinct MI300X", "", "CPU"}) {
    EXPECT_FALSE(zt::monitor::dense_bf16_peak(unknown).has_value()) << unknown;
  }
}

}  // namespace

}  // namespace zt_test_monitor
