// See [TP Reshard] in ckpt/tp_reshard.h.
#include "ckpt/tp_reshard.h"

#include <torch/torch.h>

#include <optional>

#include "zerotrain/error.h"

namespace zt::ckpt {
namespace {

int64_t reshard_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

TpSplit split_of_entry(const nlohmann::json& p, const std::string& what) {
  TpSplit s;
  try {
    const auto& j = p.at("tp_split");
    s.blocks = j.at("blocks").get<int64_t>();
    s.padded = j.at("padded").get<int64_t>();
    s.full_shape = j.at("full_shape").get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& ex) {
    throw CheckpointError(detail::cat(what, ": malformed \"tp_split\" entry: ", ex.what()));
  }
  return s;
}

}  // namespace

torch::Tensor tp_index_map(const TpSplit& split, int64_t dim, int rank, int size) {
  const auto& shape = split.full_shape;
  ZT_CHECK_T(dim >= 0 && dim < static_cast<int64_t>(shape.size()), CheckpointError, "tensor-parallel dim ", dim,
             " of a ", shape.size(), "-d parameter");
  auto idx = torch::arange(reshard_numel(shape), torch::kLong).view(shape);
  const int64_t full = shape[static_cast<size_t>(dim)];
  if (split.padded > full) {
    auto pad = shape;
    pad[static_cast<size_t>(dim)] = split.padded - full;
    idx = torch::cat({idx, torch::full(pad, -1, torch::kLong)}, dim);
  }
  const int64_t n = idx.size(dim);
  ZT_CHECK_T(split.blocks >= 1 && size >= 1 && n % (split.blocks * size) == 0, CheckpointError,
             "a tensor-parallel dimension of size ", n, " (", split.blocks, " block(s)) does not divide by tp ", size);
  const int64_t block = n / split.blocks, slice = block / size;
  std::vector<torch::Tensor> parts;
  for (int64_t b = 0; b < split.blocks; ++b) parts.push_back(idx.narrow(dim, b * block + rank * slice, slice));
  return torch::cat(parts, dim).contiguous().view({-1});
}

ParamRead plan_param_read(const nlohmann::json& params, const std::string& name, const ShardCoord& want,
                          const TpSplit* want_split, const std::vector<int64_t>& full_shape, const std::string& where) {
  const std::string what = detail::cat("checkpoint '", where, "': parameter '", name, "'");
  // The entries of `name` at this rank's pipeline stage and expert: the exact one, a whole
  // one, and the tp shards by size.
  std::optional<size_t> exact, whole;
  std::map<int, std::map<int, size_t>> shards;  // tp_size -> tp_rank -> entry
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].at("name") != name) continue;
    const ShardCoord c = coord_of_entry(params[i], what);
    if (c.pp_stage != want.pp_stage || c.expert != want.expert) continue;
    const bool has_split = params[i].contains("tp_split");
    if (c == want && (want.tp_size == 1 || (want_split != nullptr && has_split &&
                                            split_of_entry(params[i], what) == *want_split))) {
      exact = i;
    }
    if (c.tp_size == 1) whole = i;
    else if (has_split) shards[c.tp_size][c.tp_rank] = i;
  }
  ParamRead r;
  if (exact) {
    r.entry = *exact;
    r.id = param_id(name, want);
    return r;
  }
  // Re-shard only into a cut this rank knows (a tp coordinate without one, as the tests'
  // layouts give, keeps the exact-match rule).
  const bool can_want = want.tp_size == 1 || want_split != nullptr;
  std::vector<size_t> set;
  if (can_want && whole) {
    set.push_back(*whole);
  } else if (can_want) {
    for (const auto& [size, by_rank] : shards) {
      if (static_cast<int>(by_rank.size()) == size) {
        for (const auto& [rk, e] : by_rank) set.push_back(e);
        break;
      }
    }
  }
  if (set.empty()) {
    r.entry = find_param_entry(params, name, want, where);  // throws: no re-shardable set either
    r.id = param_id(name, want);
    return r;
  }
  // The full shape of the stored parameter, and the element sources.
  std::vector<int64_t> saved_full;
  for (size_t e : set) {
    const ShardCoord c = coord_of_entry(params[e], what);
    torch::Tensor map;
    std::vector<int64_t> f;
    if (c.tp_size == 1) {
      f = params[e].at("shape").get<std::vector<int64_t>>();
      map = torch::arange(reshard_numel(f), torch::kLong);
    } else {
      const TpSplit s = split_of_entry(params[e], what);
      f = s.full_shape;
      map = tp_index_map(s, c.tp_dim, c.tp_rank, c.tp_size);
      ZT_CHECK_T(map.numel() == reshard_numel(params[e].at("shape").get<std::vector<int64_t>>()), CheckpointError,
                 what, " at ", describe(c), ": its shape does not match its tp_split");
    }
    ZT_CHECK_T(saved_full.empty() || saved_full == f, CheckpointError, what, ": its tensor-parallel shards disagree "
               "on the full shape");
    saved_full = f;
    r.sources.emplace_back(param_id(name, c), map);
  }
  const std::vector<int64_t> model_full = want_split != nullptr ? want_split->full_shape : full_shape;
  ZT_CHECK_T(model_full.empty() || model_full == saved_full, CheckpointError, what, " has the full shape ",
             c10::IntArrayRef(saved_full), " but the model's is ", c10::IntArrayRef(model_full));
  r.full_numel = reshard_numel(saved_full);
  r.full_shape = saved_full;
  if (want.tp_size > 1) r.wanted = tp_index_map(*want_split, want.tp_dim, want.tp_rank, want.tp_size);
  return r;
}

torch::Tensor TpResharder::read(int param, const ParamRead& r, int64_t begin, int64_t end, const std::string& kind) {
  auto it = full_.find(kind);
  if (it == full_.end() || it->second.first != param) {
    full_.erase(kind);  // one full parameter per kind in memory
    auto full = torch::zeros({r.full_numel}, torch::kFloat);
    for (const auto& [id, map] : r.sources) {
      auto vals = fetch_(id, 0, map.numel(), kind);
      const auto keep = map >= 0;  // padding rows are not data of the full parameter
      full.index_put_({map.masked_select(keep)}, vals.masked_select(keep));
    }
    it = full_.emplace(kind, std::make_pair(param, full)).first;
  }
  const auto& full = it->second.second;
  if (!r.wanted.defined()) return full.narrow(0, begin, end - begin).clone();
  const auto idx = r.wanted.narrow(0, begin, end - begin);
  auto out = full.index_select(0, idx.clamp_min(0));
  out.masked_fill_(idx < 0, 0.0f);  // this layout's padding
  return out;
}

}  // namespace zt::ckpt
