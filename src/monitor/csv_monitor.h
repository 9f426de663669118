// DeepSpeed's CSV monitor (deepspeed/monitor/csv_monitor.py), file for file: an event
// "A/B/c" goes to DIR/A_B_c.csv (every '/' and ' ' of the name becomes '_'), opened for
// appending; the first write of a file in this process adds the header row "step,c" (the
// name's last '/' part). Rows are "step,value" with Python's csv module's line ending
// "\r\n" and the value as Python's repr() prints a float (python_repr), so the files read
// the same as DeepSpeed's. Like DeepSpeed, a second run into the same directory appends
// (with a second header row).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

namespace zt::monitor {

// repr(float(v)) in Python 3: the shortest digits that read back as v, fixed notation for
// decimal exponents -4..15 (with ".0" when integral), else d.ddde+XX; "inf", "-inf", "nan".
std::string python_repr(double v);

class CsvMonitor {
 public:
  // Creates `dir` (with its parents); throws zt::Error naming it when it cannot.
  explicit CsvMonitor(std::string dir);
  // One row in the event's file. Throws zt::Error naming the file when it cannot be written.
  void write(std::string_view name, double value, int64_t step);
  const std::string& dir() const { return dir_; }
  // The file an event name goes to.
  std::string file_of(std::string_view name) const;

 private:
  std::string dir_;
  std::set<std::string, std::less<>> started_;  // files given their header in this process
};

}  // namespace zt::monitor
