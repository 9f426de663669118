// The "tensor_parallel" section's keys beyond autotp_size, read by the config layer to
// validate them and by `zerotrain train --tp` to apply them (src/cli/train.cpp,
// [Tensor-Parallel Train]). Kept out of zerotrain/config.h, as pipeline_options.h is, so
// that adding a key does not rebuild everything that includes the public config. See
// docs/tensor-parallel.md.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace zt::config {

struct TensorParallelOptions {
  /// The tensor-parallel degree (tensor_parallel.autotp_size; 0 and 1 both mean none).
  int64_t size = 1;
  /// zerotrain's key tensor_parallel.sequence_parallel (DeepSpeed has none; Megatron-LM's
  /// --sequence-parallel): the parts tp leaves replicated (norms, residual stream, the
  /// embedding sum) split along the sequence over the tp ranks (Korthikanti et al. 2022).
  /// true needs autotp_size > 1 (otherwise "takes effect only with ..."). false.
  bool sequence_parallel = false;
};

// The tensor_parallel section of a DeepSpeed config (JSON as read by
// Config::read_json_file). Throws ConfigError for a value of the wrong type; the rest of
// the section is checked by Config::parse.
TensorParallelOptions tensor_parallel_options(const nlohmann::json& ds_config);

// Removes from a config's not_supported_yet the note that tensor_parallel.autotp_size > 1
// is not supported (it holds for zt::initialize from the config alone): `zerotrain train
// --tp` and check-config, which build the tensor-parallel models, take such a config.
void drop_tensor_parallel_note(std::vector<std::string>& not_supported);

}  // namespace zt::config
