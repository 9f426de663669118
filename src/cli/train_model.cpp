#include "cli/train_model.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <type_traits>

#include "lora/lora_spec.h"
#include "lora/qlora.h"
#include "models/gpt2.h"
#include "models/gpt2_tp.h"
#include "models/hf_gpt2.h"
#include "models/hf_llama.h"
#include "models/hf_tp.h"
#include "models/llama.h"
#include "models/llama_engine.h"
#include "models/llama_tp.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::cli {
namespace {

bool is_file_or_dir(const std::string& p) { return !p.empty() && std::filesystem::exists(p); }

bool wants_llama(const TrainModelOptions& o) {
  if (models::is_llama_name(o.model)) return true;
  // A config.json (or a directory with one): build_llama reads it and names an
  // architecture it does not support.
  if (is_file_or_dir(o.model) && (o.model.ends_with(".json") ||
                                  std::filesystem::exists(std::filesystem::path(o.model) / "config.json"))) {
    return true;
  }
  return !o.init_from.empty() && std::filesystem::is_directory(o.init_from) && models::is_llama_hf_config(o.init_from);
}

bool checkpointing(const TrainModelOptions& o, const Config& cfg) {
  return o.checkpoint_activations || cfg.activation_checkpointing.number_checkpoints ||
         cfg.activation_checkpointing.cpu_checkpointing;
}

// What GPT-2 and the Llama family fill alike: activation checkpointing per the config or
// the flag, the module and its loss, the parameter count and the FLOPs per token.
template <class Holder>
TrainModel common_train_model(Holder& model, const TrainModelOptions& o, const Config& cfg, const char* family) {
  if (checkpointing(o, cfg)) {
    model->set_activation_checkpointing(true, cfg.activation_checkpointing.number_checkpoints,
                                        cfg.activation_checkpointing.cpu_checkpointing);
  }
  TrainModel t;
  t.family = family;
  t.module = model.ptr();
  t.loss = [m = model.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return m->loss(x, y); };
  if constexpr (std::is_same_v<Holder, models::LlamaForCausalLM>) {
    t.loss_with_positions = [m = model.ptr()](const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& pos) {
      return m->loss(x, y, pos);
    };
  }
  t.num_params = model->num_params();
  t.activation_checkpointing = model->activation_checkpointing();
  t.flops_per_token = [model](int64_t seq) { return model->flops_per_token(seq); };
  return t;
}

// --lora (and --qlora): adapters on the model's adaptable linears, recorded in the
// checkpoint's model description.
// `nf4_bases`: the targets' NF4 made while the base was built ([Layerwise QLoRA Base]), if any.
template <class Holder>
void apply_lora_options(TrainModel& t, Holder& model, const TrainModelOptions& o, lora::Nf4Bases* nf4_bases = nullptr) {
  if (!o.lora) return;
  const bool prebuilt = nf4_bases != nullptr && !nf4_bases->empty();
  t.lora_space = lora::lora_space(*model);
  t.lora = std::make_shared<lora::LoraModel>(lora::apply_lora(
      *model, t.lora_space.sites, *o.lora, prebuilt ? lora::LoraBase::kWholeOrHeldElsewhere : lora::LoraBase::kWhole));
  t.model_json["lora"] = lora::lora_spec_string(*o.lora);
  t.lora_trainable = t.lora->trainable_params();
  if (o.qlora) {
    t.nf4_bytes = prebuilt ? lora::attach_nf4_bases(*t.lora, std::move(*nf4_bases)) : lora::quantize_lora_bases(*t.lora);
    t.model_json["qlora"] = true;
  }
}

// A random Llama base for --lora/--qlora, drawn one decoder layer at a time on the intra-op
// threads, with --qlora each target weight quantized as soon as its layer is drawn
// ([Layerwise Init], [Layerwise QLoRA Base]): the same values as LlamaForCausalLM(mc).
models::LlamaForCausalLM build_llama_layerwise(const models::LlamaConfig& mc, const TrainModelOptions& o,
                                               lora::Nf4Bases& nf4_bases) {
  models::LlamaForCausalLM model(models::LlamaForCausalLMImpl::skeleton(mc));
  models::LlamaForCausalLMImpl::InitSink sink;
  if (o.qlora) sink = lora::nf4_base_sink(lora::select_targets(lora::lora_space(*model).sites, *o.lora), nf4_bases);
  // The draws and the quantizer give the same values on any thread count, so the build takes
  // this host's cores shared by its ranks even where the intra-op pool was left at one thread
  // (an 8B QLoRA base took 185 s on one thread of a 32-core GPU host); restored after.
  const int threads_before = at::get_num_threads();
  const int local = std::max(1, comm::discover_rank().local_world_size);
  const int threads = std::max(threads_before, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / local);
  if (threads != threads_before) at::set_num_threads(threads);
  const auto t0 = std::chrono::steady_clock::now();
  model->init_layerwise(sink);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (threads != threads_before) at::set_num_threads(threads_before);
  if (o.rank == 0) {
    log::info("built the random Llama base layer by layer in %.1f s on %d threads%s", seconds, threads,
              o.qlora ? ", each adapted linear quantized to NF4 as its layer was drawn" : "");
  }
  return model;
}

TrainModel::MoeStats gpt2_moe_stats(models::GPT2Impl& m) {
  return {m.last_moe_aux_tensor(), m.last_moe_dropped_fraction(), m.last_moe_kept_per_expert(),
          m.take_moe_all_to_all_spans()};
}

// [Mixtral]: the routing of the last loss() (the model-level load-balancing loss, dropless).
TrainModel::MoeStats llama_moe_stats(models::LlamaForCausalLMImpl& m) {
  return {m.last_moe_aux_tensor(), 0.0, m.last_moe_kept_per_expert(), m.take_moe_all_to_all_spans()};
}

TrainModel build_gpt2(const TrainModelOptions& o, const Config& cfg) {
  models::GPT2Config mc = models::named_gpt2(o.model);
  if (o.layers) mc.n_layer = o.layers;
  if (o.embd) mc.n_embd = o.embd;
  if (o.heads) mc.n_head = o.heads;
  if (o.vocab) mc.vocab_size = o.vocab;
  if (!o.init_from.empty() && std::ifstream(o.init_from + "/config.json").good()) {
    mc = models::gpt2_config_from_hf_json(o.init_from + "/config.json");
  }
  if (o.moe.any()) {
    ZT_CHECK_T(o.init_from.empty(), ConfigError, "train: --moe-* with --init-from: Hugging Face GPT-2 weights have "
               "no experts; drop one");
    if (o.moe.experts) mc.moe_num_experts = o.moe.experts;
    ZT_CHECK_T(mc.moe_num_experts > 0, ConfigError, "train: --moe-k/--moe-every/--moe-capacity-factor/--moe-aux-coef/--moe-timing "
               "shape the experts of an MoE model; ", o.model, " has none: add --moe-experts N, or use gpt2-tiny-moe");
    if (o.moe.k) mc.moe_k = o.moe.k;
    if (o.moe.every) mc.moe_every = o.moe.every;
    if (o.moe.capacity_factor >= 0) {
      mc.moe_capacity_factor = o.moe.capacity_factor;
      mc.moe_drop_tokens = true;
    }
    if (o.moe.aux_coef >= 0) mc.moe_aux_loss_coef = o.moe.aux_coef;
  }
  // ZeRO-3 builds the model partitioned: placeholders now, each unit materialised on the
  // device (and sharded) by initialize(), so no rank ever holds the whole model.
  // With LoRA the frozen base is not the engine's, so it is built whole (the engine
  // fills placeholders of managed parameters only). The MoE GPT-2 has no placeholders
  // ([GPT-2 MoE]): it is built whole, then initialize() partitions it (docs/moe.md).
  mc.deferred_init = (cfg.zero_optimization.stage == 3 || o.weights_later) && !o.lora && mc.moe_num_experts == 0;
  ZT_CHECK_T(mc.moe_num_experts == 0 || !o.lora, ConfigError, "train: --lora/--qlora with the MoE model ", o.model,
             " is not supported yet (adapters on the experts); train it without --lora");
  models::GPT2 model(mc);
  if (!o.init_from.empty() && !o.weights_later) {
    // Every rank reads the file; the engine then starts all ranks from rank 0's copy.
    models::load_hf_gpt2(*model, o.init_from);
    if (o.rank == 0) log::info("initialized from Hugging Face GPT-2 weights in %s", o.init_from.c_str());
  }
  TrainModel t = common_train_model(model, o, cfg, "gpt2");
  t.name = o.model;
  t.vocab_size = mc.vocab_size;
  t.max_seq = mc.n_positions;
  t.n_layer = mc.n_layer;
  t.width = mc.n_embd;
  t.n_head = mc.n_head;
  t.flops_formula = "6N+12LCT FLOPs per token";
  t.model_json = {{"name", o.model},
                  {"gpt2",
                   {{"n_layer", mc.n_layer},
                    {"n_head", mc.n_head},
                    {"n_embd", mc.n_embd},
                    {"vocab_size", mc.vocab_size},
                    {"n_positions", mc.n_positions}}}};
  if (mc.moe_num_experts > 0) {
    t.model_json["gpt2"]["moe"] = {{"num_experts", mc.moe_num_experts}, {"every", mc.moe_every},
                                   {"k", mc.moe_k}, {"capacity_factor", mc.moe_capacity_factor},
                                   {"min_capacity", mc.moe_min_capacity}, {"drop_tokens", mc.moe_drop_tokens},
                                   {"aux_loss_coef", mc.moe_aux_loss_coef}};
    model->set_moe_timing(o.moe.timing);
    t.moe = [m = model.ptr()] { return gpt2_moe_stats(*m); };
  }
  apply_lora_options(t, model, o);
  t.engine_options = [](EngineOptions&) {};  // the engine drives GPT-2's block hooks itself
  t.attach = [](Engine&) {};
  t.detach = [] {};
  return t;
}

TrainModel build_llama(const TrainModelOptions& o, const Config& cfg) {
  models::LlamaConfig mc;
  if (!o.init_from.empty() && std::filesystem::is_directory(o.init_from) &&
      std::filesystem::exists(std::filesystem::path(o.init_from) / "config.json")) {
    mc = models::llama_config_from_hf_json(o.init_from);  // the weights' own shape
  } else if (models::is_llama_name(o.model)) {
    mc = models::named_llama(o.model);
  } else {
    mc = models::llama_config_from_hf_json(o.model);
  }
  const bool resized = o.layers || o.embd || o.heads || o.vocab;
  ZT_CHECK_T(!resized || o.init_from.empty(), ConfigError,
             "train: --layers/--embd/--heads/--vocab resize the model, which --init-from weights fix; drop one");
  if (o.layers) mc.num_hidden_layers = o.layers;
  if (o.vocab) mc.vocab_size = o.vocab;
  if (o.heads) {
    ZT_CHECK_T(o.heads % mc.num_key_value_heads == 0, ConfigError, "train: --heads ", o.heads,
               " must be a multiple of the model's num_key_value_heads (", mc.num_key_value_heads, ")");
    mc.num_attention_heads = o.heads;
  }
  if (o.embd) mc.hidden_size = o.embd;
  if (o.heads || o.embd) {
    ZT_CHECK_T(mc.hidden_size % mc.num_attention_heads == 0, ConfigError, "train: hidden size ", mc.hidden_size,
               " must be a multiple of the number of heads ", mc.num_attention_heads);
    mc.head_dim = mc.hidden_size / mc.num_attention_heads;
  }
  mc.layer_sliding.resize(static_cast<size_t>(mc.num_hidden_layers), mc.sliding_window > 0);
  // [Mixtral]: the experts come from the config (num_local_experts, num_experts_per_tok,
  // router_aux_loss_coef, output_router_logits), not from GPT-2's --moe-* flags.
  const bool moe_shape_flags = o.moe.experts || o.moe.k || o.moe.every || o.moe.capacity_factor >= 0 || o.moe.aux_coef >= 0;
  ZT_CHECK_T(!moe_shape_flags, ConfigError, "train: --moe-experts/--moe-k/--moe-every/--moe-capacity-factor/"
             "--moe-aux-coef shape GPT-2's MoE; a Llama's experts come from its config.json (MixtralForCausalLM: "
             "num_local_experts, num_experts_per_tok, router_aux_loss_coef, output_router_logits) or --model "
             "mixtral-tiny");
  ZT_CHECK_T(!o.moe.timing || mc.is_moe(), ConfigError, "train: --moe-timing times the experts' all-to-alls; ",
             o.model, " has no experts (use --model mixtral-tiny or a MixtralForCausalLM config.json)");
  ZT_CHECK_T(!mc.is_moe() || !o.lora, ConfigError, "train: --lora/--qlora with the MoE model ", o.model,
             " is not supported yet (adapters on the experts); train it without --lora");
  std::shared_ptr<const models::HfCheckpointReader> ckpt;
  if (!o.init_from.empty() && !o.weights_later) ckpt = std::make_shared<models::HfCheckpointReader>(o.init_from);
  // Partitioned construction at ZeRO-3 (never whole on a rank) and whenever the weights
  // come from a checkpoint (each tensor read straight into its place: never twice).
  // With LoRA the frozen base is not the engine's: built whole and loaded here. A Mixtral
  // has no placeholders for its experts: built whole, then initialize() partitions it at
  // ZeRO-3 (as the MoE GPT-2; docs/moe.md), and --init-from loads it whole.
  mc.deferred_init = (cfg.zero_optimization.stage == 3 || ckpt != nullptr || o.weights_later) && !o.lora && !mc.is_moe();
  lora::Nf4Bases nf4_bases;
  models::LlamaForCausalLM model =
      o.lora && !ckpt ? build_llama_layerwise(mc, o, nf4_bases) : models::LlamaForCausalLM(mc);
  if (o.lora && ckpt) models::load_hf_llama(*model, *ckpt);
  TrainModel t = common_train_model(model, o, cfg, "llama");
  t.name = models::is_llama_name(o.model) || is_file_or_dir(o.model) ? o.model : o.init_from;
  t.vocab_size = mc.vocab_size;
  t.max_seq = mc.max_position_embeddings;
  t.n_layer = mc.num_hidden_layers;
  t.width = mc.hidden_size;
  t.n_head = mc.num_attention_heads;
  t.flops_formula = "6(N+Vd)+12LdT FLOPs per token";
  t.model_json = {{"name", t.name}, {"llama", nlohmann::json::parse(models::llama_config_to_hf_json(mc))}};
  const int rank = o.rank;
  const std::string from = o.init_from;
  apply_lora_options(t, model, o, &nf4_bases);
  const bool lora = o.lora.has_value();
  t.engine_options = [model, ckpt, rank, from, lora](EngineOptions& eo) {
    if (lora) {
      models::llama_engine_options(model, eo, nullptr);  // the units; the base is loaded and whole
      eo.param_shape = nullptr;
      eo.param_init = nullptr;
      if (ckpt && rank == 0) {
        log::info("initialized the frozen base from Hugging Face weights in %s (%s)", from.c_str(),
                  model->config().architecture.c_str());
      }
      return;
    }
    models::llama_engine_options(model, eo, ckpt);
    if (ckpt && rank == 0) {
      log::info("initializing from Hugging Face weights in %s (%s), tensor by tensor", from.c_str(),
                model->config().architecture.c_str());
    }
  };
  t.attach = [m = model.ptr()](Engine& e) { models::attach_llama_engine(*m, e); };
  t.detach = [m = model.ptr()] { m->set_layer_runner({}); };
  if (mc.is_moe()) {
    model->set_moe_timing(o.moe.timing);
    t.moe = [m = model.ptr()] { return llama_moe_stats(*m); };
  }
  return t;
}

// [Expert-Parallel Train] of a Mixtral: `whole` (every expert) -> the model with this rank's
// experts, by global index, and the engine options for its units and experts.
TrainModel llama_ep_train_model(const TrainModel& full, models::LlamaForCausalLMImpl& whole,
                                const TrainModelOptions& o, const Config& cfg, const comm::GroupPtr& ep) {
  const models::LlamaConfig mc = whole.config();
  if (!o.init_from.empty()) {
    // --init-from: every rank reads the checkpoint into the whole model (checked by name and
    // shape first), then keeps its own experts below.
    models::load_hf_llama(whole, o.init_from);
    if (o.rank == 0) {
      log::info("initialized from Hugging Face weights in %s (%s): every rank read them and kept its experts",
                o.init_from.c_str(), mc.architecture.c_str());
    }
  }
  models::LlamaForCausalLM m(mc, ep);
  if (checkpointing(o, cfg)) {
    m->set_activation_checkpointing(true, cfg.activation_checkpointing.number_checkpoints,
                                    cfg.activation_checkpointing.cpu_checkpointing);
  }
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, torch::Tensor> weights;
    for (const auto& kv : whole.named_parameters()) weights[kv.key()] = kv.value();
    for (const auto& kv : m->named_parameters()) kv.value().copy_(weights.at(m->global_param_name(kv.key())));
  }
  TrainModel t = full;
  t.module = m.ptr();
  t.loss = [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); };
  t.loss_with_positions = nullptr;  // refused with --ep (train.cpp)
  m->set_moe_timing(o.moe.timing);
  t.moe = [p = m.ptr()] { return llama_moe_stats(*p); };
  t.model_json["expert_parallel"] = {{"size", ep ? ep->size() : 1}};
  t.flops_per_token = [mc](int64_t seq) { return models::llama_flops_per_token(mc, seq); };  // not the whole model's closure
  t.engine_options = [m](EngineOptions& eo) {
    models::llama_engine_options(m, eo, nullptr);  // the units (ZeRO-3 gathers a layer, its experts over expert-dp)
    eo.is_expert = models::llama_is_expert_param;
    eo.expert_global_name = [p = m.ptr()](const std::string& name) { return p->global_param_name(name); };
  };
  t.attach = [p = m.ptr()](Engine& e) { models::attach_llama_engine(*p, e); };
  t.detach = [p = m.ptr()] { p->set_layer_runner({}); };
  return t;
}

}  // namespace

TrainModel build_train_model(const TrainModelOptions& o, const Config& cfg) {
  if (wants_llama(o)) return build_llama(o, cfg);  // --moe-* checked there ([Mixtral])
  const auto gpt2 = models::gpt2_names();
  if (std::find(gpt2.begin(), gpt2.end(), o.model) == gpt2.end()) {
    std::string known;
    for (const auto& n : gpt2) known += n + ", ";
    for (const auto& n : models::llama_names()) known += n + ", ";
    throw ConfigError(detail::cat("train: unknown --model '", o.model, "': known models are ", known,
                                  "or a Hugging Face config.json of LlamaForCausalLM, MistralForCausalLM, "
                                  "Qwen2ForCausalLM or MixtralForCausalLM"));
  }
  return build_gpt2(o, cfg);
}

TrainModel build_ep_train_model(const TrainModelOptions& o, const Config& cfg, const comm::GroupPtr& ep) {
  const int n = ep ? ep->size() : 1;
  ZT_CHECK_T(!o.lora, ConfigError, "train: --lora/--qlora with --ep ", n,
             " is not supported yet; train without adapters, or run without --ep");
  // --init-from: a Mixtral directory ([Mixtral]; Hugging Face GPT-2 weights have no experts).
  ZT_CHECK_T(o.init_from.empty() ||
                 (models::is_llama_hf_config(o.init_from) && models::llama_config_from_hf_json(o.init_from).is_moe()),
             ConfigError, "train: --init-from ", o.init_from, " with --ep ", n, " needs a Hugging Face Mixtral "
             "directory (MixtralForCausalLM config.json); other weights have no experts to split");
  // The whole model first, as the plain path builds it (the caller seeded the generator):
  // ep N starts from ep 1's weights.
  TrainModel full = build_train_model(o, cfg);
  if (auto llama = std::dynamic_pointer_cast<models::LlamaForCausalLMImpl>(full.module); llama && llama->config().is_moe()) {
    return llama_ep_train_model(full, *llama, o, cfg, ep);  // [Mixtral]
  }
  auto whole = std::dynamic_pointer_cast<models::GPT2Impl>(full.module);
  ZT_CHECK_T(whole && whole->config().moe_num_experts > 0, ConfigError, "train: --ep ", n, " splits the experts "
             "of an MoE model; ", full.name, " has none (use --model gpt2-tiny-moe or mixtral-tiny, docs/moe.md)");
  const models::GPT2Config mc = whole->config();
  models::GPT2 m(mc, ep);
  // Activation checkpointing as the whole model has it ([Checkpointed Aux] in
  // models/checkpoint.h keeps the MoE blocks' aux loss).
  if (checkpointing(o, cfg)) {
    m->set_activation_checkpointing(true, cfg.activation_checkpointing.number_checkpoints,
                                    cfg.activation_checkpointing.cpu_checkpointing);
  }
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, torch::Tensor> weights;
    for (const auto& kv : whole->named_parameters()) weights[kv.key()] = kv.value();
    // Experts by global index: local expert i of an MoE block is global first_expert() + i.
    for (int64_t b = 0; b < mc.n_layer; ++b) {
      const auto& blk = m->blocks_at(b);
      if (!blk->moe) continue;
      const std::string pre = "h." + std::to_string(b) + ".moe.experts.";
      for (int64_t i = 0; i < blk->moe->local_experts(); ++i) {
        for (const auto& kv : blk->moe->experts->ptr(static_cast<size_t>(i))->named_parameters()) {
          const std::string src = pre + std::to_string(blk->moe->first_expert() + i) + "." + kv.key();
          kv.value().copy_(weights.at(src));
        }
      }
    }
    for (const auto& kv : m->named_parameters())
      if (!models::gpt2_is_expert_param(kv.key())) kv.value().copy_(weights.at(kv.key()));
  }
  TrainModel t = full;
  t.module = m.ptr();
  t.loss = [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); };
  m->set_moe_timing(o.moe.timing);
  t.moe = [p = m.ptr()] { return gpt2_moe_stats(*p); };
  t.model_json["expert_parallel"] = {{"size", n}};
  // Checkpoints store each expert by its global index ([Expert Checkpoints]): an ep-N
  // checkpoint is an ep-1 one, loadable at any ep.
  t.engine_options = [p = m.ptr()](EngineOptions& eo) {
    eo.is_expert = models::gpt2_is_expert_param;
    eo.expert_global_name = [p](const std::string& name) { return p->global_param_name(name); };
  };
  t.attach = [](Engine&) {};
  t.detach = [] {};
  return t;  // `full` goes here: each rank keeps its own experts
}

TrainModel build_tp_train_model(const TrainModelOptions& o, const Config& cfg, const comm::GroupPtr& tp,
                                bool sequence_parallel) {
  const int n = tp ? tp->size() : 1;
  ZT_CHECK_T(!o.lora, ConfigError, "train: --lora/--qlora with --tp ", n, " is not supported yet (adapters on the "
             "tensor-parallel layers); run without --tp");
  // [TP Activation Checkpointing]: --checkpoint-activations, or a key that describes the
  // checkpoints (as the plain path: number_checkpoints, cpu_checkpointing), turns it on.
  const auto& ac = cfg.activation_checkpointing;
  const bool tp_ckpt = o.checkpoint_activations || ac.partition_activations || ac.cpu_checkpointing ||
                       ac.number_checkpoints || ac.contiguous_memory_optimization;
  ZT_CHECK_T(tp_ckpt || (!ac.synchronize_checkpoint_boundary && !ac.profile), ConfigError,
             "train: activation_checkpointing.", ac.profile ? "profile" : "synchronize_checkpoint_boundary",
             " = true with --tp ", n, " but no layer is checkpointed; add --checkpoint-activations, or remove the key");
  if (tp_ckpt && !o.checkpoint_activations && o.rank == 0) {
    log::info("activation checkpointing on (the config's activation_checkpointing section sets %s)",
              ac.partition_activations ? "partition_activations"
              : ac.cpu_checkpointing   ? "cpu_checkpointing"
              : ac.number_checkpoints  ? "number_checkpoints"
                                       : "contiguous_memory_optimization");
  }
  const auto ckpt_opts = models::TpCheckpointOptions::from_config(ac);
  // The whole model first, as the plain path builds it (the caller seeded the generator).
  // At ZeRO-3 too it is built eagerly (the plain path's placeholders would leave nothing
  // to cut): the same weights as at stages 0-2; the engine then partitions each rank's tp
  // slices over dp (docs/tensor-parallel.md#zero-3-with-tp).
  // With --init-from: placeholders only (the shape of DIR/config.json); each rank reads
  // its own slices from the files below ([HF TP Load] in models/hf_tp.h).
  TrainModelOptions whole = o;
  whole.checkpoint_activations = false;
  whole.weights_later = !o.init_from.empty();
  std::shared_ptr<const models::HfCheckpointReader> hf;
  if (!o.init_from.empty()) hf = std::make_shared<models::HfCheckpointReader>(o.init_from);
  Config whole_cfg = cfg;
  if (whole_cfg.zero_optimization.stage == 3) whole_cfg.zero_optimization.stage = 2;
  TrainModel full = build_train_model(whole, whole_cfg);
  // Its parameters by name, not copied: load_full copies each rank's slices out of them.
  std::map<std::string, torch::Tensor> weights;
  if (!hf)
    for (const auto& kv : full.module->named_parameters()) weights[kv.key()] = kv.value().detach();

  TrainModel t;
  t.family = full.family;
  t.name = full.name;
  t.vocab_size = full.vocab_size;
  t.max_seq = full.max_seq;
  t.n_layer = full.n_layer;
  t.width = full.width;
  t.n_head = full.n_head;
  t.num_params = full.num_params;
  t.flops_formula = full.flops_formula;
  t.model_json = full.model_json;
  t.model_json["tensor_parallel"] = {{"size", n}, {"sequence_parallel", sequence_parallel}};
  std::function<double(const std::string&)> norm_weight;
  if (full.family == "gpt2") {
    auto whole_gpt2 = std::dynamic_pointer_cast<models::GPT2Impl>(full.module);
    ZT_ASSERT(whole_gpt2, "train: the GPT-2 model is not a GPT2Impl");
    models::GPT2Config mc = whole_gpt2->config();
    ZT_CHECK_T(mc.moe_num_experts == 0, ConfigError, "train: --tp ", n, " with the MoE model ", full.name,
               " is not supported yet (the tensor-parallel GPT-2 has no MoE blocks); run without --tp");
    mc.deferred_init = false;
    models::GPT2TP m(mc, tp, sequence_parallel);
    hf ? models::load_hf_gpt2_tp(*m, *hf) : m->load_full(weights);
    if (tp_ckpt) m->set_activation_checkpointing(ckpt_opts);
    t.module = m.ptr();
    t.loss = [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); };
    t.flops_per_token = [mc](int64_t seq) { return models::gpt2_flops_per_token(mc, seq); };
    t.activation_checkpointing = tp_ckpt;
    norm_weight = [p = m.ptr()](const std::string& name) { return p->norm_weight(name); };
  } else {
    auto whole_llama = std::dynamic_pointer_cast<models::LlamaForCausalLMImpl>(full.module);
    ZT_ASSERT(whole_llama, "train: the Llama model is not a LlamaForCausalLMImpl");
    models::LlamaConfig mc = whole_llama->config();
    ZT_CHECK_T(!mc.is_moe(), ConfigError, "train: --tp ", n, " with the MoE model ", full.name,
               " is not supported yet (the tensor-parallel Llama has no MoE layers); run without --tp, or with --ep");
    mc.deferred_init = false;
    models::LlamaTP m(mc, tp, sequence_parallel);
    hf ? models::load_hf_llama_tp(*m, *hf) : m->load_full(weights);
    if (tp_ckpt) m->set_activation_checkpointing(ckpt_opts);
    t.module = m.ptr();
    t.loss = [p = m.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); };
    t.flops_per_token = [mc](int64_t seq) { return models::llama_flops_per_token(mc, seq); };
    t.activation_checkpointing = tp_ckpt;
    norm_weight = [p = m.ptr()](const std::string& name) { return p->norm_weight(name); };
  }
  if (hf && o.rank == 0) {
    log::info("initialized from Hugging Face weights in %s: each of the %d tp ranks read only its slices",
              o.init_from.c_str(), n);
  }
  t.engine_options = [norm_weight](EngineOptions& eo) { eo.norm_weight = norm_weight; };
  t.attach = [](Engine&) {};
  t.detach = [] {};
  return t;  // `full` and `weights` go here: each rank keeps its slices only
}

}  // namespace zt::cli
