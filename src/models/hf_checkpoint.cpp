#include "models/hf_checkpoint.h"

#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "models/model_util.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace fs = std::filesystem;

namespace {
using util::write_text_atomic;

}  // namespace

HfCheckpointReader::HfCheckpointReader(const std::string& dir_or_file) : where_(dir_or_file) {
  const fs::path p(dir_or_file);
  ZT_CHECK(fs::exists(p), "Hugging Face checkpoint '", dir_or_file, "' does not exist");
  std::vector<std::string> paths;
  std::map<std::string, std::string> index;  // tensor -> shard path, from the index
  if (!fs::is_directory(p)) {
    paths.push_back(p.string());
  } else if (fs::exists(p / "model.safetensors")) {
    paths.push_back((p / "model.safetensors").string());
  } else {
    const fs::path ip = p / "model.safetensors.index.json";
    ZT_CHECK(fs::exists(ip), "Hugging Face checkpoint '", dir_or_file,
             "' holds neither model.safetensors nor model.safetensors.index.json (pytorch_model.bin is not "
             "supported: re-save with save_pretrained(..., safe_serialization=True))");
    nlohmann::json j;
    try {
      std::ifstream in(ip);
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw Error(detail::cat("'", ip.string(), "' is not valid JSON: ", e.what()));
    }
    ZT_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "'", ip.string(), "' has no weight_map object");
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      ZT_CHECK(file.is_string(), "'", ip.string(), "': weight_map['", name, "'] must be a file name");
      const std::string sp = (p / file.get<std::string>()).string();
      ZT_CHECK(fs::exists(sp), "'", ip.string(), "' puts '", name, "' in '", sp, "', which does not exist");
      index[name] = sp;
      shards.insert(sp);
    }
    paths.assign(shards.begin(), shards.end());
  }
  for (const auto& path : paths) {
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    const size_t k = files_.size() - 1;
    for (const auto& n : files_.back()->names()) {
      auto [it, fresh] = file_of_.emplace(n, k);
      ZT_CHECK(fresh, "Hugging Face checkpoint '", dir_or_file, "': tensor '", n, "' is stored twice ('",
               files_[it->second]->path(), "' and '", path, "')");
    }
  }
  for (const auto& [name, shard] : index) {
    auto it = file_of_.find(name);
    ZT_CHECK(it != file_of_.end() && files_[it->second]->path() == shard, "Hugging Face checkpoint '", dir_or_file,
             "': the index puts '", name, "' in '", shard, "' but that file does not hold it");
  }
}

std::vector<std::string> HfCheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [n, k] : file_of_) out.push_back(n);
  return out;
}

const std::string& HfCheckpointReader::file_of(const std::string& name) const {
  auto it = file_of_.find(name);
  ZT_CHECK(it != file_of_.end(), "Hugging Face checkpoint '", where_, "' has no tensor '", name, "'");
  return files_[it->second]->path();
}

const SafetensorsEntry& HfCheckpointReader::entry(const std::string& name) const {
  auto it = file_of_.find(name);
  ZT_CHECK(it != file_of_.end(), "Hugging Face checkpoint '", where_, "' has no tensor '", name, "'");
  return files_[it->second]->entry(name);
}

torch::Tensor HfCheckpointReader::read(const std::string& name) const {
  auto it = file_of_.find(name);
  ZT_CHECK(it != file_of_.end(), "Hugging Face checkpoint '", where_, "' has no tensor '", name, "'");
  return files_[it->second]->read(name);
}

torch::Tensor HfCheckpointReader::read_narrow(const std::string& name, int64_t dim, int64_t start,
                                              int64_t length) const {
  auto it = file_of_.find(name);
  ZT_CHECK(it != file_of_.end(), "Hugging Face checkpoint '", where_, "' has no tensor '", name, "'");
  return files_[it->second]->read_narrow(name, dim, start, length);
}

const char* hf_torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default:
      throw ConfigError(detail::cat("dtype ", t, " is not a Hugging Face weight dtype (use fp32, bf16 or fp16)"));
  }
}

std::vector<std::string> save_hf_checkpoint(const std::string& dir, const std::vector<HfTensorSpec>& specs,
                                            at::ScalarType dtype, int64_t max_shard_bytes,
                                            const std::function<torch::Tensor(const std::string&)>& produce) {
  hf_torch_dtype_name(dtype);  // validates
  ZT_CHECK_T(max_shard_bytes > 0, ConfigError, "save_hf_checkpoint: max_shard_bytes must be positive, got ",
             max_shard_bytes);
  std::error_code ec;
  fs::create_directories(dir, ec);
  ZT_CHECK(!ec, "cannot create directory '", dir, "': ", ec.message());
  // Stale weights of an earlier save (transformers prefers model.safetensors to an index).
  static const std::regex kShard(R"(model(-\d+-of-\d+)?\.safetensors(\.index\.json)?)");
  // POSIX: std::filesystem's directory iteration and removal are unreliable in
  // LibTorch-linked binaries (see ckpt/fs.h).
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> stale;
    while (const dirent* e = ::readdir(d))
      if (std::regex_match(e->d_name, kShard)) stale.push_back((fs::path(dir) / e->d_name).string());
    ::closedir(d);
    for (const auto& f : stale)
      ZT_CHECK(::unlink(f.c_str()) == 0 || errno == ENOENT, "cannot remove stale '", f, "': ", std::strerror(errno));
  }

  // Plan the shards from the shapes alone.
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<std::vector<size_t>> shards;
  int64_t in_shard = 0, total = 0;
  std::set<std::string> seen;
  for (size_t i = 0; i < specs.size(); ++i) {
    ZT_CHECK(seen.insert(specs[i].name).second, "save_hf_checkpoint: tensor '", specs[i].name, "' listed twice");
    int64_t bytes = esize;
    for (int64_t s : specs[i].shape) bytes *= s;
    if (shards.empty() || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
  }
  if (shards.empty()) shards.emplace_back();

  const size_t n = shards.size();
  auto shard_name = [&](size_t k) {
    if (n == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", k + 1, n);
    return std::string(buf);
  };
  std::vector<std::string> written;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < n; ++k) {
    std::map<std::string, torch::Tensor> tensors;
    for (size_t i : shards[k]) {
      const auto& s = specs[i];
      torch::Tensor t = produce(s.name);
      ZT_CHECK(t.defined() && t.sizes().vec() == s.shape, "save_hf_checkpoint: tensor '", s.name, "' has shape ",
               t.defined() ? t.sizes() : c10::IntArrayRef{}, ", expected ", c10::IntArrayRef(s.shape));
      tensors.emplace(s.name, t.detach().to(torch::kCPU, dtype).contiguous());
      weight_map[s.name] = shard_name(k);
    }
    const std::string path = (fs::path(dir) / shard_name(k)).string();
    save_safetensors(path, tensors, {{"format", "pt"}});
    written.push_back(path);
  }
  if (n > 1) {
    nlohmann::ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = weight_map;
    const auto path = fs::path(dir) / "model.safetensors.index.json";
    write_text_atomic(path, idx.dump(2) + "\n");
    written.push_back(path.string());
  }
  return written;
}

}  // namespace zt::models
