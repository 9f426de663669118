// Typed sections of a DeepSpeed config: optimizer, fp16, bf16, zero_optimization (with
// its offload sub-sections and deprecated keys), activation_checkpointing, aio.
// Defaults are DeepSpeed's code defaults (deepspeed/runtime/zero/config.py,
// offload_config.py, precision_config.py, activation_checkpointing/config.py,
// swap_tensor/aio_config.py); docs/config.md lists where the docs disagree.
#include <cmath>

#include "config/sections.h"

namespace zt::config {

namespace {

constexpr IntRule kNonNegative{};
constexpr IntRule kPositive{1};
constexpr DoubleRule kNonNegativeD{0.0};

OffloadDevice parse_device(Section& s) {
  std::string d = s.get_string("device", "none", {"none", "cpu", "nvme"});
  if (d == "cpu") return OffloadDevice::cpu;
  if (d == "nvme") return OffloadDevice::nvme;
  return OffloadDevice::none;
}

std::string parse_nvme_path(Section& s) {
  const json* v = s.find("nvme_path");
  if (!v || v->is_null()) return "";
  return to_string(s.ctx(), s.path_of("nvme_path"), *v).value_or("");
}

OffloadOptimizerConfig parse_offload_optimizer(Section s, std::vector<std::string>& not_supported) {
  OffloadOptimizerConfig o;
  o.device = parse_device(s);
  o.nvme_path = parse_nvme_path(s);
  o.buffer_count = s.get_int("buffer_count", o.buffer_count, kNonNegative);
  o.pin_memory = s.get_bool("pin_memory", o.pin_memory);
  o.pipeline_read = s.get_bool("pipeline_read", o.pipeline_read);
  o.pipeline_write = s.get_bool("pipeline_write", o.pipeline_write);
  o.fast_init = s.get_bool("fast_init", o.fast_init);
  o.ratio = s.get_double("ratio", o.ratio, DoubleRule{0.0, 1.0});
  o.delayed_param_update = s.get_bool("delayed_param_update", o.delayed_param_update);
  read_known_keys(s, not_supported);
  return o;
}

OffloadParamConfig parse_offload_param(Section s) {
  OffloadParamConfig o;
  o.device = parse_device(s);
  o.nvme_path = parse_nvme_path(s);
  o.buffer_count = s.get_int("buffer_count", o.buffer_count, kNonNegative);
  o.buffer_size = s.get_int("buffer_size", o.buffer_size, kNonNegative);
  o.max_in_cpu = s.get_int("max_in_cpu", o.max_in_cpu, kNonNegative);
  o.pin_memory = s.get_bool("pin_memory", o.pin_memory);
  return o;
}

// A deprecated Optional[bool] key (null allowed).
bool deprecated_flag(Section& s, std::string_view key) {
  const json* v = s.find(key);
  if (!v || v->is_null()) return false;
  return to_bool(s.ctx(), s.path_of(key), *v).value_or(false);
}

void parse_adam_params(Section& p, const std::string& type, OptimizerParams& o) {
  o.lr = p.get_double("lr", o.lr, kNonNegativeD);
  if (const json* b = p.find("betas")) {
    const std::string path = p.path_of("betas");
    if (!b->is_array() || b->size() != 2) {
      p.ctx().error(path + ": expected an array of two numbers such as [0.9, 0.999], found " + type_name(*b) +
                    " " + show(*b));
    } else {
      for (size_t i = 0; i < 2; ++i) {
        auto v = to_double(p.ctx(), path + "[" + std::to_string(i) + "]", (*b)[i], DoubleRule{0.0, 1.0});
        if (v && *v >= 1.0) {
          p.ctx().error(path + "[" + std::to_string(i) + "]: must be < 1, found " + fmt(*v) +
                        ": use a value in [0, 1) such as " + (i == 0 ? "0.9" : "0.999"));
        } else if (v) {
          o.betas[i] = *v;
        }
      }
    }
  }
  o.eps = p.get_double("eps", o.eps, kNonNegativeD);
  o.weight_decay = p.get_double("weight_decay", o.weight_decay, kNonNegativeD);
  o.bias_correction = p.get_bool("bias_correction", o.bias_correction);
  o.amsgrad = p.get_bool("amsgrad", o.amsgrad);
  o.torch_adam = p.get_bool("torch_adam", o.torch_adam);
  bool adam_w_mode = p.get_bool("adam_w_mode", true);
  if (type == "AdamW" && !adam_w_mode) {
    p.ctx().error(p.path_of("adam_w_mode") +
                  ": false has no effect with type AdamW (DeepSpeed forces decoupled weight decay for AdamW): "
                  "for Adam with L2 weight decay use type \"Adam\" with adam_w_mode false");
  }
  o.adam_w_mode = type == "AdamW" ? true : adam_w_mode;
  // DeepSpeed warns and ignores max_grad_norm here; a silent no-op would surprise.
  double max_grad_norm = p.get_double("max_grad_norm", 0.0, kNonNegativeD);
  if (max_grad_norm > 0) {
    p.ctx().error(p.path_of("max_grad_norm") + ": DeepSpeed ignores clipping set here: remove it and set " +
                  "the top-level \"gradient_clipping\": " + fmt(max_grad_norm));
  }
}

void parse_sgd_params(Section& p, OptimizerParams& o) {
  o.lr = p.get_double("lr", o.lr, kNonNegativeD);
  o.momentum = p.get_double("momentum", o.momentum, kNonNegativeD);
  o.dampening = p.get_double("dampening", o.dampening, kNonNegativeD);
  o.weight_decay = p.get_double("weight_decay", o.weight_decay, kNonNegativeD);
  o.nesterov = p.get_bool("nesterov", o.nesterov);
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    p.ctx().error(p.path_of("nesterov") + ": Nesterov momentum needs momentum > 0 and dampening 0 (found " +
                  "momentum " + fmt(o.momentum) + ", dampening " + fmt(o.dampening) +
                  "): set momentum (e.g. 0.9) and dampening 0, or nesterov false");
  }
}

}  // namespace

OptimizerConfig parse_optimizer(Section s, std::vector<std::string>& not_supported) {
  OptimizerConfig out;
  const json* type = s.find("type");
  Section params = s.sub("params");
  read_known_keys(s, not_supported);
  if (!s.present()) return out;
  if (!type) {
    s.ctx().error(join_path(s.path(), "type") + ": missing: set it to one of " + supported_optimizers());
    params.accept_all_keys();
    return out;
  }
  auto name = to_string(s.ctx(), s.path_of("type"), *type);
  if (!name) {
    params.accept_all_keys();
    return out;
  }
  TypeName t = lookup_optimizer(*name);
  if (t.canonical.empty()) {
    s.ctx().error(s.path_of("type") + ": \"" + *name + "\" is not an optimizer zerotrain knows: " +
                  (t.nearest.empty() ? "" : "did you mean " + t.nearest + "? ") + "use one of " +
                  supported_optimizers());
    params.accept_all_keys();
    return out;
  }
  out.type = t.canonical;
  if (!t.supported) {
    not_supported.push_back(s.path_of("type") + " \"" + t.canonical +
                            "\" is not supported yet by zerotrain: use one of " + supported_optimizers());
    params.accept_all_keys();  // its own hyper-parameters; nothing to validate them against
    return out;
  }
  if (out.type == "SGD") {
    parse_sgd_params(params, out.params);
  } else {
    parse_adam_params(params, out.type, out.params);
  }
  return out;
}

Fp16Config parse_fp16(Section s) {
  Fp16Config f;
  f.enabled = s.get_bool("enabled", f.enabled);
  f.auto_cast = s.get_bool("auto_cast", f.auto_cast);
  f.loss_scale = s.get_double("loss_scale", f.loss_scale, kNonNegativeD);
  f.initial_scale_power = s.get_int("initial_scale_power", f.initial_scale_power, IntRule{0, 64});
  f.loss_scale_window = s.get_int("loss_scale_window", f.loss_scale_window, kPositive);
  f.hysteresis = s.get_int("hysteresis", f.hysteresis, kPositive);
  f.consecutive_hysteresis = s.get_bool("consecutive_hysteresis", f.consecutive_hysteresis);
  f.min_loss_scale = s.get_double("min_loss_scale", f.min_loss_scale, DoubleRule{0.0, INFINITY, true});
  f.fp16_master_weights_and_grads = s.get_bool("fp16_master_weights_and_grads", f.fp16_master_weights_and_grads);
  return f;
}

Bf16Config parse_bf16(Section s) {
  Bf16Config b;
  b.enabled = s.get_bool("enabled", b.enabled);
  b.immediate_grad_update = s.get_bool("immediate_grad_update", b.immediate_grad_update);
  b.check_grad_overflow = s.get_bool("check_grad_overflow", b.check_grad_overflow);
  b.bf16_master_weights_and_grads = s.get_bool("bf16_master_weights_and_grads", b.bf16_master_weights_and_grads);
  b.bf16_optimizer_states = s.get_bool("bf16_optimizer_states", b.bf16_optimizer_states);
  return b;
}

ZeroConfig parse_zero(Section& top, std::vector<std::string>& not_supported) {
  ZeroConfig z;
  const json* raw = top.find("zero_optimization");
  // DeepSpeed's old format "zero_optimization": true|false means stage 1 | 0.
  bool old_bool = raw && raw->is_boolean();
  Section s(top.ctx(), "zero_optimization", old_bool ? nullptr : raw);
  if (old_bool) z.stage = raw->get<bool>() ? 1 : 0;

  const json* stage = s.find("stage");
  if (stage) {
    auto v = to_int(s.ctx(), s.path_of("stage"), *stage, IntRule{std::numeric_limits<int64_t>::min()}, 0);
    if (v && (*v < 0 || *v > 3)) {
      s.ctx().error(s.path_of("stage") + ": " + std::to_string(*v) +
                    " is not a ZeRO stage: use 0 (off), 1 (optimizer states), 2 (+ gradients) or "
                    "3 (+ parameters)");
    } else if (v) {
      z.stage = *v;
    }
  }
  z.contiguous_gradients = s.get_bool("contiguous_gradients", z.contiguous_gradients);
  z.reduce_scatter = s.get_bool("reduce_scatter", z.reduce_scatter);
  z.reduce_bucket_size = s.get_int("reduce_bucket_size", z.reduce_bucket_size, kNonNegative);
  z.allgather_partitions = s.get_bool("allgather_partitions", z.allgather_partitions);
  z.allgather_bucket_size = s.get_int("allgather_bucket_size", z.allgather_bucket_size, kNonNegative);
  // DeepSpeed's validator: when not given, overlap_comm is on for stage 3 only.
  z.overlap_comm = s.get_bool("overlap_comm", z.stage == 3);
  z.load_from_fp32_weights = s.get_bool("load_from_fp32_weights", z.load_from_fp32_weights);
  z.elastic_checkpoint = s.get_bool("elastic_checkpoint", z.elastic_checkpoint);
  z.offload_optimizer = parse_offload_optimizer(s.sub("offload_optimizer"), not_supported);
  z.offload_param = parse_offload_param(s.sub("offload_param"));
  z.sub_group_size = s.get_int("sub_group_size", z.sub_group_size, kNonNegative);
  z.stage3_prefetch_bucket_size = s.get_int("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size,
                                            IntRule{0, std::numeric_limits<int64_t>::max(), true},
                                            {"prefetch_bucket_size"});
  z.stage3_param_persistence_threshold =
      s.get_int("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, kNonNegative,
                {"param_persistence_threshold"});
  z.stage3_model_persistence_threshold =
      s.get_int("stage3_model_persistence_threshold", z.stage3_model_persistence_threshold, kNonNegative,
                {"model_persistence_threshold"});
  z.stage3_max_live_parameters = s.get_int("stage3_max_live_parameters", z.stage3_max_live_parameters,
                                           kNonNegative, {"max_live_parameters"});
  z.stage3_max_reuse_distance = s.get_int("stage3_max_reuse_distance", z.stage3_max_reuse_distance,
                                          kNonNegative, {"max_reuse_distance"});
  z.stage3_gather_16bit_weights_on_model_save =
      s.get_bool("stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save,
                 {"gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"});
  z.ignore_unused_parameters = s.get_bool("ignore_unused_parameters", z.ignore_unused_parameters);
  z.round_robin_gradients = s.get_bool("round_robin_gradients", z.round_robin_gradients);

  // Deprecated spellings of the offload sections (DeepSpeed maps them the same way and
  // refuses a deprecated key together with its replacement).
  bool cpu_offload = deprecated_flag(s, "cpu_offload");
  bool cpu_offload_param = deprecated_flag(s, "cpu_offload_param");
  bool use_pin = deprecated_flag(s, "cpu_offload_use_pin_memory");
  if (cpu_offload) {
    if (s.has("offload_optimizer")) {
      s.ctx().error("zero_optimization.cpu_offload (deprecated) and zero_optimization.offload_optimizer are both "
                    "given: remove cpu_offload and keep offload_optimizer");
    } else {
      z.offload_optimizer.device = OffloadDevice::cpu;
      z.offload_optimizer.pin_memory = use_pin;
    }
  }
  if (cpu_offload_param) {
    if (s.has("offload_param")) {
      s.ctx().error("zero_optimization.cpu_offload_param (deprecated) and zero_optimization.offload_param are "
                    "both given: remove cpu_offload_param and keep offload_param");
    } else {
      z.offload_param.device = OffloadDevice::cpu;
      z.offload_param.pin_memory = use_pin;
    }
  }
  if (use_pin && !cpu_offload && !cpu_offload_param) {
    s.ctx().error("zero_optimization.cpu_offload_use_pin_memory (deprecated) only applies with cpu_offload or "
                  "cpu_offload_param (DeepSpeed ignores it otherwise): set offload_optimizer.pin_memory / "
                  "offload_param.pin_memory instead");
  }
  read_known_keys(s, not_supported);
  return z;
}

ActivationCheckpointingConfig parse_activation_checkpointing(Section s) {
  ActivationCheckpointingConfig a;
  a.partition_activations = s.get_bool("partition_activations", a.partition_activations);
  a.cpu_checkpointing = s.get_bool("cpu_checkpointing", a.cpu_checkpointing);
  a.contiguous_memory_optimization = s.get_bool("contiguous_memory_optimization", a.contiguous_memory_optimization);
  a.number_checkpoints = s.get_opt_int("number_checkpoints", kPositive);
  a.synchronize_checkpoint_boundary =
      s.get_bool("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
  a.profile = s.get_bool("profile", a.profile);
  return a;
}

AioConfig parse_aio(Section s, std::vector<std::string>& not_supported) {
  AioConfig a;
  a.block_size = s.get_int("block_size", a.block_size, kPositive);
  // NVMe offload splits every transfer into block_size requests at block_size offsets;
  // O_DIRECT needs them page-aligned (src/offload/aio.h).
  constexpr int64_t kPage = 4096, kMaxBlock = int64_t{1} << 30;
  if (a.block_size > 0 && (a.block_size % kPage != 0 || a.block_size > kMaxBlock)) {
    s.ctx().error(s.path_of("block_size") + " = " + std::to_string(a.block_size) + " is not a multiple of " +
                  std::to_string(kPage) + " bytes up to 1 GiB: NVMe offload issues page-aligned requests of " +
                  "block_size bytes; use a multiple of 4096 such as 1048576 (the default)");
  }
  a.queue_depth = s.get_int("queue_depth", a.queue_depth, kPositive);
  a.thread_count = s.get_int("thread_count", a.thread_count, kPositive, {"intra_op_parallelism"});
  a.single_submit = s.get_bool("single_submit", a.single_submit);
  a.overlap_events = s.get_bool("overlap_events", a.overlap_events);
  a.use_gds = s.get_bool("use_gds", a.use_gds);
  read_known_keys(s, not_supported);
  return a;
}

void check_cross_section(Context& ctx, const Config& c) {
  if (c.fp16.enabled && c.bf16.enabled) {
    ctx.error("fp16.enabled and bf16.enabled are both true: enable one of them (DeepSpeed refuses both too)");
  }
  const ZeroConfig& z = c.zero_optimization;
  if (z.offload_param.device != OffloadDevice::none && z.stage != 3) {
    ctx.error("zero_optimization.offload_param needs stage 3 (found stage " + std::to_string(z.stage) +
              "): set zero_optimization.stage to 3 or remove offload_param");
  }
  if (z.offload_optimizer.device != OffloadDevice::none && z.stage == 0) {
    ctx.error("zero_optimization.offload_optimizer needs stage 1, 2 or 3 (found stage 0): set "
              "zero_optimization.stage or remove offload_optimizer");
  }
  if (z.offload_param.device != OffloadDevice::none && z.stage == 3 &&
      z.offload_optimizer.device == OffloadDevice::none) {
    ctx.error("zero_optimization.offload_param keeps parameter shards off the device for the CPU step to write: "
              "also set zero_optimization.offload_optimizer.device to \"cpu\" (or \"nvme\")");
  }
  if (z.offload_optimizer.device != OffloadDevice::none && c.optimizer.type == "SGD") {
    ctx.error("zero_optimization.offload_optimizer runs the step with zerotrain's CPU Adam: use optimizer.type "
              "Adam or AdamW, or remove offload_optimizer");
  }
  if (z.offload_optimizer.delayed_param_update && z.offload_optimizer.device != OffloadDevice::cpu) {
    ctx.error("zero_optimization.offload_optimizer.delayed_param_update overlaps the CPU optimizer step with the "
              "next forward/backward: it needs offload_optimizer.device \"cpu\"" +
              std::string(z.offload_optimizer.device == OffloadDevice::nvme
                              ? " (it is not supported with \"nvme\", whose step swaps the state through staging "
                                "buffers): remove delayed_param_update or use device \"cpu\""
                              : ""));
  }
  if (z.offload_optimizer.device == OffloadDevice::nvme && z.offload_optimizer.buffer_count < 1) {
    ctx.error("zero_optimization.offload_optimizer.buffer_count = " + std::to_string(z.offload_optimizer.buffer_count) +
              ": device \"nvme\" needs at least 1 staging buffer (one sub-group of master + m + v each); use 4 "
              "(DeepSpeed's default), which overlaps the reads and writes of the swap file with the CPU step");
  }
  if (z.offload_optimizer.delayed_param_update && z.offload_param.device != OffloadDevice::none) {
    ctx.error("zero_optimization.offload_optimizer.delayed_param_update cannot be combined with offload_param (the "
              "CPU step would write the parameter shards while forward reads them): remove one of them");
  }
  if (z.offload_optimizer.ratio < 1.0 && z.stage != 3) {
    ctx.error("zero_optimization.offload_optimizer.ratio " + fmt(z.offload_optimizer.ratio) +
              " (partial offload) needs stage 3: set ratio to 1.0 or stage to 3");
  }
  if (z.offload_optimizer.device == OffloadDevice::nvme && z.offload_optimizer.nvme_path.empty()) {
    ctx.error("zero_optimization.offload_optimizer.nvme_path is required for device \"nvme\": set it to a "
              "directory on the NVMe drive");
  }
  if (z.offload_param.device == OffloadDevice::nvme && z.offload_param.nvme_path.empty()) {
    ctx.error("zero_optimization.offload_param.nvme_path is required for device \"nvme\": set it to a "
              "directory on the NVMe drive");
  }
}

// ---- to_json -------------------------------------------------------------------------

namespace {
json nvme_path_json(const std::string& p) { return p.empty() ? json(nullptr) : json(p); }
}  // namespace

json offload_optimizer_to_json(const OffloadOptimizerConfig& o) {
  return json{{"device", zt::to_string(o.device)},
              {"nvme_path", nvme_path_json(o.nvme_path)},
              {"buffer_count", o.buffer_count},
              {"pin_memory", o.pin_memory},
              {"pipeline_read", o.pipeline_read},
              {"pipeline_write", o.pipeline_write},
              {"fast_init", o.fast_init},
              {"ratio", o.ratio},
              {"delayed_param_update", o.delayed_param_update}};
}

json offload_param_to_json(const OffloadParamConfig& o) {
  return json{{"device", zt::to_string(o.device)},       {"nvme_path", nvme_path_json(o.nvme_path)},
              {"buffer_count", o.buffer_count},      {"buffer_size", o.buffer_size},
              {"max_in_cpu", o.max_in_cpu},          {"pin_memory", o.pin_memory}};
}

json zero_to_json(const ZeroConfig& z) {
  return json{{"stage", z.stage},
              {"contiguous_gradients", z.contiguous_gradients},
              {"reduce_scatter", z.reduce_scatter},
              {"reduce_bucket_size", z.reduce_bucket_size},
              {"allgather_partitions", z.allgather_partitions},
              {"allgather_bucket_size", z.allgather_bucket_size},
              {"overlap_comm", z.overlap_comm},
              {"load_from_fp32_weights", z.load_from_fp32_weights},
              {"elastic_checkpoint", z.elastic_checkpoint},
              {"offload_optimizer", offload_optimizer_to_json(z.offload_optimizer)},
              {"offload_param", offload_param_to_json(z.offload_param)},
              {"sub_group_size", z.sub_group_size},
              {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
              {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
              {"stage3_model_persistence_threshold", z.stage3_model_persistence_threshold},
              {"stage3_max_live_parameters", z.stage3_max_live_parameters},
              {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
              {"stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save},
              {"ignore_unused_parameters", z.ignore_unused_parameters},
              {"round_robin_gradients", z.round_robin_gradients}};
}

json optimizer_to_json(const OptimizerConfig& o) {
  const OptimizerParams& p = o.params;
  json params;
  if (o.type == "SGD") {
    params = json{{"lr", p.lr},
                  {"momentum", p.momentum},
                  {"dampening", p.dampening},
                  {"weight_decay", p.weight_decay},
                  {"nesterov", p.nesterov}};
  } else if (o.type == "Adam" || o.type == "AdamW") {
    params = json{{"lr", p.lr},
                  {"betas", {p.betas[0], p.betas[1]}},
                  {"eps", p.eps},
                  {"weight_decay", p.weight_decay},
                  {"adam_w_mode", p.adam_w_mode},
                  {"bias_correction", p.bias_correction},
                  {"amsgrad", p.amsgrad},
                  {"torch_adam", p.torch_adam}};
  } else {
    params = json::object();  // a known type that is not supported yet: nothing was parsed
  }
  return json{{"type", o.type}, {"params", params}};
}

}  // namespace zt::config
