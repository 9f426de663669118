// A rank that dies early: run as `zerotrain launch -n 3 -- prog_early_exit [MODE]`.
// Rank 1 exits with code 3 at once; rank 0 sits in an all_reduce that rank 1 never
// joins (the default 600 s timeout, so only the launcher can end it); rank 2 sleeps
// 60 s. `zerotrain launch` must end them all quickly and name rank 1 and its code.
//   MODE "mpi" (default): every rank starts MPI first, rank 1 then exits without
//                         MPI_Finalize (a crash mid-run).
//   MODE "early":         rank 1 exits before MPI starts (a crash at start-up).
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "zerotrain/comm.h"
#include "zerotrain/error.h"

int main(int argc, char** argv) {
  const bool early = argc > 1 && std::strcmp(argv[1], "early") == 0;
  const char* r = std::getenv("RANK");
  const int rank = r ? std::atoi(r) : 0;
  try {
    if (rank == 1 && early) {
      std::printf("exiting with code 3 before MPI starts\n");
      return 3;
    }
    zt::comm::GroupPtr world = zt::comm::world_group();
    if (rank == 1) {
      std::printf("exiting with code 3\n");
      std::fflush(stdout);
      return 3;  // no finalize: a rank that died
    }
    if (rank == 0) {
      at::Tensor t = at::ones({1 << 10});
      std::printf("entering an all_reduce that rank 1 never joins\n");
      std::fflush(stdout);
      world->all_reduce(t);
      std::printf("all_reduce returned: unexpected\n");
      return 0;
    }
    std::printf("sleeping 60 s\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    std::printf("slept 60 s: the launcher did not end this rank\n");
  } catch (const zt::Error& e) {
    std::fprintf(stderr, "prog_early_exit: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
