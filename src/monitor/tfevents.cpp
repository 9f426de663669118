// TensorBoard event files: see [TFRecord Framing] in tfevents.h.
#include "monitor/tfevents.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "ckpt/crc32c.h"
#include "monitor/proto_wire.h"
#include "zerotrain/error.h"

namespace zt::monitor {

namespace {

constexpr uint32_t kMaskDelta = 0xa282ead8u;

}  // namespace

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = ckpt::crc32c(0, data, n);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  wire::put_fixed64(out, data.size());
  wire::put_fixed32(out, masked_crc32c(out.data(), 8));
  out.append(data);
  wire::put_fixed32(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::string encode_file_version_event(double wall_time, std::string_view version) {
  std::string e;
  wire::put_double(e, 1, wall_time);
  wire::put_bytes(e, 3, version);
  return e;
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;  // Summary.Value
  wire::put_bytes(v, 1, tag);
  wire::put_float(v, 2, value);
  std::string summary;
  wire::put_bytes(summary, 1, v);
  std::string e;
  wire::put_double(e, 1, wall_time);
  if (step != 0) {  // proto3: a zero scalar is not written
    wire::put_int(e, 2, step);
  }
  wire::put_bytes(e, 5, summary);
  return e;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir.empty() ? "." : dir, ec);
  ZT_CHECK(!ec, "tensorboard: cannot create the directory '", dir, "': ", ec.message(),
           " (set tensorboard.output_path to a writable directory)");
  const auto now = std::chrono::system_clock::now();
  const double wall = std::chrono::duration<double>(now.time_since_epoch()).count();
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%010lld", static_cast<long long>(wall));
  const std::string base = (dir.empty() ? std::string(".") : dir) + "/events.out.tfevents." + stamp + "." + hostname() +
                           "." + std::to_string(::getpid()) + ".";
  for (int n = 0;; ++n) {
    const std::string p = base + std::to_string(n);
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      file_ = ::fdopen(fd, "wb");
      ZT_CHECK(file_ != nullptr, "tensorboard: cannot open '", p, "': ", std::strerror(errno));
      path_ = p;
      break;
    }
    ZT_CHECK(errno == EEXIST, "tensorboard: cannot create the event file '", p, "': ", std::strerror(errno),
             " (set tensorboard.output_path to a writable directory)");
  }
  write(encode_file_version_event(wall));
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::write(const std::string& event) {
  const std::string rec = frame_record(event);
  ZT_CHECK(std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size(), "tensorboard: cannot write '", path_,
           "': ", std::strerror(errno));
}

void EventFileWriter::add_scalar(std::string_view tag, double value, int64_t step, double wall_time) {
  write(encode_scalar_event(wall_time, step, tag, static_cast<float>(value)));
}

void EventFileWriter::flush() {
  ZT_CHECK(std::fflush(file_) == 0, "tensorboard: cannot write '", path_, "': ", std::strerror(errno));
}

}  // namespace zt::monitor
