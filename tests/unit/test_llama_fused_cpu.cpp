// [Llama Fused Ops] on the CPU: llama_rms_norm, llama_rope and llama_swiglu are the
// formulations models/llama.cpp had inline before the fused CUDA path (written out again
// here), bit for bit, forward and gradients, in fp32 and bf16, with the fused switch on
// (the CPU never takes the kernels). The CPU Llama tests pin transformers' numerics on
// top of these.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/llama_fused.h"

namespace zt::models {
namespace {

namespace F = torch::nn::functional;

torch::Tensor old_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const auto xf = x.to(torch::kFloat);
  const auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * y.to(x.scalar_type());
}

torch::Tensor old_rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

torch::Tensor old_rope(const torch::Tensor& q, const torch::Tensor& cos, const torch::Tensor& sin) {
  return q * cos + old_rotate_half(q) * sin;
}

torch::Tensor old_swiglu(const torch::Tensor& g, const torch::Tensor& u) { return F::silu(g) * u; }

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.equal(b);
}

// Runs f on fresh leaves copied from `inputs` (all requiring grad), backward with dy;
// returns the output and the leaves' gradients.
template <typename Fn>
std::vector<torch::Tensor> run(Fn f, const std::vector<torch::Tensor>& inputs, const torch::Tensor& dy) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.clone().requires_grad_(true));
  auto y = f(leaves);
  y.backward(dy);
  std::vector<torch::Tensor> out{y.detach()};
  for (const auto& l : leaves) out.push_back(l.grad());
  return out;
}

void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << what << ": output " << i << " differs";
}

class LlamaFusedCpu : public ::testing::TestWithParam<torch::ScalarType> {
 protected:
  void SetUp() override { set_llama_fused(true); }
  torch::Tensor randn(at::IntArrayRef s) const { return torch::randn(s).to(GetParam()); }
};

TEST_P(LlamaFusedCpu, RmsNormIsTheInlineFormula) {
  torch::manual_seed(1);
  const auto x = randn({2, 5, 67}) * 3, w = randn({67}) * 0.1 + 1, dy = randn({2, 5, 67});
  const auto fused = run([](auto& l) { return llama_rms_norm(l[0], l[1], 1e-5); }, {x, w}, dy);
  const auto old = run([](auto& l) { return old_rms_norm(l[0], l[1], 1e-5); }, {x, w}, dy);
  expect_same(fused, old, "rms_norm");
}

TEST_P(LlamaFusedCpu, RopeIsTheInlineFormula) {
  torch::manual_seed(2);
  for (const bool per_example : {false, true}) {
    const auto x = randn({2, 7, 3, 16}).transpose(1, 2);  // (B, H, T, hd) as the model views it
    const auto cos = per_example ? randn({2, 1, 7, 16}) : randn({7, 16});
    const auto sin = per_example ? randn({2, 1, 7, 16}) : randn({7, 16});
    const auto dy = randn({2, 3, 7, 16});
    const auto fused = run([&](auto& l) { return llama_rope(l[0], cos, sin); }, {x}, dy);
    const auto old = run([&](auto& l) { return old_rope(l[0], cos, sin); }, {x}, dy);
    expect_same(fused, old, per_example ? "rope (B, 1, T, hd)" : "rope (T, hd)");
  }
}

TEST_P(LlamaFusedCpu, SwigluIsTheInlineFormula) {
  torch::manual_seed(3);
  const auto g = randn({3, 5, 24}) * 4, u = randn({3, 5, 24}), dy = randn({3, 5, 24});
  const auto fused = run([](auto& l) { return llama_swiglu(l[0], l[1]); }, {g, u}, dy);
  const auto old = run([](auto& l) { return old_swiglu(l[0], l[1]); }, {g, u}, dy);
  expect_same(fused, old, "swiglu");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LlamaFusedCpu, ::testing::Values(torch::kFloat, torch::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace zt::models
