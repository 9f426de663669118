// `zerotrain convert CKPT_DIR OUT.safetensors`: one consolidated weights file from a
// checkpoint of any world size and stage (the analogue of DeepSpeed's zero_to_fp32.py).
// Parameters are assembled one at a time from the per-rank fragments, every file verified.
#include <cstdio>
#include <string>

#include "ckpt/engine_checkpoint.h"
#include "ckpt/fs.h"
#include "cli/commands.h"
#include "models/gpt2.h"
#include "models/hf_gpt2.h"
#include "io/safetensors.h"
#include "zerotrain/error.h"

namespace zt::cli {
namespace {

const char* kConvertUsage =
    "usage: zerotrain convert CKPT_DIR OUT.safetensors [--dtype fp32|bf16|fp16] [--tag TAG] [--raw]\n\n"
    "  Consolidates the fp32 master weights of checkpoint CKPT_DIR/TAG (default: the tag in\n"
    "  CKPT_DIR/latest), saved by any number of ranks at any ZeRO stage, into one file.\n"
    "  Checkpoints of `zerotrain train` (GPT-2) are written with Hugging Face GPT-2 names and\n"
    "  layouts, plus config.json next to OUT, so transformers' GPT2LMHeadModel loads the\n"
    "  directory. Other checkpoints (or --raw) keep the module's own parameter names.\n";

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  throw ConfigError("convert: --dtype must be fp32, bf16 or fp16, got '" + s + "'");
}

models::GPT2Config gpt2_from_json(const nlohmann::json& j) {
  models::GPT2Config c;
  c.n_layer = j.at("n_layer").get<int64_t>();
  c.n_head = j.at("n_head").get<int64_t>();
  c.n_embd = j.at("n_embd").get<int64_t>();
  c.vocab_size = j.at("vocab_size").get<int64_t>();
  c.n_positions = j.at("n_positions").get<int64_t>();
  return c;
}

}  // namespace

int cmd_convert(int argc, char** argv) {
  std::vector<std::string> pos;
  std::string tag, dtype_s = "fp32";
  bool raw = false;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      std::fputs(kConvertUsage, stdout);
      return 0;
    }
    if (f == "--tag" || f == "--dtype") {
      ZT_CHECK_T(i + 1 < argc, ConfigError, "convert: ", f, " needs a value");
      (f == "--tag" ? tag : dtype_s) = argv[++i];
    } else if (f == "--raw") {
      raw = true;
    } else if (!f.empty() && f[0] == '-') {
      throw ConfigError("convert: unknown option '" + f + "' (see zerotrain convert --help)");
    } else {
      pos.push_back(f);
    }
  }
  if (pos.size() != 2) {
    std::fputs(kConvertUsage, stderr);
    return 2;
  }
  const std::string& ckpt_dir = pos[0];
  const std::string& out = pos[1];
  const at::ScalarType dtype = parse_dtype(dtype_s);

  ckpt::ConsolidatedReader reader(ckpt_dir, tag);
  const auto& m = reader.manifest();
  const auto client = m.value("client_state", nlohmann::json::object());
  const bool gpt2 = !raw && client.is_object() && client.contains("model") && client["model"].contains("gpt2");
  ckpt::make_dirs(ckpt::parent_dir(out));
  int64_t numel = 0;
  if (gpt2) {
    const auto mc = gpt2_from_json(client["model"]["gpt2"]);
    models::GPT2 model(mc);
    torch::NoGradGuard no_grad;
    auto params = model->named_parameters(/*recurse=*/true);
    for (const auto& name : reader.param_names()) {
      auto* p = params.find(name);
      ZT_CHECK_T(p != nullptr, CheckpointError, "convert: checkpoint parameter '", name,
                 "' is not a parameter of GPT-2 (", mc.n_layer, " layers)");
      auto v = reader.param(name);
      ZT_CHECK_T(v.sizes() == p->sizes(), CheckpointError, "convert: '", name, "' has shape ", v.sizes(),
                 " in the checkpoint but ", p->sizes(), " in GPT-2");
      p->copy_(v);
      numel += v.numel();
    }
    for (const auto& name : reader.extra_names()) {
      if (auto* p = params.find(name)) p->copy_(reader.extra(name));  // frozen parameters
    }
    io::save_safetensors(out, models::hf_gpt2_tensors(*model, dtype), {{"format", "pt"}});
    auto cfg = nlohmann::json::parse(models::gpt2_config_to_hf_json(mc));
    cfg["torch_dtype"] = dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "float16";
    ckpt::write_file_atomic(ckpt::join_path(ckpt::parent_dir(out), "config.json"), cfg.dump(2) + "\n");
  } else {
    // One parameter in memory at a time would need a streaming writer; the consolidated
    // tensors are held until the write (the model's size in `dtype`).
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& name : reader.param_names()) {
      auto v = reader.param(name).to(dtype);
      numel += v.numel();
      tensors.emplace(name, v);
    }
    for (const auto& name : reader.extra_names()) tensors.emplace(name, reader.extra(name));
    io::save_safetensors(out, tensors, {{"format", "pt"}});
  }
  std::printf("[zerotrain] converted checkpoint '%s' (%d ranks, stage %d, step %lld): %.2fM parameters -> %s (%s%s)\n",
              m.value("tag", "").c_str(), m.at("world_size").get<int>(), m.value("zero_stage", 0),
              static_cast<long long>(m.at("counters").value("global_steps", 0)), numel / 1e6, out.c_str(),
              dtype_s.c_str(), gpt2 ? ", Hugging Face GPT-2 names, config.json beside it" : "");
  return 0;
}

}  // namespace zt::cli
