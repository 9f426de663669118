// What the engine cannot honour yet, in ONE place. Flip `supported` (or delete the row)
// as a feature lands; every such key is accepted at DeepSpeed's default value and is a
// "not supported yet by zerotrain" error at any other (collected in
// Config::not_supported_yet; Config::from_json throws on it).
//
// Three tables:
//   kOptimizers / kSchedulers  type names DeepSpeed accepts, and which ones we run;
//   kFeatures                  typed Config fields whose non-default value needs engine work;
//   kKnownKeys                 DeepSpeed keys/sections zerotrain does not model: "default or
//                              not supported yet" (monitors, profilers, compression, ...).
#include <algorithm>
#include <cmath>

#include "config/sections.h"

namespace zt::config {

namespace {

struct NamedType {
  const char* name;
  bool supported;
};

// DeepSpeed matches its own optimizer names case-insensitively and forwards anything
// else to torch.optim by exact name; zerotrain matches all of them case-insensitively.
constexpr NamedType kOptimizers[] = {
    {"Adam", true},       {"AdamW", true},      {"SGD", true},         {"Lamb", false},
    {"OneBitAdam", false}, {"ZeroOneAdam", false}, {"OneBitLamb", false}, {"Adagrad", false},
    {"Lion", false},      {"MuAdam", false},    {"MuAdamW", false},    {"MuSGD", false},
    {"Muon", false},      {"FusedAdam", false}, {"FusedLamb", false},  {"RMSprop", false},
    {"Adadelta", false},  {"Adamax", false},    {"NAdam", false},      {"RAdam", false},
    {"ASGD", false},      {"Rprop", false},     {"LBFGS", false},      {"SparseAdam", false},
    {"Adafactor", false},
};

// DeepSpeed's lr_schedules.py classes, then torch.optim.lr_scheduler classes it forwards to.
constexpr NamedType kSchedulers[] = {
    {"WarmupLR", true},        {"WarmupDecayLR", true},     {"WarmupCosineLR", true},
    {"OneCycle", true},        {"LRRangeTest", true},      {"StepLR", false},
    {"MultiStepLR", false},    {"ExponentialLR", false},    {"CosineAnnealingLR", false},
    {"LambdaLR", false},       {"LinearLR", false},         {"ConstantLR", false},
    {"OneCycleLR", false},     {"CyclicLR", false},         {"PolynomialLR", false},
    {"ReduceLROnPlateau", false}, {"CosineAnnealingWarmRestarts", false},
};

template <size_t N>
TypeName lookup(const NamedType (&table)[N], std::string_view name) {
  TypeName out;
  size_t best = 3;
  for (const auto& t : table) {
    if (lower(t.name) == lower(name)) return TypeName{t.name, t.supported, ""};
    size_t d = edit_distance(lower(t.name), lower(name));
    if (d < best) best = d, out.nearest = t.name;
  }
  return out;
}

template <size_t N>
std::string names(const NamedType (&table)[N], bool supported) {
  std::string out;
  for (const auto& t : table)
    if (t.supported == supported) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

// A typed field whose value differs from DeepSpeed's default: `value` returns the value
// as text when it does (in use), empty otherwise.
struct Feature {
  const char* key;
  bool supported;
  std::string (*value)(const Config&);
  const char* meanwhile;  // what the user can do until it lands
};

std::string flag(bool in_use) { return in_use ? "true" : ""; }
std::string unflag(bool value) { return value ? "" : "false"; }

const Feature kFeatures[] = {
    {"aio.use_gds", false, [](const Config& c) { return flag(c.aio.use_gds); },
     "set it false (NVMe offload reads and writes through host staging buffers; GPUDirect Storage is not there yet)"},
    {"zero_optimization.offload_optimizer.ratio", false,
     [](const Config& c) {
       return c.zero_optimization.offload_optimizer.ratio != 1.0 ? std::to_string(c.zero_optimization.offload_optimizer.ratio)
                                                                  : std::string();
     },
     "remove it (the whole optimizer state is offloaded)"},
    {"zero_optimization.allgather_partitions", false,
     [](const Config& c) { return unflag(c.zero_optimization.allgather_partitions); },
     "remove it (zerotrain all-gathers the updated shards)"},
    {"zero_optimization.reduce_scatter", false,
     [](const Config& c) { return unflag(c.zero_optimization.reduce_scatter); },
     "remove it (zerotrain reduce-scatters gradients)"},
    {"zero_optimization.load_from_fp32_weights", false,
     [](const Config& c) { return unflag(c.zero_optimization.load_from_fp32_weights); },
     "remove it (checkpoints restore the fp32 master weights)"},
    {"zero_optimization.elastic_checkpoint", false,
     [](const Config& c) { return flag(c.zero_optimization.elastic_checkpoint); },
     "remove it (zerotrain checkpoints load at any world size)"},
    {"zero_optimization.ignore_unused_parameters", false,
     [](const Config& c) { return unflag(c.zero_optimization.ignore_unused_parameters); },
     "remove it (unused parameters are ignored)"},
    // [TP Activation Checkpointing] (models/tp_checkpoint.h): honoured under tensor
    // parallelism (train --tp N); the models without tp checkpoint through
    // models/checkpoint.h, which does not take these four.
    {"activation_checkpointing.partition_activations", false,
     [](const Config& c) { return c.tp_size() > 1 ? std::string() : flag(c.activation_checkpointing.partition_activations); },
     "set it false: it takes effect with tensor parallelism only (zerotrain train --tp N, docs/tensor-parallel.md)"},
    {"activation_checkpointing.contiguous_memory_optimization", false,
     [](const Config& c) {
       return c.tp_size() > 1 ? std::string() : flag(c.activation_checkpointing.contiguous_memory_optimization);
     },
     "set it false: it is honoured with tensor parallelism only (zerotrain train --tp N, docs/tensor-parallel.md)"},
    {"activation_checkpointing.synchronize_checkpoint_boundary", false,
     [](const Config& c) {
       return c.tp_size() > 1 ? std::string() : flag(c.activation_checkpointing.synchronize_checkpoint_boundary);
     },
     "set it false: it is honoured with tensor parallelism only (zerotrain train --tp N, docs/tensor-parallel.md)"},
    {"activation_checkpointing.profile", false,
     [](const Config& c) { return c.tp_size() > 1 ? std::string() : flag(c.activation_checkpointing.profile); },
     "set it false (wall_clock_breakdown times the phases; per-checkpoint times come with train --tp N)"},
    {"optimizer.params.amsgrad", false, [](const Config& c) { return flag(c.optimizer.params.amsgrad); },
     "set it false"},
    {"fp16.auto_cast", false, [](const Config& c) { return flag(c.fp16.auto_cast); },
     "set it false and feed fp16 inputs"},
    {"fp16.fp16_master_weights_and_grads", false,
     [](const Config& c) { return flag(c.fp16.fp16_master_weights_and_grads); }, "set it false"},
    {"bf16.immediate_grad_update", false, [](const Config& c) { return flag(c.bf16.immediate_grad_update); },
     "set it false"},
    {"bf16.check_grad_overflow", false, [](const Config& c) { return flag(c.bf16.check_grad_overflow); },
     "set it false"},
    {"bf16.bf16_master_weights_and_grads", false,
     [](const Config& c) { return flag(c.bf16.bf16_master_weights_and_grads); }, "set it false"},
    {"bf16.bf16_optimizer_states", false, [](const Config& c) { return flag(c.bf16.bf16_optimizer_states); },
     "set it false"},
    {"dump_state", false, [](const Config& c) { return flag(c.dump_state); }, "set it false"},
};

// DeepSpeed keys zerotrain does not model.
enum class Known {
  enabled_section,  // an object whose "enabled" must be false/absent; other keys unchecked
  presence,         // a section: absent, null or {} only
  scalar,           // a value that must equal `def` (JSON text)
  any,              // informational, any value (vocabulary_size: a warning in DeepSpeed)
};
struct KnownKey {
  const char* section;  // Section path the key lives in
  const char* key;
  Known kind;
  const char* def = nullptr;  // Known::scalar
  const char* alias = nullptr;
};

const KnownKey kKnownKeys[] = {
    // monitors and profilers (tensorboard, csv_monitor and wandb: config/monitor.cpp)
    {"", "comet", Known::enabled_section},
    {"", "trackio", Known::enabled_section},
    {"", "flops_profiler", Known::enabled_section},
    {"", "comms_logger", Known::enabled_section},
    // other engines and training features
    {"", "hybrid_engine", Known::enabled_section},
    {"", "elasticity", Known::enabled_section},
    {"", "autotuning", Known::enabled_section},
    {"", "amp", Known::enabled_section},
    {"", "torch_autocast", Known::enabled_section},
    {"", "data_efficiency", Known::enabled_section},
    {"", "curriculum_learning", Known::enabled_section},
    {"", "progressive_layer_drop", Known::enabled_section},
    {"", "eigenvalue", Known::enabled_section},
    {"", "quantize_training", Known::enabled_section},
    {"", "nebula", Known::enabled_section},
    {"", "sparse_attention", Known::presence},
    {"", "compression_training", Known::presence},
    {"", "weight_quantization", Known::presence},
    {"", "compile", Known::presence},
    {"", "checkpoint", Known::presence},
    {"", "data_types", Known::presence},
    {"", "timers", Known::any},
    {"", "vocabulary_size", Known::any},
    {"", "communication_data_type", Known::scalar, "null"},
    {"", "seq_parallel_communication_data_type", Known::scalar, "\"fp32\"", "seq_parallel_comm_data_type"},
    {"", "sequence_parallel_size", Known::scalar, "1"},
    {"", "disable_allgather", Known::scalar, "false"},
    {"", "sparse_gradients", Known::scalar, "false"},
    {"", "memory_breakdown", Known::scalar, "false"},
    {"", "graph_harvesting", Known::scalar, "false"},
    {"", "dataloader_drop_last", Known::scalar, "false"},
    {"", "use_data_before_expert_parallelism", Known::scalar, "false"},
    {"optimizer", "legacy_fusion", Known::scalar, "false"},
    // zero_optimization: ZeRO++, MiCS, ZenFlow and stage-3 tuning knobs
    {"zero_optimization", "use_multi_rank_bucket_allreduce", Known::scalar, "true"},
    {"zero_optimization", "legacy_stage1", Known::scalar, "false"},
    {"zero_optimization", "zero_hpz_partition_size", Known::scalar, "1"},
    {"zero_optimization", "zero_quantized_weights", Known::scalar, "false"},
    {"zero_optimization", "zero_quantized_nontrainable_weights", Known::scalar, "false"},
    {"zero_optimization", "zero_quantized_gradients", Known::scalar, "false"},
    {"zero_optimization", "zeropp_loco_param", Known::scalar, "null"},
    {"zero_optimization", "mics_shard_size", Known::scalar, "-1"},
    {"zero_optimization", "mics_hierarchical_params_gather", Known::scalar, "false"},
    {"zero_optimization", "memory_efficient_linear", Known::any},  // config/notes.cpp
    {"zero_optimization", "pipeline_loading_checkpoint", Known::scalar, "false"},
    {"zero_optimization", "override_module_apply", Known::scalar, "true"},
    {"zero_optimization", "log_trace_cache_warnings", Known::scalar, "false"},
    {"zero_optimization", "enable_sanity_checks", Known::scalar, "false"},
    {"zero_optimization", "save_muon_momentum_buffer_in_memory", Known::scalar, "false"},
    {"zero_optimization", "zenflow", Known::scalar, "null"},
    {"zero_optimization", "leaf_module", Known::presence},
    {"zero_optimization", "stage3_module_granularity_threshold", Known::scalar, "0", "module_granularity_threshold"},
    {"zero_optimization", "stage3_use_all_reduce_for_fetch_params", Known::scalar, "false",
     "use_all_reduce_for_fetch_params"},
    {"zero_optimization", "stage3_allgather_sequential", Known::scalar, "false", "allgather_sequential"},
    {"zero_optimization", "stage3_partition_stream_chunk_size", Known::scalar, "0",
     "partition_stream_chunk_size"},
    {"zero_optimization.offload_optimizer", "super_offload", Known::scalar, "false"},
    {"zero_optimization.offload_optimizer", "convert_grad_on_cpu", Known::scalar, "true"},
    {"zero_optimization.offload_optimizer", "cpuadam_cores_perc", Known::scalar, "0.8"},
    {"aio", "io_backend", Known::scalar, "\"async_io\""},
    // tensor_parallel (AutoTP training; autotp_size is typed):
    // DeepSpeed's defaults (runtime/tensor_parallel/config.py, runtime/config.py)
    {"tensor_parallel", "tp_overlap_comm", Known::scalar, "false"},
    {"tensor_parallel", "dtype", Known::presence},
    {"tensor_parallel", "tensor_parallel", Known::presence, nullptr, "tp"},
    {"tensor_parallel", "injection_policy_tuple", Known::scalar, "null"},
    {"tensor_parallel", "partition_config", Known::scalar, "null"},
    {"tensor_parallel", "preset_model", Known::scalar, "null"},
    {"tensor_parallel", "keep_module_on_host", Known::scalar, "false"},
    {"tensor_parallel", "replace_with_kernel_inject", Known::scalar, "false", "kernel_inject"},
    // (the pipeline section's other keys are read in parallel.cpp: read_pipeline_keys)
};

bool equal_values(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

std::string not_yet(const std::string& path, const std::string& value, const std::string& meanwhile) {
  return path + " = " + value + " is not supported yet by zerotrain: " + meanwhile;
}

}  // namespace

TypeName lookup_optimizer(std::string_view name) { return lookup(kOptimizers, name); }
TypeName lookup_scheduler(std::string_view name) { return lookup(kSchedulers, name); }
std::string supported_optimizers() { return names(kOptimizers, true); }
std::string supported_schedulers() { return names(kSchedulers, true); }

void read_known_keys(Section& s, std::vector<std::string>& not_supported) {
  for (const auto& k : kKnownKeys) {
    if (s.path() != k.section) continue;
    const json* v = k.alias ? s.find(k.key, {k.alias}) : s.find(k.key);
    std::string path = k.alias ? s.path_of(k.key, {k.alias}) : s.path_of(k.key);
    switch (k.kind) {
      case Known::enabled_section: {
        if (!v || v->is_null()) break;
        Section sec(s.ctx(), path, v);
        bool enabled = sec.get_bool("enabled", false);
        sec.accept_all_keys();
        if (enabled) not_supported.push_back(not_yet(path + ".enabled", "true", "set it false or remove " + path));
        break;
      }
      case Known::presence:
        if (v && !v->is_null() && !(v->is_object() && v->empty()))
          not_supported.push_back(path + " is not supported yet by zerotrain: remove " +
                                  (v->is_object() ? "the section" : "it"));
        break;
      case Known::scalar: {
        json def = json::parse(k.def);
        if (v && !equal_values(*v, def))
          not_supported.push_back(not_yet(path, show(*v), "remove it or use DeepSpeed's default " + def.dump()));
        break;
      }
      case Known::any:
        break;
    }
  }
}

void check_support(const Config& c, std::vector<std::string>& not_supported) {
  for (const auto& f : kFeatures) {
    if (f.supported) continue;
    std::string v = f.value(c);
    if (!v.empty()) not_supported.push_back(not_yet(f.key, v, f.meanwhile));
  }
  // The parallel degrees (docs/parallel.md): the layout and its groups exist
  // (src/parallel), the engine runs data parallelism only.
  const std::string dp_all = "; remove it (train data parallel over all ranks) until it lands";
  if (c.tp_size() > 1) {
    // `zerotrain train --tp` and check-config take such a config
    // (config::drop_tensor_parallel_note); zt::initialize does not: it needs the
    // tensor-parallel model and the topology's groups, which a config alone does not give.
    not_supported.push_back(not_yet("tensor_parallel.autotp_size", std::to_string(c.tensor_parallel.autotp_size),
                                    "tensor parallelism (tp " + std::to_string(c.tp_size()) +
                                        ") runs through zerotrain train --tp (GPT-2 and Llama, "
                                        "docs/tensor-parallel.md), not zt::initialize from the config alone (build "
                                        "the tp model and pass the topology's groups in EngineOptions)"));
  }
  if (c.pp_size() > 1) {
    // zt::pipe::PipeEngine (and with it `zerotrain train` and check-config) takes such a
    // config (pipe::pipeline_config drops this message); zt::initialize does not.
    not_supported.push_back(not_yet("pipeline.stages", std::to_string(c.pipeline.stages),
                                    "pipeline parallelism (pp " + std::to_string(c.pp_size()) +
                                        ") runs through zt::pipe::PipeEngine and zerotrain train (docs/pipeline.md), "
                                        "not zt::initialize" + dp_all + " (or drop --pp)"));
  }
  if (c.expert_parallel.enabled) {
    not_supported.push_back(not_yet("expert_parallel.enabled", "true",
                                    "expert parallelism (ep " + std::to_string(c.ep_size()) +
                                        ") is not implemented yet (no MoE layers); set it false (or drop --ep)"));
  }
}

}  // namespace zt::config
