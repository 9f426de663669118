#include "models/lora.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "models/safetensors.h"
#include "zerotrain/error.h"

namespace zt::models {

double LoraConfig::scaling() const {
  ZT_CHECK_T(r > 0, ConfigError, "lora r must be > 0, got ", r);
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

LoraLinearImpl::LoraLinearImpl(torch::nn::Linear base_, int64_t r, double scaling_, double p)
    : scaling(scaling_) {
  ZT_CHECK_T(r > 0, ConfigError, "lora r must be > 0, got ", r);
  ZT_CHECK_T(p >= 0.0 && p < 1.0, ConfigError, "lora dropout must be in [0, 1), got ", p);
  const auto& o = base_->options;
  base = register_module("base_layer", base_);
  const auto opts = base->weight.options();
  lora_A = register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(o.in_features(), r).bias(false)));
  lora_B = register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(r, o.out_features()).bias(false)));
  lora_A->to(opts.device(), opts.dtype().toScalarType());
  lora_B->to(opts.device(), opts.dtype().toScalarType());
  torch::NoGradGuard ng;
  // peft: nn.init.kaiming_uniform_(lora_A.weight, a=math.sqrt(5)); zeros_(lora_B.weight).
  torch::nn::init::kaiming_uniform_(lora_A->weight, std::sqrt(5.0));
  lora_B->weight.zero_();
  dropout = register_module("lora_dropout", torch::nn::Dropout(p));
  for (auto& prm : base->parameters()) prm.set_requires_grad(false);
}

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& x) {
  return base->forward(x) + scaling * lora_B->forward(lora_A->forward(dropout->forward(x)));
}

torch::Tensor LoraLinearImpl::merged_weight() const {
  torch::NoGradGuard ng;
  const auto w = base->weight;
  return (w.to(torch::kFloat32) +
          scaling * torch::matmul(lora_B->weight.to(torch::kFloat32), lora_A->weight.to(torch::kFloat32)))
      .to(w.scalar_type());
}

namespace {

bool suffix_match(const std::string& path, const std::string& name) {
  return path == name ||
         (path.size() > name.size() && path.compare(path.size() - name.size(), name.size(), name) == 0 &&
          path[path.size() - name.size() - 1] == '.');
}

std::string some_names(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < 12; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > 12) os << ", ... (" << names.size() << " in all)";
  return os.str();
}

// parent path and child name of "a.b.c" -> {"a.b", "c"}
std::pair<std::string, std::string> split_path(const std::string& path) {
  const auto dot = path.rfind('.');
  if (dot == std::string::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

torch::nn::Module& module_at(torch::nn::Module& model, const std::string& path) {
  if (path.empty()) return model;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (item.key() == path) return *item.value();
  throw InternalError("lora: no module at " + path);
}

}  // namespace

std::vector<std::string> find_lora_targets(torch::nn::Module& model, const LoraConfig& cfg) {
  ZT_CHECK_T(!cfg.target_modules.empty() || !cfg.target_regex.empty(), ConfigError,
             "lora: target_modules is empty (name the Linear modules to adapt, e.g. [\"c_attn\"])");
  std::vector<std::string> linears, all;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    all.push_back(item.key());
    if (item.value()->as<torch::nn::Linear>() != nullptr) linears.push_back(item.key());
  }
  std::vector<std::string> out;
  if (!cfg.target_regex.empty()) {
    std::regex re;
    try {
      re = std::regex(cfg.target_regex);
    } catch (const std::regex_error& e) {
      throw ConfigError("lora: target_modules regex '" + cfg.target_regex + "' is invalid: " + e.what());
    }
    for (const auto& p : linears)
      if (std::regex_match(p, re)) out.push_back(p);
    ZT_CHECK_T(!out.empty(), ConfigError, "lora: target_modules regex '", cfg.target_regex,
               "' matches no Linear module; Linear modules are: ", some_names(linears));
    return out;
  }
  for (const auto& name : cfg.target_modules) {
    bool hit = false;
    for (const auto& p : linears)
      if (suffix_match(p, name)) {
        hit = true;
        if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
      }
    ZT_CHECK_T(hit, ConfigError, "lora: target_modules entry '", name,
               "' matches no Linear module (matched as the last path components); Linear modules are: ",
               some_names(linears.empty() ? all : linears));
  }
  return out;
}

std::map<std::string, LoraLinear> apply_lora(torch::nn::Module& model, const LoraConfig& cfg) {
  const auto targets = find_lora_targets(model, cfg);
  const double scaling = cfg.scaling();
  for (auto& prm : model.parameters()) prm.set_requires_grad(false);
  std::map<std::string, LoraLinear> out;
  for (const auto& path : targets) {
    const auto [parent_path, name] = split_path(path);
    torch::nn::Module& parent = module_at(model, parent_path);
    auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(parent.named_children()[name]);
    ZT_ASSERT(lin != nullptr, path);
    LoraLinear lora(torch::nn::Linear(lin), cfg.r, scaling, cfg.dropout);
    parent.replace_module(name, lora.ptr());
    out.emplace(path, lora);
  }
  return out;
}

torch::Tensor lora_forward(torch::nn::Module& parent, const std::string& name, const torch::Tensor& x) {
  const auto child = parent.named_children()[name];
  if (auto l = std::dynamic_pointer_cast<LoraLinearImpl>(child)) return l->forward(x);
  if (auto l = std::dynamic_pointer_cast<torch::nn::LinearImpl>(child)) return l->forward(x);
  throw InternalError("lora_forward: child '" + name + "' is neither a Linear nor a LoraLinear");
}

void merge_lora(torch::nn::Module& model, const std::map<std::string, LoraLinear>& adapters) {
  for (const auto& [path, lora] : adapters) {
    const auto [parent_path, name] = split_path(path);
    torch::nn::Module& parent = module_at(model, parent_path);
    torch::nn::Linear base = lora->base;
    {
      torch::NoGradGuard ng;
      base->weight.copy_(lora->merged_weight());
    }
    parent.replace_module(name, base.ptr());
  }
}

std::map<std::string, torch::Tensor> lora_state_dict(const std::map<std::string, LoraLinear>& adapters) {
  std::map<std::string, torch::Tensor> sd;
  for (const auto& [path, lora] : adapters) {
    sd["base_model.model." + path + ".lora_A.weight"] = lora->lora_A->weight.detach();
    sd["base_model.model." + path + ".lora_B.weight"] = lora->lora_B->weight.detach();
  }
  return sd;
}

void save_lora_adapter(const std::string& dir, const std::map<std::string, LoraLinear>& adapters,
                       const LoraConfig& cfg) {
  std::filesystem::create_directories(dir);
  save_safetensors(dir + "/adapter_model.safetensors", lora_state_dict(adapters), {{"format", "pt"}});
  nlohmann::json j;
  j["peft_type"] = "LORA";
  j["r"] = cfg.r;
  j["lora_alpha"] = cfg.alpha;
  j["lora_dropout"] = cfg.dropout;
  j["use_rslora"] = cfg.use_rslora;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["init_lora_weights"] = true;
  if (!cfg.target_regex.empty()) j["target_modules"] = cfg.target_regex;
  else j["target_modules"] = cfg.target_modules;
  std::ofstream f(dir + "/adapter_config.json");
  ZT_CHECK_T(f.good(), CheckpointError, "lora: cannot write ", dir, "/adapter_config.json");
  f << j.dump(2) << "\n";
}

void load_lora_adapter(const std::string& dir, const std::map<std::string, LoraLinear>& adapters) {
  const std::string path = dir + "/adapter_model.safetensors";
  SafetensorsFile file(path);
  torch::NoGradGuard ng;
  for (const auto& [key, dst] : lora_state_dict(adapters)) {
    ZT_CHECK_T(file.contains(key), CheckpointError, "lora: ", path, " has no tensor '", key,
               "' (was the adapter saved for the same target_modules?)");
    const torch::Tensor t = file.read(key);
    ZT_CHECK_T(t.sizes() == dst.sizes(), CheckpointError, "lora: ", path, " tensor '", key, "' has shape ",
               t.sizes(), ", the model expects ", dst.sizes(), " (different r?)");
    dst.copy_(t);
  }
}

}  // namespace zt::models
