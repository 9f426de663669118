// Measured pipeline bubble of each schedule against its formula, with throughput and peak
// memory per stage; GPT-2 or a Llama-family shape, pp = world size (or --pp, dp = world / pp),
// ZeRO 0 (or --zero-stage 1|2 over dp), one JSON line per schedule.
//
// CPU ranks (the default: GPT-2 with 8 blocks, C 512, T 128, micro-batch 4, fp32, partition
// type:GPT2Block so that every chunk, also at 2 virtual stages, holds 2 blocks; one thread per
// rank). scripts/pipe_bubble_cpu.sh runs issue 18's measurement (pp 2, m 8, every schedule,
// at high scheduler priority, repeated while other processes load the CPUs):
//   OMP_NUM_THREADS=1 build/zerotrain launch -n 2 -- build/bench_pipe_bubble --micro-batches 8 --batches 5 \
//       --max-other-load 0.1 --attempts 3
// GPUs (one per rank; CUDA-event timing, see [Pipeline Execution]):
//   build/zerotrain launch -n 2 -- build/bench_pipe_bubble --device cuda --model gpt2-xl \
//       --micro-batch 4 --seq 1024 --micro-batches 8 --batches 5 --dtype bf16
// A Llama shape (scripts/device/pipe_llama_2gpu.sh; CPU: --model llama-tiny --layers 4):
//   build/zerotrain launch -n 2 -- build/bench_pipe_bubble --device cuda --model llama3.2-1b \
//       --micro-batch 4 --seq 2048 --micro-batches 8 --batches 5 --dtype bf16
//
// Flags: --device cpu|cuda, --model NAME (a named GPT-2, see models/gpt2.h, or a named Llama
// shape, models/llama.h: llama-tiny, llama3.2-1b, llama3-8b; default: the small CPU GPT-2),
// --micro-batch B, --seq T, --micro-batches m (default 8), --batches N
// timed batches (default 5) after --warmup N (default 2), --dtype fp32|bf16,
// --schedules LIST (default gpipe,1f1b,interleaved,zb-h1; "zb-h1:K" is zb-h1 with
// pipeline.zb_max_pending_w = K, [ZB-H1 Pending Cap]), --ckpt-interval K (activation
// checkpoint interval, default 0), --pp N (default: world size / tp; dp = world / (tp x N)),
// --zero-stage S (0, 1 or 2 over dp; default 0), --tp M (default 1: each stage's layers
// cut over M tensor-parallel ranks, GPT2TP from the same weights; [Pipeline x Tensor
// Parallel] in pipe/gpt2_pipe.h; GPT-2 only), --layers N (the small CPU GPT-2's blocks,
// default 8; a Llama's decoder layers, default its shape's) / --embd C (the small CPU GPT-2's
// width, default 512), --partition P (default type:GPT2Block for the small GPT-2,
// parameters -- the CLI's default -- for a named model), --max-other-load X --attempts N
// (CPU: time the batches again, up to N rounds in all, while other processes used more than
// X CPU cores during them; default: once).
//
// A Llama is built as `zerotrain train --model NAME --pp N` builds it: one
// LlamaForCausalLM from seed 1 on every rank, cut by PipeEngine ([Llama Pipeline] in
// pipe/llama_pipe.h: embedding | decoder layers | norm + head + loss, tied embeddings
// exchanged as GPT-2's wte), tp 1. Random tokens below the config's vocabulary.
//
// Per schedule: the median measured bubble ((max stage wall - max stage busy) / max stage
// busy), the published formula, the bubble the simulator predicts from the measured
// per-micro-batch F / B / W times of the busiest stage on every stage (unequal stage and pass
// times are what separate measurement from formula) and from each stage's own times
// (`bubble_simulated_per_stage`; each stage's F / B / W ms per batch in `stage_ms`), each
// stage's busy fraction, the median batch
// time (host clock, the optimizer step included) and tokens/s, and each stage's peak
// device memory (`peak_gib_per_stage`: the engine's phase peaks and zb-h1's input-gradient
// passes, [Input Backward Peak]; `phase_peak_gib_per_stage`: the phases only, what this bench
// reported before; CUDA caching allocator; CPU: not measured);
// each batch's bubble, and on CPU the cores other processes used meanwhile and the rounds.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifdef ZT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "models/gpt2.h"
#include "models/gpt2_tp.h"
#include "models/llama.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "zerotrain/comm.h"

#include <sys/resource.h>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Args {
  std::string device = "cpu", model, dtype = "fp32", schedules = "gpipe,1f1b,interleaved,zb-h1";
  std::string partition;  // default: "type:GPT2Block" for the small CPU model, "parameters" for a named one
  int64_t micro = 4, seq = 128, m = 8, batches = 5, warmup = 2, ckpt = 0, pp = 0, zero = 0, tp = 1;
  int64_t layers = 0, embd = 512;  // the small CPU GPT-2's blocks (0: 8) and width; a Llama's layers (0: its own)
  double max_other_load = -1;      // CPU cores other processes may use during the timed batches
  int64_t attempts = 1;            // timed rounds at most while they use more
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + f + " needs a value");
    const std::string v = argv[++i];
    if (f == "--device") a.device = v;
    else if (f == "--model") a.model = v;
    else if (f == "--dtype") a.dtype = v;
    else if (f == "--schedules") a.schedules = v;
    else if (f == "--micro-batch") a.micro = std::stoll(v);
    else if (f == "--seq") a.seq = std::stoll(v);
    else if (f == "--micro-batches") a.m = std::stoll(v);
    else if (f == "--batches") a.batches = std::stoll(v);
    else if (f == "--warmup") a.warmup = std::stoll(v);
    else if (f == "--ckpt-interval") a.ckpt = std::stoll(v);
    else if (f == "--pp") a.pp = std::stoll(v);
    else if (f == "--zero-stage") a.zero = std::stoll(v);
    else if (f == "--tp") a.tp = std::stoll(v);
    else if (f == "--layers") a.layers = std::stoll(v);
    else if (f == "--embd") a.embd = std::stoll(v);
    else if (f == "--partition") a.partition = v;
    else if (f == "--max-other-load") a.max_other_load = std::stod(v);
    else if (f == "--attempts") a.attempts = std::stoll(v);
    else throw std::runtime_error("unknown flag " + f);
  }
  if (a.device != "cpu" && a.device != "cuda") throw std::runtime_error("--device is cpu or cuda");
  if (a.dtype != "fp32" && a.dtype != "bf16") throw std::runtime_error("--dtype is fp32 or bf16");
  return a;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// The stage's peak device memory in its last batch: the engine restarts the allocator's
// peak at every phase (each forward, backward and step), and keeps the largest peak of each
// phase kind over the batch; a phase starts from what is allocated, so the largest of the
// three is the batch's peak (the receive buffers, outside any phase, are one activation) --
// with zb-h1's input-gradient passes (B), which run outside those phases, measured by the
// pipeline engine itself ([Input Backward Peak] in pipe/pipe_engine.h).
// `with_b` false: the engine's phases only (what this bench reported before B was measured).
double batch_peak_gib(zt::pipe::PipeEngine& pipe, bool with_b = true) {
  const auto& r = pipe.engine().last_report();
  const int64_t b = std::max({r.forward.mem_peak, r.backward.mem_peak, r.step_phase.mem_peak,
                              with_b ? pipe.input_backward_mem_peak() : int64_t{0}});
  return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0);
}

// [Bubble Bench Load] CPU seconds the whole machine has been busy (Linux /proc/stat: every
// state but idle and iowait), and this process's own CPU seconds (all its threads). Their
// difference over the timed batches, less every rank's own, is what other processes took:
// a CPU bubble is only the schedule's on an otherwise idle machine (one rank per core).
double bubble_bench_machine_busy_s() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  f >> cpu;
  if (cpu != "cpu") return -1;
  std::vector<double> v;
  std::string line;
  std::getline(f, line);
  std::istringstream in(line);
  for (double x; in >> x;) v.push_back(x);
  if (v.size() < 5) return -1;
  double busy = 0;
  for (size_t i = 0; i < v.size() && i < 8; ++i)
    if (i != 3 && i != 4) busy += v[i];  // user nice system [idle iowait] irq softirq steal
  return busy / 100.0;  // USER_HZ
}
double bubble_bench_own_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.device == "cpu") torch::set_num_threads(1);
    auto world = zt::comm::world_group();
    const int tp = static_cast<int>(a.tp);
    if (tp < 1 || world->size() % tp != 0) throw std::runtime_error("--tp must divide the world size");
    const int pp = a.pp > 0 ? static_cast<int>(a.pp) : world->size() / tp;
    if (world->size() % (pp * tp) != 0) throw std::runtime_error("--pp x --tp must divide the world size");
    if (a.zero < 0 || a.zero > 2) throw std::runtime_error("--zero-stage is 0, 1 or 2 (the pipeline's ZeRO over dp)");
    const int dp = world->size() / (pp * tp);
    // A named Llama shape ([Llama Pipeline]) or GPT-2 (the small CPU model, or a named one).
    const bool llama = !a.model.empty() && zt::models::is_llama_name(a.model);
    zt::models::GPT2Config cfg;
    zt::models::LlamaConfig lcfg;
    int64_t vocab = 0, max_seq = 0;
    if (llama) {
      lcfg = zt::models::named_llama(a.model);
      if (a.layers > 0) lcfg.num_hidden_layers = a.layers;
      if (lcfg.is_moe())
        throw std::runtime_error("--model " + a.model + ": the pipeline stages do not take an MoE Llama");
      if (tp > 1) throw std::runtime_error("--tp > 1 with a Llama: the Llama pipeline is tp 1 ([Llama Pipeline])");
      vocab = lcfg.vocab_size;
      max_seq = lcfg.max_position_embeddings;
    } else {
      if (a.model.empty()) {
        cfg.n_layer = a.layers > 0 ? a.layers : 8;
        cfg.n_head = 4;
        cfg.n_embd = a.embd;
        cfg.vocab_size = 256;
        cfg.n_positions = 128;
      } else {
        cfg = zt::models::named_gpt2(a.model);
      }
      vocab = cfg.vocab_size;
      max_seq = cfg.n_positions;
    }
    const int64_t B = a.micro, T = a.seq;
    if (T > max_seq)
      throw std::runtime_error("--seq " + std::to_string(T) + " exceeds the model's " + std::to_string(max_seq) +
                               " positions");
    const int m = static_cast<int>(a.m);
    for (const std::string& entry : split(a.schedules)) {
      // "zb-h1:K": zb-h1 with pipeline.zb_max_pending_w = K ([ZB-H1 Pending Cap]).
      const size_t colon = entry.find(':');
      const std::string sched = entry.substr(0, colon);
      const int cap = colon == std::string::npos ? -1 : std::stoi(entry.substr(colon + 1));
      nlohmann::json j = {{"train_micro_batch_size_per_gpu", B},
                          {"gradient_accumulation_steps", m},
                          {"steps_per_print", 100000},
                          {"gradient_clipping", 1.0},
                          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                          {"zero_optimization", {{"stage", a.zero}}},
                          {"pipeline",
                           {{"stages", pp},
                            {"schedule", sched},
                            {"partition", !a.partition.empty()  ? a.partition
                                          : a.model.empty() ? "type:GPT2Block"
                                                            : "parameters"},
                            {"activation_checkpoint_interval", a.ckpt}}}};
      if (cap >= 0) j["pipeline"]["zb_max_pending_w"] = cap;  // a ConfigError unless zb-h1
      if (a.dtype == "bf16") j["bf16"] = {{"enabled", true}};
      if (tp > 1) j["tensor_parallel"] = {{"autotp_size", tp}};
      if (sched == "interleaved") {
        if (pp < 2 || m % pp != 0) continue;
        j["pipeline"]["virtual_stages"] = 2;
      }
      auto pc = zt::pipe::pipeline_config(j, world->size());
      zt::parallel::Topology topo(world, zt::parallel::ParallelDims::make(world->size(), dp, tp, pp));
      zt::pipe::PipeOptions po;
      if (a.device == "cpu") po.device = torch::Device(torch::kCPU);
      std::unique_ptr<zt::pipe::PipeEngine> pipe;
      if (llama) {  // as `zerotrain train --model NAME --pp N` (cli/train.cpp, train_pipeline)
        torch::manual_seed(1);
        zt::models::LlamaForCausalLM full(lcfg);  // freed once the stage has taken its layers
        pipe = std::make_unique<zt::pipe::PipeEngine>(full, pc, topo, po);
      } else {
        torch::manual_seed(1);
        zt::models::GPT2 full(cfg);  // freed once the stage has copied its layers
        if (tp > 1) {
          auto tp_group = topo.tp();  // before the engine's groups, on every rank
          zt::models::GPT2Config tc = cfg;
          tc.deferred_init = false;
          zt::models::GPT2TP cut(tc, tp_group);
          std::map<std::string, torch::Tensor> weights;  // by name, not copied
          for (const auto& kv : full->named_parameters()) weights[kv.key()] = kv.value().detach();
          cut->load_full(weights);
          pipe = std::make_unique<zt::pipe::PipeEngine>(cut, pc, topo, po);
        } else {
          pipe = std::make_unique<zt::pipe::PipeEngine>(full, pc, topo, po);
        }
      }
      const torch::Device dev = pipe->engine().device();
      auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
      auto next = [&] {
        auto s = torch::randint(0, vocab, {B, T + 1}, gen, torch::kLong);
        return zt::pipe::MicroBatch{s.narrow(1, 0, T).contiguous(), s.narrow(1, 1, T).contiguous()};
      };
      for (int w = 0; w < a.warmup; ++w) pipe->train_batch(next);
      double peak = 0, phase_peak = 0, other_cores = -1;
      std::vector<double> bubbles, predicted, predicted_per_stage, batch_ms;
      std::vector<std::vector<double>> stage_f(static_cast<size_t>(pp)), stage_b(static_cast<size_t>(pp)),
          stage_w(static_cast<size_t>(pp));
      std::vector<std::vector<double>> busy(static_cast<size_t>(pp));
      int attempt = 0;
      for (;;) {  // the timed batches; again while other processes loaded the CPUs (--max-other-load)
        ++attempt;
        bubbles.clear();
        predicted.clear();
        predicted_per_stage.clear();
        batch_ms.clear();
        for (auto& v : busy) v.clear();
        for (auto* v : {&stage_f, &stage_b, &stage_w})
          for (auto& x : *v) x.clear();
        const double machine0 = bubble_bench_machine_busy_s(), own0 = bubble_bench_own_cpu_s();
        const auto wall0 = std::chrono::steady_clock::now();
        for (int b = 0; b < a.batches; ++b) {
          const auto t0 = std::chrono::steady_clock::now();
          pipe->train_batch(next);  // returns after the loss is on the host: the batch is done
          batch_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          peak = std::max(peak, dev.is_cuda() ? batch_peak_gib(*pipe) : 0.0);
          phase_peak = std::max(phase_peak, dev.is_cuda() ? batch_peak_gib(*pipe, false) : 0.0);
          const auto& r = pipe->last_report();
          bubbles.push_back(r.bubble);
          size_t hot = 0;
          for (size_t s = 0; s < r.timing.size(); ++s) {
            busy[s].push_back(r.timing[s].busy_fraction());
            if (r.timing[s].busy_ms > r.timing[hot].busy_ms) hot = s;
          }
          const double per = static_cast<double>(m * pipe->schedule().spec.virtual_stages);
          const auto& h = r.timing[hot];
          zt::pipe::UnitTimes u{h.forward_ms / per, h.backward_ms / per, h.weight_ms / per};
          predicted.push_back(zt::pipe::simulate(pipe->schedule(), u).bubble);
          std::vector<zt::pipe::UnitTimes> each;  // every stage its own times
          for (size_t s = 0; s < r.timing.size(); ++s) {
            const auto& t = r.timing[s];
            each.push_back({t.forward_ms / per, t.backward_ms / per, t.weight_ms / per});
            stage_f[s].push_back(t.forward_ms);
            stage_b[s].push_back(t.backward_ms);
            stage_w[s].push_back(t.weight_ms);
          }
          predicted_per_stage.push_back(zt::pipe::simulate(pipe->schedule(), each).bubble);
        }
        // Other processes' CPU load during the timed batches, in cores ([Bubble Bench Load];
        // one host's ranks: the machine's busy time less every rank's own); the ranks agree
        // on the largest reading.
        auto own = torch::tensor({bubble_bench_own_cpu_s() - own0}, torch::kDouble);
        world->all_reduce(own, zt::comm::ReduceOp::kSum);
        const double timed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
        const double machine1 = bubble_bench_machine_busy_s();
        auto other = torch::tensor(
            {machine0 < 0 || machine1 < 0 ? -1.0 : std::max(0.0, (machine1 - machine0 - own.item<double>()) / timed_s)},
            torch::kDouble);
        world->all_reduce(other, zt::comm::ReduceOp::kMax);
        other_cores = other.item<double>();
        if (a.max_other_load < 0 || other_cores <= a.max_other_load || attempt >= a.attempts) break;
      }
      // Each stage's peak memory and the slowest rank's batch time, on every rank (CPU: MPI).
      // Every rank sends (its stage, its peak); a stage's peak is the largest of its dp replicas.
      auto mine = torch::tensor({static_cast<double>(topo.coords().pp), peak, phase_peak}, torch::kDouble);
      auto all = torch::empty({world->size() * 3}, torch::kDouble);
      world->all_gather(all, mine);
      auto peaks = torch::zeros({pp}, torch::kDouble), phase_peaks = torch::zeros({pp}, torch::kDouble);
      for (int r = 0; r < world->size(); ++r) {
        const auto s = static_cast<int64_t>(all[3 * r].item<double>());
        peaks[s] = std::max(peaks[s].item<double>(), all[3 * r + 1].item<double>());
        phase_peaks[s] = std::max(phase_peaks[s].item<double>(), all[3 * r + 2].item<double>());
      }
      auto ms = torch::tensor({median(batch_ms)}, torch::kDouble);
      world->all_reduce(ms, zt::comm::ReduceOp::kMax);
      if (world->rank() == 0) {
        std::string fr, pk, per, sms;
        for (double b : bubbles) per += (per.empty() ? "" : ", ") + std::to_string(b);
        for (size_t s = 0; s < stage_f.size(); ++s) {
          char buf[128];
          std::snprintf(buf, sizeof buf, "%s{\"F\": %.2f, \"B\": %.2f, \"W\": %.2f}", s ? ", " : "", median(stage_f[s]),
                        median(stage_b[s]), median(stage_w[s]));
          sms += buf;
        }
        for (auto& v : busy) fr += (fr.empty() ? "" : ", ") + std::to_string(median(v));
        std::string ppk;
        for (int s = 0; s < pp; ++s) pk += (s ? ", " : "") + std::to_string(peaks[s].item<double>());
        for (int s = 0; s < pp; ++s) ppk += (s ? ", " : "") + std::to_string(phase_peaks[s].item<double>());
        const auto& r = pipe->last_report();
        const double batch = ms.item<double>();
        const double tokens_per_s = static_cast<double>(dp) * static_cast<double>(m * B * T) / (batch / 1000.0);
        std::printf(
            "{\"bench\": \"pipe_bubble\", \"device\": \"%s\", \"model\": \"%s\", \"dtype\": \"%s\", \"schedule\": \"%s\", "
            "\"zb_max_pending_w\": %d, \"stages\": %d, \"tp\": %d, \"dp\": %d, \"zero_stage\": %d, \"micro_batches\": %d, \"micro_batch\": %lld, \"seq\": %lld, \"virtual_stages\": %d, "
            "\"bubble_measured\": %.4f, \"bubble_per_batch\": [%s], \"bubble_formula\": %.4f, \"bubble_simulated_from_measured_times\": %.4f, "
            "\"bubble_simulated_per_stage\": %.4f, \"stage_ms\": [%s], \"stage_busy_fraction\": [%s], \"other_processes_cpu_cores\": %.2f, \"attempts\": %d, \"ms_per_batch\": %.2f, \"tokens_per_s\": %.1f, \"peak_gib_per_stage\": [%s], \"phase_peak_gib_per_stage\": [%s], "
            "\"loss_last\": %.4f, \"last_stage_ms\": {\"F\": %.2f, \"B\": %.2f, \"W\": %.2f, \"step\": %.2f}}\n",
            a.device.c_str(), a.model.empty() ? "tiny" : a.model.c_str(), a.dtype.c_str(), sched.c_str(),
            pipe->schedule().spec.max_pending_w, pp, tp, dp, static_cast<int>(a.zero), m,
            static_cast<long long>(B), static_cast<long long>(T), pipe->schedule().spec.virtual_stages,
            median(bubbles), per.c_str(), r.bubble_formula, median(predicted), median(predicted_per_stage), sms.c_str(), fr.c_str(), other_cores, attempt, batch, tokens_per_s, pk.c_str(), ppk.c_str(), r.loss,
            r.timing.back().forward_ms, r.timing.back().backward_ms, r.timing.back().weight_ms,
            r.timing.back().step_ms);
        std::fflush(stdout);
      }
      pipe.reset();
#ifdef ZT_WITH_CUDA
      if (dev.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    }
    zt::comm::finalize();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipe_bubble: %s\n", e.what());
    return 1;
  }
}
