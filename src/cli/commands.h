// Subcommands of the `zerotrain` executable. Each takes the arguments after its own
// name (argv[0] is the subcommand name) and returns the process exit code; errors are
// thrown as zt::Error and turned into exit codes by main().
#pragma once
#include <string>
#include <vector>

namespace zt::cli {
int cmd_launch(int argc, char** argv);        // zerotrain launch -n N [--] PROGRAM ARGS...
int cmd_check_config(int argc, char** argv);  // zerotrain check-config CONFIG.json [--world N]
int cmd_train(int argc, char** argv);         // zerotrain train --config ... --model ...
int cmd_convert(int argc, char** argv);       // zerotrain convert CKPT_DIR OUT.safetensors
int cmd_merge(int argc, char** argv);         // zerotrain merge --base DIR --adapter DIR --out DIR
int cmd_bench_adam(int argc, char** argv);    // zerotrain bench adam ...
int cmd_bench_sweep(int argc, char** argv);   // zerotrain bench --model ... (the ZeRO cost sweep)
int cmd_estimate(int argc, char** argv);      // zerotrain estimate --model ... --config ... --gpus N
int cmd_generate(int argc, char** argv);      // zerotrain generate --model-dir DIR --prompt TEXT
int cmd_tokenize(int argc, char** argv);      // zerotrain tokenize --tokenizer T --out DIR INPUT...

// The files a glob matches (sorted; ConfigError when none), or the path itself when it has
// no wildcard. Used by tokenize and train's --data / --val-data.
std::vector<std::string> expand_glob_or_self(const std::string& pattern);
}  // namespace zt::cli
