// TensorBoard event files written without TensorFlow or protobuf: the TFRecord framing
// and the few fields of tensorflow.Event / Summary that scalars need, encoded by hand.
//
// [TFRecord Framing] Each record is
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) |
//   data (length bytes)          | uint32 masked_crc32c(data)
// with masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (TensorFlow's
// core/lib/hash/crc32c.h: Mask). The data of each record is one serialized Event:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first event of a file carries file_version "brain.Event:2" (as TensorFlow's and
// torch.utils.tensorboard's writers do); every scalar is then one Event with one Value,
// as torch's SummaryWriter.add_scalar writes it. TensorBoard reads simple_value as a
// scalar of the tag at that step.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace zt::monitor {

// TensorFlow's masked CRC-32C of [data, data + n).
uint32_t masked_crc32c(const void* data, size_t n);

// This machine's name (gethostname; "localhost" when it has none), as event file names
// and wandb runs carry it.
std::string hostname();

// One framed record around `data` (see [TFRecord Framing]).
std::string frame_record(std::string_view data);

// Serialized Event messages.
std::string encode_file_version_event(double wall_time, std::string_view version = "brain.Event:2");
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

// Appends scalars to a new event file in `dir` (created with its parents), named as
// torch.utils.tensorboard names them: events.out.tfevents.<10-digit unix time>.<host>.<pid>.<n>,
// n the first number whose file does not exist yet. Not thread-safe.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& dir);  // throws zt::Error naming the path
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // wall_time: seconds since the Unix epoch.
  void add_scalar(std::string_view tag, double value, int64_t step, double wall_time);
  // Hands what was written to the OS (TensorBoard then sees it). Throws on a write error.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace zt::monitor
