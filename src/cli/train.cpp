// `zerotrain train`: GPT-2 on a text file or random tokens, through the engine.
#include <torch/torch.h>
#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/profile.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/token_dataset.h"
#include "models/gpt2.h"
#include "models/hf_gpt2.h"
#include "parallel/topology.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt::cli {
namespace {

const char* kTrainUsage =
    "usage: zerotrain train --config CONFIG.json --model NAME [options]\n\n"
    "  --model NAME        gpt2-tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl\n"
    "  --layers/--embd/--heads/--vocab N   override the named size\n"
    "  --data PATH|random  a text file (byte tokens) or random tokens (default: random)\n"
    "  --steps N           optimizer steps (default 20)\n"
    "  --seq N             sequence length (default: min(1024, model positions))\n"
    "  --micro-batch N     fills train_micro_batch_size_per_gpu when the config says \"auto\" or omits it\n"
    "  --grad-accum N      fills gradient_accumulation_steps when \"auto\"\n"
    "  --clip X            fills gradient_clipping when \"auto\" (default 1.0)\n"
    "  --checkpoint-activations   recompute each block in backward (activation_checkpointing section applies)\n"
    "  --no-decay-1d       no weight decay for biases and LayerNorm weights (parameters with fewer\n"
    "                      than 2 dims); the others keep optimizer.params.weight_decay\n"
    "  --metrics PATH      JSON lines, one object per step (rank 0)\n"
    "  --summary PATH      one JSON object with the run's totals (rank 0)\n"
    "  --print-every N     print 'Epoch E, Step S, Loss: L' every N steps (default: steps_per_print)\n"
    "  --warmup N          steps left out of the throughput figures (default 2)\n"
    "  --peak-tflops X     per-device peak for MFU (default: 989 on H100/H200, else none)\n"
    "  --seed N            model init and data order (default 1234)\n"
    "  --device cpu|cuda   where the ranks run (default: cuda:LOCAL_RANK when CUDA is available)\n"
    "  --tp N / --pp N / --ep N   tensor-parallel, pipeline and expert-parallel degrees (the config's\n"
    "                      tensor_parallel.autotp_size, pipeline.stages, expert_parallel.autoep_size;\n"
    "                      dp = ranks / (tp x pp)); > 1 is not implemented yet (docs/parallel.md)\n"
    "  --profile STEP      profile that step (0-based) with Kineto: writes PATH.rank<R>.json (Chrome\n"
    "                      trace) and PATH.rank<R>.txt (GPU time by kernel kind, top kernels)\n"
    "  --profile-out PATH  where (default zerotrain-profile)\n"
    "  --save DIR          write checkpoints to DIR (DIR/TAG/, DIR/latest) at the end of the run\n"
    "  --save-every N      ... and every N steps (needs --save)\n"
    "  --save-async        snapshot to host memory and write in a background thread (training\n"
    "                      stalls only for the snapshot; `latest` moves once every rank's file is done)\n"
    "  --load DIR          resume from DIR/latest: weights, optimizer, step, data position, RNG\n"
    "                      (--steps stays the total, so the run continues to step N)\n"
    "  --init-from PATH    start from Hugging Face GPT-2 weights (a model.safetensors file or a\n"
    "                      directory with one; a directory's config.json sets the model size)\n"
    "Run N ranks with: zerotrain launch -n N -- zerotrain train ...\n";

struct Args {
  std::string config, model = "gpt2-tiny", data = "random", metrics, summary, save, load, init_from, device, profile_out = "zerotrain-profile";
  int64_t save_every = 0;
  int64_t profile_step = -1;
  int64_t steps = 20, seq = 0, micro = 0, accum = 0, layers = 0, embd = 0, heads = 0, vocab = 0, print_every = 0,
          warmup = 2, seed = 1234, tp = -1, pp = -1, ep = -1;  // -1: flag not given
  double clip = 1.0, peak_tflops = -1;
  bool checkpoint = false;
  bool no_decay_1d = false;
  bool save_async = false;
  bool help = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  auto need = [&](int& i) -> std::string {
    ZT_CHECK_T(i + 1 < argc, ConfigError, "train: ", argv[i], " needs a value");
    return argv[++i];
  };
  auto num = [&](int& i) -> int64_t {
    const std::string flag = argv[i];
    return parse_count("train", flag, need(i));
  };
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      a.help = true;
      return a;
    } else if (f == "--config") a.config = need(i);
    else if (f == "--model") a.model = need(i);
    else if (f == "--data") a.data = need(i);
    else if (f == "--metrics") a.metrics = need(i);
    else if (f == "--summary") a.summary = need(i);
    else if (f == "--steps") a.steps = num(i);
    else if (f == "--seq") a.seq = num(i);
    else if (f == "--micro-batch") a.micro = num(i);
    else if (f == "--grad-accum") a.accum = num(i);
    else if (f == "--layers") a.layers = num(i);
    else if (f == "--embd") a.embd = num(i);
    else if (f == "--heads") a.heads = num(i);
    else if (f == "--vocab") a.vocab = num(i);
    else if (f == "--print-every") a.print_every = num(i);
    else if (f == "--warmup") a.warmup = num(i);
    else if (f == "--seed") a.seed = num(i);
    else if (f == "--clip") a.clip = std::stod(need(i));
    else if (f == "--peak-tflops") a.peak_tflops = std::stod(need(i));
    else if (f == "--checkpoint-activations") a.checkpoint = true;
    else if (f == "--no-decay-1d") a.no_decay_1d = true;
    else if (f == "--save") a.save = need(i);
    else if (f == "--save-every") a.save_every = num(i);
    else if (f == "--save-async") a.save_async = true;
    else if (f == "--load") a.load = need(i);
    else if (f == "--init-from") a.init_from = need(i);
    else if (f == "--device") a.device = need(i);
    else if (f == "--profile") a.profile_step = num(i);
    else if (f == "--profile-out") a.profile_out = need(i);
    else if (f == "--tp") a.tp = num(i);
    else if (f == "--pp") a.pp = num(i);
    else if (f == "--ep") a.ep = num(i);
    else throw ConfigError("train: unknown option '" + f + "' (see zerotrain train --help)");
  }
  ZT_CHECK_T(!a.config.empty(), ConfigError, "train: --config CONFIG.json is required (see zerotrain train --help)");
  ZT_CHECK_T(a.steps >= 1, ConfigError, "train: --steps must be at least 1");
  ZT_CHECK_T(a.save_every == 0 || !a.save.empty(), ConfigError, "train: --save-every needs --save DIR");
  ZT_CHECK_T(!a.save_async || !a.save.empty(), ConfigError, "train: --save-async needs --save DIR");
  ZT_CHECK_T(a.device.empty() || a.device == "cpu" || a.device == "cuda", ConfigError,
             "train: --device must be cpu or cuda, got '", a.device, "'");
  return a;
}

double detect_peak_tflops(const torch::Device& d) {
#ifdef ZT_WITH_CUDA
  if (d.is_cuda()) {
    // H100/H200 SXM dense bf16 (and fp16) tensor-core peak.
    return 989.0;
  }
#endif
  return 0;
}

std::string device_name(const torch::Device& d) {
#ifdef ZT_WITH_CUDA
  if (d.is_cuda()) return at::cuda::getDeviceProperties(d.index())->name;
#endif
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      return "CPU: " + line.substr(line.find(':') + 2);
    }
  }
  return "CPU";
}

// Device memory (0 for the CPU: ranks share the host's memory).
double device_total_bytes(const torch::Device& d) {
#ifdef ZT_WITH_CUDA
  if (d.is_cuda()) return static_cast<double>(at::cuda::getDeviceProperties(d.index())->totalGlobalMem);
#endif
  return 0;
}

}  // namespace

int cmd_train(int argc, char** argv) {
  Args a = parse_args(argc, argv);
  if (a.help) {
    std::fputs(kTrainUsage, stdout);
    return 0;
  }
  auto group = comm::world_group();
  const int rank = group->rank(), world = group->size();

  nlohmann::json j = Config::read_json_file(a.config);
  fill_batch_auto(j, a.micro, a.accum, a.clip);
  fill_parallel_flags(j, a.tp, a.pp, a.ep);
  Config cfg = Config::from_json(j, world, a.config);
  if (rank == 0) {
    // Every factor and rank 0's coordinates; Topology makes no group here.
    std::printf("[zerotrain] %s\n", parallel::Topology(group, parallel::dims_of(cfg, world)).describe().c_str());
    std::fflush(stdout);
  }

  models::GPT2Config mc = models::named_gpt2(a.model);
  if (a.layers) mc.n_layer = a.layers;
  if (a.embd) mc.n_embd = a.embd;
  if (a.heads) mc.n_head = a.heads;
  if (a.vocab) mc.vocab_size = a.vocab;
  if (!a.init_from.empty() && std::ifstream(a.init_from + "/config.json").good()) {
    mc = models::gpt2_config_from_hf_json(a.init_from + "/config.json");
  }
  const int64_t seq = a.seq > 0 ? a.seq : std::min<int64_t>(1024, mc.n_positions);
  ZT_CHECK_T(seq <= mc.n_positions, ConfigError, "train: --seq ", seq, " exceeds the model's ", mc.n_positions,
             " positions");
  const bool text = a.data != "random";
  ZT_CHECK_T(!text || mc.vocab_size >= 256, ConfigError, "train: a text file needs a vocabulary of at least 256 "
             "(byte tokens); --vocab ", mc.vocab_size, " is too small");

  torch::manual_seed(static_cast<uint64_t>(a.seed));
  // ZeRO-3 builds the model partitioned: placeholders now, each unit materialised on the
  // device (and sharded) by initialize(), so no rank ever holds the whole model.
  mc.deferred_init = cfg.zero_optimization.stage == 3;
  models::GPT2 model(mc);
  if (!a.init_from.empty()) {
    // Every rank reads the file; the engine then starts all ranks from rank 0's copy.
    models::load_hf_gpt2(*model, a.init_from);
    if (rank == 0) std::printf("[zerotrain] initialized from Hugging Face GPT-2 weights in %s\n", a.init_from.c_str());
  }
  if (a.checkpoint || cfg.activation_checkpointing.number_checkpoints || cfg.activation_checkpointing.cpu_checkpointing) {
    model->set_activation_checkpointing(true, cfg.activation_checkpointing.number_checkpoints,
                                        cfg.activation_checkpointing.cpu_checkpointing);
  }
  const double flops_per_token = model->flops_per_token(seq);

  EngineOptions eo;
  eo.metrics_path = a.metrics;
  if (a.no_decay_1d) eo.param_groups = no_decay_groups(*model, cfg.optimizer.params.weight_decay);
  eo.flops_per_sample = flops_per_token * static_cast<double>(seq);
  if (a.device == "cpu") eo.device = torch::Device(torch::kCPU);
  if (a.device == "cuda") {
    ZT_CHECK_T(torch::cuda::is_available(), ConfigError, "train: --device cuda but CUDA is not available here");
    eo.device = default_device();
  }
  auto engine = initialize(model.ptr(), cfg, eo);
  const torch::Device device = engine->device();
  const double peak = a.peak_tflops >= 0 ? a.peak_tflops : detect_peak_tflops(device);

  std::shared_ptr<const data::Dataset> ds;
  if (text) ds = std::make_shared<data::TokenDataset>(a.data, seq);
  else ds = std::make_shared<data::RandomTokenDataset>(mc.vocab_size, seq, static_cast<uint64_t>(a.seed));
  data::DistributedSampler sampler(ds->size(), rank, world, /*shuffle=*/true, static_cast<uint64_t>(a.seed));
  data::Loader loader(ds, sampler, cfg.train_micro_batch_size_per_gpu, device);

  // Checkpoints: the data position and the model's shape travel as client state (the
  // latter lets `zerotrain convert` write Hugging Face GPT-2 files).
  const nlohmann::json model_json = {{"name", a.model},
                                     {"gpt2",
                                      {{"n_layer", mc.n_layer},
                                       {"n_head", mc.n_head},
                                       {"n_embd", mc.n_embd},
                                       {"vocab_size", mc.vocab_size},
                                       {"n_positions", mc.n_positions}}}};
  // Every published save (the engine prints each; async ones are published a few steps
  // after the call, when every rank's writer is done), for --summary.
  nlohmann::json saves = nlohmann::json::array();
  auto collect_saves = [&] {
    const CheckpointSaveReport& r = engine->last_checkpoint_save();
    if (r.index == 0 || static_cast<int64_t>(saves.size()) >= r.index) return;
    saves.push_back({{"tag", r.tag},           {"async", r.async},         {"step", r.step},
                     {"published_step", r.published_step}, {"stall_ms", r.stall_ms}, {"wait_ms", r.wait_ms},
                     {"snapshot_ms", r.snapshot_ms}, {"write_ms", r.write_ms}, {"publish_ms", r.publish_ms},
                     {"bytes", r.bytes}});
  };
  auto save = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const auto pos = loader.state();
    engine->save_checkpoint(a.save, "",
                            {{"data", {{"epoch", pos.epoch}, {"batch", pos.batch}}}, {"model", model_json}, {"seq", seq}},
                            a.save_async);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    collect_saves();
    if (rank == 0) {
      if (a.save_async) {
        std::printf("[zerotrain] checkpoint save (async): training stalled %.1f ms (snapshot to host memory); "
                    "the file write continues in the background\n", ms);
      } else {
        std::printf("[zerotrain] checkpoint save: %.1f ms (training stalled for all of it)\n", ms);
      }
      std::fflush(stdout);
    }
  };
  int64_t start = 0;
  if (!a.load.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const nlohmann::json client = engine->load_checkpoint(a.load);
    if (rank == 0) {
      std::printf("[zerotrain] checkpoint load: %.1f ms\n",
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (client.contains("data")) loader.set_state({client["data"].at("epoch").get<int64_t>(),
                                                   client["data"].at("batch").get<int64_t>()});
    start = engine->global_steps();
    if (rank == 0) {
      std::printf("[zerotrain] resuming at step %lld of %lld\n", static_cast<long long>(start),
                  static_cast<long long>(a.steps));
    }
  }

  if (rank == 0) {
    std::printf("[zerotrain] %s: %.1fM parameters (%lld layers, %lld embd, %lld heads, vocab %lld), seq %lld | "
                "ZeRO stage %lld, %s, %d rank(s) on %s | batch %lld = micro %lld x accum %lld x %d ranks | data %s\n",
                a.model.c_str(), model->num_params() / 1e6, static_cast<long long>(mc.n_layer),
                static_cast<long long>(mc.n_embd), static_cast<long long>(mc.n_head),
                static_cast<long long>(mc.vocab_size), static_cast<long long>(seq),
                static_cast<long long>(cfg.zero_optimization.stage), c10::toString(engine->compute_dtype()), world,
                device.str().c_str(), static_cast<long long>(cfg.train_batch_size),
                static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
                static_cast<long long>(cfg.gradient_accumulation_steps), world, a.data.c_str());
    std::fflush(stdout);
  }

  const int64_t print_every = a.print_every > 0 ? a.print_every : std::max<int64_t>(1, cfg.steps_per_print);
  const double tokens_per_step = static_cast<double>(cfg.train_batch_size) * static_cast<double>(seq);
  double timed_ms = 0, save_ms = 0, first_loss = 0, last_loss = 0;
  int64_t timed_steps = 0, skipped_steps = 0;
  PhaseStats peak_fwd, peak_bwd, peak_step;
  std::map<std::string, double> phase_ms_sum{{"forward", 0}, {"backward", 0}, {"step", 0}};
  StepProfiler profiler;
  auto sync_device = [&] {
#ifdef ZT_WITH_CUDA
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
#endif
  };
  // Step reports arrive when the GPU has finished the step (on CUDA usually during the
  // next one): the loop reads them as they come and never waits for the GPU itself.
  const int64_t first_timed = start + std::min(a.warmup, a.steps - start);
  std::map<int64_t, int64_t> epoch_of;  // step -> its epoch, until its report arrives
  auto consume = [&](const StepReport& r) {
    const int64_t s = r.step - 1;  // the loop index of this step
    if (s == start) first_loss = r.loss;
    if (r.skipped) ++skipped_steps;
    last_loss = r.loss;
    if (s >= first_timed) {
      phase_ms_sum["forward"] += r.forward.ms;
      phase_ms_sum["backward"] += r.backward.ms;
      phase_ms_sum["step"] += r.step_phase.ms;
    }
    auto upd = [](PhaseStats& m, const PhaseStats& p) {
      m.mem_peak = std::max(m.mem_peak, p.mem_peak);
      m.mem_after = std::max(m.mem_after, p.mem_after);
    };
    upd(peak_fwd, r.forward);
    upd(peak_bwd, r.backward);
    upd(peak_step, r.step_phase);
    auto it = epoch_of.find(r.step);
    const int64_t epoch = it != epoch_of.end() ? it->second : loader.epoch();
    if (rank == 0 && ((s + 1) % print_every == 0 || s == start || s + 1 == a.steps)) {
      // ms: the step's forward + backward + step on the device (CPU: wall time).
      const double ms = r.forward.ms + r.backward.ms + r.step_phase.ms;
      std::printf("Epoch %lld, Step %lld, Loss: %.6f  (%.1f ms, lr %.3g%s)\n", static_cast<long long>(epoch + 1),
                  static_cast<long long>(s), r.loss, ms, r.lr, r.skipped ? ", skipped" : "");
      std::fflush(stdout);
    }
    if (it != epoch_of.end()) epoch_of.erase(it);
  };
  auto timed_t0 = std::chrono::steady_clock::now();
  for (int64_t s = start; s < a.steps; ++s) {
    if (s == first_timed) {
      // The timed region starts with an idle device and ends (below) when it is idle again.
      sync_device();
      for (const auto& r : engine->take_reports(true)) consume(r);
      timed_t0 = std::chrono::steady_clock::now();
    }
    if (s == a.profile_step) {
      sync_device();
      profiler.start(device.is_cuda());
    }
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < cfg.gradient_accumulation_steps; ++k) {
      auto [x, y] = loader.next();
      auto loss = engine->forward([&] { return model->loss(x, y); });
      engine->backward(loss);
      engine->step();
    }
    if (s == a.profile_step) sync_device();  // the profiled step's device work, all of it
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    epoch_of[engine->global_steps()] = loader.epoch();
    if (s == a.profile_step) {
      const std::string text = profiler.stop(a.profile_out, rank, ms);
      if (rank == 0) std::printf("%s", text.c_str());
    }
    if (s >= first_timed) ++timed_steps;
    for (const auto& r : engine->take_reports()) consume(r);
    collect_saves();  // an async save may have been published by this step
    if (a.save_every > 0 && (s + 1) % a.save_every == 0 && s + 1 < a.steps) {
      const auto ts = std::chrono::steady_clock::now();
      save();
      // Iteration time excludes the saves (they are reported on their own).
      if (s >= first_timed) save_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count();
    }
  }
  for (const auto& r : engine->take_reports(true)) consume(r);
  sync_device();
  if (timed_steps > 0) {
    timed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - timed_t0).count() - save_ms;
  }
  if (!a.save.empty()) {
    save();
    const auto t0 = std::chrono::steady_clock::now();
    engine->wait_checkpoint();  // the run's last checkpoint must be published before exit
    collect_saves();
    if (rank == 0 && a.save_async) {
      std::printf("[zerotrain] waited %.1f ms at the end of the run for the last checkpoint\n",
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }

  // Totals. Peak memory: max over ranks (one all-reduce).
  auto mem = torch::tensor({peak_fwd.mem_peak, peak_bwd.mem_peak, peak_step.mem_peak, peak_fwd.mem_after,
                            peak_bwd.mem_after, peak_step.mem_after},
                           torch::kLong);
  group->all_reduce(mem, comm::ReduceOp::kMax);
  const double ms_per_iter = timed_steps ? timed_ms / timed_steps : 0;
  const double tokens_per_s = ms_per_iter > 0 ? tokens_per_step / (ms_per_iter / 1000.0) : 0;
  const double tflops = tokens_per_s * flops_per_token / world / 1e12;
  const ModelStateBytes msb = engine->model_state_bytes();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (rank == 0) {
    auto m = mem.accessor<int64_t, 1>();
    std::printf("\n[zerotrain] per-phase report (rank max; %lld timed steps after %lld warm-up)\n",
                static_cast<long long>(timed_steps), static_cast<long long>(std::min(a.warmup, a.steps)));
    std::printf("  phase     ms/step   peak GiB   after GiB\n");
    const char* names[3] = {"forward", "backward", "step"};
    for (int p = 0; p < 3; ++p) {
      std::printf("  %-9s %7.2f   %8.3f   %9.3f\n", names[p], timed_steps ? phase_ms_sum[names[p]] / timed_steps : 0.0,
                  m[p] / gib, m[p + 3] / gib);
    }
    std::printf("  model states per rank: params %.3f, grads %.3f, fp32 master %.3f, optimizer %.3f = %.3f GiB",
                msb.params / gib, msb.grads / gib, msb.master / gib, msb.optimizer / gib, msb.total() / gib);
    if (msb.host > 0) std::printf(" (host memory %.3f GiB, NVMe files %.3f GiB)", msb.host / gib, msb.nvme / gib);
    std::printf("\n");
    if (timed_steps == 0) {
      std::printf("  no timed steps: all %lld were warm-up (--warmup %lld); run more --steps for the throughput",
                  static_cast<long long>(a.steps), static_cast<long long>(a.warmup));
    } else {
      std::printf("  %.1f ms/iteration, %.0f tokens/s", ms_per_iter, tokens_per_s);
    }
    if (device.is_cuda() && timed_steps > 0) {
      std::printf(", %.1f TFLOP/s per GPU", tflops);
      if (peak > 0) std::printf(", MFU %.1f%% (of %.0f TFLOP/s; 6N+12LCT FLOPs per token)", 100 * tflops / peak, peak);
    }
    const double drop = first_loss > 0 ? 100 * (1 - last_loss / first_loss) : 0.0;
    std::printf("\n  loss %.4f -> %.4f (%.1f%% %s)\n", first_loss, last_loss, std::abs(drop), drop >= 0 ? "lower" : "higher");
    std::fflush(stdout);
    if (!a.summary.empty()) {
      nlohmann::json sj = {
          {"framework", "zerotrain"},
          {"model", a.model},
          {"n_params", model->num_params()},
          {"world", world},
          {"stage", cfg.zero_optimization.stage},
          {"dtype", c10::toString(engine->compute_dtype())},
          {"micro_batch", cfg.train_micro_batch_size_per_gpu},
          {"grad_accum", cfg.gradient_accumulation_steps},
          {"seq", seq},
          {"steps", a.steps},
          {"timed_steps", timed_steps},
          {"device", device.str()},
          {"device_name", device_name(device)},
          {"device_total_gib", device_total_bytes(device) / gib},
          {"skipped_steps", skipped_steps},
          {"peak_tflops", peak},
          {"ms_per_iter", ms_per_iter},
          {"tokens_per_s", tokens_per_s},
          {"tflops_per_gpu", tflops},
          {"mfu", peak > 0 ? tflops / peak : 0.0},
          {"activation_checkpointing", model->activation_checkpointing()},
          {"phase_ms",
           {{"forward", timed_steps ? phase_ms_sum["forward"] / timed_steps : 0},
            {"backward", timed_steps ? phase_ms_sum["backward"] / timed_steps : 0},
            {"step", timed_steps ? phase_ms_sum["step"] / timed_steps : 0}}},
          {"phase_mem_gib",
           {{"forward", {{"peak", m[0] / gib}, {"after", m[3] / gib}}},
            {"backward", {{"peak", m[1] / gib}, {"after", m[4] / gib}}},
            {"step", {{"peak", m[2] / gib}, {"after", m[5] / gib}}}}},
          {"peak_gib", std::max({m[0], m[1], m[2]}) / gib},
          {"model_state_gib", msb.total() / gib},
          {"loss_first", first_loss},
          {"loss_last", last_loss},
          {"last_step", engine->last_report().to_json()},  // exposed comm, ZeRO-3 gathers, ...
      };
      if (!saves.empty()) sj["checkpoint_saves"] = saves;
      std::ofstream f(a.summary, std::ios::app);
      ZT_CHECK(f.good(), "cannot write ", a.summary);
      f << sj.dump() << "\n";
    }
  }
  engine.reset();
  comm::finalize();
  return 0;
}

}  // namespace zt::cli
