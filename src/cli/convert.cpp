// `zerotrain convert CKPT_DIR OUT.safetensors`: one consolidated weights file from a
// checkpoint of any world size and stage (the analogue of DeepSpeed's zero_to_fp32.py).
// Parameters are assembled one at a time from the per-rank fragments, every file verified.
#include <cstdio>
#include <set>
#include <string>

#include "ckpt/engine_checkpoint.h"
#include "ckpt/fs.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "models/gpt2.h"
#include "models/hf_gpt2.h"
#include "io/safetensors.h"
#include "models/hf_llama.h"
#include "models/llama.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::cli {
namespace {

const char* kConvertUsage =
    "usage: zerotrain convert CKPT_DIR OUT.safetensors [--dtype fp32|bf16|fp16] [--tag TAG] [--raw]\n"
    "       zerotrain convert CKPT_DIR OUT_DIR [--dtype ...] [--max-shard-gb G]   (Llama family)\n\n"
    "  Consolidates the fp32 master weights of checkpoint CKPT_DIR/TAG (default: the tag in\n"
    "  CKPT_DIR/latest), saved by any number of ranks at any ZeRO stage, into one file.\n"
    "  Checkpoints of `zerotrain train` (GPT-2) are written with Hugging Face GPT-2 names and\n"
    "  layouts, plus config.json next to OUT, so transformers' GPT2LMHeadModel loads the\n"
    "  directory. Llama-family checkpoints are written as a Hugging Face directory (OUT, or\n"
    "  OUT's directory when OUT ends in .safetensors): config.json and model.safetensors, or\n"
    "  shards of at most --max-shard-gb GB (default 5) with model.safetensors.index.json,\n"
    "  one parameter assembled at a time. Other checkpoints (or --raw) keep the module's own\n"
    "  parameter names.\n";

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  throw UsageError("convert: --dtype must be fp32, bf16 or fp16, got '" + s + "'");
}

models::GPT2Config gpt2_from_json(const nlohmann::json& j) {
  // [GPT-2 MoE]: Hugging Face's GPT-2 has no experts; --raw still writes the tensors.
  ZT_CHECK_T(!j.contains("moe"), ConfigError, "convert: the checkpoint holds an MoE GPT-2 (", j["moe"].dump(),
             "), which has no Hugging Face GPT-2 form; convert it with --raw");
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
  double shard_gb = 5;
  bool raw = false;
  Flags f("convert");
  f.text("--tag", tag);
  f.choice("--dtype", dtype_s, {"fp32", "float32", "bf16", "bfloat16", "fp16", "float16"});
  f.number("--max-shard-gb", shard_gb, 0.0);
  f.flag("--raw", raw);
  f.positionals(pos, "CKPT_DIR and OUT", 2, 2);
  if (!f.parse(argc, argv)) {
    std::fputs(kConvertUsage, stdout);
    return 0;
  }
  ZT_CHECK_T(shard_gb > 0, UsageError, "convert: --max-shard-gb: '", shard_gb,
             "' is out of range (--max-shard-gb must be above 0)");
  const std::string& ckpt_dir = pos[0];
  const std::string& out = pos[1];
  const at::ScalarType dtype = parse_dtype(dtype_s);
  // Outputs never overlap inputs: OUT (and the config.json beside it) inside the
  // checkpoint would overwrite the files being read and leave the checkpoint unloadable.
  ZT_CHECK_T(!path_within(out, ckpt_dir), ConfigError, "convert: OUT '", out, "' is inside the checkpoint '", ckpt_dir,
             "' that convert reads (it would overwrite checkpoint files): give a path outside ", ckpt_dir);
  ZT_CHECK_T(!ckpt::is_directory(out), ConfigError, "convert: OUT '", out,
             "' is a directory: give a file name, for example ", ckpt::join_path(out, "model.safetensors"));

  ckpt::ConsolidatedReader reader(ckpt_dir, tag);
  const auto& m = reader.manifest();
  const auto client = m.value("client_state", nlohmann::json::object());
  const bool gpt2 = !raw && client.is_object() && client.contains("model") && client["model"].contains("gpt2");
  const bool llama = !raw && client.is_object() && client.contains("model") && client["model"].contains("llama");
  int64_t numel = 0;
  // One tick per tensor read from the shards (the slow part: every rank's file is read).
  const auto names = reader.param_names(), extras = reader.extra_names();
  log::Progress progress("convert '" + ckpt_dir + "'", static_cast<double>(names.size() + extras.size()), "tensors");
  int64_t read = 0;
  if (llama) {
    const auto mc = models::llama_config_from_hf_json_text(client["model"]["llama"].dump(), ckpt_dir + " (manifest)");
    const double gb = shard_gb;
    const std::string dir = out.size() > 12 && out.ends_with(".safetensors") ? ckpt::parent_dir(out) : out;
    const std::set<std::string> managed(names.begin(), names.end()), extra(extras.begin(), extras.end());
    std::set<std::string> want;
    for (const auto& [n, shape] : models::llama_param_shapes(mc)) want.insert(n);
    for (const auto& n : names)
      ZT_CHECK_T(want.count(n), CheckpointError, "convert: checkpoint parameter '", n, "' is not a parameter of ",
                 mc.architecture, " (", mc.num_hidden_layers, " layers)");
    const auto files = models::save_hf_llama(
        mc,
        [&](const std::string& n) {
          ZT_CHECK_T(managed.count(n) || extra.count(n), CheckpointError, "convert: the checkpoint lacks '", n, "'");
          auto v = managed.count(n) ? reader.param(n) : reader.extra(n);
          numel += v.numel();
          progress.update(static_cast<double>(++read));
          return v;
        },
        dir, dtype, static_cast<int64_t>(gb * 1e9));
    progress.finish();
    log::info("converted checkpoint '%s' (%d ranks, stage %d, step %lld): %.2fM parameters -> %s "
              "(%s, Hugging Face %s, %zu weight file(s) and config.json)",
                m.value("tag", "").c_str(), m.at("world_size").get<int>(), m.value("zero_stage", 0),
                static_cast<long long>(m.at("counters").value("global_steps", 0)), numel / 1e6, dir.c_str(),
                dtype_s.c_str(), mc.architecture.c_str(), files.size());
    return 0;
  }
  ckpt::make_dirs(ckpt::parent_dir(out));
  if (gpt2) {
    const auto mc = gpt2_from_json(client["model"]["gpt2"]);
    models::GPT2 model(mc);
    torch::NoGradGuard no_grad;
    auto params = model->named_parameters(/*recurse=*/true);
    for (const auto& name : names) {
      auto* p = params.find(name);
      ZT_CHECK_T(p != nullptr, CheckpointError, "convert: checkpoint parameter '", name,
                 "' is not a parameter of GPT-2 (", mc.n_layer, " layers)");
      auto v = reader.param(name);
      ZT_CHECK_T(v.sizes() == p->sizes(), CheckpointError, "convert: '", name, "' has shape ", v.sizes(),
                 " in the checkpoint but ", p->sizes(), " in GPT-2");
      p->copy_(v);
      numel += v.numel();
      progress.update(static_cast<double>(++read));
    }
    for (const auto& name : extras) {
      if (auto* p = params.find(name)) p->copy_(reader.extra(name));  // frozen parameters
      progress.update(static_cast<double>(++read));
    }
    progress.finish();
    io::save_safetensors(out, models::hf_gpt2_tensors(*model, dtype), {{"format", "pt"}});
    auto cfg = nlohmann::json::parse(models::gpt2_config_to_hf_json(mc));
    cfg["torch_dtype"] = dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "float16";
    ckpt::write_file_atomic(ckpt::join_path(ckpt::parent_dir(out), "config.json"), cfg.dump(2) + "\n");
  } else {
    // One parameter in memory at a time would need a streaming writer; the consolidated
    // tensors are held until the write (the model's size in `dtype`).
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& name : names) {
      auto v = reader.param(name).to(dtype);
      numel += v.numel();
      tensors.emplace(name, v);
      progress.update(static_cast<double>(++read));
    }
    for (const auto& name : extras) {
      tensors.emplace(name, reader.extra(name));
      progress.update(static_cast<double>(++read));
    }
    progress.finish();
    io::save_safetensors(out, tensors, {{"format", "pt"}});
  }
  log::info("converted checkpoint '%s' (%d ranks, stage %d, step %lld): %.2fM parameters -> %s (%s%s)",
              m.value("tag", "").c_str(), m.at("world_size").get<int>(), m.value("zero_stage", 0),
              static_cast<long long>(m.at("counters").value("global_steps", 0)), numel / 1e6, out.c_str(),
              dtype_s.c_str(), gpt2 ? ", Hugging Face GPT-2 names, config.json beside it" : "");
  return 0;
}

}  // namespace zt::cli
