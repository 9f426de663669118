// A pipeline stage whose rank stops mid-batch: run as
//   ZT_COMM_TIMEOUT=2 zerotrain launch -n 2 -- prog_dead_stage
// pp 2 on CPU, tiny GPT-2, 1F1B over 4 micro-batches. Batch 1 runs on both ranks (the
// pipeline works). In batch 2, stage 1's rank stops in micro-batch 1's backward (a gradient
// hook sleeps 30 s: it never sends that gradient), as a rank that hangs or died without
// the launcher noticing. Stage 0's rank must get a CommError after ~2 s naming the
// instruction it waited in (rg1: the gradient of micro-batch 1 from stage 1), the recv,
// the peer and the group; it prints it and exits 1; the launcher then ends rank 1.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "models/gpt2.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

int main() {
  using namespace zt;
  try {
    comm::GroupPtr world = comm::world_group();
    if (world->size() != 2) {
      std::fprintf(stderr, "prog_dead_stage: needs 2 ranks\n");
      return 2;
    }
    constexpr int kMicroBatches = 4;
    constexpr int64_t kB = 2, kT = 16;
    parallel::Topology topo(world, parallel::ParallelDims::make(2, 1, 1, 2));
    nlohmann::json j = {
        {"train_micro_batch_size_per_gpu", kB},
        {"gradient_accumulation_steps", kMicroBatches},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
        {"zero_optimization", {{"stage", 0}}},
        {"pipeline", {{"stages", 2}, {"schedule", "1f1b"}}},
    };
    models::GPT2Config mc;
    mc.n_layer = 2;
    mc.n_head = 2;
    mc.n_embd = 32;
    mc.vocab_size = 64;
    mc.n_positions = 32;
    torch::manual_seed(3);
    models::GPT2 full(mc);
    pipe::PipeOptions po;
    po.device = torch::Device(torch::kCPU);
    pipe::PipeEngine engine(full, pipe::pipeline_config(j, 2), topo, po);

    // Stage 1: one parameter's gradient hook counts backwards; the 6th (batch 2,
    // micro-batch 1) never returns in time.
    int backwards = 0;
    if (engine.stage() == 1) {
      auto params = engine.module()->parameters();
      params.back().register_hook([&backwards](torch::Tensor g) {
        if (++backwards == kMicroBatches + 2) {
          std::printf("stage 1 stops in micro-batch 1's backward\n");
          std::fflush(stdout);
          std::this_thread::sleep_for(std::chrono::seconds(30));
          std::fprintf(stderr, "prog_dead_stage: stage 1 slept 30 s\n");
        }
        return g;
      });
    }
    std::printf("timeout %.1f s\n", world->timeout().count() / 1000.0);
    std::fflush(stdout);
    for (int batch = 1; batch <= 2; ++batch) {
      auto start = std::chrono::steady_clock::now();
      try {
        int i = 0;
        double loss = engine.train_batch([&] {
          auto seq = torch::randint(0, mc.vocab_size, {kB, kT + 1}, torch::kLong);
          ++i;
          return pipe::MicroBatch{seq.narrow(1, 0, kT).contiguous(), seq.narrow(1, 1, kT).contiguous()};
        });
        std::printf("batch %d done, loss %.4f\n", batch, loss);
        std::fflush(stdout);
      } catch (const CommError& e) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "prog_dead_stage: batch %d: CommError after %.1f s: %s\n", batch, s, e.what());
        return 1;
      }
    }
    std::fprintf(stderr, "prog_dead_stage: batch 2 finished on rank %d\n", world->rank());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "prog_dead_stage: error: %s\n", e.what());
    return 1;
  }
}
