// The stage interface's shared helpers. See pipe/stage.h.
#include "pipe/stage.h"

#include "zerotrain/error.h"

namespace zt::pipe {

StageLayers stage_layers(const std::vector<std::pair<int, int>>& chunks, int num_layers) {
  ZT_CHECK_T(!chunks.empty(), ConfigError, "a pipeline stage needs at least one chunk of layers");
  StageLayers out;
  int prev_end = 0;
  for (const auto& [b, e] : chunks) {
    ZT_CHECK_T(b >= prev_end && b < e && e <= num_layers, ConfigError, "pipeline stage chunk [", b, ", ", e,
               ") is not a range of the model's ", num_layers, " pipeline layers in order");
    prev_end = e;
    for (int l = b; l < e; ++l) {
      if (l == 0) {
        out.embedding = true;
      } else if (l == num_layers - 1) {
        out.head = true;
      } else {
        out.blocks.push_back(l - 1);
      }
    }
  }
  return out;
}

}  // namespace zt::pipe
