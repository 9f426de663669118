// The `zerotrain` command: dispatches to subcommands; the only place that turns a
// zt::Error into an exit code.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include <torch/headeronly/version.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "log/log.h"
#include "zerotrain/error.h"
#include "zerotrain_version.h"

namespace {
struct Subcommand {
  const char* name;
  const char* help;
  int (*fn)(int, char**);
};
int cmd_bench(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "adam") == 0) return zt::cli::cmd_bench_adam(argc - 1, argv + 1);
  return zt::cli::cmd_bench_sweep(argc, argv);
}
const Subcommand kSubcommands[] = {
    {"train", "train a model with a DeepSpeed JSON config", zt::cli::cmd_train},
    {"launch", "start N ranks on this node: launch -n N [--] PROGRAM ARGS...", zt::cli::cmd_launch},
    {"convert", "consolidate a checkpoint into one safetensors file (HF GPT-2 names)", zt::cli::cmd_convert},
    {"merge", "a Hugging Face model with a peft LoRA adapter merged in: merge --base --adapter --out",
     zt::cli::cmd_merge},
    {"check-config", "validate a DeepSpeed config and print it resolved", zt::cli::cmd_check_config},
    {"tokenize", "text or JSONL files -> token shards (llm.c format) with a tokenizer.json", zt::cli::cmd_tokenize},
    {"generate", "continue a prompt with a Hugging Face model directory (look at what it learned)", zt::cli::cmd_generate},
    {"estimate", "memory per GPU by kind for a GPT-2 job, before running it", zt::cli::cmd_estimate},
    {"bench", "the ZeRO cost sweep (bench --model NAME) or the CPU Adam benchmark (bench adam)", cmd_bench},
};
void usage(std::FILE* out) {
  std::fprintf(out, "zerotrain: DeepSpeed's ZeRO training engine in C++\n\nusage: zerotrain <command> [args]\n\ncommands:\n");
  for (const auto& s : kSubcommands) std::fprintf(out, "  %-14s %s\n", s.name, s.help);
  std::fprintf(out, "\nzerotrain <command> --help (or zerotrain help <command>) shows a command's options;\n"
                   "zerotrain --version prints the version.\n");
}
// [Log Lines] in log/log.h: the global `--log-level LEVEL` (or `--log-level=LEVEL`) is
// taken out of argv before any command parses it, so every command accepts it; it wins
// over ZT_LOG_LEVEL, which it sets for the ranks `zerotrain launch` starts. It is looked
// for before a `--` and, for launch, only before the command name (the program's
// arguments are the program's). Returns false (and says why) on an invalid level.
bool take_log_level(int& argc, char** argv) {
  const char* value = nullptr;
  const char* from = "ZT_LOG_LEVEL";
  int out = 1;
  bool stop = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (stop || a == "--") {
      stop = true;
    } else if (a == "--log-level" || a.rfind("--log-level=", 0) == 0) {
      if (a == "--log-level") {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "zerotrain: usage error: --log-level needs a value (%s)\n", zt::log::kValidLevels);
          return false;
        }
        value = argv[++i];
      } else {
        value = argv[i] + std::strlen("--log-level=");
      }
      from = "--log-level";
      continue;
    } else if (out == 1 && a == "launch") {
      stop = true;  // launch's own options and the program's arguments stay as they are
    }
    argv[out++] = argv[i];
  }
  argv[out] = nullptr;
  argc = out;
  if (value == nullptr) value = std::getenv("ZT_LOG_LEVEL");
  if (value == nullptr || *value == '\0') return true;
  const auto level = zt::log::parse_level(value);
  if (!level) {
    std::fprintf(stderr, "zerotrain: usage error: %s '%s' is not a log level; valid levels: %s\n", from, value,
                 zt::log::kValidLevels);
    return false;
  }
  zt::log::set_level(*level);
  ::setenv("ZT_LOG_LEVEL", value, 1);  // the ranks that launch starts inherit it
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  if (!take_log_level(argc, argv)) return 2;
  if (argc >= 2 && (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version"))) {
    std::printf("zerotrain %s (LibTorch %s, %s)\n", ZT_VERSION, TORCH_VERSION,
                ZT_TORCH_CUDA[0] ? "CUDA " ZT_TORCH_CUDA : "CPU only");
    return 0;
  }
  // `zerotrain help CMD` = `zerotrain CMD --help`.
  if (argc == 3 && !std::strcmp(argv[1], "help")) {
    for (const auto& s : kSubcommands) {
      if (std::strcmp(argv[2], s.name) == 0) {
        char help[] = "--help";
        char* args[] = {argv[2], help, nullptr};
        return s.fn(2, args);
      }
    }
    std::fprintf(stderr, "zerotrain: unknown command '%s'\n\n", argv[2]);
    usage(stderr);
    return 2;
  }
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage(stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) == 0) {
      try {
        return s.fn(argc - 1, argv + 1);
      } catch (const zt::cli::UsageError& e) {
        std::fprintf(stderr, "zerotrain %s\n", e.what());  // one line that starts with the command
        return 2;
      } catch (const zt::Error& e) {
        std::fprintf(stderr, "zerotrain %s: error: %s\n", s.name, e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "zerotrain %s: unexpected error: %s\n", s.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "zerotrain: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
