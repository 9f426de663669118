#include "cli/args.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

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

void fill_parallel_flags(nlohmann::json& j, int64_t tp, int64_t pp, int64_t ep) {
  // The degree a config key already gives (nullopt: absent, null or "auto").
  auto given = [&](const char* section, const char* key) -> std::optional<int64_t> {
    if (!j.contains(section) || !j[section].is_object() || !j[section].contains(key)) return std::nullopt;
    const auto& v = j[section][key];
    if (!v.is_number_integer()) return std::nullopt;  // "auto", null or a wrong type: Config reports it
    return v.get<int64_t>();
  };
  auto set = [&](const char* flag, int64_t degree, const char* section, const char* key, int64_t config_degree) {
    if (degree < 0) return;  // not given
    ZT_CHECK_T(degree >= 1, ConfigError, "train: ", flag, " must be at least 1");
    const auto old = given(section, key);
    ZT_CHECK_T(!old || config_degree == degree, ConfigError, "train: ", flag, " ", degree, " but the config sets ",
               section, ".", key, " = ", *old, ": give the degree once (remove the key or the flag)");
    if (!j.contains(section) || !j[section].is_object()) j[section] = nlohmann::json::object();
    j[section][key] = degree;
  };
  const auto autotp = given("tensor_parallel", "autotp_size");
  set("--tp", tp, "tensor_parallel", "autotp_size", autotp ? std::max<int64_t>(*autotp, 1) : 0);
  const auto stages = given("pipeline", "stages");
  set("--pp", pp, "pipeline", "stages", stages.value_or(0));
  set("--ep", ep, "expert_parallel", "autoep_size", given("expert_parallel", "autoep_size").value_or(0));
  if (ep > 1) j["expert_parallel"]["enabled"] = true;  // AutoEP's degree counts only when enabled
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  ZT_CHECK(n > 0, "cannot read /proc/self/exe: ", std::strerror(errno));
  buf[n] = '\0';
  return buf;
}

}  // namespace zt::cli
