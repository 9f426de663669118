// Small file and process helpers for the tests that check bytes a writer produced
// (TensorBoard event files, wandb runs) and read them back with another program. Header-only.
#pragma once
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <utility>

#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "ckpt/fs.h"

namespace zt::test_support {

// Lower-case hex of every byte.
inline std::string hex(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs `cmd` under /bin/sh; returns its stdout (stderr untouched) and its exit status (-1
// when it could not start or did not exit normally).
inline std::pair<std::string, int> run_stdout(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {"", -1};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  return {out, WIFEXITED(st) ? WEXITSTATUS(st) : -1};
}

// A fresh directory under the build tree (ZT_BINARY_DIR/<prefix>XXXXXX), removed with
// everything in it at scope exit (ckpt::remove_tree, not fs::remove_all: see ckpt/fs.h).
struct BuildTempDir {
  explicit BuildTempDir(const std::string& prefix) {
    std::string t = std::string(ZT_BINARY_DIR) + "/" + prefix + "XXXXXX";
    EXPECT_NE(mkdtemp(t.data()), nullptr);
    path = t;
  }
  ~BuildTempDir() { zt::ckpt::remove_tree(path); }
  BuildTempDir(const BuildTempDir&) = delete;
  BuildTempDir& operator=(const BuildTempDir&) = delete;
  std::string path;
};

}  // namespace zt::test_support
