// Checkpoints of tensor-parallel runs, loaded at any tensor-parallel degree.
//
// [TP Reshard]
//  * Saving. A run at dp x tp saves over all dp x tp ranks into one checkpoint: each split
//    parameter is stored as tp shards, one params entry per tp rank, at shard coordinates
//    (tp_rank, tp_size, tp_dim) ([Shard Keys]) plus "tp_split" {blocks, padded,
//    full_shape}: how the shard was cut from the full parameter ([TP Slices] in
//    tp/shard.h). Each shard's elements are ZeRO fragments as for any parameter (the dp
//    ranks of tp rank t write shard t's fragments, and no two ranks the same element). A
//    replicated parameter (LayerNorms, biases of row-parallel layers) is the same on every
//    tp rank: it is stored once, whole, at the default coordinates, by the tp rank 0 ranks.
//  * Loading. A rank asks for each parameter at its own coordinates. The entry at exactly
//    those coordinates (same tp degree, same cut) is read as it is. Otherwise, when the
//    checkpoint holds the parameter whole or as a complete set of tp shards with their cut,
//    the full parameter is assembled from them and this rank's slice is cut from it, for
//    the fp32 master and each optimizer state alike (one parameter and state kind in memory
//    at a time): tp 2 loads at tp 1, 4 or 2, and a tp 1 checkpoint loads at any tp. The
//    vocabulary padding is never stored as data of the full parameter: the padding rows of
//    a shard are dropped when assembling and are zero in a cut slice (what a padding row
//    holds in training: it gets no gradient, so Adam leaves it at 0).
//  * Anything else (an incomplete set of shards, another pipeline stage or expert) keeps
//    find_param_entry's CheckpointError naming the tensor and both layouts.
#pragma once
#include <torch/types.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/shard_coords.h"

namespace zt::ckpt {

// The full flat index of each element of tp rank `rank`'s slice (flattened, padding
// included) of a parameter cut as `split` along `dim` over `size` ranks; -1 for padding.
// Throws CheckpointError when the (padded) dimension does not divide by blocks x size.
torch::Tensor tp_index_map(const TpSplit& split, int64_t dim, int rank, int size);

// How one parameter is read from a checkpoint.
struct ParamRead {
  size_t entry = 0;  // direct: the params entry read as it is
  std::string id;    // direct: its param id
  // Re-sharded: the entries to assemble the full parameter from (param id, full flat
  // index of each stored element, -1 = padding), and the full index of each element this
  // rank needs (undefined: the whole parameter, in order).
  std::vector<std::pair<std::string, torch::Tensor>> sources;
  torch::Tensor wanted;
  int64_t full_numel = 0;
  std::vector<int64_t> full_shape;
  bool direct() const { return sources.empty(); }
};

// Plans the read of parameter `name` wanted at coordinates `want` (cut `want_split`, null
// when whole or unknown; `full_shape`: the model's full shape of it, empty = take the
// checkpoint's) from the manifest's `params`. Throws find_param_entry's CheckpointError
// when neither the exact entry nor a re-shardable set exists, and a CheckpointError naming
// both shapes when the full shapes differ. `where` names the checkpoint directory.
ParamRead plan_param_read(const nlohmann::json& params, const std::string& name, const ShardCoord& want,
                          const TpSplit* want_split, const std::vector<int64_t>& full_shape, const std::string& where);

// Elements [begin, end) of state `kind` of a re-sharded parameter; `fetch(id, begin, end,
// kind)` reads stored elements. Keeps the last assembled full parameter per kind (the
// engine imports a parameter's ranges one after another).
class TpResharder {
 public:
  using Fetch = std::function<torch::Tensor(const std::string& id, int64_t begin, int64_t end, const std::string& kind)>;
  explicit TpResharder(Fetch fetch) : fetch_(std::move(fetch)) {}
  torch::Tensor read(int param, const ParamRead& r, int64_t begin, int64_t end, const std::string& kind);

 private:
  Fetch fetch_;
  std::map<std::string, std::pair<int, torch::Tensor>> full_;  // kind -> (param, full flat fp32)
};

}  // namespace zt::ckpt
