// The MFU peak table; see device_peak.h.
#include "monitor/device_peak.h"

#include <cctype>
#include <vector>

namespace zt::monitor {

namespace {

// A row matches when the name has the token `chip` and, if given, the token `variant`
// (tokens: the name split at spaces and '-', compared case-insensitively). Rows with a
// variant come before the chip's plain row, which is the SXM / default form.
struct Row {
  const char* chip;
  const char* variant;
  const char* model;
  double tflops;
};

// NVIDIA datasheets, dense (the "with sparsity" figures halved).
constexpr Row kRows[] = {
    {"H100", "PCIe", "H100 PCIe", 756},
    {"H100", "NVL", "H100 NVL", 835},
    {"H100", nullptr, "H100 SXM", 989},
    {"H800", "PCIe", "H800 PCIe", 756},
    {"H800", nullptr, "H800 SXM", 989},
    {"H200", "NVL", "H200 NVL", 835},
    {"H200", nullptr, "H200 SXM", 989},
    {"GH200", nullptr, "GH200", 989},
    {"B200", nullptr, "B200", 2250},
    {"GB200", nullptr, "GB200", 2500},
    {"A100", nullptr, "A100 (40GB / 80GB, SXM / PCIe)", 312},
    {"A800", nullptr, "A800", 312},
    {"A30", nullptr, "A30", 165},
    {"A40", nullptr, "A40", 149.7},
    {"A10", nullptr, "A10", 125},
    {"L40S", nullptr, "L40S", 362},
    {"L40", nullptr, "L40", 181},
    {"L4", nullptr, "L4", 121},
};

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> tokens(std::string_view name) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : name) {
    if (c == ' ' || c == '-' || c == '_') {
      if (!cur.empty()) out.push_back(upper(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) out.push_back(upper(cur));
  return out;
}

}  // namespace

std::optional<DevicePeak> dense_bf16_peak(std::string_view device_name) {
  const std::vector<std::string> t = tokens(device_name);
  auto has = [&](const char* tok) {
    const std::string u = upper(tok);
    for (const auto& x : t)
      if (x == u) return true;
    return false;
  };
  for (const auto& r : kRows) {
    if (has(r.chip) && (r.variant == nullptr || has(r.variant))) return DevicePeak{r.model, r.tflops};
  }
  return std::nullopt;
}

}  // namespace zt::monitor
