// `zerotrain launch -n N [--] PROGRAM ARGS...`: starts N ranks on this node.
//
// OpenMPI's mpirun is the process starter (it gives the ranks an MPI world, which
// zerotrain's CPU collectives and NCCL rendezvous use). Each rank runs through a small
// shim (`zerotrain-rank`, tools/rank_shim.cpp: no LibTorch, so it starts at once) that sets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE,
// prefixes every output line with the rank, forwards SIGINT/SIGTERM, and reports a
// failing rank with its exit code. When one rank fails, mpirun ends the others.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "zerotrain/error.h"

namespace zt::cli {
namespace {

bool on_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string p(path);
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string cand = p.substr(start, end - start) + "/" + prog;
    if (access(cand.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// The program a rank would exec: a path (with '/') must be an executable file, a bare
// name must be on PATH. Checked here so a typo gives one clear line instead of N
// failing ranks.
void check_runnable(const std::string& prog) {
  if (prog.find('/') != std::string::npos) {
    ZT_CHECK(access(prog.c_str(), X_OK) == 0, "launch: cannot run '", prog, "': no such executable file (",
             std::strerror(errno), ")");
  } else {
    ZT_CHECK(on_path(prog), "launch: cannot run '", prog, "': not found on PATH (give a path, e.g. ./", prog, ")");
  }
}

// "-n" values: a whole positive number, nothing else.
int parse_nproc(const char* v) {
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end != v && *end == '\0' && n >= 1 && n <= 1 << 20) ? static_cast<int>(n) : -1;
}

void launch_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: zerotrain launch -n N [--] PROGRAM [ARGS...]\n\n"
               "Starts N ranks of PROGRAM on this node (through OpenMPI's mpirun). Each rank gets\n"
               "RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; rank r uses GPU r when GPUs\n"
               "exist. Output lines are prefixed with [rank r]. If a rank fails, the others are\n"
               "ended and launch exits non-zero naming the rank and its exit code.\n"
               "Multi-node: use mpirun or srun directly (see docs/comm.md).\n");
}

}  // namespace

int cmd_launch(int argc, char** argv) {
  int n = -1;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      launch_usage(stdout);
      return 0;
    } else if (a == "-n" || a == "--nproc") {
      if (i + 1 >= argc) launch_usage(stderr);
      ZT_CHECK(i + 1 < argc, "launch: -n needs a number");
      n = parse_nproc(argv[++i]);
    } else if (a.rfind("-n", 0) == 0 && a.size() > 2 && a[2] != '-') {
      n = parse_nproc(a.c_str() + 2);
    } else if (a == "--") {
      ++i;
      break;
    } else if (!a.empty() && a[0] == '-') {
      launch_usage(stderr);
      throw Error("launch: unknown option '" + a + "'");
    } else {
      break;
    }
  }
  if (n < 1 || i >= argc) launch_usage(stderr);
  ZT_CHECK(n >= 1, "launch: give the number of ranks with -n N (N >= 1)");
  ZT_CHECK(i < argc, "launch: no program given (zerotrain launch -n N -- PROGRAM ARGS...)");
  check_runnable(argv[i]);
  ZT_CHECK(on_path("mpirun"), "launch: mpirun (OpenMPI) not found on PATH: run `make setup` or install openmpi-bin");

  // NVLink multicast stays off in every rank (it can take a shared host's GPUs down).
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
  setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
  // Small shared-memory transport defaults that work in containers.
  setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  setenv("PMIX_MCA_gds", "hash", 0);

  std::vector<std::string> args = {"mpirun", "-np", std::to_string(n), "--bind-to", "none", "--oversubscribe",
                                   "--mca", "btl", "self,vader,tcp", "--quiet"};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  std::string exe = self_exe();
  args.push_back(exe.substr(0, exe.rfind('/') + 1) + "zerotrain-rank");
  args.push_back("--");
  for (; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> cargs;
  for (auto& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execvp("mpirun", cargs.data());
  throw Error(std::string("launch: cannot exec mpirun: ") + std::strerror(errno));
}

}  // namespace zt::cli
