// Layers into pipeline stages. See pipe/partition.h.
#include "pipe/partition.h"

#include <algorithm>
#include <limits>
#include <regex>

#include "config/pipeline_options.h"
#include "zerotrain/error.h"

namespace zt::pipe {

std::vector<int> partition_uniform(int num_items, int num_parts) {
  std::vector<int> parts(static_cast<size_t>(num_parts) + 1, 0);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[static_cast<size_t>(p)] = std::min(p, num_items);
    return parts;
  }
  const int chunk = num_items / num_parts;
  const int residual = num_items - chunk * num_parts;
  for (int p = 0; p <= num_parts; ++p) parts[static_cast<size_t>(p)] = p * chunk;
  // DeepSpeed adds one to every boundary after the i-th, for each of the first `residual`
  // parts: the first parts are the larger ones.
  for (int i = 0; i < residual; ++i)
    for (int p = i + 1; p <= num_parts; ++p) parts[static_cast<size_t>(p)] += 1;
  return parts;
}

std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int num_parts) {
  const int n = static_cast<int>(weights.size()), m = num_parts;
  if (n <= m) return partition_uniform(n, m);
  const double inf = std::numeric_limits<double>::infinity();
  const size_t cols = static_cast<size_t>(m) + 1;
  auto at = [cols](int i, int j) { return static_cast<size_t>(i) * cols + static_cast<size_t>(j); };
  std::vector<double> dp_max((static_cast<size_t>(n) + 1) * cols, inf), dp_min(dp_max), dp_cost(dp_max);
  std::vector<int> position(dp_max.size(), 0);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + static_cast<double>(weights[static_cast<size_t>(i)]);
  dp_max[at(0, 0)] = 0;
  dp_cost[at(0, 0)] = 0;
  for (int i = 1; i <= n; ++i) {
    for (int j = 1; j <= std::min(i, m); ++j) {
      for (int k = 0; k < i; ++k) {
        const double part = prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(k)];
        const double max_sum = std::max(dp_max[at(k, j - 1)], part);
        const double min_sum = std::min(dp_min[at(k, j - 1)], part);
        const double cost = max_sum - min_sum;
        if (dp_cost[at(i, j)] >= cost) {  // >=: the later k wins ties, as in DeepSpeed
          dp_cost[at(i, j)] = cost;
          dp_max[at(i, j)] = max_sum;
          dp_min[at(i, j)] = min_sum;
          position[at(i, j)] = k;
        }
      }
    }
  }
  std::vector<int> parts{n};
  for (int j = m; j >= 1; --j) parts.push_back(position[at(parts.back(), j)]);
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int parts, const std::string& method,
                                  const std::string& parts_key) {
  const int n = static_cast<int>(layers.size());
  ZT_CHECK_T(parts >= 1, ConfigError, parts_key, " = ", parts, " must be >= 1");
  ZT_CHECK_T(n >= parts, ConfigError, parts_key, " = ", parts, " is more than the model's ", n,
             " pipeline layers (embedding, blocks, head): every stage (model chunk) needs at least one layer; use at "
             "most ", n, " or a deeper model");
  std::vector<int> bounds;
  std::string lower;
  for (char c : method) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "uniform") {
    bounds = partition_uniform(n, parts);
  } else if (lower == "parameters" || lower == "best" || lower == "compute") {
    // [Compute Partition]: "compute" weighs the parameters a layer multiplies by -- its matrix
    // products' share of the step's FLOPs (attention's T-dependent part is left out: the same
    // in every block) -- so an embedding lookup weighs 0.
    const bool compute = lower == "compute";
    std::vector<int64_t> w;
    for (const auto& l : layers) w.push_back(compute && l.lookup ? 0 : l.params);
    bounds = partition_balanced(w, parts);
  } else if (lower.rfind("type:", 0) == 0) {
    const std::string pattern = method.substr(5);
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& e) {
      throw ConfigError("pipeline.partition = \"" + method + "\": the regular expression does not compile (" +
                        e.what() + ")");
    }
    std::vector<int64_t> w;
    int64_t matched = 0;
    for (const auto& l : layers) {
      w.push_back(std::regex_search(l.type, re) ? 1 : 0);
      matched += w.back();
    }
    if (matched == 0) {
      std::string types;
      for (const auto& l : layers)
        if (types.find(l.type) == std::string::npos) types += (types.empty() ? "" : ", ") + l.type;
      throw ConfigError("pipeline.partition = \"" + method + "\" matches no layer; the layer types are " + types);
    }
    bounds = partition_balanced(w, parts);
  } else {
    throw ConfigError(config::not_a_partition_method("pipeline.partition", method));
  }
  for (int s = 0; s < parts; ++s) {
    ZT_CHECK_T(bounds[static_cast<size_t>(s) + 1] > bounds[static_cast<size_t>(s)], ConfigError,
               "pipeline.partition = \"", method, "\" leaves stage ", s, " of ", parts,
               " without layers (a matched layer type too rare for the stages?): use \"parameters\" or "
               "\"uniform\", or fewer stages");
  }
  return bounds;
}

}  // namespace zt::pipe
