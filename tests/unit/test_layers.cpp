// Layers point down (docs/architecture.md#layers): scans the source tree for project
// includes a folder may not use. Fails naming the file, the line and the rule.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace zt_test_layers {

namespace fs = std::filesystem;

namespace {

// The project headers a file includes ("dir/name.h" and "zerotrain/name.h"), with line
// numbers: lines of the form  [spaces] # [spaces] include [spaces] "header".
std::vector<std::pair<int, std::string>> project_includes(const fs::path& file) {
  std::vector<std::pair<int, std::string>> out;
  std::ifstream in(file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] != '#') continue;
    i = line.find_first_not_of(" \t", i + 1);
    if (i == std::string::npos || line.compare(i, 7, "include") != 0) continue;
    i = line.find_first_not_of(" \t", i + 7);
    if (i == std::string::npos || line[i] != '"') continue;
    const size_t end = line.find('"', i + 1);
    if (end == std::string::npos || end == i + 1) continue;
    out.emplace_back(n, line.substr(i + 1, end - i - 1));
  }
  return out;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
  ASSERT_TRUE(f.good()) << p;
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
  std::string tmpl = std::string(ZT_BINARY_DIR) + "/zt_layers_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl;
  const std::string root = tmpl;
  for (const char* d : {"/src", "/src/zero", "/src/io"}) ASSERT_EQ(::mkdir((root + d).c_str(), 0755), 0) << root << d;
  write_file(root + "/src/zero/bad.h",
             "#pragma once\n#include <vector>\n#include \"zero/ok.h\"\n  #  include \"engine/phase_timer.h\"\n");
  write_file(root + "/src/io/bad.cpp", "#include \"io/safetensors.h\"\n#include \"zerotrain/engine.h\"\n");
  const auto v = violations(fs::path(root) / "src", rules());
  for (const char* f : {"/src/zero/bad.h", "/src/io/bad.cpp"}) ::unlink((root + f).c_str());
  for (const char* d : {"/src/zero", "/src/io", "/src", ""}) ::rmdir((root + d).c_str());
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NE(v[0].find("src/zero/bad.h:4 includes \"engine/phase_timer.h\""), std::string::npos) << v[0];
  EXPECT_NE(v[1].find("src/io/bad.cpp:2 includes \"zerotrain/engine.h\""), std::string::npos) << v[1];
}

}  // namespace zt_test_layers
