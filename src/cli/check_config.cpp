// zerotrain check-config CONFIG.json [--world N]: validates a DeepSpeed config the way
// zerotrain reads it and prints it resolved (stdout: pretty JSON, every default filled;
// stderr: batch sizes, parallel degrees, precision, "auto" keys, settings not supported yet).
// Exit 0: valid and runnable; 1: errors or settings not supported yet; 2: bad usage.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "config/notes.h"
#include "config/pipeline_options.h"
#include "config/tensor_parallel_options.h"
#include "parallel/topology.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt::cli {
namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: zerotrain check-config CONFIG.json [--world N] [--set KEY.PATH=VALUE ...]\n\n"
               "Validates a DeepSpeed JSON config and prints it resolved: every key with the value\n"
               "zerotrain uses (DeepSpeed's defaults filled, batch sizes derived for N data-parallel\n"
               "ranks). Errors name the key path and the fix. Keys left as \"auto\" for the launcher\n"
               "(batch sizes, gradient_clipping) are reported and shown as \"auto\".\n\n"
               "options:\n"
               "  --set K=V   override a key before the check (repeatable; V is JSON, or a string)\n"
               "  --world N   ranks in all (default 1; also -n N); the batch sizes count the data-parallel\n"
               "              ones, N / (tp x pp) (tensor_parallel.autotp_size, pipeline.stages)\n"
               "  --help      this text\n\n"
               "exit status: 0 valid, 1 errors or settings not supported yet, 2 bad usage\n");
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

nlohmann::json::json_pointer pointer(const std::string& dotted) {
  std::string p;
  size_t start = 0;
  while (true) {
    size_t dot = dotted.find('.', start);
    std::string segment = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    p += '/';
    for (char ch : segment) p += ch == '~' ? "~0" : ch == '/' ? "~1" : std::string(1, ch);  // RFC 6901
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return nlohmann::json::json_pointer(p);
}

const char* dtype_name(const Config& c) {
  if (c.fp16.enabled) return "fp16 compute, fp32 master weights";
  if (c.bf16.enabled) return "bf16 compute, fp32 master weights";
  return "fp32";
}

}  // namespace

int cmd_check_config(int argc, char** argv) {
  int world = 1;
  std::vector<std::string> sets, paths;
  Flags flags("check-config");
  flags.count("--world,-n", world, 1, 1 << 20);
  flags.list("--set", sets);
  flags.positionals(paths, "one CONFIG.json", 1, 1);
  if (!flags.parse(argc, argv)) {
    usage(stdout);
    return 0;
  }
  const std::string& path = paths[0];

  nlohmann::json json = Config::read_json_file(path);
  ZT_CHECK_T(json.is_object(), ConfigError, path, ": a DeepSpeed config is a JSON object ({...})");
  apply_set_overrides(json, sets, "check-config");
  // "auto" keys that need a value from the launcher get placeholders so that everything
  // else can still be checked; they print as "auto".
  std::vector<std::string> left, defaulted;
  nlohmann::json probe = json;
  for (const auto& a : Config::auto_keys(json)) {
    if (!a.needs_value) continue;
    left.push_back(a.path);
    if (a.path.find('.') == std::string::npos) {
      probe.erase(a.path);
    } else {
      probe[pointer(a.path)] = 1;
    }
  }
  if (!probe.contains("train_batch_size") && !probe.contains("train_micro_batch_size_per_gpu") && !left.empty())
    probe["train_micro_batch_size_per_gpu"] = 1;
  bool batch_left = false;
  for (const auto& k : left)
    batch_left = batch_left || k == "train_batch_size" || k == "train_micro_batch_size_per_gpu" ||
                 k == "gradient_accumulation_steps";

  Config c = Config::parse(probe, world, path);
  const auto notes = config::config_notes(json, c);
  nlohmann::json out = c.to_json();
  for (const auto& k : left) out[pointer(k)] = "auto";
  std::printf("%s\n", out.dump(2).c_str());

  if (batch_left) {
    std::fprintf(stderr, "batch: not resolved (\"auto\"): filled by zerotrain train from its flags\n");
  } else {
    std::fprintf(stderr,
                 "batch: train_batch_size %lld = train_micro_batch_size_per_gpu %lld x "
                 "gradient_accumulation_steps %lld x data-parallel ranks %d\n",
                 static_cast<long long>(c.train_batch_size), static_cast<long long>(c.train_micro_batch_size_per_gpu),
                 static_cast<long long>(c.gradient_accumulation_steps), c.dp_world_size);
  }
  std::fprintf(stderr, "parallel: %s (docs/parallel.md)\n", parallel::dims_of(c, world).to_string().c_str());
  std::fprintf(stderr, "precision: %s; ZeRO stage %lld\n", dtype_name(c),
               static_cast<long long>(c.zero_optimization.stage));
  if (!left.empty()) std::fprintf(stderr, "\"auto\" keys left for the launcher: %s\n", join(left).c_str());
  if (!c.auto_defaulted.empty())
    std::fprintf(stderr, "\"auto\" keys that took DeepSpeed's default: %s\n", join(c.auto_defaulted).c_str());
  if (!notes.empty()) {
    std::fprintf(stderr, "%zu key%s that change%s nothing in zerotrain (accepted):\n", notes.size(),
                 notes.size() == 1 ? "" : "s", notes.size() == 1 ? "s" : "");
    for (const auto& n : notes) std::fprintf(stderr, "  - %s\n", n.c_str());
  }
  // A pipeline config is train's (its pipeline path, [Pipeline Train]), and so is a
  // tensor-parallel one ([Tensor-Parallel Train]), and both at once (GPT-2 in tp x pp,
  // [Pipeline x Tensor Parallel] in pipe/gpt2_pipe.h).
  config::drop_pipeline_stages_note(c.not_supported_yet);
  config::drop_tensor_parallel_note(c.not_supported_yet);
  if (!c.not_supported_yet.empty()) {
    std::fprintf(stderr, "%s: %zu setting%s not supported yet by zerotrain:\n", path.c_str(),
                 c.not_supported_yet.size(), c.not_supported_yet.size() == 1 ? "" : "s");
    for (const auto& m : c.not_supported_yet) std::fprintf(stderr, "  - %s\n", m.c_str());
    return 1;
  }
  std::fprintf(stderr, "OK: %s is valid for zerotrain (world size %d)\n", path.c_str(), world);
  return 0;
}

}  // namespace zt::cli
