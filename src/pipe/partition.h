// Cutting a sequence of layers into pipeline stages: DeepSpeed PipelineModule's
// partition_method (runtime/pipe/module.py `_partition_layers`, runtime/utils.py
// `partition_uniform` / `partition_balanced`), as pure functions.
//
//   "parameters"  (default) balance the trainable parameter counts of the layers
//   "uniform"     balance the number of layers
//   "type:REGEX"  balance the number of layers whose type name matches REGEX
//                 (case-insensitive search, e.g. "type:block" or "type:transformer")
//   "compute"     (zerotrain's; DeepSpeed has none: its "profile" is not implemented)
//                 balance the parameters that take part in a matrix product: an
//                 embedding (a lookup) weighs 0, a tied head its whole V x C. On
//                 Llama-3.2-1B at pp 2, "parameters" gives the stage that holds the
//                 embedding 8 decoder layers and the last 8 plus the head, whose GEMMs
//                 cost about 4 layers; "compute" cuts 10 | 6 + head ([Compute Partition])
//
// Balancing is DeepSpeed's linear-partition dynamic program: among the cuts into
// `parts` contiguous ranges it takes one minimising (largest - smallest) part weight,
// ties going to the later cut position, exactly as partition_balanced does. A result is
// parts + 1 boundaries: stage s holds layers [bounds[s], bounds[s+1]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zt::pipe {

struct LayerInfo {
  std::string type;    // class-like name the type:REGEX method matches ("GPT2Block")
  int64_t params = 0;  // trainable parameters (a tied layer counts its tied weight too)
  bool lookup = false; // its parameters are only indexed (an embedding): "compute" weighs it 0
};

std::vector<int> partition_uniform(int num_items, int num_parts);
std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int num_parts);

// The boundaries for `method` over `layers` into `parts` parts. ConfigError (naming
// pipeline.partition, the value and the fix) for an unknown method, a regex that does not
// compile or matches no layer, fewer layers than parts, or a part left without layers.
// `parts_key` names where the number of parts came from in the messages.
std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int parts, const std::string& method,
                                  const std::string& parts_key = "pipeline.stages");

}  // namespace zt::pipe
