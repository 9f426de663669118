// `zerotrain launch -n N [--] PROGRAM ARGS...`: starts N ranks on this node. Everything
// from PROGRAM on reaches the ranks untouched (launch reads no option after it).
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
#include "cli/flags.h"
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

// The synopsis that a usage error of launch ends with.
constexpr const char* kSynopsis = "usage: zerotrain launch -n N [--] PROGRAM [ARGS...]";

void launch_usage(std::FILE* out) {
  std::fprintf(out,
               "%s\n\n"
               "Starts N ranks of PROGRAM on this node (through OpenMPI's mpirun). Each rank gets\n"
               "RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; rank r uses GPU r when GPUs\n"
               "exist. Output lines are prefixed with [rank r]. If a rank fails, the others are\n"
               "ended and launch exits non-zero naming the rank and its exit code.\n"
               "Multi-node: use mpirun or srun directly (see docs/comm.md).\n\n"
               "options:\n"
               "  -n N, --nproc N   ranks to start (required; also -nN, --nproc=N)\n"
               "  --                ends launch's options: everything after it is PROGRAM ARGS...,\n"
               "                    passed on untouched (without it, PROGRAM is the first argument\n"
               "                    that is not an option)\n"
               "  -h, --help        this text\n"
               "exit status: 0 when every rank succeeds, non-zero when one fails; 2 for bad usage\n",
               kSynopsis);
}

}  // namespace

int cmd_launch(int argc, char** argv) {
  int n = 0;
  std::vector<std::string> program;  // PROGRAM ARGS..., untouched
  Flags f("launch");
  f.count("-n,--nproc", n, 1, 1 << 20);
  f.passthrough(program);
  try {
    if (!f.parse(argc, argv)) {
      launch_usage(stdout);
      return 0;
    }
    ZT_CHECK_T(n >= 1, UsageError, "launch: give the number of ranks with -n N (N >= 1)");
    ZT_CHECK_T(!program.empty(), UsageError, "launch: no program given (zerotrain launch -n N -- PROGRAM ARGS...)");
  } catch (const UsageError& e) {
    throw UsageError(std::string(e.what()) + " (" + kSynopsis + ")");
  }
  check_runnable(program[0]);
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
  args.insert(args.end(), program.begin(), program.end());
  std::vector<char*> cargs;
  for (auto& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execvp("mpirun", cargs.data());
  throw Error(std::string("launch: cannot exec mpirun: ") + std::strerror(errno));
}

}  // namespace zt::cli
