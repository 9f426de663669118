// `zerotrain bench --model NAME [--gpus N] ...`: the ZeRO cost sweep.
//
// Each configuration runs in fresh processes (`zerotrain launch -n N -- zerotrain train
// ... --summary`), so one configuration's allocator state, pinned memory or failure
// cannot leak into the next. A run that fails is a row, not the end of the sweep: out of
// device memory is reported with the phase where it happened (the engine's error names
// it), anything else with the last error line of its log. With --with-anchors the
// PyTorch scripts in bench/anchors/ run in the same call, on the same devices, and each
// zerotrain row gets the ratio to its PyTorch counterpart.
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/cuda.h>

#include "cli/args.h"
#include "bench/sweep.h"
#include "ckpt/fs.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "estimate/memory.h"
#include "kernels/fused_adam.h"
#include "models/gpt2.h"
#include "zerotrain/config.h"
#include "zerotrain/error.h"

#ifndef ZT_DEFAULT_PYTHON
#define ZT_DEFAULT_PYTHON "python3"
#endif
#ifndef ZT_SOURCE_TREE
#define ZT_SOURCE_TREE "."
#endif
#ifndef ZT_DEFAULT_ANCHORS
#define ZT_DEFAULT_ANCHORS "bench/anchors"
#endif

namespace zt::cli {
namespace {

using nlohmann::json;

// The sweep: stages 1-3 in bf16 and fp16, CPU optimizer offload at stages 2 and 3, and
// stage 3 with parameters offloaded too; stage 0 as the data-parallel baseline.
using bench::SweepConfig;
const SweepConfig kSweep[] = {
    {"z0-bf16", 0, "bf16", false, false, "ddp"},
    {"z1-bf16", 1, "bf16", false, false, "zero1"},
    {"z2-bf16", 2, "bf16", false, false, "fsdp2"},
    {"z3-bf16", 3, "bf16", false, false, "fsdp2_reshard"},
    {"z1-fp16", 1, "fp16", false, false, "zero1"},
    {"z2-fp16", 2, "fp16", false, false, "fsdp2"},
    {"z3-fp16", 3, "fp16", false, false, "fsdp2_reshard"},
    {"z2-offopt", 2, "bf16", true, false, "fsdp2_offload"},
    {"z2-offdpu", 2, "bf16", true, false, "fsdp2_offload", /*delayed_update=*/true},
    {"z3-offopt", 3, "bf16", true, false, "fsdp2_offload"},
    {"z3-offall", 3, "bf16", true, true, "fsdp2_offload"},
};

// One anchor run of --with-anchors: a mode of bench/anchors/train_anchor.py and its flags.
struct AnchorRun {
  std::string name, mode, framework;
  std::vector<std::string> extra;
};

// The anchors the chosen configurations are compared with, each once, in sweep order: the
// PyTorch counterpart of each row (SweepConfig::anchor), DeepSpeed at the same stage and
// offload for the bf16 rows (bench::deepspeed_anchor), and the torch.compile'd model
// beside ZeRO-0.
std::vector<AnchorRun> anchor_runs(const std::vector<const SweepConfig*>& chosen, const std::string& set) {
  bool pytorch = false, compile = false, deepspeed = false;
  std::istringstream in(set);
  std::string kind;
  while (std::getline(in, kind, ',')) {
    if (kind == "pytorch") pytorch = true;
    else if (kind == "compile") compile = true;
    else if (kind == "deepspeed") deepspeed = true;
    else throw ConfigError("bench: --anchor-set names an unknown anchor kind '" + kind +
                           "' (known: pytorch, compile, deepspeed)");
  }
  std::vector<AnchorRun> runs;
  auto add = [&](AnchorRun r) {
    for (const auto& x : runs) {
      if (x.name == r.name) return;
    }
    runs.push_back(std::move(r));
  };
  for (const SweepConfig* c : chosen) {
    if (pytorch) add({std::string("torch-") + c->anchor, c->anchor, "pytorch", {}});
  }
  for (const SweepConfig* c : chosen) {
    if (compile && c->stage == 0) add({bench::kCompileAnchor, "compile", "pytorch", {}});
  }
  for (const SweepConfig* c : chosen) {
    const std::string ds = bench::deepspeed_anchor(*c);
    if (!deepspeed || ds.empty()) continue;
    const char* off = c->offload_param ? "all" : c->offload_optimizer ? "optimizer" : "none";
    add({ds, "deepspeed", "deepspeed", {"--ds-stage", std::to_string(c->stage), "--ds-offload", off}});
  }
  return runs;
}

const char* kBenchUsage =
    "usage: zerotrain bench --model NAME [options]      the ZeRO cost sweep\n"
    "       zerotrain bench adam [options]              the CPU Adam microbenchmark\n\n"
    "Runs every configuration in fresh processes: ZeRO stage 0-3 in bf16, stage 1-3 in fp16,\n"
    "stage 2 and 3 with offload_optimizer cpu (stage 2 also with the delayed update), stage 3\n"
    "with offload_param cpu too. Writes\n"
    "OUT/results.json, OUT/results.md, OUT/memory.png and OUT/time.png (and per-run configs,\n"
    "logs and metrics under OUT/configs, OUT/logs, OUT/runs).\n\n"
    "  --model NAME        gpt2-tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl\n"
    "  --layers/--embd/--heads/--vocab N   override the named size (no anchors then)\n"
    "  --gpus N            GPUs (ranks) to use; 0 = CPU ranks (default: all GPUs, else 0)\n"
    "  --ranks N           CPU ranks with --gpus 0 (default 2)\n"
    "  --steps N           timed iterations per configuration (default 20)\n"
    "  --warmup N          untimed iterations before them (default 2)\n"
    "  --micro-batch B     micro batch per rank (default 8 on GPUs, 2 on CPU)\n"
    "  --seq S             sequence length (default min(1024, positions) on GPUs, 64 on CPU)\n"
    "  --out DIR           where results go (default zerotrain-bench)\n"
    "  --only A,B,...      run only these configurations (names as in the table)\n"
    "  --with-anchors      also run bench/anchors/train_anchor.py (DDP, ZeroRedundancyOptimizer,\n"
    "                      FSDP2, FSDP2 reshard, FSDP2 + CPUOffloadPolicy: the counterparts of\n"
    "                      the configurations that run; a torch.compile'd model beside ZeRO-0;\n"
    "                      DeepSpeed at the stage and offload of each bf16 row, which needs the\n"
    "                      deepspeed package in --python) and add ratios\n"
    "  --anchor-set LIST   which anchors: any of pytorch,compile,deepspeed (default all three)\n"
    "  --python PY         python with torch for the anchors (default: the build's, " ZT_DEFAULT_PYTHON ")\n"
    "  --anchors DIR       the anchor scripts (default " ZT_DEFAULT_ANCHORS ")\n"
    "  --timeout S         seconds one run may take before it is ended (default 600)\n"
    "  --commit SHA        recorded in the results (default: git rev-parse in the source tree)\n"
    "  --report DIR        only re-render DIR/results.md and the charts from DIR/results.json\n"
    "MFU = (6N + 12·L·C·T) · tokens/s per GPU / peak, N = parameters without the position\n"
    "table (nanoGPT's convention), peak = the GPU's dense bf16 TFLOP/s from the table in\n"
    "docs/monitoring.md (an unknown GPU reports no MFU).\n";

struct BenchArgs {
  std::string model = "gpt2-large", out = "zerotrain-bench", python = ZT_DEFAULT_PYTHON,
              anchors = ZT_DEFAULT_ANCHORS, commit, only, report;
  int64_t gpus = -1, ranks = 2, steps = 20, warmup = 2, micro = 0, seq = 0, timeout = 600;
  int64_t layers = 0, embd = 0, heads = 0, vocab = 0;
  bool with_anchors = false;
  std::string anchor_set = "pytorch,compile,deepspeed";  // which anchors --with-anchors runs
};

struct ProcResult {
  int exit_code = -1;
  bool timed_out = false;
  double seconds = 0;
};

// Runs argv with stdout and stderr to `log`, in its own process group (so a timeout
// ends every rank), with `env` added to the environment.
ProcResult run_logged(const std::vector<std::string>& argv, const std::string& log, int64_t timeout_s,
                      const std::vector<std::pair<std::string, std::string>>& env) {
  std::fflush(stdout);
  std::fflush(stderr);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  ZT_CHECK(pid >= 0, "bench: fork failed: ", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> cargs;
    for (const auto& s : argv) cargs.push_back(const_cast<char*>(s.c_str()));
    cargs.push_back(nullptr);
    execvp(cargs[0], cargs.data());
    std::fprintf(stderr, "bench: cannot exec %s: %s\n", cargs[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  ProcResult r;
  int status = 0;
  bool term_sent = false;
  std::chrono::steady_clock::time_point term_at;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    const auto now = std::chrono::steady_clock::now();
    if (!term_sent && now - t0 > std::chrono::seconds(timeout_s)) {
      r.timed_out = true;
      kill(-pid, SIGTERM);
      term_sent = true;
      term_at = now;
    } else if (term_sent && now - term_at > std::chrono::seconds(10)) {
      kill(-pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The last JSON line of a file (the train summary and the anchor append one per run).
std::optional<json> last_json_line(const std::string& path) {
  std::ifstream f(path);
  std::string line, last;
  while (std::getline(f, line)) {
    if (!line.empty()) last = line;
  }
  if (last.empty()) return std::nullopt;
  try {
    return json::parse(last);
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

json make_config(const SweepConfig& c, int64_t micro) {
  json j = {{"train_micro_batch_size_per_gpu", micro},
            {"gradient_accumulation_steps", 1},
            {"gradient_clipping", 1.0},
            {"steps_per_print", 1000000},
            {"optimizer",
             {{"type", "AdamW"},
              {"params", {{"lr", 1e-4}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.0}}}}}};
  if (std::string(c.dtype) == "bf16") j["bf16"] = {{"enabled", true}};
  else j["fp16"] = {{"enabled", true}, {"initial_scale_power", 16}, {"loss_scale_window", 1000}, {"hysteresis", 2}};
  json z = {{"stage", c.stage}, {"overlap_comm", true}};
  if (c.stage <= 2) {
    z["reduce_bucket_size"] = 5e7;
    z["allgather_bucket_size"] = 2e8;
  } else {
    z["stage3_prefetch_bucket_size"] = 5e7;
    z["stage3_param_persistence_threshold"] = 1e5;
    z["stage3_max_live_parameters"] = 1e9;
    z["stage3_max_reuse_distance"] = 1e9;
  }
  if (c.offload_optimizer) {
    z["sub_group_size"] = 1e8;
    z["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    if (c.delayed_update) z["offload_optimizer"]["delayed_param_update"] = true;
  }
  if (c.offload_param) z["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  j["zero_optimization"] = z;
  return j;
}

std::string offload_label(const SweepConfig& c) {
  if (c.offload_param) return "optimizer+params";
  if (c.offload_optimizer) return c.delayed_update ? "optimizer, delayed update" : "optimizer";
  return "-";
}

std::string git_commit() {
  const std::string cmd = std::string("git -C \"") + ZT_SOURCE_TREE + "\" rev-parse --short HEAD 2>/dev/null";
  std::string out;
  if (std::FILE* p = popen(cmd.c_str(), "r")) {
    char buf[128];
    while (std::fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

BenchArgs parse_bench(int argc, char** argv, bool& help) {
  BenchArgs a;
  Flags f("bench");
  f.text("--model", a.model);
  f.count("--layers", a.layers);
  f.count("--embd", a.embd);
  f.count("--heads", a.heads);
  f.count("--vocab", a.vocab);
  f.count("--gpus", a.gpus);
  f.count("--ranks", a.ranks, 1);
  f.count("--steps", a.steps, 1);
  f.count("--warmup", a.warmup);
  f.count("--micro-batch", a.micro);
  f.count("--seq", a.seq);
  f.text("--out", a.out);
  f.text("--only", a.only);
  f.flag("--with-anchors", a.with_anchors);
  f.text("--anchor-set", a.anchor_set);
  f.text("--python", a.python);
  f.text("--anchors", a.anchors);
  f.count("--timeout", a.timeout);
  f.text("--commit", a.commit);
  f.text("--report", a.report);
  help = !f.parse(argc, argv);
  return a;
}

}  // namespace

int cmd_bench_sweep(int argc, char** argv) {
  bool help = false;
  BenchArgs a = parse_bench(argc, argv, help);
  if (help) {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  if (!a.report.empty()) {
    const std::string path = a.report + "/results.json";
    const std::string text = read_text(path);
    ZT_CHECK_T(!text.empty(), ConfigError, "bench: --report ", a.report, ": no ", path, " (the output of a sweep)");
    bench::write_sweep_report(json::parse(text), a.report);
    std::printf("[bench] re-rendered %s/results.md, memory.png, time.png\n", a.report.c_str());
    return 0;
  }
  const int64_t have_gpus = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  if (a.gpus < 0) a.gpus = have_gpus;
  ZT_CHECK_T(a.gpus <= have_gpus, ConfigError, "bench: --gpus ", a.gpus, " but this machine has ", have_gpus,
             " CUDA device(s) (--gpus 0 runs CPU ranks)");
  const bool cpu = a.gpus == 0;
  const int64_t ranks = cpu ? a.ranks : a.gpus;

  models::GPT2Config mc = models::named_gpt2(a.model);
  const bool custom = a.layers || a.embd || a.heads || a.vocab;
  if (a.layers) mc.n_layer = a.layers;
  if (a.embd) mc.n_embd = a.embd;
  if (a.heads) mc.n_head = a.heads;
  if (a.vocab) mc.vocab_size = a.vocab;
  ZT_CHECK_T(!(custom && a.with_anchors), ConfigError,
             "bench: --with-anchors needs a named model (the anchors know only the named sizes); drop "
             "--layers/--embd/--heads/--vocab or the anchors");
  const int64_t micro = a.micro > 0 ? a.micro : (cpu ? 2 : 8);
  const int64_t seq = a.seq > 0 ? a.seq : std::min<int64_t>(cpu ? 64 : 1024, mc.n_positions);
  ZT_CHECK_T(seq <= mc.n_positions, ConfigError, "bench: --seq ", seq, " exceeds the model's ", mc.n_positions,
             " positions");

  std::vector<const SweepConfig*> chosen;
  if (a.only.empty()) {
    for (const auto& c : kSweep) chosen.push_back(&c);
  } else {
    std::istringstream in(a.only);
    std::string name;
    while (std::getline(in, name, ',')) {
      const SweepConfig* hit = nullptr;
      for (const auto& c : kSweep) {
        if (name == c.name) hit = &c;
      }
      if (!hit) {
        std::string known;
        for (const auto& c : kSweep) known += std::string(known.empty() ? "" : ", ") + c.name;
        throw ConfigError("bench: --only names an unknown configuration '" + name + "' (known: " + known + ")");
      }
      chosen.push_back(hit);
    }
  }

  if (a.with_anchors) anchor_runs(chosen, a.anchor_set);  // a bad --anchor-set fails before any run
  const std::string out = a.out;
  for (const char* sub : {"", "/configs", "/logs", "/runs"}) ckpt::make_dirs(out + sub);
  const std::string exe = self_exe();
  std::vector<std::pair<std::string, std::string>> env = {
      {"NCCL_NVLS_ENABLE", "0"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}, {"NVSHMEM_DISABLE_NVLS", "1"},
      {"PYTHONUNBUFFERED", "1"}};
  if (!cpu && a.gpus < have_gpus && std::getenv("CUDA_VISIBLE_DEVICES") == nullptr) {
    std::string vis;
    for (int64_t g = 0; g < a.gpus; ++g) vis += (g ? "," : "") + std::to_string(g);
    env.push_back({"CUDA_VISIBLE_DEVICES", vis});
  }
  std::vector<std::string> size_flags = {"--model", a.model};
  if (a.layers) size_flags.insert(size_flags.end(), {"--layers", std::to_string(a.layers)});
  if (a.embd) size_flags.insert(size_flags.end(), {"--embd", std::to_string(a.embd)});
  if (a.heads) size_flags.insert(size_flags.end(), {"--heads", std::to_string(a.heads)});
  if (a.vocab) size_flags.insert(size_flags.end(), {"--vocab", std::to_string(a.vocab)});

  std::string command = "zerotrain";
  for (int i = 0; i < argc; ++i) command += std::string(" ") + argv[i];
  json meta = {{"bench", "zerotrain-sweep"},
               {"date", now_utc()},
               {"commit", a.commit.empty() ? git_commit() : a.commit},
               {"command", command},
               {"model", a.model},
               {"n_params", models::gpt2_num_params(mc)},
               {"gpus", a.gpus},
               {"ranks", ranks},
               {"micro_batch", micro},
               {"seq", seq},
               {"steps", a.steps},
               {"warmup", a.warmup},
               {"mfu_formula", "(6N + 12*L*C*T) * tokens/s per GPU / peak; N = parameters without wpe; peak = the GPU's dense "
                               "bf16 TFLOP/s from the device table (docs/monitoring.md)"},
               {"memory_source", cpu ? "CPU ranks: the engine's accounting of model states (no allocator)"
                                     : "CUDA caching allocator: allocated after / peak during each phase, max over "
                                       "ranks and iterations"}};
  std::printf("[bench] %s (%.1fM parameters), %lld %s, micro-batch %lld x seq %lld, %lld timed steps after %lld "
              "warm-up, %zu configurations%s -> %s\n",
              a.model.c_str(), models::gpt2_num_params(mc) / 1e6, static_cast<long long>(ranks),
              cpu ? "CPU ranks" : "GPUs", static_cast<long long>(micro), static_cast<long long>(seq),
              static_cast<long long>(a.steps), static_cast<long long>(a.warmup), chosen.size(),
              a.with_anchors ? " + PyTorch anchors" : "", out.c_str());

  const double gib = 1024.0 * 1024.0 * 1024.0;
  json rows = json::array();
  for (const SweepConfig* c : chosen) {
    const std::string name = c->name;
    const std::string cfg_path = out + "/configs/" + name + ".json";
    const std::string summary = out + "/runs/" + name + ".json";
    const std::string metrics = out + "/runs/" + name + ".metrics.jsonl";
    const std::string log = out + "/logs/" + name + ".log";
    const json cj = make_config(*c, micro);
    {
      std::ofstream f(cfg_path);
      f << cj.dump(2) << "\n";
      ZT_CHECK(f.good(), "bench: cannot write ", cfg_path);
    }
    std::remove(summary.c_str());
    std::remove(metrics.c_str());

    json row = {{"name", name},        {"framework", "zerotrain"}, {"stage", c->stage},
                {"dtype", c->dtype},   {"offload", offload_label(*c)}, {"anchor", c->anchor},
                {"ds_anchor", bench::deepspeed_anchor(*c)},
                {"config", "configs/" + name + ".json"}, {"log", "logs/" + name + ".log"}};
    // The prediction, before running.
    const Config cfg = Config::from_json(cj, static_cast<int>(ranks), cfg_path);
    estimate::Job job;
    job.model = mc;
    job.micro_batch = micro;
    job.seq = seq;
    job.gpus = static_cast<int>(ranks);
    job.cuda_kernels = !cpu && kernels::kernels_available();
    const estimate::Memory est = estimate::estimate_memory(job, cfg);
    row["estimate_gib"] = {{"forward", est.forward_peak / gib}, {"backward", est.backward_peak / gib},
                           {"step", est.step_peak / gib},       {"peak", est.peak / gib},
                           {"model_states", (est.params + est.grads + est.master + est.optimizer) / gib},
                           {"host", est.host / gib}};

    std::vector<std::string> cmd = {exe, "launch", "-n", std::to_string(ranks), "--", exe, "train",
                                    "--config", cfg_path};
    cmd.insert(cmd.end(), size_flags.begin(), size_flags.end());
    for (const std::string& s : {std::string("--steps"), std::to_string(a.steps + a.warmup), std::string("--warmup"),
                                 std::to_string(a.warmup), std::string("--seq"), std::to_string(seq),
                                 std::string("--summary"), summary, std::string("--metrics"), metrics,
                                 std::string("--device"), std::string(cpu ? "cpu" : "cuda")}) {
      cmd.push_back(s);
    }
    const ProcResult pr = run_logged(cmd, log, a.timeout, env);
    row["wall_s"] = pr.seconds;
    const auto sj = last_json_line(summary);
    if (pr.exit_code == 0 && sj) {
      row["status"] = "ok";
      for (const char* k : {"n_params", "ms_per_iter", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_tflops", "phase_ms",
                            "phase_mem_gib", "peak_gib", "model_state_gib", "skipped_steps", "loss_first", "loss_last",
                            "device_name", "device_total_gib"}) {
        if (sj->contains(k)) row[k] = (*sj)[k];
      }
      if (sj->contains("last_step")) row["exposed_comm_ms"] = (*sj)["last_step"]["comm"]["exposed_ms"];
      // On GPUs the estimate's peak is compared with the allocator's; CPU ranks measure
      // only model states (the engine's accounting), so they are compared with those.
      const double predicted = cpu ? row["estimate_gib"]["model_states"].get<double>() : est.peak / gib;
      const double measured = cpu ? (*sj)["model_state_gib"].get<double>() : (*sj)["peak_gib"].get<double>();
      row["estimate_basis"] = cpu ? "model states" : "peak";
      if (predicted > 0) row["estimate_error"] = measured / predicted - 1.0;
      if (!meta.contains("device")) meta["device"] = (*sj)["device_name"];
      std::printf("[bench] %-10s ok      %8.1f ms/iter  %s %8.4f GiB (estimate %8.4f GiB, %+5.1f%%)  (%.0f s)\n",
                  name.c_str(), (*sj)["ms_per_iter"].get<double>(), cpu ? "model states" : "peak", measured, predicted,
                  100 * row.value("estimate_error", 0.0), pr.seconds);
    } else {
      row.update(bench::classify_failure(read_text(log), pr.exit_code, pr.timed_out));
      std::printf("[bench] %-10s %-7s %s%s  (%.0f s, log %s)\n", name.c_str(), row["status"].get<std::string>().c_str(),
                  row.contains("phase") ? ("in " + row["phase"].get<std::string>() + ": ").c_str() : "",
                  row["error"].get<std::string>().c_str(), pr.seconds, log.c_str());
    }
    std::fflush(stdout);
    rows.push_back(row);
  }

  json anchors = json::array();
  if (a.with_anchors) {
    const std::string script = a.anchors + "/train_anchor.py";
    ZT_CHECK_T(access(script.c_str(), R_OK) == 0, ConfigError, "bench: --with-anchors needs ", script,
               " (give the directory with --anchors DIR)");
    // The anchors' MFU uses the peak the zerotrain runs found in the device table.
    double peak = 0;
    for (const auto& r : rows)
      if (r.contains("peak_tflops") && r["peak_tflops"].is_number()) peak = std::max(peak, r["peak_tflops"].get<double>());
    for (const AnchorRun& an : anchor_runs(chosen, a.anchor_set)) {
      const std::string& name = an.name;
      const std::string res = out + "/runs/" + name + ".json";
      const std::string log = out + "/logs/" + name + ".log";
      std::remove(res.c_str());
      std::vector<std::string> cmd = {a.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                      std::to_string(ranks), script, "--mode", an.mode, "--model", a.model,
                                      "--micro-batch", std::to_string(micro), "--seq", std::to_string(seq),
                                      "--steps", std::to_string(a.steps), "--warmup", std::to_string(a.warmup),
                                      "--dtype", "bf16", "--json", res, "--device", cpu ? "cpu" : "cuda"};
      cmd.insert(cmd.end(), an.extra.begin(), an.extra.end());
      if (peak > 0) cmd.insert(cmd.end(), {"--peak-tflops", std::to_string(peak)});
      const ProcResult pr = run_logged(cmd, log, a.timeout, env);
      json row = {{"name", name}, {"framework", an.framework}, {"mode", an.mode}, {"log", "logs/" + name + ".log"},
                  {"wall_s", pr.seconds}};
      const auto aj = last_json_line(res);
      if (pr.exit_code == 0 && aj && aj->value("status", "") == "ok") {
        row["status"] = "ok";
        for (const char* k : {"zero_equiv", "ms_per_iter", "tokens_per_s", "tflops_per_gpu", "mfu", "phase_ms",
                              "phase_mem_gib", "peak_gib", "host_peak_rss_gib", "optimizer", "deepspeed"}) {
          if (aj->contains(k)) row[k] = (*aj)[k];
        }
        std::printf("[bench] %-20s ok      %8.1f ms/iter  peak %7.3f GiB  (%.0f s)\n", name.c_str(),
                    (*aj)["ms_per_iter"].get<double>(), (*aj)["peak_gib"].is_number() ? (*aj)["peak_gib"].get<double>() : 0.0,
                    pr.seconds);
      } else if (aj && aj->value("status", "") == "oom") {
        row["status"] = "oom";
        row["phase"] = (*aj)["phase"];
        std::printf("[bench] %-20s oom     in %s  (%.0f s)\n", name.c_str(), (*aj)["phase"].dump().c_str(), pr.seconds);
      } else {
        row.update(bench::classify_failure(read_text(log), pr.exit_code, pr.timed_out));
        std::printf("[bench] %-20s %-7s %s  (%.0f s, log %s)\n", name.c_str(), row["status"].get<std::string>().c_str(),
                    row["error"].get<std::string>().c_str(), pr.seconds, log.c_str());
      }
      std::fflush(stdout);
      anchors.push_back(row);
    }
    bench::add_anchor_ratios(rows, anchors);
  }

  const json results = {{"meta", meta}, {"rows", rows}, {"anchors", anchors}};
  {
    std::ofstream f(out + "/results.json");
    f << results.dump(2) << "\n";
    ZT_CHECK(f.good(), "bench: cannot write ", out, "/results.json");
  }
  bench::write_sweep_report(results, out);
  std::printf("%s", read_text(out + "/results.md").c_str());
  std::printf("\n[bench] wrote %s/results.json, results.md, memory.png, time.png\n", out.c_str());
  return 0;
}

}  // namespace zt::cli
