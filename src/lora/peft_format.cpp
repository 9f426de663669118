#include "lora/peft_format.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/safetensors.h"
#include "zerotrain/error.h"

namespace zt::lora {
namespace fs = std::filesystem;

namespace {

constexpr const char* kWeights = "adapter_model.safetensors";
constexpr const char* kConfig = "adapter_config.json";

nlohmann::json json_number(double v) {
  // peft writes lora_alpha as an int when it is one (16, not 16.0).
  if (std::floor(v) == v && std::abs(v) < 1e15) return static_cast<int64_t>(v);
  return v;
}

}  // namespace

void save_peft_adapter(const std::string& dir, const LoraModel& lm, const LoraTargetSpace& space,
                       const std::string& base_model_name_or_path, at::ScalarType dtype) {
  ZT_CHECK_T(!lm.adapters.empty(), ConfigError, "lora: no adapters to save");
  for (const auto& a : lm.adapters) {
    ZT_CHECK_T(a.adapter->lora_A.dim() == 2 && a.adapter->lora_B.dim() == 2 &&
                   a.adapter->lora_A.size(0) == a.adapter->lora_B.size(1),
               CheckpointError, "lora: the adapter of '", a.site.path,
               "' is not whole (partitioned by ZeRO-3? gather the parameters before saving)");
  }
  write_peft_adapter(dir, peft_state_dict(lm, dtype), lm.options, space, base_model_name_or_path);
}

void write_peft_adapter(const std::string& dir, const std::map<std::string, torch::Tensor>& tensors,
                        const LoraOptions& o, const LoraTargetSpace& space, const std::string& base_model_name_or_path) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ZT_CHECK_T(!ec, CheckpointError, "lora: cannot create adapter directory '", dir, "': ", ec.message());
  io::save_safetensors((fs::path(dir) / kWeights).string(), tensors, {{"format", "pt"}});
  nlohmann::json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base_model_name_or_path;
  j["r"] = o.r;
  j["lora_alpha"] = json_number(o.alpha);
  j["lora_dropout"] = o.dropout;
  j["use_rslora"] = o.use_rslora;
  if (o.target_regex.empty()) {
    j["target_modules"] = o.target_modules;
  } else {
    j["target_modules"] = o.target_regex;
  }
  j["fan_in_fan_out"] = space.fan_in_fan_out;
  j["bias"] = "none";
  j["use_dora"] = false;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = nlohmann::json::object();
  j["alpha_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  const auto path = fs::path(dir) / kConfig;
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    ZT_CHECK_T(f.good(), CheckpointError, "lora: cannot write '", tmp, "'");
    f << j.dump(2) << "\n";
    ZT_CHECK_T(f.good(), CheckpointError, "lora: writing '", tmp, "' failed");
  }
  fs::rename(tmp, path, ec);
  ZT_CHECK_T(!ec, CheckpointError, "lora: cannot rename '", tmp, "' to '", path.string(), "': ", ec.message());
}

LoraOptions read_peft_config(const std::string& dir_or_file, const LoraTargetSpace& space) {
  fs::path p(dir_or_file);
  if (fs::is_directory(p)) p /= kConfig;
  std::ifstream in(p);
  ZT_CHECK_T(in.good(), ConfigError, "lora: cannot open '", p.string(), "' (a peft adapter directory holds ",
             kConfig, " and ", kWeights, ")");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw ConfigError(detail::cat("lora: '", p.string(), "' is not valid JSON: ", e.what()));
  }
  const std::string where = p.string();
  ZT_CHECK_T(j.is_object(), ConfigError, where, ": expected a JSON object");
  auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  auto str = [&](const char* k) {
    ZT_CHECK_T(j[k].is_string(), ConfigError, where, ": ", k, " must be a string, found ", j[k].dump());
    return j[k].get<std::string>();
  };
  ZT_CHECK_T(has("peft_type") && str("peft_type") == "LORA", ConfigError, where, ": peft_type is ",
             j.value("peft_type", nlohmann::json()).dump(), "; only LORA adapters are supported");
  if (has("task_type"))
    ZT_CHECK_T(str("task_type") == "CAUSAL_LM", ConfigError, where, ": task_type '", str("task_type"),
               "' is not supported (zerotrain's models are causal LMs: CAUSAL_LM)");
  // Keys that change the math and are not implemented: default or an error. [PEFT Config Keys]
  auto must_default = [&](const char* k, const nlohmann::json& def) {
    if (!j.contains(k) || j[k].is_null() || j[k] == def) return;
    if ((j[k].is_object() || j[k].is_array()) && j[k].empty()) return;
    throw ConfigError(detail::cat(where, ": ", k, " = ", j[k].dump(), " is not supported by zerotrain's LoRA (only ",
                                  def.is_null() ? "null" : def.dump(), ")"));
  };
  must_default("bias", "none");
  must_default("use_dora", false);
  must_default("lora_bias", false);
  must_default("use_qalora", false);
  for (const char* k : {"modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern",
                        "exclude_modules", "target_parameters", "trainable_token_indices", "layer_replication",
                        "alora_invocation_tokens", "megatron_config", "use_bdlora", "arrow_config", "kasa_config",
                        "monteclora_config", "velora_config"}) {
    must_default(k, nullptr);
  }
  if (has("fan_in_fan_out")) {
    ZT_CHECK_T(j["fan_in_fan_out"].is_boolean(), ConfigError, where, ": fan_in_fan_out must be true or false");
    ZT_CHECK_T(j["fan_in_fan_out"].get<bool>() == space.fan_in_fan_out, ConfigError, where, ": fan_in_fan_out = ",
               j["fan_in_fan_out"].get<bool>() ? "true" : "false", " does not fit a ", space.family,
               " model (its linear weights are ",
               space.fan_in_fan_out ? "Conv1D (in, out): fan_in_fan_out must be true" : "(out, in): it must be false",
               ")");
  }
  LoraOptions o;
  ZT_CHECK_T(has("r") && j["r"].is_number_integer(), ConfigError, where, ": r must be an integer");
  o.r = j["r"].get<int64_t>();
  ZT_CHECK_T(has("lora_alpha") && j["lora_alpha"].is_number(), ConfigError, where, ": lora_alpha must be a number");
  o.alpha = j["lora_alpha"].get<double>();
  if (has("lora_dropout")) {
    ZT_CHECK_T(j["lora_dropout"].is_number(), ConfigError, where, ": lora_dropout must be a number");
    o.dropout = j["lora_dropout"].get<double>();
  }
  if (has("use_rslora")) {
    ZT_CHECK_T(j["use_rslora"].is_boolean(), ConfigError, where, ": use_rslora must be true or false");
    o.use_rslora = j["use_rslora"].get<bool>();
  }
  ZT_CHECK_T(has("target_modules"), ConfigError, where,
             ": target_modules is missing (zerotrain has no per-architecture default list: name the layers)");
  const auto& t = j["target_modules"];
  if (t.is_string()) {
    o.target_regex = t.get<std::string>();
  } else {
    ZT_CHECK_T(t.is_array(), ConfigError, where, ": target_modules must be a list of names or a regex string");
    for (const auto& e : t) {
      ZT_CHECK_T(e.is_string(), ConfigError, where, ": target_modules entries must be strings, found ", e.dump());
      o.target_modules.push_back(e.get<std::string>());
    }
  }
  o.validate();
  return o;
}

void load_peft_weights(const LoraModel& lm, const std::string& dir) {
  const std::string path = (fs::path(dir) / kWeights).string();
  ZT_CHECK_T(fs::exists(path), CheckpointError, "lora: no '", path, "'");
  io::SafetensorsFile file(path);
  std::set<std::string> expected;
  torch::NoGradGuard no_grad;
  for (const auto& a : lm.adapters) {
    for (const char* which : {"lora_A", "lora_B"}) {
      const std::string key = peft_key(a.site.hf_path, which);
      expected.insert(key);
      auto& dst = std::string(which) == "lora_A" ? a.adapter->lora_A : a.adapter->lora_B;
      ZT_CHECK_T(file.contains(key), CheckpointError, "lora: '", path, "' has no tensor '", key,
                 "' (was the adapter saved for other target_modules or another model?)");
      const auto& e = file.entry(key);
      ZT_CHECK_T(c10::IntArrayRef(e.shape) == dst.sizes(), CheckpointError, "lora: '", path, "' tensor '", key,
                 "' has shape ", c10::IntArrayRef(e.shape), ", the model expects ", dst.sizes(),
                 " (another r, or another model size?)");
      dst.copy_(file.read(key));
    }
  }
  for (const auto& name : file.names()) {
    ZT_CHECK_T(expected.count(name) != 0, CheckpointError, "lora: '", path, "' holds '", name,
               "', which belongs to no adapted layer of this model (more layers, or other target_modules?)");
  }
}

LoraModel load_peft_adapter(torch::nn::Module& model, const LoraTargetSpace& space, const std::string& dir) {
  const LoraOptions o = read_peft_config(dir, space);
  LoraModel lm = apply_lora(model, space.sites, o);
  load_peft_weights(lm, dir);
  return lm;
}

}  // namespace zt::lora
