// Layers point down (docs/architecture.md#layers): scans the source tree for project
// includes a folder may not use. Fails naming the file, the line and the rule.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {

// The project headers a file includes ("dir/name.h" and "zerotrain/name.h"), with line numbers.
std::vector<std::pair<int, std::string>> project_includes(const fs::path& file) {
  static const std::regex inc(R"(^\s*#\s*include\s*"([^"]+)\")");
  std::vector<std::pair<int, std::string>> out;
  std::ifstream in(file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::smatch m;
    if (std::regex_search(line, m, inc)) out.emplace_back(n, m[1].str());
  }
  return out;
}

struct Rule {
  std::string folder;                  // under src/
  std::vector<std::string> forbidden;  // include prefixes ("engine/", "zerotrain/engine.h")
  std::string why;
};

// Each violation as "src/<file>:<line> includes <header> (<why>)".
std::vector<std::string> violations(const fs::path& src, const std::vector<Rule>& rules, int* scanned = nullptr) {
  std::vector<std::string> out;
  for (const auto& r : rules) {
    const fs::path dir = src / r.folder;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (!e.is_regular_file()) continue;
      const auto ext = e.path().extension().string();
      if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh" && ext != ".inc") continue;
      if (scanned) ++*scanned;
      for (const auto& [line, header] : project_includes(e.path())) {
        for (const auto& f : r.forbidden) {
          if (header.rfind(f, 0) == 0) {
            out.push_back(fs::relative(e.path(), src.parent_path()).string() + ":" + std::to_string(line) +
                          " includes \"" + header + "\" (" + r.why + ")");
          }
        }
      }
    }
  }
  return out;
}

const std::string kUpper = "src/zero, src/ckpt, src/optim and src/comm sit below the engine, the models, the CLI "
                           "and the config parser";
const std::string kBase = "src/common and src/io are the bottom layer: they include only each other and "
                          "zerotrain/ headers";

const std::vector<Rule>& rules() {
  static const std::vector<std::string> lower_forbidden = {"engine/", "cli/", "models/", "config/", "bench/",
                                                           "estimate/", "data/", "zerotrain/engine.h",
                                                           "zerotrain/model.h"};
  static const std::vector<std::string> base_forbidden = {
      "engine/", "cli/", "models/", "config/", "bench/", "estimate/", "data/", "zero/", "ckpt/",
      "optim/",  "comm/", "offload/", "kernels/", "report/", "zerotrain/engine.h", "zerotrain/model.h"};
  static const std::vector<Rule> r = {
      {"zero", lower_forbidden, kUpper},
      {"ckpt", lower_forbidden, kUpper},
      {"optim", lower_forbidden, kUpper},
      {"comm", lower_forbidden, kUpper},
      {"offload", lower_forbidden, kUpper},
      {"common", base_forbidden, kBase},
      {"io", base_forbidden, kBase},
      {"engine", {"models/", "cli/", "bench/"}, "the engine knows models only through zerotrain/model.h"},
  };
  return r;
}

}  // namespace

TEST(Layers, LowerLayersIncludeNothingAbove) {
  const fs::path src = fs::path(ZT_SOURCE_DIR) / "src";
  int scanned = 0;
  const auto v = violations(src, rules(), &scanned);
  EXPECT_GT(scanned, 40) << "the scan found almost no sources under " << src;
  std::string all;
  for (const auto& s : v) all += "\n  " + s;
  EXPECT_TRUE(v.empty()) << v.size() << " include(s) point up:" << all;
}

TEST(Layers, ScannerFindsAForbiddenInclude) {
  // The check above can fail: a planted upward include in a scratch tree is reported.
  const fs::path root = fs::temp_directory_path() / ("zt_layers_" + std::to_string(::getpid()));
  fs::create_directories(root / "src" / "zero");
  fs::create_directories(root / "src" / "io");
  {
    std::ofstream(root / "src" / "zero" / "bad.h") << "#pragma once\n#include <vector>\n#include \"zero/ok.h\"\n"
                                                   << "  #  include \"engine/phase_timer.h\"\n";
    std::ofstream(root / "src" / "io" / "bad.cpp") << "#include \"io/safetensors.h\"\n#include \"zerotrain/engine.h\"\n";
  }
  const auto v = violations(root / "src", rules());
  fs::remove_all(root);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NE(v[0].find("src/zero/bad.h:4 includes \"engine/phase_timer.h\""), std::string::npos) << v[0];
  EXPECT_NE(v[1].find("src/io/bad.cpp:2 includes \"zerotrain/engine.h\""), std::string::npos) << v[1];
}
