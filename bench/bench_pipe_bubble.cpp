// Measured pipeline bubble of each schedule against its formula, on CPU ranks:
//
//   OMP_NUM_THREADS=1 build/zerotrain launch -n 2 -- build/bench_pipe_bubble [micro_batches] [batches]
//
// pp = world size, dp 1, GPT-2 (4 blocks, C 256, T 128, micro-batch 4, fp32, ZeRO 0),
// `micro_batches` (default 8) per batch, one thread per rank. For every schedule: warm-up
// batches, then `batches` (default 5) timed ones; prints one JSON line per schedule with
// the median measured bubble ((max stage wall - max stage busy) / max stage busy, see
// [Pipeline Execution]), the published formula, the bubble the simulator predicts from the
// measured per-micro-batch F / B / W times of the busiest stage (unequal stage and pass
// times are what separate measurement from formula), and each stage's busy fraction.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "zerotrain/comm.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int m = argc > 1 ? std::atoi(argv[1]) : 8;
    const int batches = argc > 2 ? std::atoi(argv[2]) : 5;
    torch::set_num_threads(1);
    auto world = zt::comm::world_group();
    const int pp = world->size();
    zt::models::GPT2Config cfg;
    cfg.n_layer = 4;
    cfg.n_head = 4;
    cfg.n_embd = 256;
    cfg.vocab_size = 256;
    cfg.n_positions = 128;
    const int64_t B = 4, T = 128;
    for (const char* sched : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
      nlohmann::json j = {{"train_micro_batch_size_per_gpu", B},
                          {"gradient_accumulation_steps", m},
                          {"steps_per_print", 100000},
                          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                          {"zero_optimization", {{"stage", 0}}},
                          {"pipeline", {{"stages", pp}, {"schedule", sched}, {"partition", "uniform"}}}};
      if (std::string(sched) == "interleaved") {
        if (pp < 2 || m % pp != 0) continue;
        j["pipeline"]["virtual_stages"] = 2;
      }
      auto pc = zt::pipe::pipeline_config(j, pp);
      zt::parallel::Topology topo(world, zt::parallel::ParallelDims::make(pp, 1, 1, pp));
      torch::manual_seed(1);
      zt::models::GPT2 full(cfg);
      zt::pipe::PipeOptions po;
      po.device = torch::Device(torch::kCPU);
      zt::pipe::PipeEngine pipe(full, pc, topo, po);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
      auto next = [&] {
        auto s = torch::randint(0, 256, {B, T + 1}, gen, torch::kLong);
        return zt::pipe::MicroBatch{s.narrow(1, 0, T).contiguous(), s.narrow(1, 1, T).contiguous()};
      };
      for (int w = 0; w < 2; ++w) pipe.train_batch(next);
      std::vector<double> bubbles, predicted;
      std::vector<std::vector<double>> busy(static_cast<size_t>(pp));
      for (int b = 0; b < batches; ++b) {
        pipe.train_batch(next);
        const auto& r = pipe.last_report();
        bubbles.push_back(r.bubble);
        // The simulator on the measured pass times of the busiest stage.
        size_t hot = 0;
        for (size_t s = 0; s < r.timing.size(); ++s) {
          busy[s].push_back(r.timing[s].busy_fraction());
          if (r.timing[s].busy_ms > r.timing[hot].busy_ms) hot = s;
        }
        const double per = static_cast<double>(m * pipe.schedule().spec.virtual_stages);
        const auto& h = r.timing[hot];
        zt::pipe::UnitTimes u{h.forward_ms / per, h.backward_ms / per, h.weight_ms / per};
        predicted.push_back(zt::pipe::simulate(pipe.schedule(), u).bubble);
      }
      if (world->rank() == 0) {
        std::string fr;
        for (auto& v : busy) fr += (fr.empty() ? "" : ", ") + std::to_string(median(v));
        const auto& r = pipe.last_report();
        std::printf(
            "{\"bench\": \"pipe_bubble\", \"schedule\": \"%s\", \"stages\": %d, \"micro_batches\": %d, "
            "\"virtual_stages\": %d, \"bubble_measured\": %.4f, \"bubble_formula\": %.4f, "
            "\"bubble_simulated_from_measured_times\": %.4f, \"stage_busy_fraction\": [%s], "
            "\"last_stage_ms\": {\"F\": %.2f, \"B\": %.2f, \"W\": %.2f}}\n",
            sched, pp, m, pipe.schedule().spec.virtual_stages, median(bubbles), r.bubble_formula, median(predicted),
            fr.c_str(), r.timing.back().forward_ms, r.timing.back().backward_ms, r.timing.back().weight_ms);
        std::fflush(stdout);
      }
    }
    zt::comm::finalize();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipe_bubble: %s\n", e.what());
    return 1;
  }
}
