#include "cli/profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "zerotrain/error.h"

namespace zt::cli {
namespace {

namespace prof = torch::profiler::impl;

// Which part of the model a kernel belongs to, from its name (cuBLAS/CUTLASS, flash/cuDNN
// attention, NCCL; everything else is elementwise, norms, reductions, copies).
const char* kind_of(const std::string& n) {
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("nccl")) return "communication (NCCL)";
  if (has("flash") || has("fmha") || has("attention") || (has("cudnn") && has("sdpa"))) return "attention";
  if (has("gemm") || has("cutlass") || has("nvjet") || has("sm90_xmma") || has("cublas") || has("Gemm")) return "matmul";
  if (has("Memcpy") || has("memcpy")) return "memcpy";
  if (has("Memset") || has("memset")) return "memset";
  if (has("softmax") || has("nll_loss") || has("cross_entropy") || has("log_softmax")) return "softmax / loss";
  if (has("layer_norm") || has("LayerNorm")) return "layernorm";
  if (has("adam") || has("Adam") || has("multi_tensor")) return "optimizer";
  if (has("gelu") || has("Gelu")) return "gelu";
  return "elementwise / other";
}

}  // namespace

StepProfiler::StepProfiler() = default;
StepProfiler::~StepProfiler() {
  if (active_) torch::autograd::profiler::disableProfiler();
}

void StepProfiler::start(bool cuda) {
  std::set<prof::ActivityType> acts = {prof::ActivityType::CPU};
  if (cuda) acts.insert(prof::ActivityType::CUDA);
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
  torch::autograd::profiler::prepareProfiler(config, acts);
  torch::autograd::profiler::enableProfiler(config, acts);
  active_ = true;
}

std::string StepProfiler::stop(const std::string& path, int rank, double step_wall_ms) {
  ZT_CHECK(active_, "profiler: stop() without start()");
  active_ = false;
  auto result = torch::autograd::profiler::disableProfiler();
  const std::string base = path + ".rank" + std::to_string(rank);
  result->save(base + ".json");

  std::map<std::string, std::pair<double, int64_t>> by_name;  // kernel -> (ms, count)
  std::map<std::string, double> by_kind;
  std::map<int64_t, double> by_stream;
  double total = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    const double ms = static_cast<double>(e.durationNs()) / 1e6;
    auto& slot = by_name[e.name()];
    slot.first += ms;
    slot.second += 1;
    by_kind[kind_of(e.name())] += ms;
    by_stream[e.deviceResourceId()] += ms;
    total += ms;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> top(by_name.begin(), by_name.end());
  std::sort(top.begin(), top.end(), [](const auto& x, const auto& y) { return x.second.first > y.second.first; });
  std::vector<std::pair<std::string, double>> kinds(by_kind.begin(), by_kind.end());
  std::sort(kinds.begin(), kinds.end(), [](const auto& x, const auto& y) { return x.second > y.second; });

  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof(buf), "[profile] rank %d: step wall %.2f ms; GPU kernel time %.2f ms on %zu stream(s)\n", rank,
                step_wall_ms, total, by_stream.size());
  s += buf;
  for (const auto& [stream, ms] : by_stream) {
    std::snprintf(buf, sizeof(buf), "  stream %lld: %.2f ms busy (%.0f%% of the step)\n", static_cast<long long>(stream), ms,
                  step_wall_ms > 0 ? 100 * ms / step_wall_ms : 0.0);
    s += buf;
  }
  s += "  by kind:\n";
  for (const auto& [k, ms] : kinds) {
    std::snprintf(buf, sizeof(buf), "    %-24s %9.2f ms  %5.1f%%\n", k.c_str(), ms, total > 0 ? 100 * ms / total : 0.0);
    s += buf;
  }
  s += "  top kernels (ms, calls, name):\n";
  for (size_t i = 0; i < std::min<size_t>(30, top.size()); ++i) {
    std::string name = top[i].first;
    if (name.size() > 150) {
      // resize + append rather than substr(...) + "...": GCC 12's -Warray-bounds misfires on the temporary.
      name.resize(150);
      name += "...";
    }
    std::snprintf(buf, sizeof(buf), "    %8.2f %6lld  %s\n", top[i].second.first, static_cast<long long>(top[i].second.second),
                  name.c_str());
    s += buf;
  }
  std::ofstream f(base + ".txt");
  f << s;
  ZT_CHECK(f.good(), "profiler: cannot write ", base, ".txt");
  return s;
}

}  // namespace zt::cli
