// `zerotrain merge --base DIR --adapter DIR --out DIR`: a Hugging Face model directory whose
// linear weights carry a peft LoRA adapter merged in (W + scaling * B A), which transformers
// loads as a plain model. GPT-2 or the Llama family, chosen by the base's config.json.
#include <cstdio>
#include <filesystem>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/lora_spec.h"
#include "lora/peft_format.h"
#include "lora/qlora.h"
#include "models/hf_gpt2.h"
#include "models/hf_llama.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::cli {
namespace {

const char* kMergeUsage =
    "usage: zerotrain merge --base DIR --adapter DIR --out DIR [--dtype fp32|bf16|fp16] [--qlora]\n\n"
    "  Loads the Hugging Face model in --base (config.json + model.safetensors, GPT-2 or the Llama\n"
    "  family), applies the peft LoRA adapter in --adapter (adapter_config.json +\n"
    "  adapter_model.safetensors, as `zerotrain train --lora` or peft's save_pretrained write it),\n"
    "  adds scaling * B A to each adapted weight (in fp32) and writes the merged model to --out as\n"
    "  Hugging Face safetensors (tensors in --dtype, default fp32) with config.json. The base's\n"
    "  tokenizer files are copied along. --qlora: the adapter was trained on the NF4 base\n"
    "  (train --qlora): the adapted weights are first rounded through NF4, so the merged model\n"
    "  computes what the QLoRA model computed.\n";

at::ScalarType dtype_of(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  throw UsageError("merge: --dtype must be fp32, bf16 or fp16, got '" + s + "'");
}

}  // namespace

int cmd_merge(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string base, adapter, out, dtype = "fp32";
  bool qlora = false;
  Flags f("merge");
  f.text("--base", base);
  f.text("--adapter", adapter);
  f.text("--out", out);
  f.choice("--dtype", dtype, {"fp32", "float32", "bf16", "bfloat16", "fp16", "float16"});
  f.flag("--qlora", qlora);
  if (!f.parse(argc, argv)) {
    std::fputs(kMergeUsage, stdout);
    return 0;
  }
  ZT_CHECK_T(!base.empty() && !adapter.empty() && !out.empty(), UsageError,
             "merge: --base DIR, --adapter DIR and --out DIR are all required (see zerotrain merge --help)");
  const at::ScalarType dt = dtype_of(dtype);
  ZT_CHECK_T(fs::is_directory(base) && fs::exists(fs::path(base) / "config.json"), ConfigError, "merge: --base '",
             base, "' is not a Hugging Face model directory (config.json + model.safetensors)");
  ZT_CHECK_T(fs::weakly_canonical(base) != fs::weakly_canonical(out), ConfigError,
             "merge: --out must not be the --base directory (it would overwrite the base weights)");
  check_output_dir("merge", "--out", out);

  size_t merged = 0;
  std::string family;
  if (models::is_llama_hf_config(base)) {
    auto m = models::load_hf_llama_pretrained(base);
    auto lm = lora::load_peft_adapter(*m, lora::lora_space(*m), adapter);
    merged = lm.adapters.size();
    if (qlora) lora::round_trip_nf4_bases(lm);
    family = m->config().architecture + " " + lora::lora_spec_string(lm.options);
    lora::merge_lora(lm);
    models::save_hf_llama(*m, out, dt);
  } else {
    auto m = models::load_hf_gpt2_pretrained(base);
    auto lm = lora::load_peft_adapter(*m, lora::lora_space(*m), adapter);
    merged = lm.adapters.size();
    if (qlora) lora::round_trip_nf4_bases(lm);
    family = "GPT-2 " + lora::lora_spec_string(lm.options);
    lora::merge_lora(lm);
    models::save_hf_gpt2(*m, out, dt);
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "tokenizer.model", "generation_config.json"}) {
    const fs::path src = fs::path(base) / name;
    if (fs::exists(src)) fs::copy_file(src, fs::path(out) / name, fs::copy_options::overwrite_existing);
  }
  log::info("merged the adapter in %s (%s, %zu layers) into %s: wrote %s (%s)", adapter.c_str(), family.c_str(),
            merged, base.c_str(), out.c_str(), dtype.c_str());
  return 0;
}

}  // namespace zt::cli
