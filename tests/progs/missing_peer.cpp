// A collective that a peer never joins: run as
//   ZT_COMM_TIMEOUT=2 zerotrain launch -n 2 -- prog_missing_peer [MODE]
// Rank 0 calls all_reduce; rank 1 never does (it sleeps 8 s, then exits 0). Rank 0 must
// get a CommError after ~2 s naming the collective, its rank and "timed out"; it
// prints the message, checks that the group now refuses calls, and exits 1; the
// launcher then ends rank 1.
//   MODE cpu (default): a CPU tensor (MPI).
//   MODE cuda-setup:    rank 0's first CUDA collective (times out setting up NCCL).
//   MODE cuda-sync:     both ranks set up NCCL with one CUDA all_reduce, then rank 0's
//                       second one times out in Work::synchronize() (communicator aborted).
// The CUDA modes need 2 GPUs (rank r uses cuda:LOCAL_RANK).
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#ifdef ZT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "zerotrain/comm.h"
#include "zerotrain/error.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "cpu";
  try {
    if (mode != "cpu" && mode != "cuda-setup" && mode != "cuda-sync") {
      std::fprintf(stderr, "usage: prog_missing_peer [cpu|cuda-setup|cuda-sync]\n");
      return 2;
    }
    at::TensorOptions opts(at::kFloat);
    if (mode != "cpu") {
#ifdef ZT_WITH_CUDA
      const char* lr = std::getenv("LOCAL_RANK");
      auto dev = static_cast<c10::DeviceIndex>(lr ? std::atoi(lr) : 0);
      c10::cuda::set_device(dev);
      opts = opts.device(at::Device(at::kCUDA, dev));
#else
      std::fprintf(stderr, "prog_missing_peer: %s needs a CUDA build\n", mode.c_str());
      return 2;
#endif
    }
    zt::comm::GroupPtr world = zt::comm::world_group();
    std::printf("timeout %.1f s\n", world->timeout().count() / 1000.0);
    std::fflush(stdout);
    if (mode == "cuda-sync") {
      at::Tensor t = at::ones({1001}, opts);
      world->all_reduce(t);  // both ranks: sets up NCCL
      std::printf("NCCL set up: sum %.0f\n", t.sum().item<double>());
      std::fflush(stdout);
    }
    if (world->rank() == 0) {
      at::Tensor t = at::ones({1001}, opts);
      auto start = std::chrono::steady_clock::now();
      try {
        // CUDA: async=false only orders the current stream; synchronize() is where the
        // host waits (with the timeout). CPU: all_reduce itself waits.
        world->all_reduce(t, zt::comm::ReduceOp::kSum, /*async=*/false)->synchronize();
      } catch (const zt::CommError& e) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "prog_missing_peer: CommError after %.1f s: %s\n", s, e.what());
        // The group is broken now: a later call fails at once instead of hanging.
        try {
          at::Tensor again = at::ones({4}, opts);
          world->all_reduce(again);
          std::fprintf(stderr, "prog_missing_peer: a call after the timeout did not throw\n");
        } catch (const zt::CommError& again) {
          std::fprintf(stderr, "prog_missing_peer: next call: %s\n", again.what());
        }
        return 1;
      }
      std::printf("all_reduce returned: unexpected\n");
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::seconds(8));
    std::printf("rank %d never joined the all_reduce; exiting 0\n", world->rank());
    return 0;  // no finalize: it would wait for rank 0
  } catch (const zt::Error& e) {
    std::fprintf(stderr, "prog_missing_peer: error: %s\n", e.what());
    return 1;
  }
}
