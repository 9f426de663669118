// Flag helpers shared by the zerotrain subcommands.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "zerotrain/error.h"

namespace zt::cli {

// A bad command line (unknown flag, missing, malformed or out-of-range value): main()
// prints its one-line message, which starts with the command ("train: --steps: 'abc' is
// not a non-negative integer"), as "zerotrain <message>" and exits 2; other errors exit 1.
// See [CLI Flags] in flags.h.
class UsageError : public ConfigError {
  using ConfigError::ConfigError;
};

// `value` of `flag` as a non-negative integer ("1e6" is fine); UsageError naming the
// command, the flag and the value otherwise.
int64_t parse_count(const std::string& command, const std::string& flag, const std::string& value);
// `value` of `flag` as a finite number >= `min`; UsageError naming the command, the flag and
// the value otherwise.
double parse_number(const std::string& command, const std::string& flag, const std::string& value,
                    double min = -std::numeric_limits<double>::infinity());

// An output directory given by `flag`: throws ConfigError unless DIR is a directory
// this process can create files in, or can be created (its nearest existing ancestor is
// such a directory). Nothing is created; a probe file is made and removed.
void check_output_dir(const std::string& command, const std::string& flag, const std::string& dir);
// `train --save DIR [--load LOAD]`, before the first step: DIR passes check_output_dir
// and does not lie in the checkpoint LOAD resumes from (LOAD/<latest tag>).
void check_save_dir(const std::string& save, const std::string& load);
// `path` is `dir` or lies under it (both made absolute, symbolic links resolved where
// they exist).
bool path_within(const std::string& path, const std::string& dir);

// Fills the top-level batch keys a DeepSpeed config leaves "auto" (as Hugging Face's
// trainer does) from the flags: micro (0 = not given, default 8), accum (0 = not given,
// default 1), clip for "auto" gradient_clipping. A given micro or accum overrides the
// config, and train_batch_size is then derived instead of checked.
void fill_batch_auto(nlohmann::json& j, int64_t micro, int64_t accum, double clip);

// Fills what a Hugging Face style config leaves "auto" beyond the batch, as the Hugging
// Face trainer does from its arguments: bf16.enabled from --bf16 and fp16.enabled from
// --fp16 (an "auto" without its flag is false: fp32, the trainer's default), and
// optimizer.params.lr from --lr (lr < 0: not given; an "auto" lr without it keeps
// DeepSpeed's default, which Config reports in auto_defaulted). A flag also sets an absent
// key. A flag that contradicts an explicit value (bf16.enabled false with --bf16, another
// lr than --lr) or --bf16 with --fp16 is a ConfigError naming both. Returns the "auto"
// keys it set to false for want of a flag (for the run's warning).
std::vector<std::string> fill_precision_auto(nlohmann::json& j, bool bf16, bool fp16, double lr);

// Applies `--set KEY.PATH=VALUE` overrides to a config, in order, before it is validated
// (so an override is checked exactly like the file: a misspelt key is named with a
// suggestion). VALUE is read as JSON when it parses (3, 1e-4, true, null, {"a": 1},
// "auto" with its quotes), else as a string (auto, cpu). Missing objects on the path are
// created. An override without '=' or with an empty key is a UsageError naming it; a path
// through a value that is not an object is a ConfigError naming the path.
void apply_set_overrides(nlohmann::json& j, const std::vector<std::string>& sets, const std::string& command);

// Writes the parallel degrees of `train --tp/--pp/--ep` (-1 = not given) into the config's
// DeepSpeed keys (tensor_parallel.autotp_size, pipeline.stages, expert_parallel.enabled and
// autoep_size), so that Config validates and reports them once. A flag whose degree differs
// from one the config sets is a ConfigError naming both.
void fill_parallel_flags(nlohmann::json& j, int64_t tp, int64_t pp, int64_t ep);

// The path of the running `zerotrain` executable (/proc/self/exe).
std::string self_exe();

}  // namespace zt::cli

namespace zt {
struct Config;
}
namespace zt::cli {
// `train`, before the first step: no NVMe swap directory (offload_optimizer / offload_param
// nvme_path) lies inside --save DIR or the --load checkpoint directory, where swap files
// would sit among the checkpoints. A ConfigError names the key, both paths and the fix.
void check_swap_dirs(const Config& cfg, const std::string& save, const std::string& load);
}  // namespace zt::cli
