// Small helpers the model files share (GPT-2, Llama, their tensor-parallel forms and the
// Hugging Face readers and writers): one definition each, so the files can also be
// compiled together (unity build).
#pragma once
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "zerotrain/error.h"

namespace zt::models::util {

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "[2, 3]"
inline std::string shape_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Rotary embedding's half rotation: (x1, x2) -> (-x2, x1) over the last dimension.
inline torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// GPT-2's initializer std and LayerNorm (eps 1e-5, affine), as Hugging Face's.
inline constexpr double kGpt2InitStd = 0.02;
inline constexpr double kGpt2LayerNormEps = 1e-5;
inline torch::nn::LayerNorm make_gpt2_ln(int64_t c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}).eps(kGpt2LayerNormEps).elementwise_affine(true));
}

// Writes `text` to `path` through `path.tmp` and a rename: a reader sees the old file or
// the whole new one.
inline void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ZT_CHECK(out.good(), "cannot create '", tmp.string(), "'");
    out << text;
    out.flush();
    ZT_CHECK(out.good(), "failed writing '", tmp.string(), "' (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ZT_CHECK(!ec, "cannot rename '", tmp.string(), "' to '", path.string(), "': ", ec.message());
}

}  // namespace zt::models::util
