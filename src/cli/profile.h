// `zerotrain train --profile STEP --profile-out PATH`: one training step under the Kineto
// profiler (the one behind torch.profiler). Writes PATH.rank<R>.json (a Chrome trace, open
// it in chrome://tracing or Perfetto) and PATH.rank<R>.txt: GPU kernel time by kind
// (matmul, attention, communication, elementwise/other) and the top kernels, next to the
// step's wall time, so "where does the time go" has an answer without other tools.
#pragma once
#include <memory>
#include <string>

namespace zt::cli {

class StepProfiler {
 public:
  StepProfiler();
  ~StepProfiler();
  void start(bool cuda);
  // Stops, writes the two files and returns the summary text.
  std::string stop(const std::string& path, int rank, double step_wall_ms);

 private:
  bool active_ = false;
};

}  // namespace zt::cli
