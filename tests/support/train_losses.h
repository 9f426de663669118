// The losses `zerotrain train` prints, read back from its output by the tests that drive
// the command (tests/unit/test_parallel_config.cpp, test_mixtral_cli.cpp,
// test_hf_tp_cli.cpp). Header-only.
#pragma once
#include <regex>
#include <string>
#include <vector>

namespace zt::test_support {

// The losses `zerotrain train --print-every 1 --steps N` prints ("Step S/N, Loss: L"), in
// order (every rank's lines that are in `out`).
inline std::vector<double> train_printed_losses(const std::string& out, int steps) {
  std::vector<double> v;
  const std::regex re("Step [0-9]+/" + std::to_string(steps) + ", Loss: ([0-9.]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[1].str()));
  return v;
}

}  // namespace zt::test_support
