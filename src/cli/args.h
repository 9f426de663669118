// Flag helpers shared by the zerotrain subcommands.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace zt::cli {

// `value` of `flag` as a non-negative integer ("1e6" is fine); ConfigError naming the
// command and the flag otherwise.
int64_t parse_count(const std::string& command, const std::string& flag, const std::string& value);

// Fills the top-level batch keys a DeepSpeed config leaves "auto" (as Hugging Face's
// trainer does) from the flags: micro (0 = not given, default 8), accum (0 = not given,
// default 1), clip for "auto" gradient_clipping. A given micro or accum overrides the
// config, and train_batch_size is then derived instead of checked.
void fill_batch_auto(nlohmann::json& j, int64_t micro, int64_t accum, double clip);

// Writes the parallel degrees of `train --tp/--pp/--ep` (-1 = not given) into the config's
// DeepSpeed keys (tensor_parallel.autotp_size, pipeline.stages, expert_parallel.enabled and
// autoep_size), so that Config validates and reports them once. A flag whose degree differs
// from one the config sets is a ConfigError naming both.
void fill_parallel_flags(nlohmann::json& j, int64_t tp, int64_t pp, int64_t ep);

// The path of the running `zerotrain` executable (/proc/self/exe).
std::string self_exe();

}  // namespace zt::cli
