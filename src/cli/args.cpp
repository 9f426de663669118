#include "cli/args.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "ckpt/engine_checkpoint.h"
#include "ckpt/fs.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt::cli {

namespace {

// The whole of `value` as a double (strtod: no exceptions, "1e6" and "0x10" accepted).
bool full_double(const std::string& value, double& out) {
  if (value.empty() || std::isspace(static_cast<unsigned char>(value[0]))) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(value.c_str(), &end);
  return end == value.c_str() + value.size() && errno != ERANGE && std::isfinite(out);
}

}  // namespace

int64_t parse_count(const std::string& command, const std::string& flag, const std::string& value) {
  double d = 0;
  // 9e18 < 2^63: the cast below is defined.
  if (full_double(value, d) && d >= 0 && d < 9e18 && d == std::floor(d)) return static_cast<int64_t>(d);
  throw UsageError(command + ": " + flag + ": '" + value + "' is not a non-negative integer");
}

double parse_number(const std::string& command, const std::string& flag, const std::string& value, double min) {
  double d = 0;
  if (full_double(value, d) && d >= min) return d;
  char bound[32] = "";
  if (std::isfinite(min)) std::snprintf(bound, sizeof(bound), " >= %g", min);
  throw UsageError(command + ": " + flag + ": '" + value + "' is not a number" + bound);
}

void check_output_dir(const std::string& command, const std::string& flag, const std::string& dir) {
  namespace fs = std::filesystem;
  const auto fail = [&](const std::string& why) {
    throw ConfigError(command + ": " + flag + " " + dir + ": " + why);
  };
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  if (ec || dir.empty()) fail("not a usable path");
  // The directory itself, or the nearest ancestor that exists (it would be created).
  fs::path probe_dir = p;
  while (!fs::exists(fs::symlink_status(probe_dir, ec)) && probe_dir.has_parent_path() &&
         probe_dir.parent_path() != probe_dir)
    probe_dir = probe_dir.parent_path();
  if (!fs::is_directory(probe_dir, ec)) {
    fail(probe_dir == p ? "exists and is not a directory: give a directory"
                        : "cannot be created: " + probe_dir.string() + " is not a directory");
  }
  std::string probe = (probe_dir / ".zerotrain_write_probe_XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    fail(std::string(probe_dir == p ? "is not writable" : "cannot be created in " + probe_dir.string()) + " (" +
         std::strerror(errno) + "): give a directory you can write to");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_save_dir(const std::string& save, const std::string& load) {
  if (save.empty()) return;
  if (!load.empty()) {
    std::string tag;
    try {
      tag = ckpt::read_latest_tag(load);
    } catch (const Error&) {
      // --load reports a missing or bad checkpoint itself.
    }
    const std::string tag_dir = ckpt::join_path(load, tag);
    ZT_CHECK_T(tag.empty() || !path_within(save, tag_dir), ConfigError, "train: --save ", save,
               " is inside the checkpoint ", tag_dir, " that --load resumes from (a save there would write into it): "
               "use --save ", load, " (new tags beside it) or another directory");
  }
  check_output_dir("train", "--save", save);
}

bool path_within(const std::string& path, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  const fs::path d = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  if (ec) return false;
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty()) continue;  // a trailing separator
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
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

void apply_set_overrides(nlohmann::json& j, const std::vector<std::string>& sets, const std::string& command) {
  for (const auto& set : sets) {
    const auto eq = set.find('=');
    ZT_CHECK_T(eq != std::string::npos && eq > 0, UsageError, command, ": --set '", set,
               "' needs KEY.PATH=VALUE, e.g. --set zero_optimization.stage=3");
    const std::string path = set.substr(0, eq), text = set.substr(eq + 1);
    nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = text;  // a bare word: a string
    ZT_CHECK_T(j.is_object(), ConfigError, command, ": --set ", path, ": the config is not a JSON object");
    nlohmann::json* at = &j;
    std::string walked;
    size_t begin = 0;
    while (true) {
      const auto dot = path.find('.', begin);
      const std::string key = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
      ZT_CHECK_T(!key.empty(), UsageError, command, ": --set '", set, "': an empty key in '", path, "'");
      walked += (walked.empty() ? "" : ".") + key;
      if (dot == std::string::npos) {
        (*at)[key] = value;
        break;
      }
      nlohmann::json& next = (*at)[key];
      if (next.is_null()) next = nlohmann::json::object();
      ZT_CHECK_T(next.is_object(), ConfigError, command, ": --set ", path, ": ", walked, " is ", next.dump(),
                 " in the config, not a section: set ", walked, " itself");
      at = &next;
      begin = dot + 1;
    }
  }
}

std::vector<std::string> fill_precision_auto(nlohmann::json& j, bool bf16, bool fp16, double lr) {
  std::vector<std::string> unflagged;
  ZT_CHECK_T(!(bf16 && fp16), ConfigError, "train: --bf16 and --fp16 together: choose one precision");
  auto is_auto = [](const nlohmann::json& v) { return v.is_string() && v == "auto"; };
  auto precision = [&](const char* section, const char* flag, bool given) {
    const bool has = j.contains(section) && j[section].is_object() && j[section].contains("enabled");
    if (has && is_auto(j[section]["enabled"])) {
      j[section]["enabled"] = given;
      if (!bf16 && !fp16) unflagged.push_back(std::string(section) + ".enabled");  // no precision chosen at all
      return;
    }
    if (!given) return;
    if (has && j[section]["enabled"].is_boolean()) {
      ZT_CHECK_T(j[section]["enabled"].get<bool>(), ConfigError, "train: ", flag, " but the config sets ", section,
                 ".enabled = false: give the precision once (remove the flag, or set the key to true or \"auto\")");
      return;
    }
    if (!j.contains(section) || !j[section].is_object()) j[section] = nlohmann::json::object();
    j[section]["enabled"] = true;  // absent (a wrong type stays for Config to report)
  };
  precision("bf16", "--bf16", bf16);
  precision("fp16", "--fp16", fp16);
  if (lr < 0) return unflagged;
  if (!j.contains("optimizer") || !j["optimizer"].is_object()) return unflagged;  // Config reports a missing optimizer
  auto& o = j["optimizer"];
  if (!o.contains("params") || !o["params"].is_object()) o["params"] = nlohmann::json::object();
  auto& p = o["params"];
  if (p.contains("lr") && p["lr"].is_number()) {
    const double cfg_lr = p["lr"].get<double>();
    ZT_CHECK_T(cfg_lr == lr, ConfigError, "train: --lr ", lr, " but the config sets optimizer.params.lr = ", cfg_lr,
               ": give the learning rate once (remove the flag, or set the key to \"auto\")");
    return unflagged;
  }
  if (!p.contains("lr") || is_auto(p["lr"])) p["lr"] = lr;
  return unflagged;
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

namespace zt::cli {

void check_swap_dirs(const Config& cfg, const std::string& save, const std::string& load) {
  const auto& z = cfg.zero_optimization;
  const std::pair<const char*, const std::string*> swaps[] = {
      {"zero_optimization.offload_optimizer.nvme_path",
       z.offload_optimizer.device == OffloadDevice::nvme ? &z.offload_optimizer.nvme_path : nullptr},
      {"zero_optimization.offload_param.nvme_path",
       z.offload_param.device == OffloadDevice::nvme ? &z.offload_param.nvme_path : nullptr}};
  for (const auto& [key, path] : swaps) {
    if (!path || path->empty()) continue;
    for (const auto& [flag, dir] : {std::pair<const char*, const std::string*>{"--save", &save}, {"--load", &load}}) {
      ZT_CHECK_T(dir->empty() || !path_within(*path, *dir), ConfigError, "train: ", key, " '", *path, "' is inside ",
                 flag, " '", *dir, "': the swap files would sit among the checkpoints; point ", key,
                 " at a directory outside it");
    }
  }
}

}  // namespace zt::cli
