// LlamaConfig: named shapes, Hugging Face config.json in and out, sizes and FLOPs.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sstream>

#include "models/llama.h"
#include "zerotrain/error.h"

namespace zt::models {
namespace {

struct NamedLlamaConfig {
  const char* name;
  LlamaConfig (*make)();
};

LlamaConfig tiny() {
  LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  return c;
}

// meta-llama/Llama-3.2-1B config.json.
LlamaConfig llama32_1b() {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_type = RopeType::kLlama3;
  c.rope_factor = 32.0;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_max_position_embeddings = 8192;
  c.tie_word_embeddings = true;
  c.hf_extra_json = R"({"bos_token_id": 128000, "eos_token_id": 128001})";
  return c;
}

// meta-llama/Meta-Llama-3-8B config.json.
LlamaConfig llama3_8b() {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.hf_extra_json = R"({"bos_token_id": 128000, "eos_token_id": 128001})";
  return c;
}

// [Mixtral] A tiny Mixtral for CPU tests: Mixtral-8x7B's layout (GQA, 4 of 8 -> 2 kv heads
// here, rope_theta 1e6, no sliding window) at 2 layers of width 64, 4 experts, top-2.
// output_router_logits on (HF's default is off) so that training balances the experts, with
// Mixtral-8x7B's router_aux_loss_coef 0.02.
LlamaConfig mixtral_tiny() {
  LlamaConfig c;
  c.architecture = "MixtralForCausalLM";
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1e6;
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.router_aux_loss_coef = 0.02;
  c.output_router_logits = true;
  return c;
}

const NamedLlamaConfig kNamed[] = {
    {"llama-tiny", tiny}, {"llama3.2-1b", llama32_1b}, {"llama3-8b", llama3_8b}, {"mixtral-tiny", mixtral_tiny}};

const char* kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM"};

std::string model_type_of(const std::string& arch) {
  if (arch == "MistralForCausalLM") return "mistral";
  if (arch == "Qwen2ForCausalLM") return "qwen2";
  if (arch == "MixtralForCausalLM") return "mixtral";
  return "llama";
}

void validate(const LlamaConfig& c, const std::string& where) {
  ZT_CHECK_T(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
                 c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0 &&
                 c.max_position_embeddings > 0,
             ConfigError, where, ": Llama sizes must be positive (vocab_size=", c.vocab_size,
             ", hidden_size=", c.hidden_size, ", intermediate_size=", c.intermediate_size, ", num_hidden_layers=",
             c.num_hidden_layers, ", num_attention_heads=", c.num_attention_heads, ", num_key_value_heads=",
             c.num_key_value_heads, ", head_dim=", c.head_dim, ")");
  ZT_CHECK_T(c.num_attention_heads % c.num_key_value_heads == 0, ConfigError, where, ": num_attention_heads (",
             c.num_attention_heads, ") must be a multiple of num_key_value_heads (", c.num_key_value_heads, ")");
  ZT_CHECK_T(c.pad_token_id < c.vocab_size, ConfigError, where, ": pad_token_id (", c.pad_token_id,
             ") must be below vocab_size (", c.vocab_size, ")");
  ZT_CHECK_T(c.head_dim % 2 == 0, ConfigError, where, ": head_dim (", c.head_dim, ") must be even for rotary embeddings");
  ZT_CHECK_T(c.rms_norm_eps > 0 && c.rope_theta > 0 && c.rope_factor > 0, ConfigError, where,
             ": rms_norm_eps, rope_theta and the rope factor must be positive");
  ZT_CHECK_T(c.layer_sliding.empty() || static_cast<int64_t>(c.layer_sliding.size()) == c.num_hidden_layers,
             ConfigError, where, ": layer_types has ", c.layer_sliding.size(), " entries for ", c.num_hidden_layers,
             " layers");
  ZT_CHECK_T(c.num_local_experts >= 0 && (c.num_local_experts > 0) == (c.architecture == "MixtralForCausalLM"),
             ConfigError, where, ": num_local_experts = ", c.num_local_experts, " with architecture ", c.architecture,
             " (experts > 0 is MixtralForCausalLM, and a Mixtral has experts)");
  if (c.num_local_experts > 0) {
    ZT_CHECK_T(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_local_experts, ConfigError, where,
               ": num_experts_per_tok = ", c.num_experts_per_tok, " must be in 1..num_local_experts (",
               c.num_local_experts, ")");
    ZT_CHECK_T(c.router_aux_loss_coef >= 0, ConfigError, where, ": router_aux_loss_coef must be >= 0, got ",
               c.router_aux_loss_coef);
  }
  if (c.rope_type == RopeType::kLlama3) {
    ZT_CHECK_T(c.rope_high_freq_factor > c.rope_low_freq_factor && c.rope_low_freq_factor > 0 &&
                   c.rope_original_max_position_embeddings > 0,
               ConfigError, where, ": rope_scaling llama3 needs high_freq_factor > low_freq_factor > 0 and "
               "original_max_position_embeddings > 0");
  }
}

double num(const nlohmann::json& j, const char* key, const std::string& where) {
  ZT_CHECK_T(j.contains(key) && j[key].is_number(), ConfigError, where, ": '", key, "' must be a number");
  return j[key].get<double>();
}

}  // namespace

LlamaConfig named_llama(const std::string& name) {
  for (const auto& n : kNamed)
    if (name == n.name) return n.make();
  std::string known;
  for (const auto& n : kNamed) known += std::string(known.empty() ? "" : ", ") + n.name;
  throw ConfigError(detail::cat("unknown Llama model '", name, "': known models are ", known,
                                " (or pass a Hugging Face config.json)"));
}

std::vector<std::string> llama_names() {
  std::vector<std::string> out;
  for (const auto& n : kNamed) out.emplace_back(n.name);
  return out;
}

bool is_llama_name(const std::string& name) {
  for (const auto& n : kNamed)
    if (name == n.name) return true;
  return false;
}

namespace {
std::filesystem::path config_path(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  return p;
}
std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  ZT_CHECK_T(in.good(), ConfigError, "cannot open model config '", p.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

bool is_llama_hf_config(const std::string& path) {
  const auto p = config_path(path);
  if (!std::filesystem::is_regular_file(p)) return false;
  nlohmann::json j = nlohmann::json::parse(read_text(p), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      for (const char* k : kArchitectures)
        if (a.is_string() && a.get<std::string>() == k) return true;
  const std::string mt = j.value("model_type", "");
  return mt == "llama" || mt == "mistral" || mt == "qwen2" || mt == "mixtral";
}

LlamaConfig llama_config_from_hf_json(const std::string& path) {
  const auto p = config_path(path);
  return llama_config_from_hf_json_text(read_text(p), p.string());
}

LlamaConfig llama_config_from_hf_json_text(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw ConfigError(detail::cat("model config '", where, "' is not valid JSON: ", e.what()));
  }
  ZT_CHECK_T(j.is_object(), ConfigError, "model config '", where, "' is not a JSON object");
  std::set<std::string> used;  // keys that are read (the rest go to hf_extra_json)
  auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  auto get_int = [&](const char* k) -> int64_t {
    used.insert(k);
    ZT_CHECK_T(j.contains(k) && j[k].is_number_integer(), ConfigError, where, ": missing integer field '", k, "'");
    return j[k].get<int64_t>();
  };

  LlamaConfig c;
  // The class: architectures[0], else model_type.
  used.insert("architectures");
  used.insert("model_type");
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    arch = j["architectures"][0].get<std::string>();
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string mt = j["model_type"].get<std::string>();
    arch = mt == "llama"     ? "LlamaForCausalLM"
           : mt == "mistral" ? "MistralForCausalLM"
           : mt == "qwen2"   ? "Qwen2ForCausalLM"
           : mt == "mixtral" ? "MixtralForCausalLM"
                             : mt;
  }
  const bool qwen_moe = arch == "Qwen2MoeForCausalLM" || arch == "qwen2_moe" || arch == "Qwen3MoeForCausalLM" ||
                        arch == "qwen3_moe";
  ZT_CHECK_T(!qwen_moe, ConfigError, where, ": architecture '", arch, "' (Qwen-MoE) is not supported: its shared "
             "expert (shared_expert_intermediate_size, with its sigmoid shared_expert_gate), norm_topk_prob, "
             "decoder_sparse_step / mlp_only_layers and the q/k/v biases of its MoE layers are not built; "
             "MixtralForCausalLM is the MoE Llama zerotrain trains (docs/models.md)");
  bool known = false;
  for (const char* k : kArchitectures) known = known || arch == k;
  ZT_CHECK_T(known, ConfigError, where, ": architecture '", arch,
             "' is not supported by zerotrain's Llama family (supported: LlamaForCausalLM, MistralForCausalLM, "
             "Qwen2ForCausalLM, MixtralForCausalLM)");
  c.architecture = arch;
  const bool qwen2 = arch == "Qwen2ForCausalLM", mixtral = arch == "MixtralForCausalLM";
  // Mixtral's attention is Mistral's (every layer slides when sliding_window is set; no biases).
  const bool mistral = arch == "MistralForCausalLM" || mixtral;

  c.vocab_size = get_int("vocab_size");
  c.hidden_size = get_int("hidden_size");
  c.intermediate_size = get_int("intermediate_size");
  c.num_hidden_layers = get_int("num_hidden_layers");
  c.num_attention_heads = get_int("num_attention_heads");
  used.insert("num_key_value_heads");
  c.num_key_value_heads = has("num_key_value_heads") ? get_int("num_key_value_heads") : c.num_attention_heads;
  used.insert("head_dim");
  ZT_CHECK_T(c.num_attention_heads > 0, ConfigError, where, ": num_attention_heads must be positive");
  c.head_dim = has("head_dim") ? get_int("head_dim") : c.hidden_size / c.num_attention_heads;
  if (!has("head_dim"))
    ZT_CHECK_T(c.hidden_size % c.num_attention_heads == 0, ConfigError, where, ": hidden_size (", c.hidden_size,
               ") must be a multiple of num_attention_heads (", c.num_attention_heads, ") when head_dim is not set");
  used.insert("max_position_embeddings");
  c.max_position_embeddings = has("max_position_embeddings") ? get_int("max_position_embeddings") : 2048;
  used.insert("rms_norm_eps");
  if (has("rms_norm_eps")) c.rms_norm_eps = num(j, "rms_norm_eps", where);
  used.insert("initializer_range");
  if (has("initializer_range")) c.initializer_range = num(j, "initializer_range", where);
  used.insert("pad_token_id");
  if (has("pad_token_id")) {
    c.pad_token_id = get_int("pad_token_id");
    if (c.pad_token_id < 0) c.pad_token_id += c.vocab_size;  // nn.Embedding wraps a negative padding_idx
  }
  used.insert("tie_word_embeddings");
  if (has("tie_word_embeddings")) c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();

  // Biases: Qwen2 always has q/k/v biases; Llama's attention_bias adds q/k/v/o; mlp_bias.
  used.insert("attention_bias");
  used.insert("mlp_bias");
  const bool attention_bias = has("attention_bias") && j["attention_bias"].get<bool>();
  ZT_CHECK_T(!(attention_bias && (qwen2 || mistral)), ConfigError, where, ": attention_bias is not a field of ",
             arch, " (transformers ignores it there); remove it");
  ZT_CHECK_T(!(has("mlp_bias") && j["mlp_bias"].get<bool>() && (qwen2 || mistral)), ConfigError, where,
             ": mlp_bias is not a field of ", arch, "; remove it");
  c.qkv_bias = qwen2 || attention_bias;
  c.o_bias = attention_bias;
  c.mlp_bias = has("mlp_bias") && j["mlp_bias"].get<bool>();

  // What would compute differently: refuse.
  used.insert("hidden_act");
  if (has("hidden_act")) {
    const auto act = j["hidden_act"].get<std::string>();
    ZT_CHECK_T(act == "silu" || act == "swish", ConfigError, where, ": hidden_act '", act,
               "' is not supported (the SwiGLU MLP uses silu)");
  }
  used.insert("attention_dropout");
  if (has("attention_dropout"))
    ZT_CHECK_T(num(j, "attention_dropout", where) == 0.0, ConfigError, where, ": attention_dropout ",
               j["attention_dropout"].dump(), " is not supported (zerotrain's Llama has no dropout; set it to 0)");
  used.insert("pretraining_tp");  // a slicing of the same matmuls in old transformers: same math
  used.insert("partial_rotary_factor");
  if (has("partial_rotary_factor"))
    ZT_CHECK_T(num(j, "partial_rotary_factor", where) == 1.0, ConfigError, where,
               ": partial_rotary_factor != 1 is not supported");

  // Rotary: transformers 4 (rope_theta + rope_scaling) or 5 (rope_parameters).
  used.insert("rope_theta");
  used.insert("rope_scaling");
  used.insert("rope_parameters");
  if (has("rope_theta")) c.rope_theta = num(j, "rope_theta", where);
  nlohmann::json rp;
  if (has("rope_parameters")) rp = j["rope_parameters"];
  if (has("rope_scaling")) {
    ZT_CHECK_T(rp.is_null(), ConfigError, where, ": both rope_scaling and rope_parameters are set; keep one");
    rp = j["rope_scaling"];
  }
  if (!rp.is_null()) {
    ZT_CHECK_T(rp.is_object(), ConfigError, where, ": rope_parameters/rope_scaling must be an object");
    if (rp.contains("rope_theta") && !rp["rope_theta"].is_null()) c.rope_theta = num(rp, "rope_theta", where);
    std::string type = rp.value("rope_type", rp.value("type", std::string("default")));
    if (rp.contains("partial_rotary_factor"))
      ZT_CHECK_T(num(rp, "partial_rotary_factor", where) == 1.0, ConfigError, where,
                 ": partial_rotary_factor != 1 is not supported");
    if (type == "default") {
      c.rope_type = RopeType::kDefault;
    } else if (type == "linear") {
      c.rope_type = RopeType::kLinear;
      c.rope_factor = num(rp, "factor", where);
    } else if (type == "llama3") {
      c.rope_type = RopeType::kLlama3;
      c.rope_factor = num(rp, "factor", where);
      c.rope_low_freq_factor = num(rp, "low_freq_factor", where);
      c.rope_high_freq_factor = num(rp, "high_freq_factor", where);
      c.rope_original_max_position_embeddings =
          rp.contains("original_max_position_embeddings") && !rp["original_max_position_embeddings"].is_null()
              ? rp["original_max_position_embeddings"].get<int64_t>()
              : c.max_position_embeddings;
    } else {
      throw ConfigError(detail::cat(where, ": rope type '", type,
                                    "' is not supported (supported: default, linear, llama3)"));
    }
  }

  // Sliding windows: Mistral's sliding_window applies to every layer; Qwen2's only with
  // use_sliding_window, to the layers from max_window_layers on (or as layer_types says).
  used.insert("sliding_window");
  used.insert("use_sliding_window");
  used.insert("max_window_layers");
  used.insert("layer_types");
  const int64_t window = has("sliding_window") ? j["sliding_window"].get<int64_t>() : 0;
  std::vector<bool> sliding(static_cast<size_t>(c.num_hidden_layers), false);
  if (mistral) {
    std::fill(sliding.begin(), sliding.end(), window > 0);
  } else if (qwen2) {
    const bool use = has("use_sliding_window") && j["use_sliding_window"].get<bool>();
    if (use && window > 0) {
      const int64_t from = has("max_window_layers") ? j["max_window_layers"].get<int64_t>() : 28;
      for (int64_t i = from; i < c.num_hidden_layers; ++i) sliding[static_cast<size_t>(i)] = true;
    }
  }
  if (has("layer_types")) {
    const auto& lt = j["layer_types"];
    ZT_CHECK_T(lt.is_array() && static_cast<int64_t>(lt.size()) == c.num_hidden_layers, ConfigError, where,
               ": layer_types must list one entry per layer (", c.num_hidden_layers, ")");
    for (size_t i = 0; i < lt.size(); ++i) {
      const auto t = lt[i].get<std::string>();
      ZT_CHECK_T(t == "full_attention" || t == "sliding_attention", ConfigError, where, ": layer_types[", i, "] '", t,
                 "' is not supported (full_attention or sliding_attention)");
      // transformers' Qwen2 uses layer_types as saved; Mistral ignores it (full window rule).
      if (!mistral) sliding[i] = t == "sliding_attention" && window > 0;
    }
  }
  const bool any = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  c.sliding_window = any ? window : 0;
  if (any) c.layer_sliding = sliding;

  // [Mixtral] The experts (MixtralConfig's keys and defaults).
  used.insert("num_local_experts");
  used.insert("num_experts_per_tok");
  used.insert("router_aux_loss_coef");
  used.insert("output_router_logits");
  used.insert("router_jitter_noise");
  if (mixtral) {
    c.num_local_experts = has("num_local_experts") ? get_int("num_local_experts") : 8;
    c.num_experts_per_tok = has("num_experts_per_tok") ? get_int("num_experts_per_tok") : 2;
    if (has("router_aux_loss_coef")) c.router_aux_loss_coef = num(j, "router_aux_loss_coef", where);
    if (has("output_router_logits")) {
      ZT_CHECK_T(j["output_router_logits"].is_boolean(), ConfigError, where, ": output_router_logits must be a boolean");
      c.output_router_logits = j["output_router_logits"].get<bool>();
    }
    if (has("router_jitter_noise"))
      ZT_CHECK_T(num(j, "router_jitter_noise", where) == 0.0, ConfigError, where, ": router_jitter_noise ",
                 j["router_jitter_noise"].dump(), " is not supported (the gate draws no noise; set it to 0)");
  } else {
    for (const char* k : {"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits",
                          "router_jitter_noise"}) {
      if (has(k)) used.erase(k);  // another class's key: kept, not read
    }
  }

  nlohmann::json extra = nlohmann::json::object();
  for (const auto& [k, v] : j.items())
    if (!used.count(k)) extra[k] = v;
  c.hf_extra_json = extra.dump();
  validate(c, where);
  return c;
}

std::string llama_config_to_hf_json(const LlamaConfig& c) {
  nlohmann::json j = nlohmann::json::parse(c.hf_extra_json);
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM", mixtral = c.architecture == "MixtralForCausalLM";
  const bool mistral = c.architecture == "MistralForCausalLM" || mixtral;  // Mixtral's attention is Mistral's
  j["architectures"] = {c.architecture};
  j["model_type"] = model_type_of(c.architecture);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["pad_token_id"] = c.pad_token_id >= 0 ? nlohmann::json(c.pad_token_id) : nlohmann::json(nullptr);
  if (!qwen2 && !mistral) {
    ZT_CHECK_T(c.qkv_bias == c.o_bias, ConfigError, "LlamaForCausalLM: q/k/v and o biases go together "
               "(attention_bias); q/k/v alone is Qwen2ForCausalLM");
    j["attention_bias"] = c.o_bias;
    j["mlp_bias"] = c.mlp_bias;
  } else {
    ZT_CHECK_T(c.qkv_bias == qwen2 && !c.o_bias && !c.mlp_bias, ConfigError, c.architecture,
               ": biases other than the architecture's own cannot be written to its config.json");
  }
  // transformers 4 keys; transformers 5 reads them too (standardize_rope_params).
  j["rope_theta"] = c.rope_theta;
  if (c.rope_type == RopeType::kLinear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_factor}};
  } else if (c.rope_type == RopeType::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (mixtral) {
    j["num_local_experts"] = c.num_local_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
    j["router_jitter_noise"] = 0.0;
  }
  const bool any = std::find(c.layer_sliding.begin(), c.layer_sliding.end(), true) != c.layer_sliding.end();
  if (mistral) {
    j["sliding_window"] = any ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  } else if (qwen2) {
    j["use_sliding_window"] = any;
    j["sliding_window"] = any ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    if (any) {
      nlohmann::json lt = nlohmann::json::array();
      for (bool s : c.layer_sliding) lt.push_back(s ? "sliding_attention" : "full_attention");
      j["layer_types"] = lt;
    }
  } else {
    ZT_CHECK_T(!any, ConfigError, "LlamaForCausalLM has no sliding window; use MistralForCausalLM");
  }
  return j.dump(2) + "\n";
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_param_shapes(const LlamaConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const int64_t d = c.hidden_size, I = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, d}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "self_attn.q_proj.weight", {q, d}});
    if (c.qkv_bias) out.push_back({p + "self_attn.q_proj.bias", {q}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, d}});
    if (c.qkv_bias) out.push_back({p + "self_attn.k_proj.bias", {kv}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    if (c.qkv_bias) out.push_back({p + "self_attn.v_proj.bias", {kv}});
    out.push_back({p + "self_attn.o_proj.weight", {d, q}});
    if (c.o_bias) out.push_back({p + "self_attn.o_proj.bias", {d}});
    if (c.is_moe()) {
      // [Mixtral]: HF's MixtralSparseMoeBlock names.
      out.push_back({p + "block_sparse_moe.gate.weight", {c.num_local_experts, d}});
      for (int64_t e = 0; e < c.num_local_experts; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        out.push_back({x + "w1.weight", {I, d}});
        out.push_back({x + "w2.weight", {d, I}});
        out.push_back({x + "w3.weight", {I, d}});
      }
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {I, d}});
      if (c.mlp_bias) out.push_back({p + "mlp.gate_proj.bias", {I}});
      out.push_back({p + "mlp.up_proj.weight", {I, d}});
      if (c.mlp_bias) out.push_back({p + "mlp.up_proj.bias", {I}});
      out.push_back({p + "mlp.down_proj.weight", {d, I}});
      if (c.mlp_bias) out.push_back({p + "mlp.down_proj.bias", {d}});
    }
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
  }
  out.push_back({"model.norm.weight", {d}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, d}});
  return out;
}

int64_t llama_num_params(const LlamaConfig& c) {
  int64_t n = 0;
  for (const auto& [name, shape] : llama_param_shapes(c)) {
    int64_t k = 1;
    for (int64_t s : shape) k *= s;
    n += k;
  }
  return n;
}

double llama_flops_per_token(const LlamaConfig& c, int64_t seq) {
  const double V = static_cast<double>(c.vocab_size), d = static_cast<double>(c.hidden_size);
  const double tables = (c.tie_word_embeddings ? 1.0 : 2.0) * V * d;  // embed_tokens (+ lm_head)
  // [Mixtral]: a token runs through k of the E experts of each layer.
  const double idle_experts = c.is_moe() ? static_cast<double>(c.num_hidden_layers) *
                                               static_cast<double>(c.num_local_experts - c.num_experts_per_tok) * 3.0 *
                                               static_cast<double>(c.intermediate_size) * d
                                         : 0.0;
  const double n_layers = static_cast<double>(llama_num_params(c)) - tables - idle_experts;
  return 6.0 * (n_layers + V * d) +
         12.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(c.q_dim()) * static_cast<double>(seq);
}

torch::Tensor llama_rope_inv_freq(const LlamaConfig& c) {
  // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in fp32.
  const int64_t dim = c.head_dim;
  auto exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / static_cast<float>(dim);
  auto inv = 1.0 / torch::pow(c10::Scalar(c.rope_theta), exponent);
  if (c.rope_type == RopeType::kLinear) return inv / c.rope_factor;
  if (c.rope_type != RopeType::kLlama3) return inv;
  // _compute_llama3_parameters: long wavelengths divided by factor, short ones kept, the
  // band between interpolated.
  const double factor = c.rope_factor, lo = c.rope_low_freq_factor, hi = c.rope_high_freq_factor;
  const double old_len = static_cast<double>(c.rope_original_max_position_embeddings);
  const double low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
  auto wavelen = 2 * std::numbers::pi / inv;
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv / factor, inv);
  auto smooth = (old_len / wavelen - lo) / (hi - lo);
  auto smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

}  // namespace zt::models
