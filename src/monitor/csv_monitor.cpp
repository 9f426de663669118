// DeepSpeed's CSV monitor layout; see csv_monitor.h.
#include "monitor/csv_monitor.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "zerotrain/error.h"

namespace zt::monitor {

std::string python_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, e.g. "-1.2345e-05", "6.5536e+04".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e);
  std::string sign;
  if (!mant.empty() && mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;  // the significant digits without the point
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + ebuf;
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exp + 1) {
    out = digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
  }
  return sign + out;
}

CsvMonitor::CsvMonitor(std::string dir) : dir_(dir.empty() ? "." : std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  ZT_CHECK(!ec, "csv_monitor: cannot create the directory '", dir_, "': ", ec.message(),
           " (set csv_monitor.output_path to a writable directory)");
}

std::string CsvMonitor::file_of(std::string_view name) const {
  std::string f(name);
  for (char& c : f)
    if (c == '/' || c == ' ') c = '_';
  return dir_ + "/" + f + ".csv";
}

void CsvMonitor::write(std::string_view name, double value, int64_t step) {
  const std::string path = file_of(name);
  std::FILE* f = std::fopen(path.c_str(), "ab");
  ZT_CHECK(f != nullptr, "csv_monitor: cannot open '", path, "': ", std::strerror(errno));
  std::string text;
  if (started_.insert(path).second) {
    const size_t slash = name.rfind('/');
    text += "step," + std::string(slash == std::string_view::npos ? name : name.substr(slash + 1)) + "\r\n";
  }
  text += std::to_string(step) + "," + python_repr(value) + "\r\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  ZT_CHECK(ok && closed, "csv_monitor: cannot write '", path, "': ", std::strerror(errno));
}

}  // namespace zt::monitor
