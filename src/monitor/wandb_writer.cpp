// Weights & Biases offline runs: see [W&B Transaction Log] in wandb_writer.h.
#include "monitor/wandb_writer.h"

#include <fcntl.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <random>

#include "log/log.h"
#include "monitor/csv_monitor.h"
#include "monitor/proto_wire.h"
#include "zerotrain/error.h"

namespace zt::monitor {

namespace {

// datastore.py's LEVELDBLOG_* constants.
constexpr size_t kBlockBytes = 32768;
constexpr size_t kChunkHeaderBytes = 7;
constexpr size_t kChunkDataBytes = kBlockBytes - kChunkHeaderBytes;
enum ChunkType : uint8_t { kFull = 1, kFirst = 2, kMiddle = 3, kLast = 4 };

// Record's fields (wandb_internal.proto).
enum RecordField : int { kNum = 1, kHistory = 2, kSummary = 3, kRun = 17, kExit = 18 };

void put_chunk(std::string& out, ChunkType type, std::string_view data) {
  const uint8_t t = type;
  wire::put_fixed32(out, crc32_ieee(crc32_ieee(0, &t, 1), data.data(), data.size()));
  out.push_back(static_cast<char>(data.size() & 0xff));
  out.push_back(static_cast<char>(data.size() >> 8));
  out.push_back(static_cast<char>(t));
  out.append(data);
}

void put_string_field(std::string& out, int field, std::string_view s) {
  if (!s.empty()) wire::put_bytes(out, field, s);  // proto3: "" is not written
}

// HistoryItem and SummaryItem share their layout: key = 1, value_json = 16.
std::string encode_item(const WandbItem& item) {
  std::string m;
  put_string_field(m, 1, item.key);
  put_string_field(m, 16, item.value_json);
  return m;
}

std::string encode_record(int64_t num, int field, std::string_view body) {
  std::string r;
  if (num != 0) wire::put_int(r, kNum, num);
  wire::put_bytes(r, field, body);
  return r;
}

// wandb's generate_id(): 8 random characters of [a-z0-9].
std::string random_run_id() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd());
  std::uniform_int_distribution<int> pick(0, 35);
  std::string id;
  for (int i = 0; i < 8; ++i) id.push_back(kChars[pick(gen)]);
  return id;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32_ieee(uint32_t crc, const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
      t[b] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = (crc >> 8) ^ table[(crc ^ p[i]) & 0xff];
  return ~crc;
}

std::string wandb_file_header() {
  std::string h = ":W&B";
  h.push_back(static_cast<char>(0xE1));  // magic 0xBEE1, little-endian: the low 16 bits of
  h.push_back(static_cast<char>(0xBE));  // zlib.crc32(b"Weights & Biases")
  h.push_back(0);                        // version
  return h;
}

std::string frame_wandb_record(std::string_view data, uint64_t offset) {
  std::string out;
  size_t left = kBlockBytes - offset % kBlockBytes;
  if (left < kChunkHeaderBytes) {  // no room for a chunk header: pad the block
    out.append(left, '\0');
    left = kBlockBytes;
  }
  if (data.size() + kChunkHeaderBytes <= left) {
    put_chunk(out, kFull, data);
    return out;
  }
  // FIRST fills the block (possibly with no data at all, as wandb's writers do when the
  // block has exactly a header's room left); MIDDLEs fill whole blocks; LAST the rest.
  size_t used = left - kChunkHeaderBytes;
  put_chunk(out, kFirst, data.substr(0, used));
  while (data.size() - used > kChunkDataBytes) {
    put_chunk(out, kMiddle, data.substr(used, kChunkDataBytes));
    used += kChunkDataBytes;
  }
  put_chunk(out, kLast, data.substr(used));
  return out;
}

std::string encode_wandb_run(int64_t num, const WandbRun& run) {
  std::string m;
  put_string_field(m, 1, run.run_id);
  put_string_field(m, 2, run.entity);
  put_string_field(m, 3, run.project);
  put_string_field(m, 6, run.group);
  put_string_field(m, 7, run.job_type);
  put_string_field(m, 8, run.display_name);
  put_string_field(m, 13, run.host);
  if (run.start_seconds != 0 || run.start_nanos != 0) {
    std::string ts;  // google.protobuf.Timestamp
    if (run.start_seconds != 0) wire::put_int(ts, 1, run.start_seconds);
    if (run.start_nanos != 0) wire::put_int(ts, 2, run.start_nanos);
    wire::put_bytes(m, 17, ts);
  }
  return encode_record(num, kRun, m);
}

std::string encode_wandb_history(int64_t num, int64_t step, const std::vector<WandbItem>& items) {
  std::string m;
  for (const auto& item : items) wire::put_bytes(m, 1, encode_item(item));
  std::string s;  // HistoryStep, written even for step 0, as wandb does
  if (step != 0) wire::put_int(s, 1, step);
  wire::put_bytes(m, 2, s);
  return encode_record(num, kHistory, m);
}

std::string encode_wandb_summary(int64_t num, const std::vector<WandbItem>& items) {
  std::string m;
  for (const auto& item : items) wire::put_bytes(m, 1, encode_item(item));
  return encode_record(num, kSummary, m);
}

std::string encode_wandb_exit(int64_t num, int32_t exit_code, int32_t runtime_s) {
  std::string m;
  if (exit_code != 0) wire::put_int(m, 1, exit_code);
  if (runtime_s != 0) wire::put_int(m, 2, runtime_s);
  return encode_record(num, kExit, m);
}

std::string wandb_json_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return python_repr(v);
}

// ---- WandbWriter --------------------------------------------------------------------

WandbWriter::WandbWriter(const std::string& root, WandbRun run) : run_(std::move(run)) {
  if (run_.run_id.empty()) run_.run_id = random_run_id();
  if (run_.start_seconds == 0 && run_.start_nanos == 0) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    run_.start_seconds = ns / 1000000000;
    run_.start_nanos = static_cast<int32_t>(ns % 1000000000);
  }
  start_time_ = double(run_.start_seconds) + run_.start_nanos * 1e-9;

  // wandb names the directory by the local start time (run-dir's "%Y%m%d_%H%M%S").
  const std::time_t t = static_cast<std::time_t>(run_.start_seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d_%H%M%S", &tm);
  dir_ = (root.empty() ? std::string("wandb") : root) + "/offline-run-" + stamp + "-" + run_.run_id;
  std::error_code ec;
  std::filesystem::create_directories(dir_ + "/files", ec);  // files/: see [W&B Transaction Log]
  ZT_CHECK(!ec, "wandb: cannot create the run directory '", dir_, "': ", ec.message(),
           " (set WANDB_DIR to a writable directory)");
  path_ = dir_ + "/run-" + run_.run_id + ".wandb";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ZT_CHECK(fd >= 0, "wandb: cannot create '", path_, "': ", std::strerror(errno),
           " (set WANDB_DIR to a writable directory)");
  file_ = ::fdopen(fd, "wb");
  ZT_CHECK(file_ != nullptr, "wandb: cannot open '", path_, "': ", std::strerror(errno));

  const std::string header = wandb_file_header();
  ZT_CHECK(std::fwrite(header.data(), 1, header.size(), file_) == header.size(), "wandb: cannot write '", path_,
           "': ", std::strerror(errno));
  offset_ = header.size();
  append(encode_wandb_run(++num_, run_));
  flush();
}

WandbWriter::~WandbWriter() {
  try {
    finish(std::uncaught_exceptions() > 0 ? 1 : 0);
  } catch (const std::exception& e) {
    zt::log::warn("%s", e.what());
  }
}

void WandbWriter::append(const std::string& record) {
  const std::string bytes = frame_wandb_record(record, offset_);
  ZT_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size(), "wandb: cannot write '", path_,
           "': ", std::strerror(errno));
  offset_ += bytes.size();
}

void WandbWriter::log(std::string_view key, double value, int64_t step, double wall_time) {
  ZT_ASSERT(file_ != nullptr, "WandbWriter::log after finish");
  if (row_open_ && step != row_step_) write_row();
  row_open_ = true;
  row_step_ = step;
  row_time_ = wall_time;
  const std::string json = wandb_json_number(value);
  for (auto& item : row_) {
    if (item.key == key) {  // the same key twice in a row: the last value counts, as in wandb
      item.value_json = json;
      return;
    }
  }
  row_.push_back({std::string(key), json});
}

void WandbWriter::write_row() {
  row_.push_back({"_runtime", wandb_json_number(row_time_ - start_time_)});
  row_.push_back({"_timestamp", wandb_json_number(row_time_)});
  row_.push_back({"_step", std::to_string(row_step_)});
  append(encode_wandb_history(++num_, row_step_, row_));
  for (auto& item : row_) {
    auto [it, added] = summary_index_.try_emplace(item.key, summary_.size());
    if (added) summary_.push_back(item);
    else summary_[it->second].value_json = item.value_json;
  }
  row_.clear();
  row_open_ = false;
}

void WandbWriter::flush() {
  ZT_CHECK(std::fflush(file_) == 0, "wandb: cannot write '", path_, "': ", std::strerror(errno));
}

void WandbWriter::finish(int exit_code) {
  if (!file_) return;
  struct Closer {  // the file is closed even when a write below throws
    std::FILE*& f;
    ~Closer() {
      std::fclose(f);
      f = nullptr;
    }
  } closer{file_};
  if (row_open_) write_row();
  if (!summary_.empty()) append(encode_wandb_summary(++num_, summary_));
  append(encode_wandb_exit(++num_, exit_code, static_cast<int32_t>(std::lround(unix_now() - start_time_))));
  flush();
}

}  // namespace zt::monitor
