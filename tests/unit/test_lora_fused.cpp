// [Fused LoRA Linear] (src/lora/lora_linear.h): the adapter's fused path (one autograd
// Function: base GEMM, the update added by addmm_'s alpha, x's two gradients summed in one
// addmm_) against the unfused one (base(x) + linear(linear(x, A), B) * scaling), forward
// and every gradient, for a plain base (W, optional bias) and an NF4 base, fp32 and bf16,
// x of 2 and 3 dims.
//  - fp32: fused and unfused agree within 1e-6 of the largest magnitude (the same products
//    rounded in another order); both equal an fp64 reference written out by hand
//    (x W^T + b + s x A^T B^T, its gradients by autograd in fp64) within 1e-5, so a scaling
//    dropped or applied twice (s = 2.5) fails however the two paths agree.
//  - bf16: within 3e-2 of the largest magnitude (the update is rounded to bf16 once in the
//    GEMM epilogue instead of three times: product, scaled product, sum; a few bf16 ulps).
//  - The fused path is the one taken (the output's graph holds LoraLinearFunction and no
//    add) exactly when no dropout acts and the base is frozen and of x's dtype; dropout in
//    training, a trainable base weight, A/B of another dtype keep the unfused graph.
//  - A tiny Llama with adapters on all seven projections: loss and adapter gradients of the
//    fused model equal the unfused one's (fp32, 1e-5 of the largest magnitude: two
//    layers of rounding-order differences).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <string>

#include "lora/lora.h"
#include "lora/lora_linear.h"
#include "lora/lora_models.h"
#include "lora/qlora.h"
#include "quant/nf4.h"
#include "support/tiny_llama.h"

namespace zt_test_lora_fused {
namespace F = torch::nn::functional;
namespace {

constexpr int64_t kIn = 24, kOut = 20, kR = 4;
constexpr double kScaling = 2.5;

double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const auto fa = a.to(torch::kDouble), fb = b.to(torch::kDouble);
  return (fa - fb).abs().max().item<double>() / std::max(fb.abs().max().item<double>(), 1e-30);
}

struct Case {
  torch::Dtype dt;
  bool bias;
  bool three_d;
  bool nf4;
};

std::string name(const Case& c) {
  return std::string(c.nf4 ? "nf4" : "plain") + (c.dt == torch::kFloat ? " fp32" : " bf16") +
         (c.bias ? " bias" : "") + (c.three_d ? " 3d" : " 2d");
}

// What one run gives: output and the gradients of x, A, B.
struct Result {
  torch::Tensor y, gx, gA, gB;
};

// The adapter (plain or NF4) on a Linear (kIn -> kOut), A and B random (B nonzero), base
// and all in c.dt.
struct Fixture {
  torch::nn::Linear lin{nullptr};
  zt::lora::LoraAdapter adapter{nullptr};
  torch::Tensor w_ref, b_ref;  // the base the adapter computes, fp64 (dequant(W) for NF4)

  explicit Fixture(const Case& c) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(21);
    lin = torch::nn::Linear(torch::nn::LinearOptions(kIn, kOut).bias(c.bias));
    torch::NoGradGuard ng;
    lin->weight.copy_(at::randn({kOut, kIn}, g) * 0.2);
    if (c.bias) lin->bias.copy_(at::randn({kOut}, g) * 0.2);
    auto a = zt::lora::LoraAdapter(kIn, kOut, kR, kScaling, 0.0, torch::TensorOptions().dtype(torch::kFloat));
    a->lora_A.copy_(at::randn({kR, kIn}, g) * 0.3);
    a->lora_B.copy_(at::randn({kOut, kR}, g) * 0.3);
    if (c.nf4) {
      auto q = std::make_shared<zt::lora::QLoraAdapterImpl>(*a, lin->weight.detach(),
                                                            c.bias ? lin->bias : torch::Tensor());
      w_ref = q->base_weight().to(torch::kDouble);
      adapter = zt::lora::LoraAdapter(std::static_pointer_cast<zt::lora::LoraAdapterImpl>(q));
      lin->weight.set_data(torch::empty({0}));  // the placeholder quantize_lora_bases leaves
    } else {
      adapter = a;
      w_ref = lin->weight.to(c.dt).to(torch::kDouble);
    }
    if (c.bias) b_ref = lin->bias.to(c.dt).to(torch::kDouble);
    lin->to(c.dt);
    adapter->to(c.dt);
    for (auto& p : lin->parameters(/*recurse=*/false)) p.set_requires_grad(false);
  }

  Result run(const torch::Tensor& x0, const torch::Tensor& gy, bool fused) {
    adapter->set_fused(fused);
    for (auto* p : {&adapter->lora_A, &adapter->lora_B}) p->mutable_grad() = torch::Tensor();
    const auto x = x0.clone().requires_grad_(true);
    const auto& l = lin;
    auto y = adapter->adapt(x, *lin, [&l](const torch::Tensor& t) {
      return F::linear(t, l->weight, l->bias.defined() ? l->bias : torch::Tensor());
    });
    y.backward(gy);
    return {y.detach(), x.grad(), adapter->lora_A.grad(), adapter->lora_B.grad()};
  }

  // The definition in fp64, by hand.
  Result reference(const torch::Tensor& x0, const torch::Tensor& gy) const {
    const auto x = x0.to(torch::kDouble).requires_grad_(true);
    const auto A = adapter->lora_A.detach().to(torch::kDouble).requires_grad_(true);
    const auto B = adapter->lora_B.detach().to(torch::kDouble).requires_grad_(true);
    auto y = at::matmul(x, w_ref.t()) + kScaling * at::matmul(at::matmul(x, A.t()), B.t());
    if (b_ref.defined()) y = y + b_ref;
    y.backward(gy.to(torch::kDouble));
    return {y.detach(), x.grad(), A.grad(), B.grad()};
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool nf4 : {false, true})
    for (auto dt : {torch::kFloat, torch::kBFloat16})
      for (bool bias : {false, true})
        for (bool three_d : {false, true}) out.push_back({dt, bias, three_d, nf4});
  return out;
}

std::string graph_names(const torch::Tensor& y) {
  std::string s;
  std::vector<torch::autograd::Node*> todo{y.grad_fn().get()};
  for (int i = 0; i < 6 && !todo.empty(); ++i) {
    std::vector<torch::autograd::Node*> next;
    for (auto* n : todo) {
      if (!n) continue;
      s += n->name() + " ";
      for (const auto& e : n->next_edges()) next.push_back(e.function.get());
    }
    todo = std::move(next);
  }
  return s;
}

}  // namespace

TEST(LoraFused, EqualsTheUnfusedPathAndTheDefinition) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    Fixture f(c);
    auto g = at::make_generator<at::CPUGeneratorImpl>(22);
    const auto shape = c.three_d ? std::vector<int64_t>{3, 5, kIn} : std::vector<int64_t>{7, kIn};
    auto oshape = shape;
    oshape.back() = kOut;
    const auto x = at::randn(shape, g).to(c.dt);
    const auto gy = at::randn(oshape, g).to(c.dt);
    const Result fu = f.run(x, gy, true), un = f.run(x, gy, false), ref = f.reference(x, gy);
    ASSERT_EQ(fu.y.sizes(), c10::IntArrayRef(oshape));
    ASSERT_EQ(fu.y.scalar_type(), c.dt);
    ASSERT_TRUE(fu.gx.defined() && fu.gA.defined() && fu.gB.defined());
    EXPECT_EQ(fu.gx.scalar_type(), c.dt);
    const double tol = c.dt == torch::kFloat ? 1e-6 : 3e-2;
    EXPECT_LE(rel_diff(fu.y, un.y), tol) << "y";
    EXPECT_LE(rel_diff(fu.gx, un.gx), tol) << "grad x";
    EXPECT_LE(rel_diff(fu.gA, un.gA), tol) << "grad A";
    EXPECT_LE(rel_diff(fu.gB, un.gB), tol) << "grad B";
    // Against the definition (catches a scaling dropped or doubled on both paths alike).
    const double rtol = c.dt == torch::kFloat ? 1e-5 : 3e-2;
    for (const Result* r : {&fu, &un}) {
      EXPECT_LE(rel_diff(r->y, ref.y), rtol) << (r == &fu ? "fused" : "unfused") << " y";
      EXPECT_LE(rel_diff(r->gx, ref.gx), rtol) << (r == &fu ? "fused" : "unfused") << " grad x";
      EXPECT_LE(rel_diff(r->gA, ref.gA), rtol) << (r == &fu ? "fused" : "unfused") << " grad A";
      EXPECT_LE(rel_diff(r->gB, ref.gB), rtol) << (r == &fu ? "fused" : "unfused") << " grad B";
    }
  }
}

// The update matters in the comparison: with the scaling doubled (or 0) the reference
// moves by far more than the tolerance.
TEST(LoraFused, TheScalingIsVisibleToTheTest) {
  Fixture f({torch::kFloat, true, true, false});
  auto g = at::make_generator<at::CPUGeneratorImpl>(23);
  const auto x = at::randn({3, 5, kIn}, g);
  const auto gy = at::randn({3, 5, kOut}, g);
  const Result fu = f.run(x, gy, true);
  const auto base = at::matmul(x.to(torch::kDouble), f.w_ref.t()) + f.b_ref;
  const auto upd = (fu.y.to(torch::kDouble) - base) / kScaling;  // x A^T B^T
  EXPECT_GT(rel_diff(base + 2 * kScaling * upd, fu.y), 1e-2);
  EXPECT_GT(rel_diff(base, fu.y), 1e-2);
  const Result ref = f.reference(x, gy);
  EXPECT_GT(rel_diff(fu.gB * 2, ref.gB), 0.5);
  EXPECT_LE(rel_diff(fu.gB, ref.gB), 1e-5);
}

TEST(LoraFused, TakenOnlyWhenNoDropoutActsAndTheBaseIsFrozenInXsDtype) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(24);
  const auto x = at::randn({2, 3, kIn}, g).requires_grad_(true);
  for (bool nf4 : {false, true}) {
    SCOPED_TRACE(nf4 ? "nf4" : "plain");
    Fixture f({torch::kFloat, true, true, nf4});
    const auto& l = f.lin;
    auto base = [&l](const torch::Tensor& t) { return F::linear(t, l->weight, l->bias); };
    auto fused_graph = [&](const torch::Tensor& in) {
      const auto s = graph_names(f.adapter->adapt(in, *f.lin, base));
      return s.find("LoraLinearFunction") != std::string::npos && s.find("AddBackward") == std::string::npos;
    };
    EXPECT_TRUE(fused_graph(x));
    f.adapter->set_fused(false);
    EXPECT_FALSE(fused_graph(x));
    f.adapter->set_fused(true);
    // A and B in another dtype than x: unfused (x is cast to A's dtype, the update back).
    EXPECT_FALSE(f.adapter->fusable(x.to(torch::kDouble), torch::Tensor(), torch::Tensor()));
    EXPECT_FALSE(f.adapter->fusable(x, f.lin->weight.to(torch::kDouble), torch::Tensor()));
    // Dropout acts in training: unfused; in eval it does not: fused.
    auto dropped = zt::lora::LoraAdapter(kIn, kOut, kR, kScaling, 0.1, torch::TensorOptions());
    EXPECT_FALSE(dropped->fusable(x, torch::Tensor(), torch::Tensor()));
    dropped->eval();
    EXPECT_TRUE(dropped->fusable(x, torch::Tensor(), torch::Tensor()));
    if (!nf4) {
      // A trainable base: unfused, and its gradient arrives.
      f.lin->weight.set_requires_grad(true);
      const auto y = f.adapter->adapt(x, *f.lin, base);
      EXPECT_EQ(graph_names(y).find("LoraLinearFunction"), std::string::npos);
      y.sum().backward();
      EXPECT_TRUE(f.lin->weight.grad().defined());
      f.lin->weight.set_requires_grad(false);
      f.lin->bias.set_requires_grad(true);
      EXPECT_FALSE(fused_graph(x));
    }
  }
}

// The whole model: a tiny Llama, adapters on all seven projections (plain, then NF4), loss
// and adapter gradients fused vs unfused.
TEST(LoraFused, TinyLlamaLossAndGradientsEqualTheUnfusedModel) {
  for (bool nf4 : {false, true}) {
    SCOPED_TRACE(nf4 ? "nf4" : "plain");
    auto m = zt_test::tiny_qlora_llama();
    zt::lora::LoraOptions o;
    o.r = 4;
    o.alpha = 10;
    o.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    auto lm = zt::lora::apply_lora(*m, zt::lora::lora_space(*m).sites, o);
    {
      torch::NoGradGuard ng;
      auto g = at::make_generator<at::CPUGeneratorImpl>(25);
      for (const auto& a : lm.adapters) a.adapter->lora_B.copy_(at::randn(a.adapter->lora_B.sizes(), g) * 0.3);
    }
    if (nf4) zt::lora::quantize_lora_bases(lm);
    auto g = at::make_generator<at::CPUGeneratorImpl>(26);
    const auto ids = at::randint(0, 64, {2, 12}, g), labels = at::randint(0, 64, {2, 12}, g);
    auto step = [&](bool fused) {
      for (auto& a : lm.adapters) {
        a.adapter->set_fused(fused);
        a.adapter->lora_A.mutable_grad() = torch::Tensor();
        a.adapter->lora_B.mutable_grad() = torch::Tensor();
      }
      auto loss = m->loss(ids, labels);
      loss.backward();
      std::vector<torch::Tensor> out{loss.detach()};
      for (const auto& p : lm.parameters()) out.push_back(p.grad().clone());
      return out;
    };
    const auto fu = step(true), un = step(false);
    ASSERT_EQ(fu.size(), un.size());
    for (size_t i = 0; i < fu.size(); ++i) EXPECT_LE(rel_diff(fu[i], un[i]), 1e-5) << "tensor " << i;
  }
}

}  // namespace zt_test_lora_fused
