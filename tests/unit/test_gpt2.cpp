// GPT-2 model: configs, parameter layout, init, forward in three dtypes, causality,
// FLOPs, activation checkpointing (exact gradients), and that it actually learns.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "models/checkpoint.h"
#include "models/gpt2.h"
#include "models/lm_head_loss.h"
#include "support/grad_probe.h"
#include "zerotrain/error.h"

namespace zt_test_gpt2 {

using zt::models::GPT2;
using zt::models::GPT2Config;
using zt::models::named_gpt2;

namespace {

GPT2 tiny(uint64_t seed = 1234) {
  torch::manual_seed(seed);
  return GPT2(named_gpt2("gpt2-tiny"));
}

torch::Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(V, {B, T}, gen, torch::kLong);
}

}  // namespace

TEST(GPT2Config, NamedSizes) {
  auto t = named_gpt2("gpt2-tiny");
  EXPECT_EQ(t.n_layer, 2);
  EXPECT_EQ(t.n_head, 4);
  EXPECT_EQ(t.n_embd, 128);
  EXPECT_EQ(t.vocab_size, 256);
  EXPECT_EQ(t.n_positions, 256);
  auto xl = named_gpt2("gpt2-xl");
  EXPECT_EQ(xl.n_layer, 48);
  EXPECT_EQ(xl.n_head, 25);
  EXPECT_EQ(xl.n_embd, 1600);
  EXPECT_EQ(xl.vocab_size, 50257);
  EXPECT_EQ(xl.n_positions, 1024);
  EXPECT_EQ(named_gpt2("gpt2-medium").n_layer, 24);
  EXPECT_EQ(named_gpt2("gpt2-large").n_embd, 1280);
  EXPECT_THROW(named_gpt2("gpt3"), zt::ConfigError);
  EXPECT_THROW(GPT2(GPT2Config{2, 5, 128, 256, 64}), zt::ConfigError);  // 128 % 5 != 0
}

TEST(GPT2, HuggingFaceParameterNames) {
  auto m = tiny();
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  const std::vector<std::string> expect_first = {
      "wte.weight",          "wpe.weight",          "h.0.ln_1.weight",        "h.0.ln_1.bias",
      "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias",
      "h.0.ln_2.weight",     "h.0.ln_2.bias",       "h.0.mlp.c_fc.weight",    "h.0.mlp.c_fc.bias",
      "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias"};
  ASSERT_EQ(names.size(), 2 + 12 * 2 + 2u);
  for (size_t i = 0; i < expect_first.size(); ++i) EXPECT_EQ(names[i], expect_first[i]);
  EXPECT_EQ(names.back(), "ln_f.bias");
  EXPECT_EQ(m->named_parameters()["h.0.attn.c_attn.weight"].sizes(), torch::IntArrayRef({384, 128}));
  EXPECT_EQ(m->blocks().size(), 2u);
  EXPECT_EQ(m->blocks()[1].get(), m->h->ptr(1).get());
}

TEST(GPT2, ParameterCountsAndFlops) {
  // HF's GPT2LMHeadModel(...).num_parameters() for the OpenAI sizes (lm head tied).
  EXPECT_EQ(zt::models::gpt2_num_params(named_gpt2("gpt2")), 124439808);
  EXPECT_EQ(zt::models::gpt2_num_params(named_gpt2("gpt2-medium")), 354823168);
  EXPECT_EQ(zt::models::gpt2_num_params(named_gpt2("gpt2-large")), 774030080);
  EXPECT_EQ(zt::models::gpt2_num_params(named_gpt2("gpt2-xl")), 1557611200);
  // The formula agrees with the parameters a built model actually has.
  for (GPT2Config c : {named_gpt2("gpt2-tiny"), GPT2Config{3, 2, 64, 1000, 100}}) {
    GPT2 m(c);
    EXPECT_EQ(m->num_params(), zt::models::gpt2_num_params(c));
    EXPECT_EQ(m->num_params_non_embedding(), m->num_params() - c.n_positions * c.n_embd);
    EXPECT_DOUBLE_EQ(m->flops_per_token(50), 6.0 * m->num_params_non_embedding() + 12.0 * c.n_layer * c.n_embd * 50);
  }
  const double gpt2_1024 = 6.0 * (124439808 - 1024 * 768) + 12.0 * 12 * 768 * 1024;
  EXPECT_DOUBLE_EQ(zt::models::gpt2_flops_per_token(named_gpt2("gpt2"), 1024), gpt2_1024);
  EXPECT_NEAR(gpt2_1024, 0.855e9, 0.001e9);
}

TEST(GPT2, InitFollowsGpt2Scheme) {
  auto m = tiny(7);
  auto p = m->named_parameters();
  const double proj_std = 0.02 / std::sqrt(4.0);
  EXPECT_NEAR(p["wte.weight"].std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(p["h.0.mlp.c_fc.weight"].std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(p["h.1.mlp.c_proj.weight"].std().item<double>(), proj_std, 0.0005);
  EXPECT_NEAR(p["h.1.attn.c_proj.weight"].std().item<double>(), proj_std, 0.001);
  EXPECT_TRUE(torch::equal(p["h.0.attn.c_attn.bias"], torch::zeros({384})));
  EXPECT_TRUE(torch::equal(p["h.0.ln_1.weight"], torch::ones({128})));
  EXPECT_TRUE(torch::equal(p["ln_f.bias"], torch::zeros({128})));
}

TEST(GPT2, ForwardInFp32Bf16Fp16) {
  auto m = tiny();
  auto idx = tokens(2, 16, 256, 1);
  torch::NoGradGuard ng;
  auto ref = m->forward(idx);
  ASSERT_EQ(ref.sizes(), torch::IntArrayRef({2, 16, 256}));
  EXPECT_EQ(ref.scalar_type(), torch::kFloat);
  for (auto dt : {torch::kBFloat16, torch::kHalf}) {
    auto low = tiny();
    low->to(dt);
    auto out = low->forward(idx);
    EXPECT_EQ(out.scalar_type(), dt);
    auto diff = (out.to(torch::kFloat) - ref).abs().max().item<double>();
    // Logits are O(0.3) at init; bf16 keeps 8 mantissa bits, fp16 11.
    EXPECT_LT(diff, dt == torch::kBFloat16 ? 0.05 : 0.01) << dt;
    auto loss = low->loss(idx, idx);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
  }
}

TEST(GPT2, AttentionIsCausal) {
  auto m = tiny();
  torch::NoGradGuard ng;
  auto a = tokens(1, 32, 256, 3);
  auto b = a.clone();
  b.index_put_({0, 20}, (a.index({0, 20}) + 1) % 256);
  auto la = m->forward(a), lb = m->forward(b);
  EXPECT_TRUE(torch::allclose(la.narrow(1, 0, 20), lb.narrow(1, 0, 20), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(la.narrow(1, 20, 1), lb.narrow(1, 20, 1)));
  EXPECT_THROW(m->forward(tokens(1, 257, 256, 0)), zt::Error);  // > n_positions
}

TEST(GPT2, InitialLossIsUniform) {
  auto m = tiny();
  auto idx = tokens(4, 64, 256, 5);
  auto loss = m->loss(idx, tokens(4, 64, 256, 6)).item<double>();
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
  // -1 targets are ignored.
  auto t = tokens(4, 64, 256, 6);
  t.index_put_({torch::indexing::Slice(), torch::indexing::Slice(32)}, -1);
  auto half = m->loss(idx, t).item<double>();
  EXPECT_NEAR(half, std::log(256.0), 0.15);
}

namespace {

// Loss and every parameter gradient of one forward/backward.
std::pair<double, std::map<std::string, torch::Tensor>> loss_and_grads(GPT2& m, const torch::Tensor& x,
                                                                      const torch::Tensor& y) {
  m->zero_grad();
  auto loss = m->loss(x, y);
  loss.backward();
  std::map<std::string, torch::Tensor> g;
  for (const auto& p : m->named_parameters()) g[p.key()] = p.value().grad().clone();
  return {loss.item<double>(), g};
}

}  // namespace

TEST(GPT2, ActivationCheckpointingGivesIdenticalGradients) {
  auto m = tiny();
  auto x = tokens(2, 32, 256, 11), y = tokens(2, 32, 256, 12);
  auto [ref_loss, ref] = loss_and_grads(m, x, y);

  struct Case {
    std::optional<int64_t> n;
    bool cpu;
  };
  for (Case c : {Case{std::nullopt, false}, Case{1, false}, Case{std::nullopt, true}}) {
    int pre = 0, recompute = 0;
    m->set_block_hooks({[&](int64_t, bool rc) {
                          ++pre;
                          recompute += rc;
                        },
                        nullptr});
    m->set_activation_checkpointing(true, c.n, c.cpu);
    auto [loss, grads] = loss_and_grads(m, x, y);
    EXPECT_NEAR(loss, ref_loss, 1e-6);
    for (const auto& [name, g] : ref) {
      ASSERT_TRUE(grads[name].defined()) << name;
      EXPECT_TRUE(torch::allclose(grads[name], g, 1e-6, 1e-6)) << name << " n=" << c.n.value_or(-1);
    }
    const int ckpt_blocks = static_cast<int>(c.n.value_or(2));
    EXPECT_EQ(pre, 2 + ckpt_blocks);       // every block once, checkpointed ones again
    EXPECT_EQ(recompute, ckpt_blocks);     // ... flagged as recompute
  }
  m->set_block_hooks({});
  m->set_activation_checkpointing(false);
  EXPECT_THROW(m->set_activation_checkpointing(true, 3, false), zt::ConfigError);
}

TEST(GPT2, CheckpointFiresParameterHooksAndWorksWithoutInputGrad) {
  // Input that does not require grad (a frozen embedding): parameters inside still get
  // gradients, and their hooks fire during the recompute's backward.
  torch::manual_seed(0);
  torch::nn::Linear lin(8, 8);
  int fired = 0;
  lin->weight.register_hook([&](torch::Tensor g) {
    ++fired;
    return g;
  });
  auto x = torch::randn({4, 8});
  auto fn = [&](const torch::Tensor& t) { return torch::tanh(lin(t)); };
  fn(x).sum().backward();
  auto ref = lin->weight.grad().clone();
  lin->weight.mutable_grad().zero_();
  zt::models::checkpoint(fn, x).sum().backward();
  EXPECT_TRUE(torch::allclose(lin->weight.grad(), ref, 1e-7, 1e-7));
  EXPECT_EQ(fired, 2);
}

// The linear layers accumulate a weight gradient into an existing W.grad in the GEMM
// (ZeRO stages 0-1 keep .grad as views of the flat gradient buffer): the values equal
// autograd's, the buffer is the same one, and the accumulator's post-hooks (what the
// engine's gradient-ready hooks are) still fire once per backward.
TEST(GPT2, LinearAccumulatesIntoExistingGradAndFiresAccumulatorHooks) {
  auto m = tiny(11);
  auto idx = tokens(2, 16, 256, 1), tgt = tokens(2, 16, 256, 2);
  m->loss(idx, tgt).backward();  // no .grad yet: autograd creates them
  std::vector<torch::Tensor> g1;
  for (const auto& p : m->parameters()) g1.push_back(p.grad().clone());
  const auto w = m->named_parameters()["h.0.mlp.c_fc.weight"];
  const void* buf = w.grad().data_ptr();
  int fired = 0;
  auto acc = torch::autograd::impl::grad_accumulator(w);
  ASSERT_NE(acc, nullptr);
  acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [&](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
        ++fired;
        return out;
      }));
  for (const auto& p : m->parameters()) p.mutable_grad().zero_();
  m->loss(idx, tgt).backward();
  m->loss(idx, tgt).backward();
  EXPECT_EQ(fired, 2);
  EXPECT_EQ(w.grad().data_ptr(), buf);
  size_t i = 0;
  for (const auto& p : m->parameters()) {
    EXPECT_TRUE(torch::allclose(p.grad(), 2 * g1[i], 1e-5, 1e-6)) << "parameter " << i;
    ++i;
  }
}

// GPT-2's own linear and LayerNorm autograd functions against torch::nn's modules:
// outputs and every gradient, on a 3-D input, with and without an existing .grad.
TEST(GPT2, LinearAndLayerNormMatchTorchModules) {
  torch::manual_seed(5);
  torch::nn::Linear lin(16, 24);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({16}).eps(1e-5));
  ln->weight.data().uniform_(0.5, 1.5);
  ln->bias.data().uniform_(-0.5, 0.5);
  auto x = torch::randn({3, 5, 16}, torch::requires_grad());
  auto run = [&](bool ours) {
    for (auto* p : {&lin->weight, &lin->bias, &ln->weight, &ln->bias}) p->mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    torch::Tensor y;
    for (int pass = 0; pass < 2; ++pass) {  // the second accumulates into the existing .grad
      auto h = ours ? zt::models::layer_norm(ln, x) : ln(x);
      y = ours ? zt::models::linear(lin, h) : lin(h);
      y.pow(2).sum().backward();
    }
    return std::vector<torch::Tensor>{y.detach(), x.grad(), lin->weight.grad(), lin->bias.grad(),
                                      ln->weight.grad(), ln->bias.grad()};
  };
  auto ref = run(false);
  auto got = run(true);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << "output " << i;
    EXPECT_TRUE(torch::allclose(got[i], ref[i], 1e-5, 1e-6)) << "output " << i;
  }
}

// The LM head pads the vocabulary (100 -> 128 here) for aligned matmuls; logits, loss and
// every gradient must equal the unpadded model's with the same weights.
TEST(GPT2, PaddedLmHeadGivesTheUnpaddedLossAndGradients) {
  GPT2Config c{2, 2, 32, 100, 16};
  torch::manual_seed(7);
  GPT2 padded(c);
  c.lm_head_pad_multiple = 1;
  GPT2 plain(c);
  {
    torch::NoGradGuard g;
    auto src = padded->named_parameters();
    for (auto& kv : plain->named_parameters()) kv.value().copy_(src[kv.key()]);
  }
  EXPECT_EQ(padded->lm_head(torch::zeros({1, 1, 32})).size(-1), 128);
  EXPECT_EQ(plain->lm_head(torch::zeros({1, 1, 32})).size(-1), 100);
  auto idx = tokens(3, 16, 100, 11);
  auto tgt = tokens(3, 16, 100, 12);
  tgt.index_put_({0, 3}, -1);  // an ignored position
  EXPECT_EQ(padded->forward(idx).sizes(), (std::vector<int64_t>{3, 16, 100}));
  EXPECT_TRUE(torch::allclose(padded->forward(idx), plain->forward(idx), 1e-6, 1e-6));
  auto lp = padded->loss(idx, tgt);
  auto lq = plain->loss(idx, tgt);
  EXPECT_NEAR(lp.item<double>(), lq.item<double>(), 1e-6);
  lp.backward();
  lq.backward();
  auto gq = plain->named_parameters();
  for (auto& kv : padded->named_parameters()) {
    SCOPED_TRACE(kv.key());
    ASSERT_TRUE(kv.value().grad().defined());
    EXPECT_EQ(kv.value().grad().sizes(), gq[kv.key()].grad().sizes());
    EXPECT_TRUE(torch::allclose(kv.value().grad(), gq[kv.key()].grad(), 1e-5, 1e-6));
  }
}

// The chunked LM-head loss (the default for fp32/bf16) against the unfused one: same loss,
// same gradients for every parameter, with ignored targets, vocabulary padding and
// several chunks (chunk_rows 7 over 48 rows).
TEST(GPT2, FusedLmHeadLossMatchesTheUnfusedOne) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    GPT2Config c{2, 2, 32, 100, 16};
    torch::manual_seed(9);
    GPT2 fused(c);
    c.fused_lm_head_loss = false;
    GPT2 plain(c);
    {
      torch::NoGradGuard g;
      auto src = fused->named_parameters();
      for (auto& kv : plain->named_parameters()) kv.value().copy_(src[kv.key()]);
    }
    fused->to(dtype);
    plain->to(dtype);
    auto idx = tokens(3, 16, 100, 21);
    auto tgt = tokens(3, 16, 100, 22);
    tgt.index_put_({1, 5}, -1);
    tgt.index_put_({2, 0}, -1);
    const double tol = dtype == torch::kFloat ? 1e-5 : 2e-2;
    auto h = fused->hidden(idx).reshape({-1, 32});
    auto direct = zt::models::lm_head_cross_entropy(h, fused->wte->weight, tgt.reshape({-1}), 64, 7);
    auto lf = fused->loss(idx, tgt);
    auto lp = plain->loss(idx, tgt);
    EXPECT_NEAR(direct.item<double>(), lp.item<double>(), tol);
    EXPECT_NEAR(lf.item<double>(), lp.item<double>(), tol);
    (direct * 3.0).backward();  // upstream gradient 3: checks the backward scaling
    (lp * 3.0).backward();
    auto gp = plain->named_parameters();
    for (auto& kv : fused->named_parameters()) {
      SCOPED_TRACE(kv.key());
      ASSERT_TRUE(kv.value().grad().defined());
      const auto a = kv.value().grad().to(torch::kFloat), b = gp[kv.key()].grad().to(torch::kFloat);
      const double scale = b.abs().max().item<double>() + 1e-12;
      EXPECT_LT((a - b).abs().max().item<double>() / scale, dtype == torch::kFloat ? 1e-4 : 5e-2);
    }
  }
  // All targets ignored: loss 0, zero gradients, no division by zero.
  GPT2Config c{1, 2, 32, 100, 8};
  GPT2 m(c);
  auto l = m->loss(tokens(1, 8, 100, 3), torch::full({1, 8}, -1, torch::kLong));
  EXPECT_EQ(l.item<double>(), 0.0);
  l.backward();
  EXPECT_EQ(m->wte->weight.grad().abs().sum().item<double>(), 0.0);
}

TEST(GPT2, TinyModelLearns) {
  // Next token = current + 7 (mod 256): 30 AdamW steps must cut the loss far below
  // uniform (ln 256 = 5.55).
  auto m = tiny(3);
  auto x = (torch::arange(4).view({4, 1}) * 50 + torch::arange(32).view({1, 32}) * 7) % 256;  // (4, 32)
  auto y = (x + 7) % 256;
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    opt.zero_grad();
    auto loss = m->loss(x, y);
    loss.backward();
    opt.step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(256.0), 0.1);
  EXPECT_LT(last, 4.0);
}

TEST(GPT2, CudaForwardAndHostCheckpointing) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto m = tiny();
  auto x = tokens(2, 32, 256, 11), y = tokens(2, 32, 256, 12);
  auto [cpu_loss, cpu_grads] = loss_and_grads(m, x, y);
  m->to(torch::kCUDA);
  auto xc = x.cuda(), yc = y.cuda();
  auto [ref_loss, ref] = loss_and_grads(m, xc, yc);
  EXPECT_NEAR(ref_loss, cpu_loss, 1e-4);
  // Block inputs parked in pinned host memory come back bit-identical.
  m->set_activation_checkpointing(true, std::nullopt, /*cpu_checkpointing=*/true);
  auto [loss, grads] = loss_and_grads(m, xc, yc);
  EXPECT_NEAR(loss, ref_loss, 1e-6);
  for (const auto& [name, g] : ref) EXPECT_TRUE(torch::allclose(grads[name], g, 1e-5, 1e-6)) << name;
  m->set_activation_checkpointing(false);
  m->to(torch::kBFloat16);
  torch::NoGradGuard ng;
  auto out = m->forward(xc);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

}  // namespace zt_test_gpt2

// The chunked LM-head loss adds its weight gradient straight into an existing W.grad (the
// engine's flat buffer at ZeRO stages 0-1) in one pass; AccumulateGrad then gets no gradient,
// and its hooks still fire. Same values as a fresh gradient added to the buffer.
TEST(LmHeadLoss, AccumulatesTheWeightGradientIntoAnExistingGrad) {
  torch::manual_seed(3);
  auto x = torch::randn({12, 16}).requires_grad_();
  auto w = (torch::randn({50, 16}) * 0.1).requires_grad_();
  auto t = torch::randint(0, 50, {12}, torch::kLong);
  t[4] = -1;  // an ignored row
  zt::models::lm_head_cross_entropy(x, w, t, 8, 5).backward();  // no .grad yet: a fresh one
  const auto fresh = w.grad().clone(), dx = x.grad().clone();
  const auto before = torch::randn({50, 16});
  w.mutable_grad() = before.clone();
  x.mutable_grad() = torch::Tensor();
  const void* buf = w.grad().data_ptr();
  test_support::GradAccumulatorProbe probe(w);
  zt::models::lm_head_cross_entropy(x, w, t, 8, 5).backward();
  EXPECT_EQ(probe.calls, 1);
  EXPECT_EQ(probe.handed, 0) << "the loss returned a separate weight gradient for autograd to add";
  EXPECT_EQ(w.grad().data_ptr(), buf);
  EXPECT_TRUE(torch::allclose(w.grad(), before + fresh, 1e-6, 1e-6)) << (w.grad() - before - fresh).abs().max();
  EXPECT_TRUE(torch::equal(x.grad(), dx));
}
