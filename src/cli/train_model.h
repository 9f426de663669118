// The model `zerotrain train` builds: GPT-2 or the Llama family, chosen by --model /
// --init-from, behind the few things the training loop asks of it.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "common/phase_timer.h"
#include "lora/lora.h"
#include "lora/lora_models.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt::cli {

struct TrainModelOptions {
  std::string model;                          // --model: a name or a HF config.json (file or dir)
  std::string init_from;                      // --init-from: HF weights (dir or file)
  int64_t layers = 0, embd = 0, heads = 0, vocab = 0;  // --layers/--embd/--heads/--vocab overrides
  bool checkpoint_activations = false;        // --checkpoint-activations
  int rank = 0;
  // --lora: the base is built whole (never deferred), frozen, and adapted; only the
  // adapters are the engine's. [Linear Adapters]
  std::optional<lora::LoraOptions> lora;
  bool qlora = false;  // --qlora: the adapted linears' base weights as NF4 ([QLoRA Base])
  // --moe-*: GPT-2's MoE fields ([GPT-2 MoE] in models/gpt2.h); 0 / -1 = the model's own.
  struct Moe {
    int64_t experts = 0, k = 0, every = 0;
    double capacity_factor = -1, aux_coef = -1;  // a capacity factor turns token drops on
    bool timing = false;  // --moe-timing: time the all-to-alls ([MoE Timing] in models/moe.h)
    bool any() const { return experts || k || every || capacity_factor >= 0 || aux_coef >= 0 || timing; }
  } moe;
  // With init_from: build placeholders (shape and names only) and read no weights; the
  // caller loads them itself (build_tp_train_model: each tp rank its slices, [HF TP Load]).
  bool weights_later = false;
};

struct TrainModel {
  std::string family;                         // "gpt2" | "llama"
  std::string name;                           // for the log: --model, or --init-from's directory
  std::shared_ptr<torch::nn::Module> module;  // what initialize() gets
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;  // (x, y) -> scalar
  // (x, y, pos) -> scalar with per-example attention ([SFT Attention] in models/llama.h);
  // null for a model that has none (GPT-2, the tensor-parallel and pipelined models).
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)> loss_with_positions;
  int64_t vocab_size = 0, max_seq = 0, n_layer = 0, width = 0, n_head = 0, num_params = 0;
  bool activation_checkpointing = false;
  std::function<double(int64_t seq)> flops_per_token;
  const char* flops_formula = "";             // for the MFU line
  nlohmann::json model_json;                  // checkpoint client state: {"name", "gpt2"|"llama": {...}}
  // Fills the engine options the model needs (units, partitioned construction,
  // initialisation from --init-from); then attach after initialize(), detach before the
  // engine goes.
  std::function<void(EngineOptions&)> engine_options;
  std::function<void(Engine&)> attach;
  std::function<void()> detach;
  // With --lora: the adapters (the only trainable parameters) and where they sit.
  std::shared_ptr<lora::LoraModel> lora;
  lora::LoraTargetSpace lora_space;
  int64_t nf4_bytes = 0;  // --qlora: bytes of the NF4 base weights
  int64_t lora_trainable = 0;  // the adapters' parameters, counted whole (before ZeRO-3 partitions them)
  // An MoE model, after a micro-batch's backward: its routing (the last loss()) and the
  // all-to-all spans recorded since the last call; null for a dense model.
  struct MoeStats {
    torch::Tensor aux_loss;   // unscaled sum over the MoE blocks, detached, on the device
    double dropped_fraction = 0;  // mean over the MoE blocks
    std::vector<std::vector<int64_t>> kept_per_expert;  // [MoE block][expert], after drops
    std::vector<DeviceSpan> all_to_all;  // with --moe-timing: forward and backward
  };
  std::function<MoeStats()> moe;
};

// Builds the model for `cfg` (ZeRO-3: partitioned construction; activation
// checkpointing per the config's section or the flag). A Llama model is chosen by a
// Llama name (llama-tiny, llama3.2-1b, llama3-8b), a --model config.json naming
// LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM, or an --init-from directory
// whose config.json does; anything else is GPT-2 as before.
TrainModel build_train_model(const TrainModelOptions& o, const Config& cfg);

// [Expert-Parallel Train] The MoE model of build_train_model (same name, sizes and seed)
// with its experts split over the expert-parallel group `ep` (models/moe.h [Expert
// Parallel]): every rank builds the whole model exactly as build_train_model does, keeps
// the dense parameters and its own experts (global index first_expert() + i), and frees
// the rest, so `train --ep N` starts where `train` starts. The engine options get
// is_expert (the experts' names); the caller sets group (dp), ep and expert_dp.
// --init-from (a Mixtral directory only): every rank reads the weights into the whole
// model first. ConfigError (before any step) for a model without experts, experts that do
// not divide by ep (the layer's check), --init-from of weights without experts, --lora.
TrainModel build_ep_train_model(const TrainModelOptions& o, const Config& cfg, const comm::GroupPtr& ep);

// [Tensor-Parallel Train] The model of build_train_model (same name, sizes and seed) cut
// over the tensor-parallel group `tp`: GPT2TP or LlamaTP (docs/tensor-parallel.md), with
// sequence parallelism when asked. Every rank first builds the whole model exactly as
// build_train_model does (so one seed gives the same weights at every tp, tp 1 included:
// `train --tp N` starts where `train` starts), keeps its slices (load_full) and frees the
// rest. flops_per_token stays the whole model's (the caller divides by the ranks); the
// engine options get the tp model's norm weights (replicated parameters counted 1/tp in
// the model-parallel norm). The caller sets EngineOptions.group (dp) and model_parallel.
// With --init-from the whole model is never built: its shape comes from the directory's
// config.json and each rank reads only its slices of the safetensors files
// (models/hf_tp.h, [HF TP Load]), so `train --tp N --init-from DIR` starts where
// `train --init-from DIR` starts. ConfigError (before any step, before any weight is read)
// for what the tp models do not take: --lora; the head counts that do not divide by tp
// (the models' own checks, naming the fix).
TrainModel build_tp_train_model(const TrainModelOptions& o, const Config& cfg, const comm::GroupPtr& tp,
                                bool sequence_parallel);

}  // namespace zt::cli
