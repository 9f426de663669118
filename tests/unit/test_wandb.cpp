// src/monitor/wandb_writer: wandb offline runs. The framing (chunks across block
// boundaries, padding, zlib CRC-32 seeded with the chunk type) decoded by a reader of the
// test's own; the Record encodings byte for byte against wandb's own pb2; the writer's
// rows (wandb.log(step=) semantics), summary and exit code; a DeepSpeed config's "wandb"
// section through the Monitor; and the file read back by wandb's own DataStore and pb2.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/file_util.h"
#include "ckpt/fs.h"
#include "monitor/monitor.h"
#include "monitor/wandb_writer.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt_test_wandb {

namespace {

// The build's python (CMakeLists.txt passes ZT_PYTHON, as for test_monitor.cpp).
#ifdef ZT_PYTHON
constexpr const char* kBuildPython = ZT_PYTHON;
#else
constexpr const char* kBuildPython = "python3";
#endif

namespace fs = std::filesystem;
using nlohmann::json;
using zt::monitor::WandbItem;

using zt::test_support::hex;
using zt::test_support::read_file;
struct TempDir : zt::test_support::BuildTempDir {
  TempDir() : BuildTempDir("wandb_test_") {}
};

// Sets WANDB_DIR for one scope.
struct ScopedWandbDir {
  explicit ScopedWandbDir(const std::string& dir) {
    if (const char* v = std::getenv("WANDB_DIR")) old = v, had = true;
    setenv("WANDB_DIR", dir.c_str(), 1);
  }
  ~ScopedWandbDir() {
    if (had) setenv("WANDB_DIR", old.c_str(), 1);
    else unsetenv("WANDB_DIR");
  }
  std::string old;
  bool had = false;
};

// ---- a reader of the test's own (independent of the writer) ----------------------------

constexpr size_t kBlock = 32768;

uint64_t le(std::string_view b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

// CRC-32 bit by bit (the writer uses a table): zlib.crc32(bytes).
uint32_t bitwise_crc32(std::string_view bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
  }
  return ~c;
}

struct Chunk {
  size_t at = 0;  // offset of its header in the file
  int type = 0;
  std::string data;
};

// The chunks of a .wandb file after its header, checking each checksum, that no chunk
// crosses a block boundary and that block tails too short for a header are zeros.
std::vector<Chunk> read_chunks(const std::string& file) {
  std::vector<Chunk> out;
  EXPECT_EQ(file.substr(0, 7), std::string(":W&B\xe1\xbe\x00", 7)) << "header";
  size_t at = 7;
  while (at < file.size()) {
    const size_t left = kBlock - at % kBlock;
    if (left < 7) {
      EXPECT_EQ(file.substr(at, left), std::string(left, '\0')) << "padding at " << at;
      at += left;
      continue;
    }
    if (at + 7 > file.size()) {
      ADD_FAILURE() << "truncated chunk header at " << at;
      break;
    }
    Chunk c;
    c.at = at;
    c.type = static_cast<unsigned char>(file[at + 6]);
    const size_t len = le(file, at + 4, 2);
    EXPECT_LE(7 + len, left) << "chunk at " << at << " crosses a block boundary";
    c.data = file.substr(at + 7, len);
    EXPECT_EQ(le(file, at, 4), bitwise_crc32(std::string(1, char(c.type)) + c.data)) << "checksum at " << at;
    at += 7 + len;
    out.push_back(std::move(c));
  }
  return out;
}

// Joins chunks into records (FULL, or FIRST MIDDLE* LAST).
std::vector<std::string> join_records(const std::vector<Chunk>& chunks) {
  std::vector<std::string> out;
  bool open = false;
  for (const auto& c : chunks) {
    if (c.type == 1 || c.type == 2) {
      EXPECT_FALSE(open) << "record at " << c.at << " starts inside another";
      out.push_back(c.data);
      open = c.type == 2;
    } else {
      EXPECT_TRUE(open && (c.type == 3 || c.type == 4)) << "chunk type " << c.type << " at " << c.at;
      if (!out.empty()) out.back() += c.data;
      open = c.type == 3;
    }
  }
  EXPECT_FALSE(open) << "last record unfinished";
  return out;
}

uint64_t varint(std::string_view b, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto c = static_cast<unsigned char>(b.at(at++));
    v |= uint64_t(c & 0x7f) << shift;
    if (!(c & 0x80)) return v;
  }
}

// One level of a protobuf message: (field, varint value or bytes), wire types 0 and 2
// only (all that wandb's records here use).
struct Field {
  int number = 0;
  uint64_t num = 0;
  std::string bytes;
};
std::vector<Field> fields(std::string_view m) {
  std::vector<Field> out;
  size_t at = 0;
  while (at < m.size()) {
    const uint64_t key = varint(m, at);
    Field f;
    f.number = static_cast<int>(key >> 3);
    if ((key & 7) == 0) {
      f.num = varint(m, at);
    } else if ((key & 7) == 2) {
      const uint64_t n = varint(m, at);
      f.bytes = std::string(m.substr(at, n));
      at += n;
    } else {
      ADD_FAILURE() << "wire type " << (key & 7) << " of field " << f.number;
      break;
    }
    out.push_back(std::move(f));
  }
  return out;
}

// A Record as far as the writer fills it.
struct Decoded {
  int64_t num = 0;
  int kind = 0;  // the Record field: 2 history, 3 summary, 17 run, 18 exit
  std::vector<WandbItem> items;          // history items / summary updates
  bool has_step = false;                 // history: the HistoryStep message is there
  int64_t step = 0, exit_code = 0, runtime = 0;
  std::map<int, std::string> run;        // RunRecord string fields by number
  int64_t start_seconds = 0, start_nanos = 0;
};

Decoded decode(const std::string& record) {
  Decoded d;
  for (const Field& f : fields(record)) {
    if (f.number == 1) {
      d.num = static_cast<int64_t>(f.num);
      continue;
    }
    d.kind = f.number;
    for (const Field& g : fields(f.bytes)) {
      if (d.kind == 2 || d.kind == 3) {
        if (g.number == 1) {  // HistoryItem / SummaryItem
          WandbItem item;
          for (const Field& h : fields(g.bytes)) (h.number == 1 ? item.key : item.value_json) = h.bytes;
          d.items.push_back(item);
        } else if (d.kind == 2 && g.number == 2) {
          d.has_step = true;
          for (const Field& h : fields(g.bytes)) {
            EXPECT_EQ(h.number, 1) << "HistoryStep.num";
            d.step = static_cast<int64_t>(h.num);
          }
        } else ADD_FAILURE() << "field " << g.number << " of record kind " << d.kind;
      } else if (d.kind == 17) {
        if (g.number == 17) {
          for (const Field& h : fields(g.bytes)) (h.number == 1 ? d.start_seconds : d.start_nanos) = int64_t(h.num);
        } else d.run[g.number] = g.bytes;
      } else if (d.kind == 18) {
        (g.number == 1 ? d.exit_code : d.runtime) = static_cast<int32_t>(g.num);
      }
    }
  }
  return d;
}

std::vector<Decoded> decode_file(const std::string& path) {
  std::vector<Decoded> out;
  for (const auto& r : join_records(read_chunks(read_file(path)))) out.push_back(decode(r));
  return out;
}

using Items = std::vector<std::pair<std::string, std::string>>;
Items pairs(const std::vector<WandbItem>& items) {
  Items out;
  for (const auto& i : items) out.emplace_back(i.key, i.value_json);
  return out;
}

// ---- the framing ------------------------------------------------------------------------

TEST(WandbFormat, HeaderAndChecksumsAreZlibs) {
  // datastore.py: struct.pack("<4sHB", b":W&B", 0xBEE1, 0).
  EXPECT_EQ(hex(zt::monitor::wandb_file_header()), "3a572642" "e1be" "00");
  // zlib.crc32(b"123456789") (the CRC-32 check value), extended as zlib extends it.
  EXPECT_EQ(zt::monitor::crc32_ieee(0, "123456789", 9), 0xcbf43926u);
  EXPECT_EQ(zt::monitor::crc32_ieee(zt::monitor::crc32_ieee(0, "1234", 4), "56789", 5), 0xcbf43926u);
  // A chunk's checksum is zlib.crc32(data, zlib.crc32(bytes([type]))), unmasked
  // (datastore.py's _write_record; values from Python's zlib): FULL "hello" ...
  const std::string full = zt::monitor::frame_wandb_record("hello", 7);
  EXPECT_EQ(hex(full), "9d23ac8a" "0500" "01" + hex("hello"));
  // ... and the empty FIRST chunk a block with exactly 7 bytes left gets, then LAST.
  const std::string split = zt::monitor::frame_wandb_record("", kBlock - 7);
  EXPECT_EQ(hex(split), "1bdf05a5" "0000" "01");  // empty data fits as FULL
  const std::string first_empty = zt::monitor::frame_wandb_record("x", kBlock - 7);
  EXPECT_EQ(hex(first_empty.substr(0, 7)), "a18e0c3c" "0000" "02");
  EXPECT_EQ(le(first_empty, 7 + 4, 2), 1u);
  EXPECT_EQ(first_empty[7 + 6], 4) << "LAST";
}

TEST(WandbFormat, ChunksAtBlockBoundaries) {
  // (offset in the file, record size) -> the chunks: (type, data bytes); padding first
  // when the block has less than a header (7 bytes) left. Sizes as datastore.py's
  // _write_data splits them (LEVELDBLOG_DATA_LEN = 32761).
  struct Case {
    const char* name;
    uint64_t offset;
    size_t size;
    size_t padding;
    std::vector<std::pair<int, size_t>> chunks;
  };
  const size_t data = kBlock - 7;
  const std::vector<Case> cases = {
      {"small after the header", 7, 100, 0, {{1, 100}}},
      {"fills block 0 exactly", 7, data - 7, 0, {{1, data - 7}}},
      {"one byte over block 0", 7, data - 6, 0, {{2, data - 7}, {4, 1}}},
      {"spans a boundary", 7, 40000, 0, {{2, data - 7}, {4, 40000 - (data - 7)}}},
      {"3 bytes left: padded", 2 * kBlock - 3, 10, 3, {{1, 10}}},
      {"7 bytes left: empty FIRST", kBlock - 7, 10, 0, {{2, 0}, {4, 10}}},
      {"8 bytes left", kBlock - 8, 10, 0, {{2, 1}, {4, 9}}},
      {"at a block start", kBlock, data, 0, {{1, data}}},
      {"three blocks", kBlock + 100, 70000, 0, {{2, data - 100}, {3, data}, {4, 70000 - (data - 100) - data}}},
      {"MIDDLE fills, LAST exact", kBlock + 100, (data - 100) + 2 * data, 0, {{2, data - 100}, {3, data}, {4, data}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string payload(c.size, '\0');
    for (size_t i = 0; i < c.size; ++i) payload[i] = static_cast<char>(i * 7 + 3);
    const std::string out = zt::monitor::frame_wandb_record(payload, c.offset);
    size_t at = c.padding;
    EXPECT_EQ(out.substr(0, c.padding), std::string(c.padding, '\0'));
    std::string joined;
    for (const auto& [type, n] : c.chunks) {
      ASSERT_LE(at + 7 + n, out.size());
      EXPECT_EQ(static_cast<unsigned char>(out[at + 6]), type) << "at " << at;
      EXPECT_EQ(le(out, at + 4, 2), n) << "at " << at;
      const std::string d = out.substr(at + 7, n);
      EXPECT_EQ(le(out, at, 4), bitwise_crc32(std::string(1, char(type)) + d));
      // No chunk crosses a block boundary of the file.
      EXPECT_LE((c.offset + at) % kBlock + 7 + n, kBlock) << "at " << at;
      joined += d;
      at += 7 + n;
    }
    EXPECT_EQ(at, out.size());
    EXPECT_EQ(joined, payload);
  }
}

// ---- the records, against wandb's own protobuf encoder -----------------------------------

TEST(WandbEncoding, MatchesWandbPb2ByteForByte) {
  // Expected bytes: wandb 0.31.0's wandb.proto.wandb_internal_pb2 (protobuf 6), each
  // Record built with the same values and SerializeToString().hex(), e.g.
  //   r = pb.Record(num=1); r.run.run_id = "k3x9q2ab"; ...; r.run.start_time.seconds = ...
  //   r = pb.Record(num=2); it = r.history.item.add(); it.key = ...; r.history.step.num = 32
  //   r = pb.Record(num=3); ...; r.history.step.SetInParent()    (step 0: `step {}`)
  //   r = pb.Record(num=5); r.exit.exit_code = 1; r.exit.runtime = 12
  zt::monitor::WandbRun run;
  run.run_id = "k3x9q2ab";
  run.entity = "my-team";
  run.project = "deepspeed";
  run.group = "grp";
  run.job_type = "train";
  run.display_name = "gpt2-small";
  run.host = "node-1";
  run.start_seconds = 1795000000;
  run.start_nanos = 123456000;
  EXPECT_EQ(hex(zt::monitor::encode_wandb_run(1, run)),
            "08018a014c0a086b3378397132616212076d792d7465616d1a0964656570737065656432036772703a05747261696e42"
            "0a677074322d736d616c6c6a066e6f64652d318a010b08c08df6d706108094ef3a");
  EXPECT_EQ(hex(zt::monitor::encode_wandb_history(2, 32,
                                                  {{"Train/Samples/lr", "0.001"},
                                                   {"Train/Samples/loss_scale", "65536.0"},
                                                   {"_runtime", "1.5"},
                                                   {"_timestamp", "1795000001.623456"},
                                                   {"_step", "32"}})),
            "08021288010a1a0a10547261696e2f53616d706c65732f6c72820105302e3030310a240a18547261696e2f53616d706c"
            "65732f6c6f73735f7363616c6582010736353533362e300a100a085f72756e74696d65820103312e350a200a0a5f7469"
            "6d657374616d70820111313739353030303030312e3632333435360a0c0a055f73746570820102333212020820");
  // A key over 127 bytes (two-byte lengths) and step 0 (an empty HistoryStep, still written).
  EXPECT_EQ(hex(zt::monitor::encode_wandb_history(3, 0, {{std::string(130, 'x'), "NaN"}, {"_step", "0"}})),
            "0803129d010a8b010a8201" + hex(std::string(130, 'x')) + "8201034e614e0a0b0a055f73746570820101301200");
  EXPECT_EQ(hex(zt::monitor::encode_wandb_summary(4, {{"Train/Samples/train_loss", "2.5"}, {"_step", "32"}})),
            "08041a300a200a18547261696e2f53616d706c65732f747261696e5f6c6f7373820103322e350a0c0a055f737465708201"
            "023332");
  EXPECT_EQ(hex(zt::monitor::encode_wandb_exit(5, 1, 12)), "08059201040801100c");
  EXPECT_EQ(hex(zt::monitor::encode_wandb_exit(6, -1, 0)), "080692010b08ffffffffffffffffff01");  // int32 -1
  EXPECT_EQ(hex(zt::monitor::encode_wandb_exit(7, 0, 0)), "0807920100");  // exit {} (code 0)
}

TEST(WandbEncoding, JsonNumbersAsPythonWritesThem) {
  // json.dumps(float(v)) in Python 3.
  const std::vector<std::pair<double, std::string>> cases = {
      {0.001, "0.001"}, {65536.0, "65536.0"}, {1e-05, "1e-05"}, {2.5, "2.5"}, {-0.0, "-0.0"},
      {1795000001.623456, "1795000001.623456"}, {1e16, "1e+16"}, {std::nan(""), "NaN"},
      {INFINITY, "Infinity"}, {-INFINITY, "-Infinity"}};
  for (const auto& [v, s] : cases) EXPECT_EQ(zt::monitor::wandb_json_number(v), s) << v;
}

// ---- the writer --------------------------------------------------------------------------

zt::monitor::WandbRun test_run() {
  zt::monitor::WandbRun run;
  run.entity = "my-team";
  run.project = "proj";
  run.group = "g";
  run.host = "node-1";
  run.start_seconds = 1795000000;  // fixed, so _runtime is known
  return run;
}

TEST(WandbWriter, RunDirectoryRowsSummaryAndExit) {
  TempDir t;
  std::string path, dir, id;
  int64_t runtime_lo = 0, runtime_hi = 0;
  {
    zt::monitor::WandbWriter w(t.path + "/wandb", test_run());
    path = w.path();
    dir = w.run_dir();
    id = w.run().run_id;
    // wandb.log({k: v}, step=s) one metric at a time: a row closes when the step changes.
    w.log("a", 1.0, 0, 1795000001.5);
    w.log("b", 2.0, 32, 1795000002.0);
    w.log("c", 3.0, 32, 1795000002.25);
    w.log("b", 4.0, 32, 1795000002.5);  // the same key again: the last value counts
    w.log("a", 5.0, 64, 1795000003.0);
    w.flush();
    runtime_lo = std::lround(double(std::time(nullptr)) - 1 - 1795000000);
    w.finish(0);
    runtime_hi = std::lround(double(std::time(nullptr)) + 1 - 1795000000);
    w.finish(3);  // later calls do nothing
  }
  // <root>/offline-run-<local YYYYMMDD_HHMMSS>-<id>/run-<id>.wandb, and files/.
  EXPECT_TRUE(std::regex_match(id, std::regex("[a-z0-9]{8}"))) << id;
  const std::time_t start = 1795000000;
  std::tm tm{};
  localtime_r(&start, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d_%H%M%S", &tm);
  EXPECT_EQ(dir, t.path + "/wandb/offline-run-" + stamp + "-" + id);
  EXPECT_EQ(path, dir + "/run-" + id + ".wandb");
  EXPECT_TRUE(fs::is_directory(dir + "/files"));

  const auto recs = decode_file(path);
  ASSERT_EQ(recs.size(), 6u);  // run, 3 rows, summary, exit
  for (size_t i = 0; i < recs.size(); ++i) EXPECT_EQ(recs[i].num, int64_t(i + 1)) << "record numbers";
  EXPECT_EQ(recs[0].kind, 17);
  EXPECT_EQ(recs[0].run, (std::map<int, std::string>{{1, id}, {2, "my-team"}, {3, "proj"}, {6, "g"}, {13, "node-1"}}));
  EXPECT_EQ(recs[0].start_seconds, 1795000000);
  const std::vector<std::pair<int64_t, Items>> rows = {
      {0, {{"a", "1.0"}, {"_runtime", "1.5"}, {"_timestamp", "1795000001.5"}, {"_step", "0"}}},
      {32, {{"b", "4.0"}, {"c", "3.0"}, {"_runtime", "2.5"}, {"_timestamp", "1795000002.5"}, {"_step", "32"}}},
      {64, {{"a", "5.0"}, {"_runtime", "3.0"}, {"_timestamp", "1795000003.0"}, {"_step", "64"}}}};
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    EXPECT_EQ(recs[1 + i].kind, 2);
    EXPECT_TRUE(recs[1 + i].has_step);
    EXPECT_EQ(recs[1 + i].step, rows[i].first);
    EXPECT_EQ(pairs(recs[1 + i].items), rows[i].second);
  }
  EXPECT_EQ(recs[4].kind, 3);
  EXPECT_EQ(pairs(recs[4].items), (Items{{"a", "5.0"}, {"_runtime", "3.0"}, {"_timestamp", "1795000003.0"},
                                         {"_step", "64"}, {"b", "4.0"}, {"c", "3.0"}}));
  EXPECT_EQ(recs[5].kind, 18);
  EXPECT_EQ(recs[5].exit_code, 0);
  EXPECT_GE(recs[5].runtime, runtime_lo);
  EXPECT_LE(recs[5].runtime, runtime_hi);
}

TEST(WandbWriter, ExitCodeOneWhenUnwindingAndNoRowsNoSummary) {
  TempDir t;
  std::string path;
  try {
    zt::monitor::WandbWriter w(t.path, test_run());
    path = w.path();
    throw std::runtime_error("training failed");
  } catch (const std::runtime_error&) {
  }
  const auto recs = decode_file(path);
  ASSERT_EQ(recs.size(), 2u);  // run, exit: no rows, so no summary either
  EXPECT_EQ(recs[0].kind, 17);
  EXPECT_EQ(recs[1].kind, 18);
  EXPECT_EQ(recs[1].exit_code, 1);
}

TEST(WandbWriter, UnwritableRootIsNamed) {
  TempDir t;
  std::ofstream(t.path + "/file") << "x";
  try {
    zt::monitor::WandbWriter w(t.path + "/file/wandb", test_run());
    FAIL() << "expected an error";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(t.path + "/file/wandb/offline-run-"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("WANDB_DIR"), std::string::npos) << e.what();
  }
}

// ---- a DeepSpeed config's "wandb" section through the Monitor ----------------------------

zt::StepReport report(int64_t step, double loss, double lr) {
  zt::StepReport r;
  r.step = step;
  r.samples = step * 32;  // the engine's global_samples at train_batch_size 32
  r.loss = loss;
  r.lr = lr;
  r.loss_scale = 65536.0 / static_cast<double>(step);
  r.grad_norm = 0.5 * static_cast<double>(step);
  r.forward.ms = 10.0 + static_cast<double>(step);
  return r;
}

zt::Config wandb_config() {
  return zt::Config::from_json({{"train_batch_size", 32},
                                {"fp16", {{"enabled", true}}},
                                {"wandb", {{"enabled", true}, {"team", "my-team"}, {"group", "g"}, {"project", "proj"}}}},
                               2);
}

// What wandb makes of DeepSpeed's wandb.log({name: value}, step=samples) per event: rows
// of consecutive events at the same step, values as JSON. (Without _runtime etc.)
std::vector<std::pair<int64_t, Items>> expected_rows(const std::vector<zt::monitor::Event>& events) {
  std::vector<std::pair<int64_t, Items>> rows;
  for (const auto& e : events) {
    if (rows.empty() || rows.back().first != e.samples) rows.push_back({e.samples, {}});
    rows.back().second.emplace_back(e.name, zt::monitor::wandb_json_number(e.value));
  }
  return rows;
}

// The rows of a history as (step, items without _runtime/_timestamp), checking _step.
std::pair<int64_t, Items> metrics_of(int64_t step, const Items& items) {
  Items out;
  for (const auto& [k, v] : items) {
    if (k == "_step") EXPECT_EQ(v, std::to_string(step));
    else if (k != "_runtime" && k != "_timestamp") out.emplace_back(k, v);
  }
  return {step, out};
}

TEST(WandbMonitor, DeepSpeedSectionWritesEveryEventAgainstSamples) {
  TempDir t;
  ScopedWandbDir env(t.path);
  const zt::Config c = wandb_config();
  std::vector<zt::monitor::Event> events;
  std::string dir;
  {
    auto m = zt::monitor::Monitor::create(c);  // only wandb enabled: still a monitor
    ASSERT_NE(m, nullptr);
    dir = m->wandb_run_dir();
    EXPECT_EQ(m->tensorboard_file(), "");
    for (int s = 1; s <= 3; ++s) {
      const auto r = report(s, 4.0 / s, 1e-3 * s);
      m->write(r);
      for (const auto& e : zt::monitor::step_events(r, c)) events.push_back(e);
    }
  }
  EXPECT_EQ(fs::path(dir).parent_path().string(), t.path + "/wandb");  // $WANDB_DIR/wandb
  const auto files = std::vector<fs::directory_entry>(fs::directory_iterator(dir), {});
  std::string path;
  for (const auto& f : files)
    if (f.path().extension() == ".wandb") path = f.path().string();
  ASSERT_FALSE(path.empty());
  const auto recs = decode_file(path);
  const auto want = expected_rows(events);
  ASSERT_EQ(recs.size(), 1 + want.size() + 2);
  EXPECT_EQ(recs[0].run.at(2), "my-team");  // team -> entity
  EXPECT_EQ(recs[0].run.at(3), "proj");
  EXPECT_EQ(recs[0].run.at(6), "g");  // group -> run_group
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    ASSERT_EQ(recs[1 + i].kind, 2);
    EXPECT_EQ(metrics_of(recs[1 + i].step, pairs(recs[1 + i].items)), want[i]);
  }
  // DeepSpeed logs the loss at the samples before the step: row 0 holds only step 1's
  // loss, and step 2's loss joins step 1's row (samples 32).
  EXPECT_EQ(want[0].second, (Items{{"Train/Samples/train_loss", "4.0"}}));
  EXPECT_EQ(want[1].first, 32);
  EXPECT_EQ(want[1].second.back(), (std::pair<std::string, std::string>{"Train/Samples/train_loss", "2.0"}));
  EXPECT_EQ(want.back().first, 96);
  EXPECT_EQ(recs.back().exit_code, 0);
}

// ---- wandb's own reader ------------------------------------------------------------------

const auto run = zt::test_support::run_stdout;

TEST(WandbMonitor, WandbsDataStoreReadsEveryRecord) {
  // ZT_WANDB_PYTHON picks a python with wandb < 0.30 (the last with a Python DataStore)
  // when the build's python has none or a newer wandb.
  const char* env_py = std::getenv("ZT_WANDB_PYTHON");
  const std::string py = env_py && *env_py ? env_py : kBuildPython;
  if (run(py + " -c 'import wandb' 2>/dev/null").second != 0) {
    GTEST_SKIP() << py << " has no wandb package, so wandb's own reader cannot check the run "
                 << "(pip install 'wandb<0.30' there, or set ZT_WANDB_PYTHON to a python that has it)";
  }
  TempDir t;
  ScopedWandbDir env(t.path);
  const zt::Config c = wandb_config();
  std::vector<zt::monitor::Event> events;
  std::string path, id;
  {
    auto m = zt::monitor::Monitor::create(c);
    ASSERT_NE(m, nullptr);
    for (int s = 1; s <= 200; ++s) {
      const auto r = report(s, 4.0 / s, 1e-3 * s);
      m->write(r);
      for (const auto& e : zt::monitor::step_events(r, c)) events.push_back(e);
    }
    // One row of 3000 metrics (about 100 KB): a record of FIRST, MIDDLE(s) and LAST chunks.
    std::vector<zt::monitor::Event> wide;
    for (int i = 0; i < 3000; ++i) wide.push_back({"Wide/metric_" + std::to_string(i), i * 0.25, 201 * 32});
    m->write_events(wide);
    events.insert(events.end(), wide.begin(), wide.end());
    const std::string dir = m->wandb_run_dir();
    id = dir.substr(dir.size() - 8);
    path = dir + "/run-" + id + ".wandb";
  }
  ASSERT_GT(fs::file_size(path), 3 * kBlock);
  // The test's own reader too: it checks block boundaries, which DataStore's scan does not.
  EXPECT_EQ(decode_file(path).size(), 1 + expected_rows(events).size() + 2);
  const auto [out, rc] = run(py + " " ZT_SOURCE_DIR "/tests/support/read_wandb.py " + path + " 2>&1");
  if (rc == 3) GTEST_SKIP() << out;
  ASSERT_EQ(rc, 0) << out;
  const json got = json::parse(out);
  const json& recs = got["records"];
  const auto want = expected_rows(events);
  ASSERT_EQ(recs.size(), 1 + want.size() + 2) << "wandb " << got["wandb"];
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_TRUE(recs[i]["reserialized_equal"].get<bool>()) << "record " << i;
    EXPECT_EQ(recs[i]["num"].get<int64_t>(), int64_t(i + 1));
  }
  EXPECT_EQ(recs[0]["type"], "run");
  EXPECT_EQ(recs[0]["run_id"], id);
  EXPECT_EQ(recs[0]["entity"], "my-team");
  EXPECT_EQ(recs[0]["project"], "proj");
  EXPECT_EQ(recs[0]["run_group"], "g");
  EXPECT_GT(recs[0]["start_seconds"].get<int64_t>(), 1600000000);
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    const json& r = recs[1 + i];
    ASSERT_EQ(r["type"], "history");
    EXPECT_TRUE(r["has_step"].get<bool>());
    EXPECT_EQ(metrics_of(r["step"].get<int64_t>(), r["items"].get<Items>()), want[i]);
  }
  EXPECT_GT(recs[want.size()]["bytes"].get<int64_t>(), int64_t(2 * kBlock)) << "the wide row spans blocks";
  const json& summary = recs[1 + want.size()];
  EXPECT_EQ(summary["type"], "summary");
  const Items s = summary["items"].get<Items>();
  EXPECT_NE(std::find(s.begin(), s.end(), std::pair<std::string, std::string>{"_step", "6432"}), s.end());
  EXPECT_NE(std::find(s.begin(), s.end(), std::pair<std::string, std::string>{"Train/Samples/train_loss", "0.02"}),
            s.end());
  EXPECT_EQ(recs.back()["type"], "exit");
  EXPECT_EQ(recs.back()["exit_code"].get<int>(), 0);
}

}  // namespace

}  // namespace zt_test_wandb
