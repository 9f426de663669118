// gpt2_logits MODEL_DIR TOKENS_FILE OUT_FILE [--device cuda|cpu] [--dtype fp32|bf16|fp16]
//             [--export DIR]
//
// Loads a Hugging Face GPT-2 checkpoint (config.json + model.safetensors) into
// zerotrain's GPT2, runs one forward over the token ids in TOKENS_FILE (a safetensors
// file holding "input_ids", (B, T) int64) and writes the logits, (B, T, V) fp32, to
// OUT_FILE as safetensors tensor "logits". bench/anchors/hf_gpt2_compare.py drives it
// against transformers. Prints one JSON line with the shapes and the forward time.
// --export DIR also writes the loaded model back out with save_hf_gpt2 (fp32), so the
// anchor can check that transformers loads zerotrain's export.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

// bench targets link zerotrain but get only include/ on their path (src/ is private).
#include "../src/models/hf_gpt2.h"
#include "../src/io/safetensors.h"
#include "zerotrain/error.h"

namespace {

constexpr const char* kUsage =
    "usage: gpt2_logits MODEL_DIR TOKENS_FILE OUT_FILE [--device cuda|cpu] [--dtype fp32|bf16|fp16]\n"
    "                   [--export DIR]\n";

torch::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32") return torch::kFloat;
  if (s == "bf16") return torch::kBFloat16;
  if (s == "fp16") return torch::kHalf;
  throw zt::ConfigError("--dtype must be fp32, bf16 or fp16, got '" + s + "'");
}

void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

int run(int argc, char** argv) {
  std::vector<std::string> pos;
  std::string device_s = torch::cuda::is_available() ? "cuda" : "cpu", dtype_s = "fp32", export_dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--device" || a == "--dtype" || a == "--export") && i + 1 < argc) {
      (a == "--device" ? device_s : a == "--dtype" ? dtype_s : export_dir) = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << "gpt2_logits: unknown option " << a << "\n" << kUsage;
      return 2;
    } else {
      pos.push_back(a);
    }
  }
  if (pos.size() != 3) {
    std::cerr << kUsage;
    return 2;
  }
  ZT_CHECK_T(device_s == "cpu" || device_s == "cuda", zt::ConfigError, "--device must be cuda or cpu, got '",
             device_s, "'");
  ZT_CHECK_T(device_s == "cpu" || torch::cuda::is_available(), zt::ConfigError,
             "--device cuda but no CUDA device is available");
  const torch::Device device(device_s);
  const auto dtype = parse_dtype(dtype_s);

  auto model = zt::models::load_hf_gpt2_pretrained(pos[0]);
  if (!export_dir.empty()) zt::models::save_hf_gpt2(*model, export_dir, torch::kFloat);
  model->to(device, dtype);
  model->eval();
  zt::io::SafetensorsFile tok_file(pos[1]);
  ZT_CHECK(tok_file.contains("input_ids"), "'", pos[1], "' has no tensor 'input_ids'");
  auto idx = tok_file.read("input_ids").to(torch::kLong).to(device);  // (B, T)

  torch::NoGradGuard no_grad;
  model->forward(idx);  // warm-up: kernels, allocator
  sync(device);
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = model->forward(idx);  // (B, T, V)
  sync(device);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  zt::io::save_safetensors(pos[2], {{"logits", logits.to(torch::kFloat)}});

  nlohmann::json j{{"bench", "gpt2_logits"},
                   {"device", device_s},
                   {"dtype", dtype_s},
                   {"batch", idx.size(0)},
                   {"seq", idx.size(1)},
                   {"vocab", logits.size(-1)},
                   {"params", model->num_params()},
                   {"forward_ms", ms},
                   {"finite", torch::isfinite(logits).all().item<bool>()}};
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "gpt2_logits: error: " << e.what() << "\n";
    return 1;
  }
}
