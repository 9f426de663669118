// See [HF TP Load] in models/hf_tp.h.
#include "models/hf_tp.h"

#include <algorithm>
#include <map>
#include <vector>

#include "models/gpt2_shapes.h"
#include "models/hf_llama.h"
#include "models/model_util.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace {

constexpr const char* kHfTpGpt2Prefix = "transformer.";

// HF stores these as Conv1D, weight (in, out) (as hf_gpt2.cpp).
bool hftp_is_gpt2_conv1d(const std::string& name) {
  using util::ends_with;
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

bool hftp_gpt2_skipped(const std::string& name) {
  using util::ends_with;
  return name == "lm_head.weight" || ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

// Rejects NaN / infinity in what this rank read (the unsplit loaders check whole tensors).
void hftp_check_finite(const HfCheckpointReader& ckpt, const std::string& stored, const torch::Tensor& t) {
  ZT_CHECK_T(at::isFloatingType(t.scalar_type()), ConfigError, "Hugging Face checkpoint '", ckpt.where(), "': tensor '",
             stored, "' in '", ckpt.file_of(stored), "' has dtype ", io::safetensors_dtype_name(t.scalar_type()),
             ", not floating point (a wrong or corrupt file)");
  const int64_t bad = t.numel() - t.to(at::kFloat).isfinite().sum().item<int64_t>();
  ZT_CHECK_T(bad == 0, ConfigError, "Hugging Face checkpoint '", ckpt.where(), "': tensor '", stored, "' in '",
             ckpt.file_of(stored), "' holds ", bad, " non-finite value(s) (NaN or infinity): the weights are corrupt");
}

}  // namespace

torch::Tensor read_tp_slice(const HfCheckpointReader& ckpt, const std::string& stored, const tp::SplitSpec& spec,
                            const std::vector<int64_t>& full_shape, int rank, int tp, bool transposed) {
  ZT_ASSERT(!transposed || full_shape.size() == 2, "read_tp_slice: only a 2-d tensor is stored transposed");
  if (!spec.split()) {
    auto t = ckpt.read(stored);
    return transposed ? t.t().contiguous() : t;
  }
  const auto dim = static_cast<size_t>(spec.dim);
  const int64_t n = full_shape[dim], padded = std::max(spec.padded, n);
  ZT_CHECK_T(padded % (spec.blocks * tp) == 0, ConfigError, "tensor parallelism: a dimension of size ", padded, " (",
             spec.blocks, " block(s)) of '", stored, "' does not divide by tp ", tp,
             "; choose a tp degree that divides it");
  const int64_t block = padded / spec.blocks, slice = block / tp;
  const int64_t stored_dim = transposed ? 1 - spec.dim : spec.dim;
  std::vector<torch::Tensor> parts;
  for (int64_t b = 0; b < spec.blocks; ++b) {
    const int64_t start = b * block + rank * slice;
    const int64_t real = std::clamp<int64_t>(n - start, 0, slice);  // rows past n: the padding
    if (real > 0) {
      auto t = ckpt.read_narrow(stored, stored_dim, start, real);
      parts.push_back(transposed ? t.t() : t);
    }
    if (real < slice) {
      auto shape = full_shape;
      shape[dim] = slice - real;
      parts.push_back(torch::zeros(shape, torch::TensorOptions().dtype(ckpt.entry(stored).dtype)));
    }
  }
  return torch::cat(parts, spec.dim).contiguous();
}

void load_hf_gpt2_tp(GPT2TPImpl& model, const HfCheckpointReader& ckpt) {
  const auto& cfg = model.config();
  // Headers first: every parameter once, with its HF shape; nothing unknown.
  std::map<std::string, std::string> stored_of;  // parameter -> stored name
  std::map<std::string, std::vector<int64_t>> want;
  for (const auto& kv : model.named_parameters()) want.emplace(kv.key(), gpt2_param_shape(cfg, kv.key()));
  for (const auto& stored : ckpt.names()) {
    const std::string name = stored.rfind(kHfTpGpt2Prefix, 0) == 0 ? stored.substr(std::string(kHfTpGpt2Prefix).size()) : stored;
    if (hftp_gpt2_skipped(name)) continue;
    auto it = want.find(name);
    ZT_CHECK_T(it != want.end(), ConfigError, "Hugging Face checkpoint '", ckpt.where(), "': tensor '", stored,
               "' in '", ckpt.file_of(stored), "' matches no parameter of this GPT-2 (", cfg.n_layer,
               " layers): is the checkpoint for another config.json?");
    ZT_CHECK_T(!stored_of.count(name), ConfigError, "Hugging Face checkpoint '", ckpt.where(), "': parameter '", name,
               "' is stored twice ('", stored_of[name], "' and '", stored, "')");
    auto expect = it->second;
    if (hftp_is_gpt2_conv1d(name)) std::swap(expect[0], expect[1]);
    const auto& e = ckpt.entry(stored);
    ZT_CHECK_T(e.shape == expect, ConfigError, "Hugging Face checkpoint '", ckpt.where(), "': tensor '", stored,
               "' in '", ckpt.file_of(stored), "' has shape ", util::shape_str(e.shape), " but the model expects ",
               util::shape_str(expect), hftp_is_gpt2_conv1d(name) ? " (HF Conv1D layout (in, out))" : "");
    stored_of[name] = stored;
  }
  std::string missing;
  for (const auto& [name, s] : want)
    if (!stored_of.count(name)) missing += (missing.empty() ? "" : ", ") + name;
  ZT_CHECK_T(missing.empty(), ConfigError, "Hugging Face checkpoint '", ckpt.where(), "' lacks parameters: ", missing);
  // Then each parameter's slice, one at a time.
  torch::NoGradGuard no_grad;
  for (auto& kv : model.named_parameters()) {
    const auto& stored = stored_of.at(kv.key());
    auto t = read_tp_slice(ckpt, stored, model.split_spec(kv.key()), want.at(kv.key()), model.tp_rank(),
                           model.tp_size(), hftp_is_gpt2_conv1d(kv.key()));
    hftp_check_finite(ckpt, stored, t);
    kv.value().copy_(t);  // converts dtype and device
  }
}

void load_hf_llama_tp(LlamaTPImpl& model, const HfCheckpointReader& ckpt) {
  const auto& cfg = model.config();
  check_hf_llama(cfg, ckpt);
  torch::NoGradGuard no_grad;
  for (auto& kv : model.named_parameters()) {
    auto t = read_tp_slice(ckpt, kv.key(), model.split_spec(kv.key()), llama_param_shape(cfg, kv.key()),
                           model.tp_rank(), model.tp_size(), /*transposed=*/false);
    hftp_check_finite(ckpt, kv.key(), t);
    kv.value().copy_(t);
  }
}

}  // namespace zt::models
