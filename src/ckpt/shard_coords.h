// Shard coordinates of checkpointed tensors: where a stored piece of a parameter sits in
// the model-parallel layout (tensor-parallel rank and size and the split dimension,
// pipeline stage, expert index), so that a loader can tell two tensor-parallel shards of
// one parameter apart and, later, re-shard. See docs/checkpoints.md ("Shard coordinates").
//
// [Shard Keys]
//  * A parameter is identified by its name and its coordinates: the "param id" is NAME for
//    the default coordinates (tp 1, stage 0, dense) and NAME[c] otherwise, with c e.g.
//    "tp1of2d0,pp1,ex3" (only the parts that differ from the default). Tensor keys in the
//    shard files are KIND/ID/BEGIN, so checkpoints of today's (default) layout keep the
//    keys of format version 1, and a version-1 manifest (no "shard" entries) reads as
//    every parameter at the default coordinates.
//  * The manifest's "params" list may hold one name several times with different
//    coordinates (one entry per stored shard). A loader asks for (name, coordinates) and
//    gets exactly that entry; anything else is a CheckpointError naming the tensor and
//    both layouts (re-sharding on load is for the features that need it).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zt::ckpt {

struct ShardCoord {
  int tp_rank = 0;   // tensor-parallel rank holding this piece, 0 .. tp_size-1
  int tp_size = 1;   // tensor-parallel degree the parameter is split over (1: whole)
  int tp_dim = -1;   // dimension split over tp (-1: not split; required when tp_size > 1)
  int pp_stage = 0;  // pipeline stage owning the parameter
  int expert = -1;   // expert index for an expert's parameter (-1: dense)

  bool is_default() const { return *this == ShardCoord{}; }
  bool operator==(const ShardCoord&) const = default;
};

// "" for the default coordinates, else e.g. "tp1of2d0,pp1,ex3" ([Shard Keys]).
std::string shard_suffix(const ShardCoord& c);
// NAME, or NAME[suffix]: the parameter's id in tensor keys and lookups.
std::string param_id(const std::string& name, const ShardCoord& c);
// "tp rank 1 of 2 (dim 0), pipeline stage 1, expert 3" (for messages).
std::string describe(const ShardCoord& c);
// Throws CheckpointError naming `what` when the coordinates are inconsistent.
void validate(const ShardCoord& c, const std::string& what);

nlohmann::json to_json(const ShardCoord& c);
// The "shard" object of a manifest params entry; absent (format version 1) = default.
// `what` names the entry for errors (a malformed object is a CheckpointError).
ShardCoord coord_of_entry(const nlohmann::json& param_entry, const std::string& what);

// How a tensor-parallel shard was cut from the full parameter, besides its coordinates
// ([TP Slices] in tp/shard.h): what a loader at another tp degree needs to re-shard it
// ([TP Reshard] in ckpt/tp_reshard.h). Stored as the params entry's "tp_split".
struct TpSplit {
  int64_t blocks = 1;                // equal blocks along tp_dim, each cut on its own
  int64_t padded = 0;                // tp_dim zero-padded to this size before cutting; 0 = none
  std::vector<int64_t> full_shape;   // the full, unpadded parameter's shape
  bool operator==(const TpSplit&) const = default;
};

// This rank's coordinates per trained parameter name; names not listed are at the
// default. Filled by the model-parallel features; empty today.
struct ShardLayout {
  std::map<std::string, ShardCoord> params;
  ShardCoord of(const std::string& name) const {
    auto it = params.find(name);
    return it == params.end() ? ShardCoord{} : it->second;
  }
  // Tensor parallelism over the checkpoint's ranks ([TP Reshard]): tp_size > 1 when the
  // saving group is dp x tp ranks and this rank is tp rank tp_rank; `splits` holds every
  // split parameter's cut. Such a save lists every tp rank's shard of a split parameter
  // and writes a replicated one from the tp rank 0 ranks only.
  int tp_rank = 0;
  int tp_size = 1;
  std::map<std::string, TpSplit> splits;
  const TpSplit* split_of(const std::string& name) const {
    auto it = splits.find(name);
    return it == splits.end() ? nullptr : &it->second;
  }
};

// The index in manifest["params"] of parameter `name` at coordinates `want`. Throws
// CheckpointError naming the tensor when the checkpoint has no such name, or holds it
// only at other coordinates (listing them: re-sharding is not supported yet). `where`
// names the checkpoint directory.
size_t find_param_entry(const nlohmann::json& params, const std::string& name, const ShardCoord& want,
                        const std::string& where);

}  // namespace zt::ckpt
