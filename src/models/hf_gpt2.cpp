#include "models/hf_gpt2.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "models/model_util.h"
#include "io/safetensors.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace fs = std::filesystem;
using io::SafetensorsFile;
using io::save_safetensors;
using io::safetensors_dtype_name;
namespace {
using util::ends_with;
using util::shape_str;
using util::write_text_atomic;

constexpr const char* kPrefix = "transformer.";

// HF stores these as Conv1D, weight (in, out).
bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

// Tensors in HF checkpoints that are not parameters of this model.
bool is_skipped(const std::string& name) {
  return name == "lm_head.weight" || ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

std::vector<std::string> resolve_files(const std::string& dir_or_file) {
  fs::path p(dir_or_file);
  ZT_CHECK(fs::exists(p), "load_hf_gpt2: '", dir_or_file, "' does not exist");
  if (!fs::is_directory(p)) return {p.string()};
  if (fs::exists(p / "model.safetensors")) return {(p / "model.safetensors").string()};
  const fs::path index = p / "model.safetensors.index.json";
  ZT_CHECK(fs::exists(index), "load_hf_gpt2: '", dir_or_file,
           "' holds neither model.safetensors nor model.safetensors.index.json (pytorch_model.bin is not "
           "supported: re-save with save_pretrained(..., safe_serialization=True))");
  std::ifstream in(index);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw zt::Error(zt::detail::cat("load_hf_gpt2: '", index.string(), "' is not valid JSON: ", e.what()));
  }
  ZT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "load_hf_gpt2: '",
           index.string(), "' has no weight_map object");
  // Shards are files of this directory: a name that leaves it (absolute, "..", a link
  // out) is refused, so an index cannot make the loader read elsewhere.
  std::error_code ec;
  fs::path root = fs::weakly_canonical(p, ec);
  if (!root.has_filename()) root = root.parent_path();  // "dir/" ends in an empty element
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    ZT_CHECK(file.is_string(), "load_hf_gpt2: '", index.string(), "': weight_map[\"", name,
             "\"] must be a file name string, found ", file.dump(), ": write the shard's file name in quotes");
    const fs::path rel(file.get<std::string>());
    const fs::path shard = fs::weakly_canonical(p / rel, ec);
    const auto [r, s] = std::mismatch(root.begin(), root.end(), shard.begin(), shard.end());
    ZT_CHECK(!rel.empty() && !rel.is_absolute() && r == root.end() && s != shard.end(), "load_hf_gpt2: '",
             index.string(), "': weight_map[\"", name, "\"] = \"", rel.string(),
             "\" is outside the model directory: shards must be files in ", p.string());
    files.insert((p / rel).string());
  }
  return {files.begin(), files.end()};
}

const char* hf_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default:
      throw zt::Error(
          zt::detail::cat("save_hf_gpt2: dtype ", t, " is not a GPT-2 weight dtype (use fp32, bf16 or fp16)"));
  }
}

}  // namespace

void load_hf_gpt2(GPT2Impl& model, const std::string& dir_or_file) {
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) params.emplace(item.key(), item.value());
  std::map<std::string, std::string> loaded_from;  // param name -> file

  torch::NoGradGuard no_grad;
  for (const auto& file : resolve_files(dir_or_file)) {
    SafetensorsFile f(file);
    for (const auto& stored : f.names()) {
      std::string name = stored.rfind(kPrefix, 0) == 0 ? stored.substr(std::string(kPrefix).size()) : stored;
      if (is_skipped(name)) continue;
      auto it = params.find(name);
      ZT_CHECK(it != params.end(), "load_hf_gpt2: tensor '", stored, "' in '", file,
               "' matches no parameter of the model (checkpoint for a bigger model? build the model from "
               "its config.json with gpt2_config_from_hf_json)");
      ZT_CHECK(!loaded_from.count(name), "load_hf_gpt2: parameter '", name, "' appears twice (in '",
               loaded_from[name], "' and as '", stored, "' in '", file, "')");
      torch::Tensor& param = it->second;
      const bool conv1d = is_conv1d_weight(name);
      std::vector<int64_t> expect = param.sizes().vec();
      if (conv1d) std::swap(expect[0], expect[1]);
      const auto& e = f.entry(stored);
      ZT_CHECK(at::isFloatingType(e.dtype), "load_hf_gpt2: tensor '", stored, "' in '", file, "' has dtype ",
               safetensors_dtype_name(e.dtype), ", not floating point: weights are loaded only from F32, F16, BF16, "
               "F64 or F8 tensors (an integer or boolean tensor here is a wrong or corrupt file)");
      ZT_CHECK(e.shape == expect, "load_hf_gpt2: tensor '", stored, "' in '", file, "' has shape ",
               shape_str(e.shape), " but the model expects ", shape_str(expect),
               conv1d ? " (HF Conv1D layout (in, out))" : "");
      torch::Tensor t = f.read(stored);
      const int64_t bad = t.numel() - t.to(at::kFloat).isfinite().sum().item<int64_t>();
      ZT_CHECK(bad == 0, "load_hf_gpt2: tensor '", stored, "' in '", file, "' holds ", bad,
               " non-finite value(s) (NaN or infinity) out of ", t.numel(),
               ": the weights are corrupt or come from a diverged run");
      if (conv1d) t = t.t();
      param.copy_(t);  // converts dtype and device
      loaded_from[name] = file;
    }
  }
  std::string missing;
  for (const auto& [name, p] : params)
    if (!loaded_from.count(name)) missing += (missing.empty() ? "" : ", ") + name;
  ZT_CHECK(missing.empty(), "load_hf_gpt2: '", dir_or_file, "' lacks parameters: ", missing);
}

GPT2 load_hf_gpt2_pretrained(const std::string& dir) {
  GPT2 model(gpt2_config_from_hf_json(dir));
  load_hf_gpt2(*model, dir);
  return model;
}

std::map<std::string, torch::Tensor> hf_gpt2_tensors(const GPT2Impl& model, at::ScalarType dtype) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    torch::Tensor t = item.value().detach().to(torch::kCPU, dtype);
    if (is_conv1d_weight(item.key())) t = t.t().contiguous();
    out.emplace(kPrefix + item.key(), t);
  }
  return out;
}

void save_hf_gpt2(const GPT2Impl& model, const std::string& dir, at::ScalarType dtype) {
  const char* dtype_name = hf_dtype_name(dtype);
  std::error_code ec;
  fs::create_directories(dir, ec);
  ZT_CHECK(!ec, "save_hf_gpt2: cannot create directory '", dir, "': ", ec.message());
  const auto out = hf_gpt2_tensors(model, dtype);
  // transformers refuses safetensors files whose metadata lacks format=pt.
  save_safetensors((fs::path(dir) / "model.safetensors").string(), out, {{"format", "pt"}});
  auto cfg = nlohmann::json::parse(gpt2_config_to_hf_json(model.config()));
  cfg["torch_dtype"] = dtype_name;
  write_text_atomic(fs::path(dir) / "config.json", cfg.dump(2) + "\n");
}

}  // namespace zt::models
