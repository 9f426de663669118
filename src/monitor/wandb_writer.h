// Weights & Biases offline runs written without wandb or protobuf: the run directory
// `wandb sync` uploads, its transaction log framed and its records encoded by hand.
//
// [W&B Transaction Log] An offline run is a directory
//   <root>/offline-run-<YYYYMMDD_HHMMSS>-<id>/run-<id>.wandb   (+ an empty files/)
// (`wandb sync` takes the directory, finds the *.wandb file in it and treats a run
// directory named offline-run-* as not yet uploaded; it writes wandb-summary.json and
// config.yaml into files/ to upload them and skips both, logging an error, without it).
// The .wandb file is
//   header: ":W&B" | uint16 0xBEE1 (little-endian) | uint8 version 0      (7 bytes)
// then LevelDB's log format (leveldb/doc/log_format.md) in 32 KiB blocks, the header
// counting as the first 7 bytes of block 0. A record goes out as chunks
//   uint32 checksum | uint16 length | uint8 type | length bytes    (little-endian)
// type FULL (1) when it fits the rest of the block, else FIRST (2) filling the block,
// MIDDLE (3) for whole blocks and LAST (4). A block with less than 7 bytes left is
// padded with zeros. The checksum is NOT LevelDB's masked CRC-32C: it is zlib's CRC-32
// (IEEE) over the type byte followed by the data, unmasked; i.e.
// zlib.crc32(data, zlib.crc32(bytes([type]))). Sources: wandb/sdk/internal/datastore.py
// (wandb <= 0.29: LEVELDBLOG_*, DataStore._write_data/_write_record) and, since wandb-core
// reads and writes these files, core/pkg/leveldb/record.go (CRCAlgoIEEE) and
// core/internal/transactionlog/ (wandbStoreVersion = 0).
//
// Each record's data is one serialized wandb.proto.wandb_internal_pb2.Record. The
// fields used (wandb/proto/wandb_internal.proto):
//   Record        { int64 num = 1; HistoryRecord history = 2; SummaryRecord summary = 3;
//                   RunRecord run = 17; RunExitRecord exit = 18; }   (one of 2/3/17/18)
//   RunRecord     { string run_id = 1; string entity = 2; string project = 3;
//                   string run_group = 6; string job_type = 7; string display_name = 8;
//                   string host = 13; google.protobuf.Timestamp start_time = 17; }
//   Timestamp     { int64 seconds = 1; int32 nanos = 2; }
//   HistoryRecord { repeated HistoryItem item = 1; HistoryStep step = 2; }
//   HistoryItem   { string key = 1; string value_json = 16; }   (SummaryItem: the same)
//   HistoryStep   { int64 num = 1; }
//   SummaryRecord { repeated SummaryItem update = 1; }
//   RunExitRecord { int32 exit_code = 1; int32 runtime = 2; }
// A run is one run record, a history record per row (items: the row's metrics plus
// _step, _runtime and _timestamp, which wandb's sender uploads as they are; step.num =
// _step), a summary record (each key's last value) and an exit record. wandb's own runs
// also carry header, telemetry, environment, stats and config records; `wandb sync`
// needs none of them (core/internal/runsync/runreader.go: a run record first, an exit
// record last, else it marks the run failed).
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace zt::monitor {

// ---- the format, as pure functions (tests/unit/test_wandb.cpp checks each) ------------

// zlib's crc32(crc, data, n): CRC-32 (IEEE 802.3, reflected 0xEDB88320), extendable.
uint32_t crc32_ieee(uint32_t crc, const void* data, size_t n);

// The 7-byte file header.
std::string wandb_file_header();

// The bytes that append `data` as one record to a .wandb file that is `offset` bytes long
// now (header included): padding if the block has less than a chunk header left, then
// the chunks. See [W&B Transaction Log].
std::string frame_wandb_record(std::string_view data, uint64_t offset);

// One metric of a history row or a summary: the key and its value as JSON.
struct WandbItem {
  std::string key;
  std::string value_json;
};

// What the run record says; empty strings are left out (the server's defaults: the
// API key's default entity, a generated display name).
struct WandbRun {
  std::string run_id;  // 8 characters [a-z0-9], as wandb generates them
  std::string entity, project, group, job_type, display_name, host;
  int64_t start_seconds = 0;  // Unix time
  int32_t start_nanos = 0;
};

// Serialized Record messages; `num` is the record's sequence number (1, 2, ...).
std::string encode_wandb_run(int64_t num, const WandbRun& run);
std::string encode_wandb_history(int64_t num, int64_t step, const std::vector<WandbItem>& items);
std::string encode_wandb_summary(int64_t num, const std::vector<WandbItem>& items);
std::string encode_wandb_exit(int64_t num, int32_t exit_code, int32_t runtime_s);

// A float as wandb's JSON has it (Python's json.dumps): repr() digits ("0.001",
// "65536.0", "1e-05"), and NaN, Infinity, -Infinity.
std::string wandb_json_number(double v);

// ---- the writer -----------------------------------------------------------------------

// Writes one offline run. log() collects the metrics of a row until a metric of another
// step comes, as wandb.log(..., step=s) does: a row is written when the step changes
// (and at finish), so the loss DeepSpeed logs at the samples before a step joins the
// previous step's row. Not thread-safe; one writer per run.
class WandbWriter {
 public:
  // Creates root/offline-run-<local start time>-<run_id>/ (with its parents, and files/)
  // and run-<run_id>.wandb in it, and writes the header and the run record. An empty
  // run.run_id gets a random one; a zero start time gets now. Throws zt::Error naming
  // the path that cannot be written.
  WandbWriter(const std::string& root, WandbRun run);
  // finish(1) when destroyed by an exception's unwinding, else finish(0); an error then
  // is logged, not thrown.
  ~WandbWriter();
  WandbWriter(const WandbWriter&) = delete;
  WandbWriter& operator=(const WandbWriter&) = delete;

  // One metric of the row at `step` (wandb's _step; DeepSpeed's samples); wall_time in
  // seconds since the Unix epoch. A step lower than the row's opens a row anyway (wandb
  // would drop it with a warning): the events zerotrain logs never go back.
  void log(std::string_view key, double value, int64_t step, double wall_time);
  // Hands the rows written so far to the OS. Throws zt::Error on a write error.
  void flush();
  // Writes the open row, the summary and the exit record (exit_code 0: the run finished,
  // else it failed), and closes the file. Later calls do nothing.
  void finish(int exit_code);

  const std::string& run_dir() const { return dir_; }
  const std::string& path() const { return path_; }
  const WandbRun& run() const { return run_; }

 private:
  void append(const std::string& record);
  void write_row();

  WandbRun run_;
  double start_time_ = 0;  // seconds since the epoch
  std::string dir_, path_;
  std::FILE* file_ = nullptr;
  uint64_t offset_ = 0;  // bytes in the file
  int64_t num_ = 0;      // last record number

  // The open row: its step, metrics in logging order and the wall time of its last metric.
  bool row_open_ = false;
  int64_t row_step_ = 0;
  double row_time_ = 0;
  std::vector<WandbItem> row_;
  // The summary: every key's last value, keys in first-logged order.
  std::vector<WandbItem> summary_;
  std::map<std::string, size_t, std::less<>> summary_index_;
};

}  // namespace zt::monitor
