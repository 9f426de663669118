#include "cli/args.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "zerotrain/error.h"

namespace zt::cli {

int64_t parse_count(const std::string& command, const std::string& flag, const std::string& value) {
  try {
    size_t pos = 0;
    const double d = std::stod(value, &pos);
    if (pos == value.size() && d >= 0 && d == static_cast<double>(static_cast<int64_t>(d))) {
      return static_cast<int64_t>(d);
    }
  } catch (const std::exception&) {
  }
  throw ConfigError(command + ": " + flag + " needs a non-negative integer, got '" + value + "'");
}

void fill_batch_auto(nlohmann::json& j, int64_t micro, int64_t accum, double clip) {
  auto is_auto = [&](const char* k) { return j.contains(k) && j[k].is_string() && j[k] == "auto"; };
  if (is_auto("train_micro_batch_size_per_gpu") ||
      (!j.contains("train_micro_batch_size_per_gpu") && !j.contains("train_batch_size"))) {
    j["train_micro_batch_size_per_gpu"] = micro > 0 ? micro : 8;
  } else if (micro > 0) {
    j["train_micro_batch_size_per_gpu"] = micro;
  }
  if (is_auto("gradient_accumulation_steps")) j["gradient_accumulation_steps"] = accum > 0 ? accum : 1;
  else if (accum > 0) j["gradient_accumulation_steps"] = accum;
  if (is_auto("train_batch_size") || (micro > 0 || accum > 0)) j.erase("train_batch_size");
  if (is_auto("gradient_clipping")) j["gradient_clipping"] = clip;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  ZT_CHECK(n > 0, "cannot read /proc/self/exe: ", std::strerror(errno));
  buf[n] = '\0';
  return buf;
}

}  // namespace zt::cli
