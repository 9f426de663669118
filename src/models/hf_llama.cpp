#include "models/hf_llama.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "models/model_util.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace fs = std::filesystem;
namespace {
using util::ends_with;
using util::shape_str;

}  // namespace

bool hf_llama_skipped(const LlamaConfig& cfg, const std::string& name) {
  return ends_with(name, "rotary_emb.inv_freq") || (cfg.tie_word_embeddings && name == "lm_head.weight");
}

void check_hf_llama(const LlamaConfig& cfg, const HfCheckpointReader& ckpt) {
  std::map<std::string, std::vector<int64_t>> want;
  for (auto& [n, s] : llama_param_shapes(cfg)) want.emplace(n, s);
  for (const auto& name : ckpt.names()) {
    if (hf_llama_skipped(cfg, name)) continue;
    auto it = want.find(name);
    ZT_CHECK_T(it != want.end(), ConfigError, "Hugging Face checkpoint '", ckpt.where(), "': tensor '", name, "' in '",
               ckpt.file_of(name), "' is not a parameter of this ", cfg.architecture, " (", cfg.num_hidden_layers,
               " layers", cfg.qkv_bias ? ", q/k/v bias" : "", cfg.tie_word_embeddings ? ", tied embeddings" : "",
               "): is the checkpoint for another config.json?");
    const auto& e = ckpt.entry(name);
    ZT_CHECK_T(e.shape == it->second, ConfigError, "Hugging Face checkpoint '", ckpt.where(), "': tensor '", name,
               "' in '", ckpt.file_of(name), "' has shape ", shape_str(e.shape), " but the model expects ",
               shape_str(it->second));
    want.erase(it);
  }
  std::string missing;
  for (const auto& [n, s] : want) missing += (missing.empty() ? "" : ", ") + n;
  ZT_CHECK_T(missing.empty(), ConfigError, "Hugging Face checkpoint '", ckpt.where(), "' lacks parameters: ", missing);
}

void load_hf_llama(LlamaForCausalLMImpl& model, const HfCheckpointReader& ckpt) {
  check_hf_llama(model.config(), ckpt);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    torch::Tensor& p = item.value();
    const auto& e = ckpt.entry(item.key());
    if (p.sizes().vec() != e.shape) continue;  // a placeholder of a deferred_init model
    p.copy_(ckpt.read(item.key()));            // converts dtype and device
  }
}

void load_hf_llama(LlamaForCausalLMImpl& model, const std::string& dir_or_file) {
  load_hf_llama(model, HfCheckpointReader(dir_or_file));
}

LlamaForCausalLM load_hf_llama_pretrained(const std::string& dir) {
  LlamaForCausalLM model(llama_config_from_hf_json(dir));
  load_hf_llama(*model, dir);
  return model;
}

std::vector<std::string> save_hf_llama(const LlamaConfig& cfg,
                                       const std::function<torch::Tensor(const std::string&)>& produce,
                                       const std::string& dir, at::ScalarType dtype, int64_t max_shard_bytes) {
  std::vector<HfTensorSpec> specs;
  for (auto& [n, s] : llama_param_shapes(cfg)) specs.push_back({n, s});
  auto files = save_hf_checkpoint(dir, specs, dtype, max_shard_bytes, produce);
  auto j = nlohmann::json::parse(llama_config_to_hf_json(cfg));
  j["torch_dtype"] = hf_torch_dtype_name(dtype);  // transformers 4
  j["dtype"] = hf_torch_dtype_name(dtype);        // transformers 5
  const fs::path path = fs::path(dir) / "config.json", tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    ZT_CHECK(out.good(), "cannot create '", tmp.string(), "'");
    out << j.dump(2) << "\n";
    out.flush();
    ZT_CHECK(out.good(), "failed writing '", tmp.string(), "' (disk full?)");
  }
  fs::rename(tmp, path);
  return files;
}

std::vector<std::string> save_hf_llama(const LlamaForCausalLMImpl& model, const std::string& dir,
                                       at::ScalarType dtype, int64_t max_shard_bytes) {
  const auto params = model.named_parameters(/*recurse=*/true);
  return save_hf_llama(
      model.config(),
      [&](const std::string& name) {
        const auto* p = params.find(name);
        ZT_CHECK(p != nullptr, "save_hf_llama: the model has no parameter '", name, "'");
        ZT_CHECK(p->numel() > 0 && p->sizes().vec() == model.param_shape(name), "save_hf_llama: '", name,
                 "' is not full-size (", p->sizes(), "): under ZeRO-3 call Engine::gather_params() first");
        return p->detach();
      },
      dir, dtype, max_shard_bytes);
}

}  // namespace zt::models
