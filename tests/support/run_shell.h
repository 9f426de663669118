// Runs a shell command as a user would (a child process, stdout and stderr together) for
// the tests that drive the `zerotrain` command. Header-only.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace zt::test_support {

struct ShellRun {
  int code = -1;  // exit code (128+N when the command died of signal N; -1: not started)
  std::string output;
};

// `command` runs under /bin/sh with 2>&1 appended.
inline ShellRun run_shell(const std::string& command) {
  ShellRun r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) r.output += buf.data();
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace zt::test_support
