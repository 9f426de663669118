// `zerotrain train`: GPT-2 or a Llama-family model on a text file or random tokens,
// through the engine.
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
#include <memory>
#include <optional>
#include <sys/statvfs.h>
#include <string>

#include "ckpt/dir_lock.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/profile.h"
#include "cli/train_model.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "pipe/pipe_engine.h"
#include "config/notes.h"
#include "config/tensor_parallel_options.h"
#include "data/shards.h"
#include "data/token_dataset.h"
#include "lora/lora_spec.h"
#include "lora/peft_format.h"
#include "lora/qlora.h"
#include "monitor/device_peak.h"
#include "parallel/topology.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/data/loader.h"
#include "zerotrain/data/sampler.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::cli {
namespace {

// [Periodic Saves] A save point's save (or the wait for the previous asynchronous one, or
// the step that publishes it) that fails with a CheckpointError is reported on rank 0 and
// remembered; training goes on and the next save point tries again. At the end of the run
// exit_code() lists the failures on rank 0 and returns 3, or 0 when every save succeeded.
// Used by the plain path and the pipeline path of `train` alike.
class PeriodicSaves {
 public:
  explicit PeriodicSaves(int rank) : rank_(rank) {}
  void operator()(const std::function<void()>& fn, int64_t step) {
    try {
      fn();
    } catch (const CheckpointError& e) {
      failed_.push_back(detail::cat("step ", step, ": ", e.what()));
      if (rank_ == 0) {
        log::error("checkpoint save at step %lld failed: %s -- training goes on; the next save point tries again",
                   static_cast<long long>(step), e.what());
      }
    }
  }
  int exit_code() const {
    if (failed_.empty()) return 0;
    if (rank_ == 0) {
      std::string text = detail::cat(failed_.size(), " checkpoint save(s) failed during the run (the last one "
                                     "succeeded):");
      for (const auto& f : failed_) text += "\n  " + f;
      log::write(log::Level::kError, text);
    }
    return 3;
  }

 private:
  int rank_;
  std::vector<std::string> failed_;
};

const char* kTrainUsage =
    "usage: zerotrain train --config CONFIG.json --model NAME [options]\n\n"
    "  --model NAME        gpt2-tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl |\n"
    "                      llama-tiny | llama3.2-1b | llama3-8b | mixtral-tiny | path/to/config.json\n"
    "                      (Hugging Face LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or\n"
    "                      MixtralForCausalLM)\n"
    "  --layers/--embd/--heads/--vocab N   override the named size\n"
    "  --data PATH|random  token shards (a glob such as 'dir/train_*.bin', written by zerotrain tokenize;\n"
    "                      memory-mapped, each rank reads its windows), a text file (byte tokens, for the\n"
    "                      demo) or random tokens (default: random)\n"
    "  --val-data GLOB     validation shards: loss and perplexity every --eval-every steps and at the end\n"
    "  --eval-every N      steps between validation passes (default: only at the end)\n"
    "  --eval-batches N    micro batches per rank per pass (default 20; 0 = all of the rank's windows)\n"
    "  --sft-attention causal|per-example   packed SFT windows (zerotrain tokenize --sft): causal over the\n"
    "                      whole window (default), or per-example (Llama): attention stays within each\n"
    "                      example and positions restart at 0 per example\n"
    "  --steps N           optimizer steps (default 20)\n"
    "  --seq N             sequence length (default: min(1024, model positions))\n"
    "  --micro-batch N     fills train_micro_batch_size_per_gpu when the config says \"auto\" or omits it\n"
    "  --grad-accum N      fills gradient_accumulation_steps when \"auto\"\n"
    "  --clip X            fills gradient_clipping when \"auto\" (default 1.0)\n"
    "  --bf16 / --fp16     fill bf16.enabled / fp16.enabled when \"auto\" or absent (an \"auto\"\n"
    "                      without its flag is false: fp32, as the Hugging Face trainer)\n"
    "  --lr X              fills optimizer.params.lr when \"auto\" or absent\n"
    "  --set KEY.PATH=V    override a config key before it is checked (repeatable), e.g.\n"
    "                      --set zero_optimization.stage=3 --set optimizer.params.lr=1e-4\n"
    "  --checkpoint-activations   recompute each block in backward (activation_checkpointing section applies)\n"
    "  --no-decay-1d       no weight decay for biases and LayerNorm weights (parameters with fewer\n"
    "                      than 2 dims); the others keep optimizer.params.weight_decay\n"
    "  --metrics PATH      JSON lines, one object per step (rank 0)\n"
    "  --summary PATH      one JSON object with the run's totals (rank 0)\n"
    "  --print-every N     print 'Epoch E, Step S, Loss: L' every N steps (default: steps_per_print)\n"
    "  --warmup N          steps left out of the throughput figures (default 2)\n"
    "  --peak-tflops X     per-device peak for MFU (default: the dense bf16 peak of the GPU from\n"
    "                      the table in docs/monitoring.md; an unknown GPU reports no MFU)\n"
    "  --seed N            model init and data order (default 1234)\n"
    "  --device cpu|cuda   where the ranks run (default: cuda:LOCAL_RANK when CUDA is available)\n"
    "  --tp N / --pp N / --ep N   tensor-parallel, pipeline and expert-parallel degrees (the config's\n"
    "                      tensor_parallel.autotp_size, pipeline.stages, expert_parallel.autoep_size;\n"
    "                      dp = ranks / (tp x pp)); --pp N > 1 trains GPT-2 or Llama in N pipeline\n"
    "                      stages (pipeline.schedule, docs/pipeline.md; e.g. --set pipeline.schedule=zb-h1\n"
    "                      --set pipeline.zb_max_pending_w=0); --tp N > 1 splits every layer of GPT-2\n"
    "                      or Llama over N ranks (Megatron-style; sequence parallelism with\n"
    "                      --set tensor_parallel.sequence_parallel=true; docs/tensor-parallel.md);\n"
    "                      --tp M --pp N together: GPT-2 in N stages of M-way tensor-parallel layers\n"
    "                      --ep N > 1 splits the experts of an MoE model (gpt2-tiny-moe, mixtral-tiny) over\n"
    "                      N ranks, ZeRO 1-3 over dp for the dense part and over expert-dp = dp / N\n"
    "                      for the experts (docs/moe.md; checkpoints store experts by global index and\n"
    "                      load at any --ep); not with --tp/--pp\n"
    "  --moe-experts N     GPT-2 with every --moe-every-th block's MLP (default 2: every other) an MoE of\n"
    "                      N copies of it (docs/moe.md); --moe-k 1|2 (default 2), --moe-capacity-factor F\n"
    "                      (drop tokens beyond capacity F; default dropless), --moe-aux-coef X (the\n"
    "                      load-balancing loss's weight in the loss, default 0.01). --model gpt2-tiny-moe\n"
    "                      is gpt2-tiny with --moe-experts 4. --metrics and --summary get the routing\n"
    "                      (moe_aux_loss, moe_dropped_fraction, moe_tokens_per_expert; docs/moe.md)\n"
    "  --moe-timing        time the MoE layers' all-to-alls (CUDA events; --ep N > 1) into --metrics and\n"
    "                      --summary as moe_all_to_all_ms\n"
    "  --profile STEP      profile that step (0-based) with Kineto: writes PATH.rank<R>.json (Chrome\n"
    "                      trace) and PATH.rank<R>.txt (GPU time by kernel kind, top kernels)\n"
    "  --profile-steps N   profile N consecutive steps from STEP (default 1): a step after the first\n"
    "                      starts with work queued, as unprofiled steps do\n"
    "  --profile-out PATH  where (default zerotrain-profile)\n"
    "  --save DIR          write checkpoints to DIR (DIR/TAG/, DIR/latest) at the end of the run\n"
    "  --save-every N      ... and every N steps (needs --save)\n"
    "  --save-async        snapshot to host memory and write in a background thread (training\n"
    "                      stalls only for the snapshot; `latest` moves once every rank's file is done)\n"
    "  --load DIR          resume from DIR/latest: weights, optimizer, step, data position, RNG\n"
    "                      (--steps stays the total, so the run continues to step N)\n"
    "  --max-skipped-steps N   stop (error) after N consecutive steps skipped for inf/NaN gradients,\n"
    "                      any precision (default 50; 0 = never, DeepSpeed's behaviour)\n"
    "  --init-from PATH    start from Hugging Face weights: GPT-2 (a model.safetensors file or a\n"
    "                      directory with one) or a Llama-family directory (config.json plus\n"
    "                      model.safetensors or a sharded model.safetensors.index.json); a\n"
    "                      directory's config.json sets the model and its size\n"
    "  --lora SPEC         LoRA: freeze the model, train low-rank adapters on the layers SPEC names:\n"
    "                      r=16,alpha=32,dropout=0.05,targets=q_proj|v_proj[,rslora] (or regex=RE, last);\n"
    "                      GPT-2: c_attn, c_proj, c_fc; Llama: q/k/v/o_proj, gate/up/down_proj (docs/lora.md)\n"
    "  --lora-out DIR      where the adapter goes in peft's format (adapter_model.safetensors +\n"
    "                      adapter_config.json) at the end and with each --save (default: SAVE/adapter,\n"
    "                      or ./lora_adapter without --save)\n"
    "  --qlora             with --lora: the adapted layers' base weights stored as NF4 (bitsandbytes'\n"
    "                      format) and dequantized in each forward (CPU path; no CUDA kernel yet)\n"
    "Run N ranks with: zerotrain launch -n N -- zerotrain train ...\n";

struct TrainArgs {
  std::string config, model = "gpt2-tiny", data = "random", val_data, metrics, summary, save, load, init_from, device, profile_out = "zerotrain-profile";
  std::string lora, lora_out;  // --lora SPEC, --lora-out DIR
  std::string sft_attention = "causal";  // --sft-attention causal|per-example ([SFT Attention])
  bool qlora = false;          // --qlora
  int64_t save_every = 0;
  int64_t max_skipped_steps = 50;
  int64_t profile_step = -1;
  int64_t profile_steps = 1;  // consecutive steps from profile_step
  int64_t eval_every = 0, eval_batches = 20;
  int64_t steps = 20, seq = 0, micro = 0, accum = 0, layers = 0, embd = 0, heads = 0, vocab = 0, print_every = 0,
          warmup = 2, seed = 1234, tp = -1, pp = -1, ep = -1;  // -1: flag not given
  double clip = 1.0, peak_tflops = -1, lr = -1;
  TrainModelOptions::Moe moe;  // --moe-*
  bool bf16 = false, fp16 = false;
  std::vector<std::string> sets;  // --set KEY.PATH=VALUE, in order
  bool checkpoint = false;
  bool no_decay_1d = false;
  bool save_async = false;
  bool help = false;
};

TrainArgs parse_train_args(int argc, char** argv) {
  TrainArgs a;
  Flags f("train");
  f.text("--config", a.config);
  f.text("--model", a.model);
  f.text("--data", a.data);
  f.text("--val-data", a.val_data);
  f.count("--eval-every", a.eval_every);
  f.count("--eval-batches", a.eval_batches);
  f.choice("--sft-attention", a.sft_attention, {"causal", "per-example"});
  f.text("--metrics", a.metrics);
  f.text("--summary", a.summary);
  f.count("--steps", a.steps, 1);
  f.count("--seq", a.seq);
  f.count("--micro-batch", a.micro);
  f.count("--grad-accum", a.accum);
  f.count("--layers", a.layers);
  f.count("--embd", a.embd);
  f.count("--heads", a.heads);
  f.count("--vocab", a.vocab);
  f.count("--print-every", a.print_every);
  f.count("--warmup", a.warmup);
  f.count("--seed", a.seed);
  f.number("--clip", a.clip, 0.0);
  f.number("--peak-tflops", a.peak_tflops, 0.0);
  f.number("--lr", a.lr, 0.0);
  f.list("--set", a.sets);
  f.flag("--bf16", a.bf16);
  f.flag("--fp16", a.fp16);
  f.flag("--checkpoint-activations", a.checkpoint);
  f.flag("--no-decay-1d", a.no_decay_1d);
  f.text("--save", a.save);
  f.count("--save-every", a.save_every);
  f.flag("--save-async", a.save_async);
  f.count("--max-skipped-steps", a.max_skipped_steps);
  f.text("--load", a.load);
  f.text("--init-from", a.init_from);
  f.text("--lora", a.lora);
  f.text("--lora-out", a.lora_out);
  f.flag("--qlora", a.qlora);
  f.choice("--device", a.device, {"cpu", "cuda"});
  f.count("--profile", a.profile_step);
  f.count("--profile-steps", a.profile_steps, 1);
  f.text("--profile-out", a.profile_out);
  f.count("--tp", a.tp, 1);
  f.count("--pp", a.pp, 1);
  f.count("--ep", a.ep, 1);
  f.count("--moe-experts", a.moe.experts, 1);
  f.count("--moe-k", a.moe.k, 1, 2);
  f.count("--moe-every", a.moe.every, 1);
  f.number("--moe-capacity-factor", a.moe.capacity_factor, 1e-9);
  f.number("--moe-aux-coef", a.moe.aux_coef, 0.0);
  f.flag("--moe-timing", a.moe.timing);
  a.help = !f.parse(argc, argv);
  if (a.help) return a;
  ZT_CHECK_T(!a.config.empty(), UsageError, "train: --config CONFIG.json is required (see zerotrain train --help)");
  ZT_CHECK_T(a.save_every == 0 || !a.save.empty(), ConfigError, "train: --save-every needs --save DIR");
  ZT_CHECK_T(!a.save_async || !a.save.empty(), ConfigError, "train: --save-async needs --save DIR");
  ZT_CHECK_T(a.eval_every == 0 || !a.val_data.empty(), ConfigError, "train: --eval-every needs --val-data GLOB");
  ZT_CHECK_T(a.lora_out.empty() || !a.lora.empty(), ConfigError, "train: --lora-out needs --lora SPEC");
  ZT_CHECK_T(!a.qlora || !a.lora.empty(), ConfigError, "train: --qlora needs --lora SPEC (the adapters to train)");
  return a;
}

std::string device_name(const torch::Device& d);

// A value for a log line: 4 significant digits ("1.234", "0.0001234", "1.235e+04").
std::string log_num(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.4g", v);
  return b;
}

// Dense bf16 peak of this device from the table (monitor/device_peak.h); 0 = unknown,
// said in one line (rank 0), and MFU is then left out.
double detect_peak_tflops(const torch::Device& d, int rank) {
  if (!d.is_cuda()) return 0;
  const std::string name = device_name(d);
  if (auto p = monitor::dense_bf16_peak(name)) return p->tflops;
  if (rank == 0) {
    log::info("MFU left out: no peak TFLOP/s known for '%s' (docs/monitoring.md lists the table); "
              "pass --peak-tflops X to report it", name.c_str());
  }
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

// Token shards for `flag`, checked against the model's vocabulary: the shards' declared
// vocabulary (header[3], written by zerotrain tokenize) or, for files that do not record
// it (llm.c's), the largest id in them. Ids beyond the model's vocabulary are an error
// always; with --init-from the vocabularies must also agree, up to the padding rows some
// checkpoints add to the embedding (Qwen2, llm.c's 50304): at most kVocabPadding.
std::shared_ptr<data::ShardDataset> open_shards(const std::vector<std::string>& files, const char* flag, int64_t seq,
                                                int64_t model_vocab, bool init_from, int rank) {
  constexpr int64_t kVocabPadding = 512;
  for (const auto& f : files) {
    ZT_CHECK_T(data::looks_like_shard(f), ConfigError, "train: ", flag, " file '", f,
               "' is not a token shard (write shards with zerotrain tokenize)");
  }
  auto ds = std::make_shared<data::ShardDataset>(files, seq, model_vocab);
  const bool declared = ds->declared_vocab() > 0;
  const int64_t data_vocab = declared ? ds->declared_vocab() : ds->max_token_id() + 1;
  const char* what = declared ? "a tokenizer vocabulary of" : "token ids up to (max id + 1)";
  ZT_CHECK_T(data_vocab <= model_vocab, ConfigError, "train: ", flag, " shards ('", files[0], "', ...) have ", what,
             " ", data_vocab, " but the model's vocabulary is ", model_vocab,
             ": the data was tokenized for another model (use the model's tokenizer, or a model with --vocab ",
             data_vocab, ")");
  ZT_CHECK_T(!init_from || model_vocab - data_vocab <= kVocabPadding, ConfigError, "train: ", flag, " shards ('",
             files[0], "', ...) have ", what, " ", data_vocab, " but the --init-from weights have a vocabulary of ",
             model_vocab, ": the data was not tokenized with the model's tokenizer (tokenize with the tokenizer.json "
             "that comes with the weights)");
  if (rank == 0) {
    log::info("%s: %zu shard(s), %lld tokens, %lld windows of %lld, vocabulary %lld%s", flag, files.size(),
              static_cast<long long>(ds->num_tokens()), static_cast<long long>(ds->size()),
              static_cast<long long>(seq), static_cast<long long>(data_vocab), declared ? "" : " (from the max id)");
    if (ds->masked_shards() > 0) {
      log::info("%s: %lld of %zu shard(s) have a loss mask (SFT): prompt targets are ignored", flag,
                static_cast<long long>(ds->masked_shards()), files.size());
    }
  }
  return ds;
}

// open_shards, with the example positions of --sft-attention per-example ([SFT Attention]
// in models/llama.h): a shard without example starts is an error naming the flag.
std::shared_ptr<data::ShardDataset> open_shards_for(const TrainArgs& a, const std::vector<std::string>& files,
                                                    const char* flag, int64_t seq, int64_t model_vocab, int rank) {
  auto ds = open_shards(files, flag, seq, model_vocab, !a.init_from.empty(), rank);
  if (a.sft_attention == "per-example") {
    try {
      ds->set_example_positions(true);
    } catch (const ConfigError& e) {
      throw ConfigError(detail::cat("train: --sft-attention per-example: ", flag, " ", e.what()));
    }
    if (rank == 0) log::info("%s: per-example attention: positions restart at each example's first token", flag);
  }
  return ds;
}

// --device: cpu, cuda (this rank's GPU, checked) or unset (the engine's default).
std::optional<torch::Device> train_device(const TrainArgs& a) {
  if (a.device == "cpu") return torch::Device(torch::kCPU);
  if (a.device != "cuda") return std::nullopt;
  ZT_CHECK_T(torch::cuda::is_available(), ConfigError, "train: --device cuda but CUDA is not available here");
  return default_device();
}

// --data: token shards (a glob), a text file (byte tokens) or random tokens, in windows of
// `seq`. Opened before initialize(): a tokenizer that does not match the model (or the
// --init-from weights) is reported before the engine is built.
std::shared_ptr<const data::Dataset> open_train_data(const TrainArgs& a, int64_t vocab_size, int64_t seq, int rank) {
  // --data: token shards (a glob), a text file (byte tokens) or random tokens.
  std::vector<std::string> data_files;
  if (a.data != "random") data_files = expand_glob_or_self(a.data);
  const bool shards = !data_files.empty() && data::looks_like_shard(data_files[0]);
  const bool text = !data_files.empty() && !shards;
  if (text) {
    ZT_CHECK_T(data_files.size() == 1, ConfigError, "train: --data '", a.data, "' matches ", data_files.size(),
               " files that are not token shards; byte-token training takes one text file (tokenize many with "
               "zerotrain tokenize)");
    ZT_CHECK_T(vocab_size >= 256, ConfigError, "train: a text file needs a vocabulary of at least 256 "
               "(byte tokens); --vocab ", vocab_size, " is too small");
    ZT_CHECK_T(a.init_from.empty(), ConfigError, "train: --data '", a.data, "' is a text file, fed as byte tokens, "
               "but --init-from weights have a ", vocab_size, "-token vocabulary of their own tokenizer; "
               "tokenize the text with that tokenizer first (zerotrain tokenize --tokenizer DIR/tokenizer.json "
               "--out SHARDS FILE) and pass --data 'SHARDS/data_train_*.bin'");
  }
  ZT_CHECK_T(a.sft_attention == "causal" || shards, ConfigError, "train: --sft-attention per-example needs SFT "
             "shards with example boundaries (--data 'DIR/data_train_*.bin' written by zerotrain tokenize --sft), not ",
             text ? "a text file" : "random tokens");
  std::shared_ptr<const data::Dataset> ds;
  if (shards) ds = open_shards_for(a, data_files, "--data", seq, vocab_size, rank);
  else if (text) ds = std::make_shared<data::TokenDataset>(data_files[0], seq);
  else ds = std::make_shared<data::RandomTokenDataset>(vocab_size, seq, static_cast<uint64_t>(a.seed));
  return ds;
}

// [Tensor-Parallel Train] `train --tp N` (or a config whose tensor_parallel.autotp_size is
// N > 1): the model of --model built whole from --seed on every rank and cut over the tp
// group (GPT2TP / LlamaTP, docs/tensor-parallel.md; build_tp_train_model), trained by the
// engine with ZeRO 0-3 over the dp = ranks / N replicas (EngineOptions.group = the dp
// group, model_parallel = the tp ranks for the norm; at ZeRO-3 each tp slice is partitioned
// over dp, gathered per block). Every tp rank of a replica reads the
// replica's data (the sampler runs over the dp coordinate); the printed loss is the dp
// mean; tokens/s count each replica's tokens once and MFU divides the whole model's FLOPs
// over all ranks. tensor_parallel.sequence_parallel (zerotrain's key) turns on sequence
// parallelism. --save/--load store each split parameter as tp shards with their cut, which
// load at any --tp and without it ([TP Reshard] in ckpt/tp_reshard.h). --init-from DIR: each
// rank reads only its slices of the Hugging Face weights ([HF TP Load] in models/hf_tp.h).
// What it does not do yet is named before the first step (check_tensor_parallel_args,
// build_tp_train_model): --lora, optimizer offload.

// The config of a tensor-parallel run: Config::parse with the "tp > 1 is not supported by
// zt::initialize alone" note dropped (this path builds what it needs); every other
// setting zerotrain does not support is still an error.
Config tensor_parallel_config(const nlohmann::json& j, int world, const std::string& origin) {
  Config cfg = Config::parse(j, world, origin);
  config::drop_tensor_parallel_note(cfg.not_supported_yet);
  std::string rest;
  for (const auto& m : cfg.not_supported_yet) rest += "\n  " + m;
  ZT_CHECK_T(rest.empty(), ConfigError, origin, ": settings zerotrain does not support yet:", rest);
  return cfg;
}

// The config of an expert-parallel run: Config::parse with the "expert parallelism is not
// implemented yet" note dropped (it holds for zt::initialize from the config alone; this path
// builds the groups and the MoE model); every other unsupported setting is still an error.
Config expert_parallel_config(const nlohmann::json& j, int world, const std::string& origin) {
  Config cfg = Config::parse(j, world, origin);
  std::erase_if(cfg.not_supported_yet,
                [](const std::string& m) { return m.rfind("expert_parallel.enabled = ", 0) == 0; });
  std::string rest;
  for (const auto& m : cfg.not_supported_yet) rest += "\n  " + m;
  ZT_CHECK_T(rest.empty(), ConfigError, origin, ": settings zerotrain does not support yet:", rest);
  return cfg;
}

// The flags and settings the tensor-parallel path does not take yet (ConfigError naming
// each and the fix, before the model is built).
void check_tensor_parallel_args(const TrainArgs& a, const Config& cfg, const config::TensorParallelOptions& tpo) {
  auto refuse = [&](bool given, const char* what, const char* why) {
    ZT_CHECK_T(!given, ConfigError, "train: ", what, " with --tp ", tpo.size, " is not supported yet (", why,
               "); run without it, or without --tp (docs/tensor-parallel.md)");
  };
  refuse(!a.lora.empty() || a.qlora, "--lora/--qlora", "adapters on the tensor-parallel layers");
  refuse(cfg.zero_optimization.offload_optimizer.device != OffloadDevice::none,
         "zero_optimization.offload_optimizer", "the host optimizer step is not tested with the model-parallel norm");
}

// [Resume Data Position] A checkpoint's data position is a loader position (epoch, batch)
// of the saving run's micro batch and data-parallel degree ("micro", "dp" in the client
// state). Every dp rank reads every dp-th window of one shuffled order (DistributedSampler),
// so after `batch` micro-batches the replicas together have read the first batch x micro x
// dp windows of the epoch: at another micro x dp the same windows are batch x micro x dp /
// (micro' x dp') batches (a ConfigError when that does not divide). Without the two keys
// (older checkpoints) the position is taken as it is.
int64_t resumed_data_batch(const nlohmann::json& d, int64_t micro, int64_t dp, const std::string& load) {
  const int64_t batch = d.at("batch").get<int64_t>();
  if (!d.contains("micro") || !d.contains("dp")) return batch;
  const int64_t windows = batch * d.at("micro").get<int64_t>() * d.at("dp").get<int64_t>();
  ZT_CHECK_T(windows % (micro * dp) == 0, ConfigError, "train: the checkpoint in ", load, " was saved after ", windows,
             " windows of its epoch (micro batch ", d.at("micro").get<int64_t>(), " x dp ", d.at("dp").get<int64_t>(),
             " x ", batch, " micro-batches), which this run's micro batch ", micro, " x dp ", dp,
             " does not divide: resume with a train_micro_batch_size_per_gpu x data-parallel degree dividing ", windows);
  return windows / (micro * dp);
}

// [Pipeline Train] `train --pp N` (or a config whose pipeline.stages is N > 1): GPT-2 cut
// into N stages by zt::pipe::PipeEngine (docs/pipeline.md), dp = ranks / N data-parallel
// replicas with ZeRO 0-2 over dp, the schedule of pipeline.schedule. One step is
// gradient_accumulation_steps micro-batches through the pipeline, then the optimizer step on
// every stage; every dp replica reads its own part of the data, and the printed loss is the
// mean over the replicas (as DeepSpeed's PipelineEngine reports it). What the pipeline does not
// do yet is named before the first step: --init-from (checkpoints: [Pipeline Checkpoints]),
// --lora/--qlora, --val-data, ZeRO-3, expert parallelism, a Llama with --tp. A Llama-family
// model (--model llama-tiny, a config.json) is cut the same way ([Llama Pipeline] in
// pipe/llama_pipe.h).
// With --tp M too (tensor x pipeline parallelism, [Pipeline x Tensor Parallel] in
// pipe/gpt2_pipe.h): dp = ranks / (M x N); the whole GPT-2 from --seed is cut into GPT2TP over
// the tp group (tensor_parallel.sequence_parallel as with --tp alone), and each stage keeps its
// layers of its tp slice; the tp ranks of a replica read the replica's data.
int train_pipeline(const TrainArgs& a, const nlohmann::json& j, const comm::GroupPtr& group) {
  const int rank = group->rank(), world = group->size();
  auto refuse = [](bool given, const char* what) {
    ZT_CHECK_T(!given, ConfigError, "train: ", what, " is not supported with pipeline parallelism (--pp) yet; "
               "run without it, or without --pp (docs/pipeline.md)");
  };
  refuse(!a.init_from.empty(), "--init-from");
  refuse(!a.lora.empty() || a.qlora, "--lora/--qlora");
  refuse(!a.val_data.empty(), "--val-data");
  refuse(a.sft_attention != "causal", "--sft-attention per-example");
  refuse(a.profile_step >= 0 || a.profile_steps != 1, "--profile");
  ZT_CHECK_T(!a.checkpoint, ConfigError, "train: --checkpoint-activations with --pp: set "
             "pipeline.activation_checkpoint_interval in the config instead (the pipeline's own checkpointing)");
  pipe::PipeConfig pc = pipe::pipeline_config(j, world, a.config);
  const Config& cfg = pc.config;
  const int pp = static_cast<int>(pc.pipeline.stages);
  const config::TensorParallelOptions tpo = config::tensor_parallel_options(j);
  const int tp = cfg.tp_size();
  ZT_CHECK_T(pp >= 1 && world % (pp * tp) == 0, ConfigError, "train: pipeline.stages = ", pp, " x tp ", tp,
             " does not divide the ", world, " ranks");
  refuse(tp > 1 && cfg.zero_optimization.offload_optimizer.device != OffloadDevice::none,
         "zero_optimization.offload_optimizer with --tp and --pp");
  const int dp = world / (pp * tp);
  torch::manual_seed(static_cast<uint64_t>(a.seed));
  TrainModel model = build_train_model({a.model, "", a.layers, a.embd, a.heads, a.vocab, false, rank, std::nullopt, false, a.moe}, cfg);
  auto impl = std::dynamic_pointer_cast<models::GPT2Impl>(model.module);
  // [Llama Pipeline] (pipe/llama_pipe.h): a Llama-family model is cut as GPT-2 is, at tp 1.
  auto llama = std::dynamic_pointer_cast<models::LlamaForCausalLMImpl>(model.module);
  const char* family_label = llama ? "Llama" : "GPT-2";
  ZT_CHECK_T((model.family == "gpt2" && impl) || (model.family == "llama" && llama), ConfigError,
             "train: --pp cuts GPT-2 or a Llama-family model into stages; ", model.name, " is a ", model.family,
             " model");
  ZT_CHECK_T(!llama || tp == 1, ConfigError, "train: --tp ", tp, " with --pp and the Llama model ", model.name,
             " is not supported yet (tensor x pipeline parallelism cuts GPT-2 only); run a Llama with --pp alone or "
             "--tp alone (docs/pipeline.md)");
  ZT_CHECK_T(!impl || impl->config().moe_num_experts == 0, ConfigError, "train: --pp with the MoE model ", model.name,
             " is not supported yet (the pipeline stages hold dense GPT-2 blocks); run without --pp");
  ZT_CHECK_T(!llama || !llama->config().is_moe(), ConfigError, "train: --pp with the MoE model ", model.name,
             " is not supported yet (the pipeline stages do not add the router's load-balancing loss); run without --pp");
  const int64_t seq = a.seq > 0 ? a.seq : std::min<int64_t>(1024, model.max_seq);
  ZT_CHECK_T(seq <= model.max_seq, ConfigError, "train: --seq ", seq, " exceeds the model's ", model.max_seq,
             " positions");
  ZT_CHECK_T(!tpo.sequence_parallel || seq % tp == 0, ConfigError, "train: --seq ", seq, " does not divide by --tp ",
             tp, ": tensor_parallel.sequence_parallel splits the sequence over the tensor-parallel ranks; choose --seq "
             "a multiple of ", tp, " or turn sequence_parallel off");
  std::shared_ptr<const data::Dataset> ds = open_train_data(a, model.vocab_size, seq, rank);
  parallel::Topology topo(group, parallel::ParallelDims::make(world, dp, tp, pp));
  if (rank == 0) log::info("%s", topo.describe().c_str());
  pipe::PipeOptions po;
  po.device = train_device(a);
  po.metrics_path = rank == 0 ? a.metrics : "";  // one PipeReport per step
  std::unique_ptr<pipe::PipeEngine> engine_ptr;
  if (tp > 1) {
    // [Pipeline x Tensor Parallel]: the whole model's weights cut over the tp group (the
    // group first: every rank builds the topology's groups in the same order).
    auto tp_group = topo.tp();
    models::GPT2Config mc = impl->config();
    mc.deferred_init = false;
    models::GPT2TP cut(mc, tp_group, tpo.sequence_parallel);
    std::map<std::string, torch::Tensor> weights;  // by name, not copied: load_full copies the slices
    for (const auto& kv : impl->named_parameters()) weights[kv.key()] = kv.value().detach();
    cut->load_full(weights);
    model.module.reset();
    impl.reset();
    engine_ptr = std::make_unique<pipe::PipeEngine>(cut, pc, topo, po);
  } else if (llama) {
    engine_ptr = std::make_unique<pipe::PipeEngine>(models::LlamaForCausalLM(llama), pc, topo, po);
  } else {
    engine_ptr = std::make_unique<pipe::PipeEngine>(models::GPT2(impl), pc, topo, po);
  }
  pipe::PipeEngine& engine = *engine_ptr;
  model.module.reset();
  impl.reset();  // each stage keeps its own layers
  llama.reset();
  data::DistributedSampler sampler(ds->size(), topo.coords().dp, dp, /*shuffle=*/true, static_cast<uint64_t>(a.seed));
  data::Loader loader(ds, sampler, cfg.train_micro_batch_size_per_gpu, torch::kCPU);
  auto next = [&] {
    auto [x, y] = loader.next();
    return pipe::MicroBatch{x, y};
  };
  if (rank == 0) {
    const int cap = engine.schedule().spec.max_pending_w;  // [ZB-H1 Pending Cap]
    log::info("pipeline: %s %s in %d stages (layers %s), schedule %s%s, %lld micro-batches of %lld x %lld per step, "
              "dp %d%s", family_label, model.name.c_str(), pp, nlohmann::json(engine.partition()).dump().c_str(),
              schedule_name(engine.schedule().spec.kind),
              cap >= 0 ? (" (zb_max_pending_w " + std::to_string(cap) + ")").c_str() : "",
              static_cast<long long>(cfg.gradient_accumulation_steps),
              static_cast<long long>(cfg.train_micro_batch_size_per_gpu), static_cast<long long>(seq), dp,
              tp > 1 ? detail::cat(", tp ", tp, tpo.sequence_parallel ? " with sequence parallelism" : "").c_str() : "");
  }
  // [Pipeline Checkpoints]: one checkpoint of the whole GPT-2 over every stage, with the
  // client state of the non-pipelined path (data position, model shape, seq), so it loads
  // with or without --pp, at any pp and dp, and `zerotrain convert` reads it.
  nlohmann::json saves = nlohmann::json::array();
  auto collect_saves = [&] {
    const CheckpointSaveReport& r = engine.engine().last_checkpoint_save();
    if (r.index == 0 || static_cast<int64_t>(saves.size()) >= r.index) return;
    saves.push_back({{"tag", r.tag}, {"async", r.async}, {"step", r.step}, {"published_step", r.published_step},
                     {"stall_ms", r.stall_ms}, {"write_ms", r.write_ms}, {"bytes", r.bytes}});
  };
  auto save = [&] {
    const auto pos = loader.state();
    engine.save_checkpoint(a.save, "",
                           {{"data", {{"epoch", pos.epoch}, {"batch", pos.batch}, {"samples", ds->size()},
                                      {"micro", cfg.train_micro_batch_size_per_gpu}, {"dp", dp}}},
                            {"model", model.model_json},
                            {"seq", seq}},
                           a.save_async);
    collect_saves();
  };
  // A failed periodic save is reported, training goes on, and the run exits with code 3 (as
  // without --pp); the last save of the run must succeed ([Periodic Saves]).
  PeriodicSaves periodic(rank);
  int64_t start = 0;
  if (!a.load.empty()) {
    const nlohmann::json client = engine.load_checkpoint(a.load);
    if (client.contains("data")) {
      const nlohmann::json& d = client["data"];
      ZT_CHECK_T(!d.contains("samples") || d["samples"].get<int64_t>() == ds->size(), ConfigError, "train: the "
                 "checkpoint in ", a.load, " was saved at a data position over ", d["samples"].get<int64_t>(),
                 " windows of ", seq, " tokens, but --data '", a.data, "' gives ", ds->size(),
                 " (resume with the same --data and --seq)");
      loader.set_state({d.at("epoch").get<int64_t>(), resumed_data_batch(d, cfg.train_micro_batch_size_per_gpu, dp, a.load)});
    }
    start = engine.engine().global_steps();
    if (rank == 0) {
      log::info("resuming at step %lld of %lld", static_cast<long long>(start), static_cast<long long>(a.steps));
    }
  }
  const int64_t print_every = a.print_every > 0 ? a.print_every : std::max<int64_t>(1, cfg.steps_per_print);
  const double tokens_per_step = static_cast<double>(cfg.train_batch_size * seq);
  double first = 0, last = 0, timed_ms = 0;
  int64_t timed = 0;
  // This rank's peak device memory over the run: the largest phase peak of its stage engine's
  // steps (CUDA caching allocator, as the non-pipelined summary; not measured on CPU), and of
  // zb-h1's input-gradient passes, which run outside those phases ([Input Backward Peak]).
  const bool measure_peak = !a.summary.empty() && engine.engine().device().is_cuda();
  int64_t peak_bytes = 0;
  for (int64_t s = start + 1; s <= a.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    // A failed asynchronous save surfaces here, after the batch is done ([Pipeline Checkpoints]).
    periodic([&] { engine.train_batch(next); }, s);
    last = engine.last_report().loss;  // this dp replica's mean: averaged over the replicas below
    if (measure_peak) {
      const StepReport& er = engine.engine().last_report();
      peak_bytes = std::max({peak_bytes, er.forward.mem_peak, er.backward.mem_peak, er.step_phase.mem_peak,
                             engine.input_backward_mem_peak()});
    }
    if (dp > 1) {
      auto l = torch::tensor({last}, torch::kDouble);
      topo.dp()->all_reduce(l, comm::ReduceOp::kSum);
      last = l.item<double>() / dp;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s == start + 1) first = last;
    if (s > start + a.warmup) timed_ms += ms, ++timed;
    ZT_CHECK_T(std::isfinite(last), TrainingError, "train: the pipeline's loss is not finite at step ", s);
    if (rank == 0 && (s % print_every == 0 || s == a.steps)) {
      const auto& r = engine.last_report();
      std::printf("Epoch %lld, Step %lld/%lld, Loss: %.6f | %.1f ms, %.0f tokens/s, bubble %.3f (formula %.3f)\n",
                  static_cast<long long>(loader.epoch() + 1), static_cast<long long>(s), static_cast<long long>(a.steps),
                  last, ms, tokens_per_step / (ms / 1000.0), r.bubble, r.bubble_formula);
      std::fflush(stdout);
    }
    collect_saves();  // an asynchronous save may have been published by this step
    // Periodic saves (not in the step's time). An asynchronous save still in flight is
    // settled on its own first, as without --pp.
    if (a.save_every > 0 && s % a.save_every == 0 && s < a.steps) {
      if (engine.engine().checkpoint_pending()) periodic([&] { engine.wait_checkpoint(); }, s);
      periodic(save, s);
    }
  }
  if (!a.save.empty()) {
    if (engine.engine().checkpoint_pending()) periodic([&] { engine.wait_checkpoint(); }, a.steps);
    save();
    engine.wait_checkpoint();  // the run's last checkpoint is published before exit
    collect_saves();
  }
  // Each stage's peak: the largest over its tp x dp ranks (every rank sends its stage and its
  // peak; one all-gather over the world). Null on CPU.
  nlohmann::json peak_per_stage = nullptr, peak_gib = nullptr;
  if (!a.summary.empty()) {
    auto mine = torch::tensor({static_cast<double>(topo.coords().pp), static_cast<double>(peak_bytes)}, torch::kDouble);
    auto all = torch::empty({world * 2}, torch::kDouble);
    group->all_gather(all, mine);
    if (measure_peak) {
      std::vector<double> per(static_cast<size_t>(pp), 0.0);
      auto acc = all.accessor<double, 1>();
      for (int r = 0; r < world; ++r) {
        auto& p = per[static_cast<size_t>(acc[2 * r])];
        p = std::max(p, acc[2 * r + 1] / (1024.0 * 1024.0 * 1024.0));
      }
      peak_per_stage = per;
      peak_gib = *std::max_element(per.begin(), per.end());
    }
  }
  if (rank == 0) {
    std::printf("pipeline: loss %.4f -> %.4f", first, last);
    if (timed > 0) std::printf(", %.1f ms/step, %.0f tokens/s", timed_ms / timed, tokens_per_step * timed / (timed_ms / 1000.0));
    std::printf("\n");
    if (!a.summary.empty()) {
      const auto& r = engine.last_report();
      nlohmann::json sj = {{"framework", "zerotrain"},
                           {"model", model.name},
                           {"world", world},
                           {"dp", dp},
                           {"tp", cfg.tp_size()},
                           {"pp", pp},
                           {"schedule", r.schedule},
                           {"stage", cfg.zero_optimization.stage},
                           {"micro_batch", cfg.train_micro_batch_size_per_gpu},
                           {"grad_accum", cfg.gradient_accumulation_steps},
                           {"seq", seq},
                           {"steps", a.steps},
                           {"timed_steps", timed},
                           {"ms_per_iter", timed > 0 ? timed_ms / timed : 0.0},
                           {"tokens_per_s", timed > 0 ? tokens_per_step * timed / (timed_ms / 1000.0) : 0.0},
                           {"loss_first", first},
                           {"loss_last", last},
                           {"global_samples", engine.engine().global_samples()},
                           {"peak_gib_per_stage", peak_per_stage},  // null on CPU
                           {"peak_gib", peak_gib},
                           {"last_step", r.to_json()}};  // per-stage timing and the bubble
      if (!saves.empty()) sj["checkpoint_saves"] = saves;
      if (r.zb_max_pending_w >= 0) sj["zb_max_pending_w"] = r.zb_max_pending_w;  // [ZB-H1 Pending Cap]
      std::ofstream f(a.summary, std::ios::app);
      ZT_CHECK(f.good(), "cannot write ", a.summary);
      f << sj.dump() << "\n";
    }
  }
  return periodic.exit_code();
}

}  // namespace
// [Expert-Parallel Train] `train --ep N` (or a config whose expert_parallel.enabled is true
// with autoep_size N > 1): an MoE model (gpt2-tiny-moe, [GPT-2 MoE] in models/gpt2.h) built
// whole from --seed on every rank, each keeping the dense part and its own experts
// (build_ep_train_model), trained by the engine with ZeRO 0-3: dense parameters over dp
// (every rank), experts over expert-dp = dp / N (EngineOptions.is_expert / ep / expert_dp,
// docs/moe.md). Each rank reads its own data as without --ep (dp = world), and the line
// shows rank 0's own loss as the plain path does, so ep N prints what ep 1 prints. What it
// does not do yet is named before the first step (here, build_ep_train_model and the
// engine): --init-from, --lora, --val-data, NVMe offload, --tp/--pp. Checkpoints store the
// experts by global index and load at any --ep ([Expert Checkpoints] in ckpt/engine_checkpoint.cpp).

// The expert-parallel degree the config (after the flags) asks for: autoep_size when
// expert_parallel.enabled is true, else 1. Wrong types are left to Config::parse.
int64_t expert_parallel_degree(const nlohmann::json& j) {
  if (!j.contains("expert_parallel") || !j["expert_parallel"].is_object()) return 1;
  const auto& e = j["expert_parallel"];
  if (!e.contains("enabled") || !e["enabled"].is_boolean() || !e["enabled"].get<bool>()) return 1;
  return e.contains("autoep_size") && e["autoep_size"].is_number_integer() ? e["autoep_size"].get<int64_t>() : 1;
}

// The flags the expert-parallel path does not take yet (ConfigError naming each and the
// fix, before the model is built).
void check_expert_parallel_args(const TrainArgs& a, int64_t ep) {
  auto refuse = [&](bool given, const char* what, const char* why) {
    ZT_CHECK_T(!given, ConfigError, "train: ", what, " with --ep ", ep, " is not supported yet (", why,
               "); run without it, or without --ep (docs/moe.md)");
  };
  refuse(!a.lora.empty() || a.qlora, "--lora/--qlora", "adapters on the experts");
  refuse(!a.val_data.empty(), "--val-data", "validation of the expert-parallel model is not tested");
}

int cmd_train(int argc, char** argv) {
  TrainArgs a = parse_train_args(argc, argv);
  if (a.help) {
    std::fputs(kTrainUsage, stdout);
    return 0;
  }
  check_save_dir(a.save, a.load);  // an unusable --save fails now, not after the last step
  std::optional<lora::LoraOptions> lora_opts;
  if (!a.lora.empty()) {
    lora_opts = lora::parse_lora_spec(a.lora);
    if (a.lora_out.empty()) a.lora_out = a.save.empty() ? "lora_adapter" : a.save + "/adapter";
    check_output_dir("train", "--lora-out", a.lora_out);
  }
  auto group = comm::world_group();
  const int rank = group->rank(), world = group->size();
  // [Save Dir Lock]: one job per --save directory, taken by rank 0 for the whole run.
  std::unique_ptr<ckpt::DirLock> save_lock;
  if (!a.save.empty()) {
    std::string err;
    if (rank == 0) {
      try {
        save_lock = ckpt::DirLock::acquire(a.save);
      } catch (const std::exception& ex) {
        err = ex.what();
      }
    }
    const auto failure = comm::lowest_failure(group, err);
    ZT_CHECK_T(!failure, ConfigError, "train: --save ", a.save, ": ", failure->message);
  }

  nlohmann::json j = Config::read_json_file(a.config);
  apply_set_overrides(j, a.sets, "train");
  fill_batch_auto(j, a.micro, a.accum, a.clip);
  const auto unflagged = fill_precision_auto(j, a.bf16, a.fp16, a.lr);
  fill_parallel_flags(j, a.tp, a.pp, a.ep);
  const config::TensorParallelOptions tpo = config::tensor_parallel_options(j);
  const bool tensor_parallel = tpo.size > 1;
  const int64_t ep = expert_parallel_degree(j);
  const bool expert_parallel = ep > 1;
  if (expert_parallel && (tensor_parallel || (j.contains("pipeline") && j["pipeline"].is_object() &&
                                              j["pipeline"].contains("stages") &&
                                              j["pipeline"]["stages"].is_number_integer() &&
                                              j["pipeline"]["stages"].get<int64_t>() > 1))) {
    throw ConfigError(detail::cat("train: --ep ", ep, " with ", tensor_parallel ? "--tp" : "--pp",
                                  " is not supported yet; use expert parallelism alone (docs/moe.md)"));
  }
  ZT_CHECK_T(a.sft_attention == "causal" || (!tensor_parallel && !expert_parallel), ConfigError,
             "train: --sft-attention per-example with ", tensor_parallel ? "--tp" : "--ep",
             " is not supported yet (only the plain Llama model takes position ids); run without it");
  if (j.contains("pipeline") && j["pipeline"].is_object() && j["pipeline"].contains("stages") &&
      j["pipeline"]["stages"].is_number_integer() && j["pipeline"]["stages"].get<int64_t>() > 1) {
    const int rc = train_pipeline(a, j, group);  // [Pipeline Train]; its engine is gone on return
    comm::finalize();
    return rc;
  }
  Config cfg = tensor_parallel   ? tensor_parallel_config(j, world, a.config)
               : expert_parallel ? expert_parallel_config(j, world, a.config)
                                 : Config::from_json(j, world, a.config);
  if (tensor_parallel) check_tensor_parallel_args(a, cfg, tpo);
  if (expert_parallel) check_expert_parallel_args(a, ep);
  check_swap_dirs(cfg, a.save, a.load);
  if (rank == 0) {
    for (const auto& n : config::config_notes(j, cfg)) log::info("note: %s", n.c_str());
    std::string keys;
    for (const auto& k : unflagged) keys += (keys.empty() ? "" : ", ") + k + " = false";
    for (const auto& k : cfg.auto_defaulted) keys += (keys.empty() ? "" : ", ") + k;
    if (!keys.empty()) {
      log::warn("\"auto\" keys took the default: %s -- training in %s; set them in the "
                "config or with --bf16, --fp16, --lr", keys.c_str(), cfg.fp16.enabled ? "fp16" : cfg.bf16.enabled ? "bf16" : "fp32");
    }
  }
  if (rank == 0) {
    // Every factor and rank 0's coordinates; Topology makes no group here.
    log::info("%s", parallel::Topology(group, parallel::dims_of(cfg, world)).describe().c_str());
  }

  // --init-from: the data must fit the weights' tokenizer. Checked from their config.json
  // before any weights are read (building the model reads them).
  if (!a.init_from.empty() && a.data != "random") {
    const std::string hf_config = a.init_from + "/config.json";
    const std::vector<std::string> files = expand_glob_or_self(a.data);
    if (!files.empty() && !data::looks_like_shard(files[0])) {
      ZT_CHECK_T(false, ConfigError, "train: --data '", a.data, "' is a text file, fed as byte tokens, but the "
                 "--init-from weights have a vocabulary of their own tokenizer; tokenize the text with that tokenizer "
                 "first (zerotrain tokenize --tokenizer DIR/tokenizer.json --out SHARDS FILE) and pass --data "
                 "'SHARDS/data_train_*.bin'");
    }
    std::ifstream f(hf_config);
    if (f.good() && !files.empty()) {
      const nlohmann::json hc = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      if (hc.is_object() && hc.contains("vocab_size") && hc["vocab_size"].is_number_integer()) {
        open_shards(files, "--data", a.seq > 0 ? a.seq : 1, hc["vocab_size"].get<int64_t>(), true, /*rank=*/-1);  // quiet
      }
    }
  }

  // [Tensor-Parallel Train]: the topology's groups, built in the same order on every rank
  // (tp, dp, model-parallel; see [Topology Groups]); the model cut over tp.
  std::unique_ptr<parallel::Topology> topo;
  if (tensor_parallel) {
    topo = std::make_unique<parallel::Topology>(
        group, parallel::ParallelDims::make(world, world / static_cast<int>(tpo.size), static_cast<int>(tpo.size), 1));
    topo->tp();
    topo->dp();
    topo->model_parallel();
  } else if (expert_parallel) {
    // [Expert-Parallel Train]: dp = every rank, cut into ep groups (DeepSpeed's E + D).
    topo = std::make_unique<parallel::Topology>(group, parallel::ParallelDims::make(world, world, 1, 1, static_cast<int>(ep)));
    topo->dp();
    topo->ep();
    topo->expert_dp();
  }
  // Data parallelism: each dp replica reads its own windows; the tp ranks of one replica
  // read the same ones.
  const int dp_rank = topo ? topo->coords().dp : rank, dp_size = topo ? topo->dims().dp : world;
  torch::manual_seed(static_cast<uint64_t>(a.seed));
  const TrainModelOptions model_opts{a.model, a.init_from, a.layers,   a.embd,    a.heads,
                                     a.vocab, a.checkpoint, rank,      lora_opts, a.qlora, a.moe};
  TrainModel model = tensor_parallel ? build_tp_train_model(model_opts, cfg, topo->tp(), tpo.sequence_parallel)
                     : expert_parallel ? build_ep_train_model(model_opts, cfg, topo->ep())
                                       : build_train_model(model_opts, cfg);
  // The recompute of a checkpointed layer does not replay the RNG (models/checkpoint.h):
  // its dropout mask would differ from the forward's, and the gradients would be wrong.
  ZT_CHECK_T(!model.lora || model.lora->options.dropout == 0 || !model.activation_checkpointing, ConfigError,
             "train: --lora dropout=", model.lora ? model.lora->options.dropout : 0.0,
             " with activation checkpointing: the recomputed layers would draw other dropout masks; use dropout=0 "
             "or turn activation checkpointing off");
  const int64_t seq = a.seq > 0 ? a.seq : std::min<int64_t>(1024, model.max_seq);
  ZT_CHECK_T(seq <= model.max_seq, ConfigError, "train: --seq ", seq, " exceeds the model's ", model.max_seq,
             " positions");
  ZT_CHECK_T(!tpo.sequence_parallel || seq % tpo.size == 0, ConfigError, "train: --seq ", seq,
             " does not divide by --tp ", tpo.size, ": tensor_parallel.sequence_parallel splits the sequence over the "
             "tensor-parallel ranks; choose --seq a multiple of ", tpo.size, " or turn sequence_parallel off");
  std::shared_ptr<const data::Dataset> ds = open_train_data(a, model.vocab_size, seq, rank);
  std::shared_ptr<const data::ShardDataset> val_ds;
  if (!a.val_data.empty()) {
    val_ds = open_shards_for(a, expand_glob_or_self(a.val_data), "--val-data", seq, model.vocab_size, rank);
  }
  // [SFT Attention]: the loss that takes the batches' position ids.
  const bool per_example = a.sft_attention == "per-example";
  ZT_CHECK_T(!per_example || model.loss_with_positions, ConfigError, "train: --sft-attention per-example needs a "
             "Llama-family model; ", model.name, " is ", model.family, " (use --sft-attention causal)");
  auto batch_loss = [&](const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& pos) {
    return per_example ? model.loss_with_positions(x, y, pos) : model.loss(x, y);
  };

  const double flops_per_token = model.flops_per_token(seq);

  // [MoE Metrics] An MoE model: after each micro-batch's backward the routing of its
  // forward and its all-to-all spans are kept by step; when the step's report resolves
  // (its device work done: reading the aux loss and the spans waits for nothing),
  // on_report puts them into StepReport::extra, so the metrics line, the monitor and the
  // progress line get them (docs/moe.md):
  //   moe_aux_loss             unscaled sum over the MoE blocks, mean over the micro-batches
  //   moe_dropped_fraction     mean over the MoE blocks and micro-batches
  //   moe_tokens_per_expert    [E]: assignments each expert kept, summed over the MoE blocks
  //                            and micro-batches (sum = blocks x tokens x k x (1 - dropped))
  //   moe_tokens_per_expert_by_layer   [MoE block][E], the same per block
  //   moe_all_to_all_ms / moe_all_to_all_calls   (--moe-timing) the all-to-alls' time, forward
  //                            and backward, summed over the step, and their count
  // All of this rank's tokens (rank 0's in the files).
  struct MoeStep {
    torch::Tensor aux_sum;
    double dropped_sum = 0;
    int64_t micro = 0;
    std::vector<std::vector<int64_t>> kept;  // [MoE block][E]
    std::vector<DeviceSpan> all_to_all;
  };
  std::map<int64_t, MoeStep> moe_steps;  // by global step (StepReport::step)
  auto moe_record = [&](int64_t step, TrainModel::MoeStats st) {
    MoeStep& m = moe_steps[step];
    m.aux_sum = m.aux_sum.defined() ? m.aux_sum + st.aux_loss : st.aux_loss;
    m.dropped_sum += st.dropped_fraction;
    ++m.micro;
    if (m.kept.empty()) {
      m.kept = std::move(st.kept_per_expert);
    } else {
      for (size_t b = 0; b < m.kept.size() && b < st.kept_per_expert.size(); ++b)
        for (size_t e = 0; e < m.kept[b].size() && e < st.kept_per_expert[b].size(); ++e) m.kept[b][e] += st.kept_per_expert[b][e];
    }
    for (auto& sp : st.all_to_all) m.all_to_all.push_back(std::move(sp));
  };
  auto moe_report = [&](StepReport& r) {
    auto it = moe_steps.find(r.step);
    if (it == moe_steps.end()) return;
    const MoeStep& m = it->second;
    const double n = static_cast<double>(std::max<int64_t>(1, m.micro));
    r.extra["moe_aux_loss"] = m.aux_sum.defined() ? m.aux_sum.item<double>() / n : 0.0;
    r.extra["moe_dropped_fraction"] = m.dropped_sum / n;
    std::vector<int64_t> total(m.kept.empty() ? 0 : m.kept.front().size(), 0);
    for (const auto& row : m.kept)
      for (size_t e = 0; e < row.size() && e < total.size(); ++e) total[e] += row[e];
    r.extra["moe_tokens_per_expert"] = total;
    r.extra["moe_tokens_per_expert_by_layer"] = m.kept;
    if (a.moe.timing) {
      double ms = 0;
      for (const auto& sp : m.all_to_all) ms += sp.ms();
      r.extra["moe_all_to_all_ms"] = ms;
      r.extra["moe_all_to_all_calls"] = m.all_to_all.size();
    }
    moe_steps.erase(it);
  };

  EngineOptions eo;
  eo.metrics_path = a.metrics;
  if (model.moe) eo.on_report = moe_report;
  model.engine_options(eo);
  eo.max_skipped_steps = a.max_skipped_steps;
  if (a.no_decay_1d) eo.param_groups = no_decay_groups(*model.module, cfg.optimizer.params.weight_decay);
  // This rank's share: a tp rank computes 1/tp of its replica's FLOPs.
  eo.flops_per_sample = flops_per_token * static_cast<double>(seq) / static_cast<double>(tpo.size);
  eo.device = train_device(a);
  if (tensor_parallel) {
    eo.group = topo->dp();                     // ZeRO over the data-parallel ranks
    eo.model_parallel = topo->model_parallel();  // the norm (clipping, overflow) over the tp ranks too
  } else if (expert_parallel) {
    eo.group = topo->dp();  // the dense parameters over every rank; experts over expert-dp
    eo.ep = topo->ep();
    eo.expert_dp = topo->expert_dp();
  }
  // [NF4 At ZeRO-3]: QLoRA's NF4 base partitioned over the dp ranks with the rest of the base.
  const bool nf4_partitioned = model.lora && model.nf4_bytes > 0 && cfg.zero_optimization.stage == 3;
  if (nf4_partitioned) lora::partition_nf4_bases(*model.lora, eo);
  auto engine = initialize(model.module, cfg, eo);
  model.attach(*engine);
  const torch::Device device = engine->device();
  std::vector<int64_t> nf4_per_rank;  // [NF4 At ZeRO-3]: each rank's NF4 bytes (every rank calls)
  if (nf4_partitioned) {
    auto g = comm::world_group();
    auto mine = torch::tensor({engine->model_state_bytes().frozen_storage}, torch::kLong);
    auto all = torch::empty({g->size()}, torch::kLong);
    g->all_gather(all, mine);
    for (int64_t r = 0; r < g->size(); ++r) nf4_per_rank.push_back(all[r].item<int64_t>());
  }
  const double peak = a.peak_tflops >= 0 ? a.peak_tflops : detect_peak_tflops(device, rank);

  data::DistributedSampler sampler(ds->size(), dp_rank, dp_size, /*shuffle=*/true, static_cast<uint64_t>(a.seed));
  data::Loader loader(ds, sampler, cfg.train_micro_batch_size_per_gpu, device);

  // Checkpoints: the data position and the model's shape travel as client state (the
  // latter lets `zerotrain convert` write Hugging Face GPT-2 / Llama files).
  const nlohmann::json& model_json = model.model_json;
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
  // The adapters in peft's format, from the fp32 master weights (collective; rank 0 writes).
  auto save_adapter = [&] {
    if (!model.lora) return;
    const auto master = engine->gather_master_params();  // the engine's parameters: the adapters, in order
    const auto& adapters = model.lora->adapters;
    ZT_CHECK_T(master.size() == 2 * adapters.size(), InternalError, "train: the engine manages ", master.size(),
               " tensors, the LoRA adapters ", 2 * adapters.size());
    std::string err;  // rank 0's write failure, reported on every rank (no rank left waiting)
    if (rank == 0) try {
      std::map<std::string, torch::Tensor> sd;
      const int64_t r = model.lora->options.r;
      for (size_t i = 0; i < adapters.size(); ++i) {
        const auto& lin = adapters[i].site.linear->options;
        const std::vector<int64_t> a_shape{r, lin.in_features()}, b_shape{lin.out_features(), r};
        ZT_CHECK_T(master[2 * i].numel() == r * lin.in_features() && master[2 * i + 1].numel() == r * lin.out_features(),
                   InternalError, "train: the engine's tensors ", 2 * i, "/", 2 * i + 1, " are not the adapter of ",
                   adapters[i].site.path);
        sd[lora::peft_key(adapters[i].site.hf_path, "lora_A")] = master[2 * i].reshape(a_shape).contiguous();
        sd[lora::peft_key(adapters[i].site.hf_path, "lora_B")] = master[2 * i + 1].reshape(b_shape).contiguous();
      }
      lora::write_peft_adapter(a.lora_out, sd, model.lora->options, model.lora_space,
                               a.init_from.empty() ? model.name : a.init_from);
      log::info("LoRA adapter (peft format, fp32) written to %s", a.lora_out.c_str());
    } catch (const std::exception& e) {
      err = detail::cat("train: writing the LoRA adapter to --lora-out ", a.lora_out, " failed: ", e.what());
    }
    const auto failure = comm::lowest_failure(group, err);
    ZT_CHECK_T(!failure, CheckpointError, failure->message);
  };
  auto save = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const auto pos = loader.state();
    engine->save_checkpoint(a.save, "",
                            {{"data", {{"epoch", pos.epoch}, {"batch", pos.batch}, {"samples", ds->size()},
                                       {"micro", cfg.train_micro_batch_size_per_gpu}, {"dp", dp_size}}},
                             {"model", model_json},
                             {"seq", seq}},
                            a.save_async);
    save_adapter();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    collect_saves();
    if (rank == 0) {
      if (a.save_async) {
        log::info("checkpoint save (async): training stalled %.1f ms (snapshot to host memory); "
                  "the file write continues in the background", ms);
      } else {
        log::info("checkpoint save: %.1f ms (training stalled for all of it)", ms);
      }
    }
  };
  // Room for one checkpoint before the first step: the fp32 master weights and optimizer
  // state of every rank (what a checkpoint holds), against the free space of --save.
  if (!a.save.empty()) {
    const ModelStateBytes msb = engine->model_state_bytes();
    auto need = torch::full({1}, static_cast<double>(msb.master + msb.optimizer), torch::kDouble);
    group->all_reduce(need, comm::ReduceOp::kSum);
    std::string err;
    if (rank == 0) {
      struct statvfs st{};
      if (::statvfs(a.save.c_str(), &st) == 0) {
        const double free_bytes = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
        const double want = need.item<double>();
        if (free_bytes < want) {
          err = detail::cat("train: --save ", a.save, " has ", free_bytes / 1048576.0, " MiB free but one checkpoint "
                            "needs about ", want / 1048576.0, " MiB (fp32 master weights and optimizer state of ",
                            world, " rank(s)): free space or give another directory");
        }
      }
    }
    const auto failure = comm::lowest_failure(group, err);
    ZT_CHECK_T(!failure, ConfigError, failure->message);
  }
  // A failed periodic save (a full disk) is reported and cleaned up (no partial files),
  // training goes on and the next save point tries again ([Periodic Saves]). The last save
  // of the run must succeed (its failure ends the run with an error).
  PeriodicSaves periodic(rank);
  // An asynchronous save still in flight at a save point is published (or fails) on its
  // own first: its failure is reported as such, and this save point still saves. (Inside
  // the next save, the previous one's failure would abort that save too.)
  auto settle_previous_save = [&](int64_t step) {
    if (engine->checkpoint_pending()) periodic([&] { engine->wait_checkpoint(); }, step);
  };
  int64_t start = 0;
  if (!a.load.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const nlohmann::json client = engine->load_checkpoint(a.load);
    if (rank == 0) {
      log::info("checkpoint load: %.1f ms",
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (client.contains("data")) {
      const nlohmann::json& d = client["data"];
      // The position counts windows of this data set: resuming on other data (or another
      // --seq) would silently start somewhere else.
      ZT_CHECK_T(!d.contains("samples") || d["samples"].get<int64_t>() == ds->size(), ConfigError, "train: the "
                 "checkpoint in ", a.load, " was saved at a data position over ", d["samples"].get<int64_t>(),
                 " windows of ", seq, " tokens, but --data '", a.data, "' gives ", ds->size(),
                 " (resume with the same --data and --seq)");
      loader.set_state({d.at("epoch").get<int64_t>(),
                        resumed_data_batch(d, cfg.train_micro_batch_size_per_gpu, dp_size, a.load)});
    }
    start = engine->global_steps();
    if (rank == 0) {
      log::info("resuming at step %lld of %lld", static_cast<long long>(start), static_cast<long long>(a.steps));
    }
  }

  if (rank == 0) {
    log::info("%s: %.1fM parameters (%lld layers, %lld embd, %lld heads, vocab %lld), seq %lld | "
              "ZeRO stage %lld, %s, %d rank(s) on %s | batch %lld = micro %lld x accum %lld x %d dp ranks | data %s",
                model.name.c_str(), model.num_params / 1e6, static_cast<long long>(model.n_layer),
                static_cast<long long>(model.width), static_cast<long long>(model.n_head),
                static_cast<long long>(model.vocab_size), static_cast<long long>(seq),
                static_cast<long long>(cfg.zero_optimization.stage), c10::toString(engine->compute_dtype()), world,
                device.str().c_str(), static_cast<long long>(cfg.train_batch_size),
                static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
                static_cast<long long>(cfg.gradient_accumulation_steps), dp_size, a.data.c_str());
    if (expert_parallel) {
      log::info("expert parallelism: the experts of %s split over ep %lld, expert-dp %lld (dense parameters over "
                "dp %d; the loss shown is rank 0's, as without --ep)",
                model.name.c_str(), static_cast<long long>(ep), static_cast<long long>(world / ep), dp_size);
    }
    if (tensor_parallel) {
      log::info("tensor parallelism: %s split over tp %lld%s, dp %d (each tp group reads one replica's data; "
                "the loss shown is the mean over the dp replicas)",
                model.name.c_str(), static_cast<long long>(tpo.size),
                tpo.sequence_parallel ? " with sequence parallelism" : "", dp_size);
    }
    if (model.lora) {
      const auto& lo = model.lora->options;
      if (model.nf4_bytes > 0) {
        log::info("QLoRA: the adapted layers' base weights as NF4, %.3f MiB",
                    static_cast<double>(model.nf4_bytes) / 1048576.0);
      }
      if (!nf4_per_rank.empty()) {
        std::string per;
        for (int64_t b : nf4_per_rank) per += (per.empty() ? "" : ", ") + std::to_string(b);
        log::info("QLoRA at ZeRO-3: the NF4 base partitioned over %zu ranks, NF4 bytes per rank: %s (of %lld; each "
                  "unit's NF4 padded to a multiple of 64 x %zu bytes)",
                  nf4_per_rank.size(), per.c_str(), static_cast<long long>(model.nf4_bytes), nf4_per_rank.size());
      }
      log::info("LoRA %s on %zu linear layers: %lld trainable parameters (%.3f%% of %lld), base frozen%s",
                  lora::lora_spec_string(lo).c_str(), model.lora->adapters.size(),
                  static_cast<long long>(model.lora_trainable),
                  100.0 * static_cast<double>(model.lora_trainable) / static_cast<double>(model.num_params),
                  static_cast<long long>(model.num_params),
                  cfg.zero_optimization.stage == 3 ? " (partitioned over the ranks by ZeRO-3, as the adapters)" : "");
    }
  }

  // Validation: loss over this replica's windows of --val-data (data-parallel rank r takes
  // r, r + dp, ..., the same count on every rank; the tp ranks of a replica the same
  // ones), averaged over all ranks' tokens (under tp each replica's count tp times, which
  // leaves the mean as it is). Parameters are gathered for the pass (ZeRO-3) and the
  // model runs without gradients.
  nlohmann::json evals = nlohmann::json::array();
  auto evaluate = [&](int64_t step) {
    const int64_t per_rank = val_ds->size() / dp_size;
    ZT_CHECK_T(per_rank > 0, ConfigError, "train: --val-data '", a.val_data, "' has ", val_ds->size(),
               " windows of ", seq, " tokens, fewer than the ", dp_size, " data-parallel ranks");
    const int64_t micro = cfg.train_micro_batch_size_per_gpu;
    int64_t batches = (per_rank + micro - 1) / micro;
    if (a.eval_batches > 0) batches = std::min(batches, a.eval_batches);
    const auto t0 = std::chrono::steady_clock::now();
    double sum = 0, count = 0;
    model.module->eval();
    engine->gather_params();
    {
      torch::NoGradGuard no_grad;
      for (int64_t b = 0; b < batches; ++b) {
        std::vector<torch::Tensor> xs, ys, ps;
        for (int64_t k = b * micro; k < std::min(per_rank, (b + 1) * micro); ++k) {
          auto ex = val_ds->get(dp_rank + k * dp_size);
          xs.push_back(ex.x);
          ys.push_back(ex.y);
          if (ex.pos.defined()) ps.push_back(ex.pos);
        }
        auto x = torch::stack(xs).to(device), y = torch::stack(ys).to(device);
        const auto pos = ps.empty() ? torch::Tensor() : torch::stack(ps).to(device);
        const double n = static_cast<double>(y.numel());
        sum += batch_loss(x, y, pos).item<double>() * n;
        count += n;
      }
    }
    engine->release_params();
    model.module->train();
    auto t = torch::tensor({sum, count}, torch::kDouble);
    group->all_reduce(t, comm::ReduceOp::kSum);
    const double loss = t[0].item<double>() / t[1].item<double>();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const int64_t tokens = static_cast<int64_t>(t[1].item<double>()) / tpo.size;  // each replica's once
    evals.push_back({{"step", step}, {"val_loss", loss}, {"val_ppl", std::exp(loss)}, {"val_tokens", tokens}, {"ms", ms}});
    if (rank == 0) {
      log::info("validation at step %lld: loss %.6f, perplexity %.3f (%lld tokens, %.0f ms)",
                static_cast<long long>(step), loss, std::exp(loss), static_cast<long long>(tokens), ms);
    }
  };

  const int64_t print_every = a.print_every > 0 ? a.print_every : std::max<int64_t>(1, cfg.steps_per_print);
  const double tokens_per_step = static_cast<double>(cfg.train_batch_size) * static_cast<double>(seq);
  double timed_ms = 0, save_ms = 0, first_loss = 0, last_loss = 0;
  int64_t timed_steps = 0, skipped_steps = 0;
  PhaseStats peak_fwd, peak_bwd, peak_step;
  std::map<std::string, double> phase_ms_sum{{"forward", 0}, {"backward", 0}, {"step", 0}};
  nlohmann::json moe_last;  // the last step's [MoE Metrics]
  double moe_dropped_sum = 0, moe_a2a_sum = 0;  // over the timed steps
  int64_t moe_timed = 0;
  StepProfiler profiler;
  auto profile_t0 = std::chrono::steady_clock::now();  // --profile: the first profiled step's start
  auto sync_device = [&] {
#ifdef ZT_WITH_CUDA
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
#endif
  };
  // Step reports arrive when the GPU has finished the step (on CUDA usually during the
  // next one): the loop reads them as they come and never waits for the GPU itself.
  const int64_t first_timed = start + std::min(a.warmup, a.steps - start);
  std::map<int64_t, int64_t> epoch_of;  // step -> its epoch, until its report arrives
  const auto run_t0 = std::chrono::steady_clock::now();
  auto timed_t0 = run_t0;  // reset when the first timed step starts
  // [Progress Line] Every print_every steps (steps_per_print, or --print-every), the first
  // and the last, rank 0 logs one info line:
  //   Epoch 1, Step 10/200, Loss: 9.876543 | lr 0.0003 | grad norm 1.234 | 41.2 ms/step |
  //   24854 tokens/s | MFU 31.2% | elapsed 0:03, left 1:13
  // Step S/N counts optimizer steps from 1. The step time is the mean wall time of the
  // timed steps so far (after --warmup, saves and validation left out), so tokens/s, MFU
  // and the time left (mean step time x steps to go) settle as the run goes; until a timed
  // step is done the line shows the step's own time and "left ?". MFU needs the device's
  // peak (--peak-tflops or the table); the grad norm shows when the step computed it.
  // An MoE model: the step's aux loss and dropped fraction ([MoE Metrics]).
  auto progress_line = [&](const StepReport& r, double loss, int64_t s, int64_t epoch) {
    const auto now = std::chrono::steady_clock::now();
    double step_s = (r.forward.ms + r.backward.ms + r.step_phase.ms) / 1000.0;  // this step, on the device
    bool mean = false;
    const int64_t timed_done = s + 1 - first_timed;
    if (timed_done > 0) {
      const double timed_s = std::chrono::duration<double>(now - timed_t0).count() - save_ms / 1000.0;
      if (timed_s > 0) {
        step_s = timed_s / static_cast<double>(timed_done);
        mean = true;
      }
    }
    const double tok_s = step_s > 0 ? tokens_per_step / step_s : 0;
    char buf[512];
    int n = std::snprintf(buf, sizeof(buf), "Epoch %lld, Step %lld/%lld, Loss: %.6f%s | lr %.3g",
                          static_cast<long long>(epoch + 1), static_cast<long long>(s + 1),
                          static_cast<long long>(a.steps), loss, r.skipped ? " (skipped)" : "", r.lr);
    std::string line(buf, static_cast<size_t>(n));
    if (r.grad_norm > 0) line += detail::cat(" | grad norm ", log_num(r.grad_norm));
    if (r.extra.contains("moe_aux_loss")) {
      std::snprintf(buf, sizeof(buf), " | moe aux %.4f, dropped %.3f", r.extra["moe_aux_loss"].get<double>(),
                    r.extra["moe_dropped_fraction"].get<double>());
      line += buf;
    }
    std::snprintf(buf, sizeof(buf), " | %.1f ms/step | %.0f tokens/s", step_s * 1000, tok_s);
    line += buf;
    if (peak > 0) {
      std::snprintf(buf, sizeof(buf), " | MFU %.1f%%", 100 * tok_s * flops_per_token / world / 1e12 / peak);
      line += buf;
    }
    line += " | elapsed " + log::format_duration(std::chrono::duration<double>(now - run_t0).count()) + ", left " +
            (mean ? log::format_duration(step_s * static_cast<double>(a.steps - (s + 1))) : std::string("?"));
    log::write(log::Level::kInfo, line);
  };
  // [Tensor-Parallel Train] With dp > 1 under tp the printed loss is the mean over the dp
  // replicas (the tp ranks of a replica hold the same loss): for each printed step, every
  // rank all-reduces its micro-batch losses over dp right after the step (the same point
  // on every rank; no wait for the device), and the line reads the result when the step's
  // report arrives. Without tp the line shows rank 0's own loss, as before.
  const bool dp_mean_loss = tensor_parallel && dp_size > 1;
  auto printed = [&](int64_t s) { return (s + 1) % print_every == 0 || s == start || s + 1 == a.steps; };
  std::map<int64_t, torch::Tensor> dp_loss;  // loop index -> the dp mean (a device scalar)
  auto consume = [&](const StepReport& r) {
    const int64_t s = r.step - 1;  // the loop index of this step
    double loss = r.loss;
    if (auto it = dp_loss.find(s); it != dp_loss.end()) {
      loss = it->second.item<double>();
      dp_loss.erase(it);
    }
    if (s == start) first_loss = loss;
    if (r.skipped) ++skipped_steps;
    last_loss = loss;
    if (r.extra.contains("moe_aux_loss")) {  // [MoE Metrics]: the summary's
      moe_last = r.extra;
      if (s >= first_timed) {
        ++moe_timed;
        moe_dropped_sum += r.extra["moe_dropped_fraction"].get<double>();
        if (r.extra.contains("moe_all_to_all_ms")) moe_a2a_sum += r.extra["moe_all_to_all_ms"].get<double>();
      }
    }
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
    // Rank 0, or every rank with ZT_LOG_RANKS=all (each shows its own loss).
    if (log::enabled(log::Level::kInfo) && printed(s)) progress_line(r, loss, s, epoch);
    if (it != epoch_of.end()) epoch_of.erase(it);
  };
  for (int64_t s = start; s < a.steps; ++s) {
    if (s == first_timed) {
      // The timed region starts with an idle device and ends (below) when it is idle again.
      sync_device();
      for (const auto& r : engine->take_reports(true)) consume(r);
      timed_t0 = std::chrono::steady_clock::now();
    }
    const bool profile_last = a.profile_step >= 0 && s == a.profile_step + a.profile_steps - 1;
    if (s == a.profile_step) {
      sync_device();
      profiler.start(device.is_cuda());
      profile_t0 = std::chrono::steady_clock::now();
    }
    torch::Tensor step_loss;  // dp_mean_loss: this rank's micro-batch losses, summed
    for (int64_t k = 0; k < cfg.gradient_accumulation_steps; ++k) {
      auto [x, y, pos] = loader.next_batch();
      auto loss = engine->forward([&] { return batch_loss(x, y, pos); });
      if (dp_mean_loss && printed(s)) {
        // A copy: the all-reduce is in place, and the engine reads the loss for its report.
        auto l = loss.detach().to(torch::kFloat);
        step_loss = step_loss.defined() ? step_loss + l : l.clone();
      }
      engine->backward(loss);
      if (model.moe) moe_record(engine->global_steps() + 1, model.moe());
      // step() publishes an asynchronous save whose files are written: its failure
      // surfaces here, after the step itself is done.
      periodic([&] { engine->step(); }, engine->global_steps());
    }
    if (step_loss.defined()) {
      topo->dp()->all_reduce(step_loss, comm::ReduceOp::kSum);
      dp_loss[s] = step_loss / static_cast<double>(dp_size * cfg.gradient_accumulation_steps);
    }
    if (profile_last) sync_device();  // the profiled steps' device work, all of it
    epoch_of[engine->global_steps()] = loader.epoch();
    if (profile_last) {
      const double profiled_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - profile_t0).count();
      const std::string text = profiler.stop(a.profile_out, rank, profiled_ms);
      if (rank == 0) std::printf("%s", text.c_str());
    }
    if (s >= first_timed) ++timed_steps;
    for (const auto& r : engine->take_reports()) consume(r);
    collect_saves();  // an async save may have been published by this step
    if (val_ds && a.eval_every > 0 && (s + 1) % a.eval_every == 0 && s + 1 < a.steps) {
      const auto te = std::chrono::steady_clock::now();
      for (const auto& r : engine->take_reports(true)) consume(r);
      evaluate(s + 1);
      // Iteration time excludes validation (it is reported on its own).
      if (s >= first_timed) save_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - te).count();
    }
    if (a.save_every > 0 && (s + 1) % a.save_every == 0 && s + 1 < a.steps) {
      const auto ts = std::chrono::steady_clock::now();
      settle_previous_save(s + 1);
      periodic(save, s + 1);
      // Iteration time excludes the saves (they are reported on their own).
      if (s >= first_timed) save_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count();
    }
  }
  for (const auto& r : engine->take_reports(true)) consume(r);
  sync_device();
  if (timed_steps > 0) {
    timed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - timed_t0).count() - save_ms;
  }
  if (val_ds) evaluate(a.steps);
  if (a.save.empty()) save_adapter();  // with --save, save() writes it
  if (!a.save.empty()) {
    settle_previous_save(a.steps);
    save();
    const auto t0 = std::chrono::steady_clock::now();
    engine->wait_checkpoint();  // the run's last checkpoint must be published before exit
    collect_saves();
    if (rank == 0 && a.save_async) {
      log::info("waited %.1f ms at the end of the run for the last checkpoint",
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
    std::printf("  model states per rank: params %.3f, grads %.3f, fp32 master %.3f, optimizer %.3f", msb.params / gib,
                msb.grads / gib, msb.master / gib, msb.optimizer / gib);
    if (msb.frozen > 0) std::printf(", frozen shard %.3f", msb.frozen / gib);
    std::printf(" = %.3f GiB", msb.total() / gib);
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
      if (peak > 0) std::printf(", MFU %.1f%% (of %.0f TFLOP/s; %s)", 100 * tflops / peak, peak, model.flops_formula);
    }
    const double drop = first_loss > 0 ? 100 * (1 - last_loss / first_loss) : 0.0;
    std::printf("\n  loss %.4f -> %.4f (%.1f%% %s)\n", first_loss, last_loss, std::abs(drop), drop >= 0 ? "lower" : "higher");
    std::fflush(stdout);
    if (!a.summary.empty()) {
      nlohmann::json sj = {
          {"framework", "zerotrain"},
          {"model", model.name},
          {"n_params", model.num_params},
          {"world", world},
          {"dp", dp_size},
          {"tp", tpo.size},
          {"sequence_parallel", tpo.sequence_parallel},
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
          {"global_samples", engine->global_samples()},  // DeepSpeed's count, kept across a resume
          {"peak_tflops", peak},
          {"ms_per_iter", ms_per_iter},
          {"tokens_per_s", tokens_per_s},
          {"tflops_per_gpu", tflops},
          {"mfu", peak > 0 ? tflops / peak : 0.0},
          {"activation_checkpointing", model.activation_checkpointing},
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
      if (!moe_last.is_null()) {
        // [MoE Metrics] of rank 0: the last step's aux loss and tokens per expert; the
        // dropped fraction and all-to-all time as means over the timed steps (the last
        // step's when none was timed).
        sj["moe_aux_loss"] = moe_last["moe_aux_loss"];
        sj["moe_tokens_per_expert"] = moe_last["moe_tokens_per_expert"];
        sj["moe_tokens_per_expert_by_layer"] = moe_last["moe_tokens_per_expert_by_layer"];
        sj["moe_dropped_fraction"] = moe_timed ? moe_dropped_sum / moe_timed : moe_last["moe_dropped_fraction"].get<double>();
        if (moe_last.contains("moe_all_to_all_ms")) {
          sj["moe_all_to_all_ms"] = moe_timed ? moe_a2a_sum / moe_timed : moe_last["moe_all_to_all_ms"].get<double>();
          sj["moe_all_to_all_calls"] = moe_last["moe_all_to_all_calls"];
        }
      }
      if (!evals.empty()) {
        sj["validation"] = evals;
        sj["val_loss"] = evals.back()["val_loss"];
        sj["val_ppl"] = evals.back()["val_ppl"];
      }
      std::ofstream f(a.summary, std::ios::app);
      ZT_CHECK(f.good(), "cannot write ", a.summary);
      f << sj.dump() << "\n";
    }
  }
  model.detach();  // the layers' runner points at the engine
  engine.reset();
  // Validation records join --metrics once the engine (which owns that file while it
  // runs) has closed it.
  if (rank == 0 && !a.metrics.empty() && !evals.empty()) {
    std::ofstream f(a.metrics, std::ios::app);
    for (const auto& e : evals) {
      f << nlohmann::json({{"step", e["step"]}, {"val_loss", e["val_loss"]}, {"val_ppl", e["val_ppl"]}}).dump() << "\n";
    }
  }
  const int code = periodic.exit_code();
  comm::finalize();
  return code;
}

}  // namespace zt::cli
