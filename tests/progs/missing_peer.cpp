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
//   MODE p2p-recv:      rank 0 receives from rank 1, which never sends (CPU).
//   MODE p2p-batch:     rank 0 posts a batch of a large send to and a recv from rank 1;
//                       rank 1 posts neither (CPU). The error names both pending ops.
//   MODE cuda-p2p:      as cuda-sync, but rank 0's second CUDA call is a recv.
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
    const bool cuda = mode.rfind("cuda", 0) == 0;
    if (mode != "cpu" && mode != "cuda-setup" && mode != "cuda-sync" && mode != "p2p-recv" && mode != "p2p-batch" &&
        mode != "cuda-p2p") {
      std::fprintf(stderr, "usage: prog_missing_peer [cpu|cuda-setup|cuda-sync|p2p-recv|p2p-batch|cuda-p2p]\n");
      return 2;
    }
    at::TensorOptions opts(at::kFloat);
    if (cuda) {
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
    if (mode == "cuda-sync" || mode == "cuda-p2p") {
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
        if (mode == "p2p-recv" || mode == "cuda-p2p") {
          world->recv(t, 1)->synchronize();
        } else if (mode == "p2p-batch") {
          at::Tensor big = at::ones({1 << 20}, opts);  // past MPI's eager limit: waits for the peer
          world->batch_isend_irecv({zt::comm::isend(big, 1), zt::comm::irecv(t, 1)})->wait();
        } else {
          world->all_reduce(t, zt::comm::ReduceOp::kSum, /*async=*/false)->synchronize();
        }
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
      std::printf("%s returned: unexpected\n", mode.c_str());
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::seconds(8));
    std::printf("rank %d never joined rank 0's call; exiting 0\n", world->rank());
    return 0;  // no finalize: it would wait for rank 0
  } catch (const zt::Error& e) {
    std::fprintf(stderr, "prog_missing_peer: error: %s\n", e.what());
    return 1;
  }
}
