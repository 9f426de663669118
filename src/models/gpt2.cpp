#include "models/gpt2.h"
#include "models/gpt2_shapes.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/model_util.h"
#include "models/shared_linear.h"  // accumulates_in_place, accumulate_mm
#include "models/checkpoint.h"
#include "models/deferred_grad.h"
#include "kernels/aten.h"
#include "kernels/column_sum.h"
#include "models/linear_adapter.h"
#include "models/lm_head_loss.h"
#include "zerotrain/error.h"


namespace zt::models {
namespace F = torch::nn::functional;

namespace {
using util::ends_with;

struct NamedConfig {
  const char* name;
  GPT2Config cfg;
};
// The four OpenAI sizes (vocab 50257, context 1024) plus a byte-level toy.
const NamedConfig kNamedConfigs[] = {
    {"gpt2-tiny", {2, 4, 128, 256, 256}},
    // [GPT-2 MoE]: block 1 of 2 an MoE of 4 MLPs, top-2, dropless.
    {"gpt2-tiny-moe", {.n_layer = 2, .n_head = 4, .n_embd = 128, .vocab_size = 256, .n_positions = 256,
                       .moe_num_experts = 4}},
    {"gpt2", {12, 12, 768, 50257, 1024}},
    {"gpt2-medium", {24, 16, 1024, 50257, 1024}},
    {"gpt2-large", {36, 20, 1280, 50257, 1024}},
    {"gpt2-xl", {48, 25, 1600, 50257, 1024}},
};

void validate(const GPT2Config& c, const std::string& where) {
  ZT_CHECK_T(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.vocab_size > 0 && c.n_positions > 0,
             zt::ConfigError, where, ": GPT-2 sizes must be positive (n_layer=", c.n_layer, ", n_head=", c.n_head,
             ", n_embd=", c.n_embd, ", vocab_size=", c.vocab_size, ", n_positions=", c.n_positions, ")");
  ZT_CHECK_T(c.n_embd % c.n_head == 0, zt::ConfigError, where, ": n_embd (", c.n_embd,
             ") must be divisible by n_head (", c.n_head, ")");
  if (c.moe_num_experts == 0) return;
  ZT_CHECK_T(c.moe_num_experts > 0, zt::ConfigError, where, ": moe_num_experts must be >= 0 (0 = dense), got ",
             c.moe_num_experts);
  ZT_CHECK_T(c.moe_every >= 1 && c.moe_every <= c.n_layer, zt::ConfigError, where, ": moe_every = ", c.moe_every,
             " must be in [1, n_layer = ", c.n_layer, "] (1 = every block an MoE, 2 = every other block)");
  ZT_CHECK_T(c.moe_capacity_factor > 0, zt::ConfigError, where, ": moe_capacity_factor must be > 0, got ",
             c.moe_capacity_factor);
  ZT_CHECK_T(c.moe_aux_loss_coef >= 0, zt::ConfigError, where, ": moe_aux_loss_coef must be >= 0, got ",
             c.moe_aux_loss_coef);
  ZT_CHECK_T(!c.deferred_init, zt::ConfigError, where, ": the MoE GPT-2 (moe_num_experts = ", c.moe_num_experts,
             ") has no partitioned construction (deferred_init) yet: build it whole; ZeRO stage 3 then partitions "
             "it in initialize(), the experts over expert-dp (docs/moe.md)");
}

// The dense GPT-2 name of an expert's parameter: "h.1.moe.experts.3.c_fc.weight" ->
// "h.1.mlp.c_fc.weight" (each expert is GPT-2's MLP: same shape and init).
std::string gpt2_dense_name(const std::string& name) {
  const std::string key = ".moe.experts.";
  const auto at = name.find(key);
  if (at == std::string::npos) return name;
  const auto dot = name.find('.', at + key.size());
  if (dot == std::string::npos) return name;
  return name.substr(0, at) + ".mlp" + name.substr(dot);
}

// Parameters of one GPT-2 MLP (c_fc and c_proj, weights and biases).
int64_t gpt2_mlp_params(int64_t C) { return 8 * C * C + 5 * C; }

int64_t gpt2_moe_blocks(const GPT2Config& c) {
  int64_t n = 0;
  for (int64_t i = 0; i < c.n_layer; ++i) n += gpt2_is_moe_block(c, i) ? 1 : 0;
  return n;
}

}  // namespace

GPT2Config named_gpt2(const std::string& name) {
  for (const auto& nc : kNamedConfigs)
    if (name == nc.name) return nc.cfg;
  std::string known;
  for (const auto& nc : kNamedConfigs) known += std::string(known.empty() ? "" : ", ") + nc.name;
  throw zt::ConfigError(zt::detail::cat("unknown GPT-2 model '", name, "': known models are ", known));
}

std::vector<std::string> gpt2_names() {
  std::vector<std::string> out;
  for (const auto& nc : kNamedConfigs) out.emplace_back(nc.name);
  return out;
}

GPT2Config gpt2_config_from_hf_json(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (fs::is_directory(p)) p /= "config.json";
  std::ifstream in(p);
  ZT_CHECK_T(in.good(), zt::ConfigError, "cannot open GPT-2 config '", p.string(), "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw zt::ConfigError(zt::detail::cat("GPT-2 config '", p.string(), "' is not valid JSON: ", e.what()));
  }
  const std::string where = p.string();
  auto get_int = [&](const char* key, std::optional<const char*> alt = std::nullopt) -> int64_t {
    if (j.contains(key) && j[key].is_number_integer()) return j[key].get<int64_t>();
    if (alt && j.contains(*alt) && j[*alt].is_number_integer()) return j[*alt].get<int64_t>();
    throw zt::ConfigError(zt::detail::cat(where, ": missing integer field '", key, "'"));
  };
  if (j.contains("model_type") && j["model_type"].is_string())
    ZT_CHECK_T(j["model_type"] == "gpt2", zt::ConfigError, where, ": model_type is '",
               j["model_type"].get<std::string>(), "', expected 'gpt2'");
  GPT2Config c;
  c.n_layer = get_int("n_layer");
  c.n_head = get_int("n_head");
  c.n_embd = get_int("n_embd");
  c.vocab_size = get_int("vocab_size");
  c.n_positions = get_int("n_positions", "n_ctx");
  validate(c, where);

  // A wrong type is named here, not left to the JSON library (type_error.302).
  auto require_type = [&](const char* key, bool (nlohmann::json::*ok)() const noexcept, const char* expected) {
    ZT_CHECK_T(!j.contains(key) || (j[key].*ok)(), zt::ConfigError, where, ": ", key, " must be ", expected,
               ", found ", j[key].dump());
  };
  require_type("activation_function", &nlohmann::json::is_string, "a string such as \"gelu_new\"");
  require_type("layer_norm_epsilon", &nlohmann::json::is_number, "a number");
  if (j.contains("n_inner") && !j["n_inner"].is_null()) require_type("n_inner", &nlohmann::json::is_number_integer, "an integer");
  // Reject what this implementation would silently compute differently.
  if (j.contains("activation_function")) {
    auto act = j["activation_function"].get<std::string>();
    ZT_CHECK_T(act == "gelu_new" || act == "gelu_pytorch_tanh", zt::ConfigError, where,
               ": activation_function '", act, "' is not supported (only the tanh GELU: gelu_new)");
  }
  if (j.contains("layer_norm_epsilon")) {
    double eps = j["layer_norm_epsilon"].get<double>();
    ZT_CHECK_T(std::abs(eps - util::kGpt2LayerNormEps) < 1e-12, zt::ConfigError, where, ": layer_norm_epsilon ", eps,
               " is not supported (only 1e-5)");
  }
  if (j.contains("n_inner") && !j["n_inner"].is_null())
    ZT_CHECK_T(j["n_inner"].get<int64_t>() == 4 * c.n_embd, zt::ConfigError, where, ": n_inner ",
               j["n_inner"].get<int64_t>(), " is not supported (only 4*n_embd = ", 4 * c.n_embd, ")");
  auto require_bool = [&](const char* key, bool expected) {
    if (j.contains(key) && j[key].is_boolean())
      ZT_CHECK_T(j[key].get<bool>() == expected, zt::ConfigError, where, ": ", key, "=",
                 j[key].get<bool>() ? "true" : "false", " is not supported (only ", expected ? "true" : "false", ")");
  };
  require_bool("tie_word_embeddings", true);
  require_bool("scale_attn_weights", true);
  require_bool("scale_attn_by_inverse_layer_idx", false);
  require_bool("reorder_and_upcast_attn", false);
  return c;
}

std::string gpt2_config_to_hf_json(const GPT2Config& c) {
  nlohmann::json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_embd"] = c.n_embd;
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.n_positions;
  j["n_ctx"] = c.n_positions;
  j["n_inner"] = nullptr;
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = util::kGpt2LayerNormEps;
  j["initializer_range"] = util::kGpt2InitStd;
  // zerotrain's GPT-2 has no dropout; say so, so HF in train mode computes the same.
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  // OpenAI's <|endoftext|> (50256) only exists in the BPE vocabulary; null stops
  // transformers from defaulting to it for smaller vocabularies.
  j["bos_token_id"] = c.vocab_size > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr);
  j["eos_token_id"] = j["bos_token_id"];
  return j.dump(2) + "\n";
}

bool gpt2_is_moe_block(const GPT2Config& cfg, int64_t block) {
  return cfg.moe_num_experts > 0 && cfg.moe_every >= 1 && (block + 1) % cfg.moe_every == 0;
}

bool gpt2_is_expert_param(const std::string& name) { return name.find(".moe.experts.") != std::string::npos; }

std::string GPT2Impl::global_param_name(const std::string& name) const {
  return expert_global_name(name, "h.", ".moe.experts.", [this](int64_t block) -> std::optional<int64_t> {
    if (block < 0 || block >= static_cast<int64_t>(blocks_.size()) || !blocks_at(block)->moe) return std::nullopt;
    return blocks_at(block)->moe->first_expert();
  }, "this GPT-2");
}

int64_t gpt2_num_params(const GPT2Config& c) {
  const int64_t C = c.n_embd;
  const int64_t dense = c.vocab_size * C + c.n_positions * C + c.n_layer * (12 * C * C + 13 * C) + 2 * C;
  // [GPT-2 MoE]: an MoE block holds E MLPs instead of one, and the gate (E, C).
  return dense + gpt2_moe_blocks(c) * ((c.moe_num_experts - 1) * gpt2_mlp_params(C) + c.moe_num_experts * C);
}

int64_t gpt2_num_params_non_embedding(const GPT2Config& c) { return gpt2_num_params(c) - c.n_positions * c.n_embd; }

int64_t gpt2_padded_vocab(const GPT2Config& c) {
  const int64_t m = std::max<int64_t>(1, c.lm_head_pad_multiple);
  return (c.vocab_size + m - 1) / m * m;
}

int64_t gpt2_loss_chunk_rows(const GPT2Config& c) {
  return std::max<int64_t>(64, (int64_t{1} << 27) / gpt2_padded_vocab(c));
}

double gpt2_flops_per_token(const GPT2Config& c, int64_t seq) {
  // [GPT-2 MoE]: the parameters a token runs through: k of the E experts and the gate.
  const int64_t C = c.n_embd;
  const int64_t inactive = gpt2_moe_blocks(c) * (c.moe_num_experts - std::min(c.moe_k, c.moe_num_experts)) * gpt2_mlp_params(C);
  return 6.0 * static_cast<double>(gpt2_num_params_non_embedding(c) - inactive) +
         12.0 * static_cast<double>(c.n_layer) * static_cast<double>(c.n_embd) * static_cast<double>(seq);
}

// ---- modules ------------------------------------------------------------------------

bool use_kernels(const torch::Tensor& t) { return kernels::runs_on(t) && t.is_contiguous(); }

// Sum over the rows of a (N, C) matrix (a bias gradient): zerotrain's column-sum kernel
// on CUDA (src/kernels/column_sum.h, deterministic), ATen elsewhere.
torch::Tensor column_sum(const torch::Tensor& g) {
  if (!use_kernels(g) || g.dim() != 2) return g.sum(0);
  auto out = at::empty({g.size(1)}, g.options());
  auto ws = at::empty({kernels::column_sum_workspace_floats(g.size(0), g.size(1))}, g.options().dtype(at::kFloat));
  kernels::ColumnSumArgs a;
  a.in = g.data_ptr();
  a.type = kernels::dtype_of(g.scalar_type());
  a.rows = g.size(0);
  a.cols = g.size(1);
  a.ld = g.stride(0);
  a.out = out.data_ptr();
  a.workspace = ws.data_ptr<float>();
  kernels::column_sum(a, kernels::current_stream(g.device()));
  return out;
}

// LayerNorm over the last dimension with ATen's forward and input gradient; on CUDA the
// weight and bias gradients come from zerotrain's kernel (src/kernels/layer_norm_grad.h),
// ATen's GammaBetaBackward ran at a third of memory bandwidth.
struct LayerNormFn : torch::autograd::Function<LayerNormFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, double eps) {
    const int64_t C = x.size(-1);
    const auto x2 = x.reshape({-1, C}).contiguous();
    auto [y, mean, rstd] = at::native_layer_norm(x2, {C}, w, b, eps);
    ctx->save_for_backward({x2, mean, rstd, w, b});
    return y.view(x.sizes());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &x2 = saved[0], &mean = saved[1], &rstd = saved[2], &w = saved[3], &b = saved[4];
    const int64_t C = x2.size(1);
    const auto g = grad_out[0].reshape({-1, C}).contiguous();
    const bool fused = use_kernels(g) && use_kernels(x2) && g.scalar_type() == x2.scalar_type() &&
                       mean.scalar_type() == at::kFloat && rstd.scalar_type() == at::kFloat;
    const bool need_w = ctx->needs_input_grad(1), need_b = ctx->needs_input_grad(2);
    auto [dx, dw, db] = at::native_layer_norm_backward(g, x2, {C}, mean, rstd, w, b,
                                                       {ctx->needs_input_grad(0), !fused && need_w, !fused && need_b});
    if (fused && (need_w || need_b)) std::tie(dw, db) = kernels::norm_param_grads(g, x2, mean, rstd, need_w, need_b);
    if (dx.defined()) dx = dx.view(grad_out[0].sizes());
    // zb-h1's input-gradient pass: the weight and bias gradients later, in W.
    // [Deferred Weight Gradients]
    const bool defer_w = !need_w && w.defined(), defer_b = !need_b && b.defined();
    if (defer_w || defer_b) {
      auto later = [g, x2, mean, rstd, w, b, fused, defer_w, defer_b] {
        torch::Tensor gw, gb;
        if (fused) {
          std::tie(gw, gb) = kernels::norm_param_grads(g, x2, mean, rstd, defer_w, defer_b);
        } else {
          auto r = at::native_layer_norm_backward(g, x2, {x2.size(1)}, mean, rstd, w, b, {false, defer_w, defer_b});
          gw = std::get<1>(r);
          gb = std::get<2>(r);
        }
        return std::vector<torch::Tensor>{gw, gb};
      };
      defer_weight_grads({defer_w ? w : torch::Tensor(), defer_b ? b : torch::Tensor()}, std::move(later));
    }
    return {dx, need_w ? dw : torch::Tensor(), need_b ? db : torch::Tensor(), torch::Tensor()};
  }
};

// y = x W^T + b on (N, in) as one addmm: cuBLASLt adds the bias in the matmul's epilogue.
// Backward: the weight gradient goes straight into W.grad when W.grad already exists
// (the engine's flat gradient buffer at ZeRO stages 0-1, or plain LibTorch accumulating
// across backward calls): one GEMM with beta = 1 accumulates it in its epilogue, where
// autograd would write a fresh gradient and then add it with a separate kernel (581 adds,
// 3.8 ms of GPT-2 Large's step on an H200). W's AccumulateGrad then receives no gradient
// and does nothing; its hooks still run, so gradient-ready hooks see the gradient in place.
struct LinearFn : torch::autograd::Function<LinearFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x2, const torch::Tensor& w,
                               const torch::Tensor& b) {
    ctx->save_for_backward({x2});
    ctx->saved_data["w"] = w;  // the parameter itself (its .grad is read in backward)
    ctx->saved_data["has_bias"] = b.defined();
    if (b.defined()) ctx->saved_data["b"] = b;  // the bias parameter ([Deferred Weight Gradients])
    return b.defined() ? at::addmm(b, x2, w.t()) : at::mm(x2, w.t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto x2 = ctx->get_saved_variables()[0];
    auto w = ctx->saved_data["w"].toTensor();
    const auto& g = grad_out[0];  // (N, out)
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = at::mm(g, w);
    if (ctx->needs_input_grad(1)) dw = weight_grad(w, g, x2);
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    if (has_bias && ctx->needs_input_grad(2)) db = column_sum(g);
    // zb-h1's input-gradient pass: the weight and bias gradients later, in W.
    // [Deferred Weight Gradients]
    if (!ctx->needs_input_grad(1)) {
      defer_weight_grads({w}, [w, g, x2] { return std::vector<torch::Tensor>{weight_grad(w, g, x2)}; });
    }
    if (has_bias && !ctx->needs_input_grad(2)) {
      defer_weight_grads({ctx->saved_data["b"].toTensor()}, [g] { return std::vector<torch::Tensor>{column_sum(g)}; });
    }
    return {dx, dw, db};
  }
  // g^T x2 added into W.grad by the GEMM when W.grad can take it (then undefined is
  // returned), else a fresh (out, in) gradient.
  static torch::Tensor weight_grad(torch::Tensor w, const torch::Tensor& g, const torch::Tensor& x2) {
    if (accumulates_in_place(w, g.scalar_type(), g.device())) {
      accumulate_mm(w.mutable_grad(), g.t(), x2);  // W.grad += g^T x, in the GEMM's epilogue
      return {};
    }
    return at::mm(g.t(), x2);  // (out, in), contiguous
  }
};

torch::Tensor layer_norm(const torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  // The weight and bias are the LayerNorm's parameters; eps its option (GPT-2: 1e-5).
  return LayerNormFn::apply(x, ln->weight, ln->bias, ln->options.eps());
}

torch::Tensor linear(const torch::nn::Linear& l, const torch::Tensor& x) {
  // Through the Linear's adapter when it carries one. [Linear Adapters]
  return run_linear(*l, x, [&l](const torch::Tensor& t) {
    const auto& w = l->weight;  // (out, in)
    const auto x2 = t.reshape({-1, t.size(-1)});
    auto y = LinearFn::apply(x2, w, l->bias.defined() ? l->bias : torch::Tensor());
    auto sizes = t.sizes().vec();
    sizes.back() = w.size(0);
    return y.view(sizes);
  });
}

// A Linear (in -> out), or a 1x1 placeholder when the model is built deferred.
torch::nn::Linear make_linear(const GPT2Config& cfg, int64_t in, int64_t out) {
  return cfg.deferred_init ? torch::nn::Linear(1, 1) : torch::nn::Linear(in, out);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPT2Config& cfg) : n_head(cfg.n_head) {
  c_attn = register_module("c_attn", make_linear(cfg, cfg.n_embd, 3 * cfg.n_embd));
  c_proj = register_module("c_proj", make_linear(cfg, cfg.n_embd, cfg.n_embd));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hs = C / n_head;
  auto qkv = linear(c_attn, x).split(C, /*dim=*/2);  // 3 x (B, T, C)
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head, hs}).transpose(1, 2); };
  auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // (B, nh, T, hs)
  auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  y = y.transpose(1, 2).contiguous().view({B, T, C});  // (B, T, C)
  return linear(c_proj, y);
}

MLPImpl::MLPImpl(const GPT2Config& cfg) {
  c_fc = register_module("c_fc", make_linear(cfg, cfg.n_embd, 4 * cfg.n_embd));
  c_proj = register_module("c_proj", make_linear(cfg, 4 * cfg.n_embd, cfg.n_embd));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return linear(c_proj, torch::gelu(linear(c_fc, x), "tanh"));  // (B, T, 4C) inside
}

BlockImpl::BlockImpl(const GPT2Config& cfg, bool is_moe, comm::GroupPtr ep_group) {
  ln_1 = register_module("ln_1", util::make_gpt2_ln(cfg.n_embd));
  attn = register_module("attn", CausalSelfAttention(cfg));
  ln_2 = register_module("ln_2", util::make_gpt2_ln(cfg.n_embd));
  if (!is_moe) {
    mlp = register_module("mlp", MLP(cfg));
    return;
  }
  // [GPT-2 MoE]: no noise and no sampled second expert (the routing draws nothing).
  MoEOptions o;
  o.hidden = cfg.n_embd;
  o.num_experts = cfg.moe_num_experts;
  o.gate.k = cfg.moe_k;
  o.gate.capacity_factor = cfg.moe_capacity_factor;
  o.gate.min_capacity = cfg.moe_min_capacity;
  o.gate.drop_tokens = cfg.moe_drop_tokens;
  o.gate.use_rts = false;
  o.gate.noisy_gate_policy = NoisyGatePolicy::None;
  o.gate.second_expert_sampling = false;
  o.eval_capacity_factor = cfg.moe_capacity_factor;
  o.ep_group = std::move(ep_group);
  moe = register_module("moe", MoE(o, [cfg] { return torch::nn::AnyModule(MLP(cfg)); }));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h1 = x + attn(layer_norm(ln_1, x));
  if (!moe) return h1 + mlp(layer_norm(ln_2, h1));
  auto out = moe(layer_norm(ln_2, h1));
  aux_loss = out.aux_loss;
  dropped_fraction = out.gate.dropped_fraction;
  kept_per_expert = std::move(out.gate.kept_counts);
  return h1 + out.output;
}

GPT2Impl::GPT2Impl(const GPT2Config& cfg, comm::GroupPtr ep_group) : cfg_(cfg) {
  validate(cfg, "GPT2Config");
  const bool d = cfg.deferred_init;
  wte = register_module("wte", torch::nn::Embedding(d ? 1 : cfg.vocab_size, d ? 1 : cfg.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(d ? 1 : cfg.n_positions, d ? 1 : cfg.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks_.emplace_back(cfg, gpt2_is_moe_block(cfg, i), ep_group);
    h->push_back(blocks_.back());
  }
  ln_f = register_module("ln_f", util::make_gpt2_ln(cfg.n_embd));
  reset_parameters();
}

void GPT2Impl::reset_parameters() {
  if (cfg_.deferred_init) return;  // placeholders: init_parameter runs at materialisation
  torch::NoGradGuard no_grad;
  // Registration order: the generator is drawn in the same order as GPT-2's reference.
  for (auto& kv : named_parameters()) init_parameter(kv.key(), kv.value());
}

std::vector<int64_t> gpt2_param_shape(const GPT2Config& cfg, const std::string& full_name) {
  const int64_t C = cfg.n_embd;
  if (cfg.moe_num_experts > 0 && ends_with(full_name, ".moe.gate.weight")) return {cfg.moe_num_experts, C};
  const std::string name = gpt2_dense_name(full_name);  // an expert is GPT-2's MLP
  if (name == "wte.weight") return {cfg.vocab_size, C};
  if (name == "wpe.weight") return {cfg.n_positions, C};
  if (ends_with(name, "attn.c_attn.weight")) return {3 * C, C};
  if (ends_with(name, "attn.c_attn.bias")) return {3 * C};
  if (ends_with(name, "attn.c_proj.weight")) return {C, C};
  if (ends_with(name, "mlp.c_fc.weight")) return {4 * C, C};
  if (ends_with(name, "mlp.c_fc.bias")) return {4 * C};
  if (ends_with(name, "mlp.c_proj.weight")) return {C, 4 * C};
  if (ends_with(name, "c_proj.bias") || ends_with(name, "ln_1.weight") || ends_with(name, "ln_1.bias") ||
      ends_with(name, "ln_2.weight") || ends_with(name, "ln_2.bias") || name == "ln_f.weight" || name == "ln_f.bias") {
    return {C};
  }
  throw zt::InternalError("GPT2: no parameter named '" + full_name + "'");
}

std::vector<int64_t> GPT2Impl::param_shape(const std::string& name) const { return gpt2_param_shape(cfg_, name); }

void GPT2Impl::init_parameter(const std::string& name, torch::Tensor& t) const {
  torch::NoGradGuard no_grad;
  const auto shape = param_shape(name);
  ZT_CHECK_T(t.sizes().vec() == shape, zt::InternalError, "GPT2: ", name, " has shape ", t.sizes(), ", expected ",
             c10::IntArrayRef(shape));
  const bool ln = name.find("ln_") != std::string::npos;
  if (ln) {
    ends_with(name, ".weight") ? t.fill_(1.0) : t.zero_();
  } else if (ends_with(name, ".bias")) {
    t.zero_();
  } else if (ends_with(name, "c_proj.weight")) {
    // Residual projections: GPT-2 scales their init by 1/sqrt(2 * n_layer).
    t.normal_(0.0, util::kGpt2InitStd / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer)));
  } else {
    t.normal_(0.0, util::kGpt2InitStd);
  }
}

torch::Tensor GPT2Impl::run_block(int64_t i, const torch::Tensor& x) {
  // Captures by value: a checkpointed body lives in the autograd graph until backward.
  auto body = [blk = blocks_[static_cast<size_t>(i)].ptr(), hooks = hooks_, i](const torch::Tensor& t) {
    const bool recompute = in_checkpoint_recompute();
    if (hooks.pre_forward) hooks.pre_forward(i, recompute);
    auto y = blk->forward(t);
    if (hooks.post_forward) hooks.post_forward(i, recompute);
    return y;
  };
  const bool ckpt = ckpt_enabled_ && i < ckpt_count_ && torch::GradMode::is_enabled();
  const auto blk = blocks_[static_cast<size_t>(i)].ptr();
  torch::Tensor y;
  if (ckpt && blk->moe) {
    // [Checkpointed Aux] (models/checkpoint.h): the loss takes this forward's aux loss, whose
    // gradient reaches the gate through the recompute; the recompute's aux is not kept.
    auto both = checkpoint_with_aux(
        [body, b = blk](const torch::Tensor& t) {
          auto out = body(t);
          auto aux = b->aux_loss;
          if (in_checkpoint_recompute()) b->aux_loss = aux.detach();
          return std::make_pair(out, aux);
        },
        x, ckpt_cpu_);
    y = both.first;
    blk->aux_loss = both.second;
  } else {
    y = ckpt ? checkpoint(body, x, ckpt_cpu_) : body(x);
  }
  return hooks_.wrap_output ? hooks_.wrap_output(i, y) : y;
}

torch::Tensor GPT2Impl::hidden(const torch::Tensor& idx) {
  ZT_CHECK(idx.dim() == 2 && idx.scalar_type() == torch::kLong, "GPT2: idx must be (B, T) int64, got ",
           idx.sizes(), " ", idx.scalar_type());
  const int64_t T = idx.size(1);
  ZT_CHECK(T <= cfg_.n_positions, "GPT2: sequence length ", T, " exceeds n_positions ", cfg_.n_positions);
  auto pos = torch::arange(T, idx.options());  // (T)
  auto x = wte(idx) + wpe(pos);                 // (B, T, C)
  for (int64_t i = 0; i < cfg_.n_layer; ++i) x = run_block(i, x);
  return layer_norm(ln_f, x);  // (B, T, C)
}

torch::Tensor GPT2Impl::forward(const torch::Tensor& idx) {
  return lm_head(hidden(idx)).narrow(-1, 0, cfg_.vocab_size).contiguous();  // (B, T, V)
}

torch::Tensor GPT2Impl::lm_head(const torch::Tensor& x) {
  const int64_t V = cfg_.vocab_size, Vp = gpt2_padded_vocab(cfg_);
  // Tied to wte; see GPT2Config::lm_head_pad_multiple for the zero rows.
  const auto w = Vp > V ? at::constant_pad_nd(wte->weight, {0, 0, 0, Vp - V}) : wte->weight;  // (Vp, C)
  return F::linear(x, w);  // (B, T, Vp)
}

torch::Tensor GPT2Impl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  ZT_CHECK(targets.sizes() == idx.sizes(), "GPT2::loss: targets ", targets.sizes(), " must match idx ",
           idx.sizes());
  const auto h = hidden(idx);  // (B, T, C)
  const auto lm = lm_loss(h, targets);
  if (cfg_.moe_num_experts == 0) return lm;
  // [GPT-2 MoE]: the load-balancing losses of this forward's MoE blocks.
  torch::Tensor aux;
  double dropped = 0.0;
  int64_t n = 0;
  for (const auto& b : blocks_) {
    if (!b->moe) continue;
    aux = aux.defined() ? aux + b->aux_loss : b->aux_loss;
    dropped += b->dropped_fraction;
    ++n;
  }
  last_aux_ = aux.detach();
  last_dropped_ = n ? dropped / static_cast<double>(n) : 0.0;
  return lm + cfg_.moe_aux_loss_coef * aux;
}

std::vector<std::vector<int64_t>> GPT2Impl::last_moe_kept_per_expert() const {
  std::vector<std::vector<int64_t>> out;
  for (const auto& b : blocks_)
    if (b->moe) out.push_back(b->kept_per_expert);
  return out;
}

void GPT2Impl::set_moe_timing(bool on) {
  for (auto& b : blocks_)
    if (b->moe) b->moe->set_timing(on);
}

std::vector<DeviceSpan> GPT2Impl::take_moe_all_to_all_spans() {
  std::vector<DeviceSpan> out;
  for (auto& b : blocks_) {
    if (!b->moe) continue;
    auto s = b->moe->take_all_to_all_spans();
    out.insert(out.end(), std::make_move_iterator(s.begin()), std::make_move_iterator(s.end()));
  }
  return out;
}

torch::Tensor GPT2Impl::lm_loss(const torch::Tensor& h, const torch::Tensor& targets) {
  const int64_t V = cfg_.vocab_size;
  if (cfg_.fused_lm_head_loss && h.scalar_type() != torch::kHalf) {
    return lm_head_cross_entropy(h.reshape({-1, h.size(-1)}), wte->weight, targets.reshape({-1}),
                                 cfg_.lm_head_pad_multiple, gpt2_loss_chunk_rows(cfg_));
  }
  const auto logits = lm_head(h);  // (B, T, Vp)
  const int64_t Vp = logits.size(-1);
  // fp32 softmax: a bf16/fp16 log-sum-exp over 50k logits loses most of its mantissa.
  auto lf = logits.to(torch::kFloat).view({-1, Vp});  // (B*T, Vp)
  // Padding columns take no probability (exp(-inf) = 0) and pass back zero gradient, so the
  // loss equals the one over the V real columns.
  if (Vp > V) lf.narrow(1, V, Vp - V).fill_(-std::numeric_limits<float>::infinity());
  return F::cross_entropy(lf, targets.reshape({-1}), F::CrossEntropyFuncOptions().ignore_index(-1));
}

void GPT2Impl::set_activation_checkpointing(bool enabled, std::optional<int64_t> number_checkpoints,
                                            bool cpu_checkpointing) {
  const int64_t n = number_checkpoints.value_or(cfg_.n_layer);
  ZT_CHECK_T(n >= 0 && n <= cfg_.n_layer, zt::ConfigError, "activation_checkpointing.number_checkpoints = ", n,
             " must be in [0, n_layer = ", cfg_.n_layer, "]");
  ckpt_enabled_ = enabled;
  ckpt_count_ = enabled ? n : 0;
  ckpt_cpu_ = enabled && cpu_checkpointing;
}

std::vector<std::shared_ptr<torch::nn::Module>> GPT2Impl::blocks() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  out.reserve(blocks_.size());
  for (const auto& b : blocks_) out.push_back(b.ptr());
  return out;
}

std::vector<zt::ModelUnit> GPT2Impl::zero_units() const {
  std::vector<zt::ModelUnit> out;
  for (size_t b = 0; b < blocks_.size(); ++b) out.push_back({"h." + std::to_string(b), blocks_[b]->parameters()});
  return out;
}

// From the config, not the tensors: under ZeRO-3 (or deferred_init) they are not full-size.
int64_t GPT2Impl::num_params() const { return gpt2_num_params(cfg_); }

int64_t GPT2Impl::num_params_non_embedding() const { return gpt2_num_params_non_embedding(cfg_); }

double GPT2Impl::flops_per_token(int64_t seq) const { return gpt2_flops_per_token(cfg_, seq); }

}  // namespace zt::models
