// `zerotrain estimate`: memory per GPU by kind for a GPT-2 job, before running it.
#include <cmath>
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "estimate/memory.h"
#include "kernels/fused_adam.h"
#include "models/gpt2.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt::cli {
namespace {
const char* kEstimateUsage =
    "usage: zerotrain estimate --model NAME --config CONFIG.json --gpus N [options]\n\n"
    "  --model NAME        gpt2-tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl\n"
    "  --layers/--embd/--heads/--vocab N   override the named size\n"
    "  --micro-batch B     micro batch per GPU (default: the config's, else 8)\n"
    "  --seq S             sequence length (default: min(1024, model positions))\n"
    "  --checkpoint-activations   activations of checkpointed blocks\n"
    "  --gpu-mem GIB       say whether the job fits a GPU of this many GiB\n"
    "  --host-mem GIB      say whether the offloaded state of the ranks of one host fits its\n"
    "                      memory (what initialize() checks against MemAvailable)\n"
    "  --gpus-per-host N   ranks per host for --host-mem (default: all of --gpus)\n"
    "  --json              one JSON object instead of the table\n"
    "The model behind the numbers: docs/zero-costs.md.\n";

}  // namespace

int cmd_estimate(int argc, char** argv) {
  std::string model = "gpt2-tiny", config;
  int64_t layers = 0, embd = 0, heads = 0, vocab = 0, micro = 0, seq = 0, gpus = 1;
  double gpu_mem = 0, host_mem = 0;
  int64_t per_host = 0;
  bool ckpt = false, json_out = false;
  Flags f("estimate");
  f.text("--model", model);
  f.text("--config", config);
  f.count("--layers", layers);
  f.count("--embd", embd);
  f.count("--heads", heads);
  f.count("--vocab", vocab);
  f.count("--micro-batch", micro);
  f.count("--seq", seq);
  f.count("--gpus", gpus, 1, 1 << 20);
  f.number("--gpu-mem", gpu_mem, 0.0);
  f.number("--host-mem", host_mem, 0.0);
  f.count("--gpus-per-host", per_host);
  f.flag("--checkpoint-activations", ckpt);
  f.flag("--json", json_out);
  if (!f.parse(argc, argv)) {
    std::fputs(kEstimateUsage, stdout);
    return 0;
  }
  ZT_CHECK_T(!config.empty(), UsageError, "estimate: --config CONFIG.json is required (see zerotrain estimate --help)");
  if (per_host == 0) per_host = gpus;
  ZT_CHECK_T(per_host >= 1 && per_host <= gpus, ConfigError, "estimate: --gpus-per-host must be between 1 and --gpus (",
             gpus, ")");
  estimate::Job job;
  job.model = models::named_gpt2(model);
  if (layers) job.model.n_layer = layers;
  if (embd) job.model.n_embd = embd;
  if (heads) job.model.n_head = heads;
  if (vocab) job.model.vocab_size = vocab;
  job.gpus = static_cast<int>(gpus);
  job.seq = seq > 0 ? seq : std::min<int64_t>(1024, job.model.n_positions);
  nlohmann::json j = Config::read_json_file(config);
  fill_batch_auto(j, micro, 0, 1.0);  // as `zerotrain train` resolves it
  Config cfg = Config::from_json(j, static_cast<int>(gpus), config);
  job.micro_batch = cfg.train_micro_batch_size_per_gpu;
  job.checkpointing = ckpt || cfg.activation_checkpointing.number_checkpoints.has_value();
  job.cuda_kernels = kernels::kernels_available();  // a build with its CUDA kernels runs them on GPUs
  const auto r = estimate::estimate_memory(job, cfg);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double host_need = r.host * static_cast<double>(per_host) / gib;  // GiB, the ranks of one host
  const bool gpu_fits = gpu_mem <= 0 || r.peak / gib <= gpu_mem, host_fits = host_mem <= 0 || host_need <= host_mem;
  if (json_out) {
    nlohmann::json o = {{"model", model}, {"num_params", r.num_params}, {"gpus", gpus},
                        {"stage", cfg.zero_optimization.stage}, {"dtype", c10::toString(cfg.compute_dtype())},
                        {"micro_batch", job.micro_batch}, {"seq", job.seq}, {"checkpointing", job.checkpointing},
                        {"gib", {{"params", r.params / gib}, {"grads", r.grads / gib}, {"master", r.master / gib},
                                 {"optimizer", r.optimizer / gib}, {"gathered", r.gathered / gib},
                                 {"activations", r.activations / gib}, {"loss", r.loss / gib},
                                 {"forward_peak", r.forward_peak / gib}, {"backward_peak", r.backward_peak / gib},
                                 {"step_peak", r.step_peak / gib}, {"peak", r.peak / gib}, {"host", r.host / gib}, {"nvme", r.nvme / gib}}}};
    if (gpu_mem > 0) o["fits"] = gpu_fits;
    if (host_mem > 0) {
      o["host_per_host_gib"] = host_need;
      o["host_fits"] = host_fits;
    }
    std::printf("%s\n", o.dump().c_str());
    return gpu_fits && host_fits ? 0 : 1;
  }
  std::printf("zerotrain estimate: %s (%.2fM parameters), %lld GPU(s), ZeRO stage %lld, %s, micro-batch %lld x seq %lld, "
              "activation checkpointing %s\n",
              model.c_str(), r.num_params / 1e6, static_cast<long long>(gpus),
              static_cast<long long>(cfg.zero_optimization.stage), c10::toString(cfg.compute_dtype()),
              static_cast<long long>(job.micro_batch), static_cast<long long>(job.seq), job.checkpointing ? "on" : "off");
  std::printf("  per GPU                       GiB\n");
  std::printf("  parameters               %8.2f\n  gradients                %8.2f\n  fp32 master              %8.2f\n"
              "  optimizer state          %8.2f\n  gathered units (ZeRO-3)  %8.2f\n  activations              %8.2f\n"
              "  logits and loss          %8.2f\n",
              r.params / gib, r.grads / gib, r.master / gib, r.optimizer / gib, r.gathered / gib, r.activations / gib,
              r.loss / gib);
  std::printf("  peak forward / backward / step: %.2f / %.2f / %.2f GiB\n", r.forward_peak / gib, r.backward_peak / gib,
              r.step_peak / gib);
  if (r.host > 0) std::printf("  host memory per rank (offload): %.2f GiB\n", r.host / gib);
  if (r.nvme > 0) std::printf("  NVMe swap files per rank: %.2f GiB\n", r.nvme / gib);
  // "fits a 80.0 GiB GPU (3.2 GiB to spare)" / "does NOT fit ... (1.0 GiB short)"
  auto fit = [](double need, double have, const char* what) {
    std::printf("%s a %.1f GiB %s (%.1f GiB %s)\n", need <= have ? "fits" : "does NOT fit", have, what,
                std::abs(have - need), need <= have ? "to spare" : "short");
  };
  if (gpu_mem > 0) {
    std::printf("  ");
    fit(r.peak / gib, gpu_mem, "GPU");
  }
  if (host_mem > 0) {
    std::printf("  host memory of %lld rank(s) on one host: %.2f GiB: ", static_cast<long long>(per_host), host_need);
    fit(host_need, host_mem, "host");
  }
  return gpu_fits && host_fits ? 0 : 1;
}

}  // namespace zt::cli
