// Shard coordinates of checkpointed tensors. See [Shard Keys] in ckpt/shard_coords.h.
#include "ckpt/shard_coords.h"

#include <vector>

#include "zerotrain/error.h"

namespace zt::ckpt {

std::string shard_suffix(const ShardCoord& c) {
  std::vector<std::string> parts;
  if (c.tp_size != 1 || c.tp_rank != 0 || c.tp_dim != -1) {
    parts.push_back(detail::cat("tp", c.tp_rank, "of", c.tp_size, c.tp_dim >= 0 ? detail::cat("d", c.tp_dim) : ""));
  }
  if (c.pp_stage != 0) parts.push_back(detail::cat("pp", c.pp_stage));
  if (c.expert != -1) parts.push_back(detail::cat("ex", c.expert));
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ",") + p;
  return s;
}

std::string param_id(const std::string& name, const ShardCoord& c) {
  const std::string s = shard_suffix(c);
  return s.empty() ? name : name + "[" + s + "]";
}

std::string describe(const ShardCoord& c) {
  std::string s = c.tp_size == 1 ? std::string("not tensor-parallel")
                                 : detail::cat("tp rank ", c.tp_rank, " of ", c.tp_size, " (dim ", c.tp_dim, ")");
  s += detail::cat(", pipeline stage ", c.pp_stage);
  s += c.expert < 0 ? std::string(", dense") : detail::cat(", expert ", c.expert);
  return s;
}

void validate(const ShardCoord& c, const std::string& what) {
  ZT_CHECK_T(c.tp_size >= 1 && c.tp_rank >= 0 && c.tp_rank < c.tp_size, CheckpointError, what,
             ": tensor-parallel rank ", c.tp_rank, " of ", c.tp_size, " is out of range (0 <= rank < size, size >= 1)");
  ZT_CHECK_T(c.tp_size == 1 ? c.tp_dim == -1 : c.tp_dim >= 0, CheckpointError, what, ": tensor-parallel size ",
             c.tp_size, " with split dimension ", c.tp_dim,
             " (a split parameter names the dimension it is split on, >= 0; a whole one has -1)");
  ZT_CHECK_T(c.pp_stage >= 0, CheckpointError, what, ": pipeline stage ", c.pp_stage, " is negative");
  ZT_CHECK_T(c.expert >= -1, CheckpointError, what, ": expert index ", c.expert, " (use -1 for a dense parameter)");
}

nlohmann::json to_json(const ShardCoord& c) {
  return {{"tp_rank", c.tp_rank},   {"tp_size", c.tp_size}, {"tp_dim", c.tp_dim},
          {"pp_stage", c.pp_stage}, {"expert", c.expert}};
}

ShardCoord coord_of_entry(const nlohmann::json& entry, const std::string& what) {
  ShardCoord c;
  if (!entry.contains("shard")) return c;  // format version 1: the default layout
  const nlohmann::json& s = entry.at("shard");
  try {
    c.tp_rank = s.at("tp_rank").get<int>();
    c.tp_size = s.at("tp_size").get<int>();
    c.tp_dim = s.at("tp_dim").get<int>();
    c.pp_stage = s.at("pp_stage").get<int>();
    c.expert = s.at("expert").get<int>();
  } catch (const nlohmann::json::exception& ex) {
    throw CheckpointError(detail::cat(what, ": malformed \"shard\" entry ", s.dump(), ": ", ex.what()));
  }
  validate(c, what);
  return c;
}

size_t find_param_entry(const nlohmann::json& params, const std::string& name, const ShardCoord& want,
                        const std::string& where) {
  std::vector<ShardCoord> held;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].at("name") != name) continue;
    const ShardCoord c = coord_of_entry(params[i], detail::cat("checkpoint '", where, "': parameter '", name, "'"));
    if (c == want) return i;
    held.push_back(c);
  }
  ZT_CHECK_T(!held.empty(), CheckpointError, "checkpoint '", where, "' has no parameter '", name,
             "' that this model trains");
  std::string list;
  for (const auto& c : held) list += detail::cat(list.empty() ? "" : "; ", describe(c));
  throw CheckpointError(detail::cat(
      "checkpoint '", where, "' holds parameter '", name, "' only as [", list, "], but this rank needs it as [",
      describe(want),
      "]: re-sharding tensor-parallel, pipeline or expert shards on load is not supported yet; load with the "
      "layout the checkpoint was saved with"));
}

}  // namespace zt::ckpt
