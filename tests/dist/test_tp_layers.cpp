// Tensor-parallel layers (src/tp) on real ranks against the unsplit layer, fp32.
//
// The tp group is the whole world (tp = 1, 2, 4 as ctest runs zt_dist). Every rank draws
// the same full weights and inputs (same seed), runs the unsplit reference locally and the
// tp layer over the group, and compares: outputs, input gradients and weight/bias
// gradients (this rank's slice of the reference's, see [TP Slices]) within 1e-6 of the
// largest reference magnitude (at least 1e-6 absolute). The only difference is summation
// order (partial products summed by the all-reduce): ~1e-7 relative. The backward goes through a fixed random projection r of the
// output, so every gradient is dense and distinct. Checks never skip a collective.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "tp/cross_entropy.h"
#include "tp/layers.h"
#include "tp/mappings.h"
#include "tp/shard.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::tp {
namespace test_tp_layers {
namespace {

namespace F = torch::nn::functional;
constexpr double kTol = 1e-6;
constexpr int64_t kB = 2, kT = 8, kIn = 16, kOut = 24;

comm::GroupPtr world() { return comm::world_group(); }

// |a - b| <= 1e-6 x max(1, max |b|): gradients summed over B*T rows reach ~10, where fp32's
// rounding of a different summation order is ~1e-6 absolute.
void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double d = (a - b).abs().max().item<double>();
  const double tol = kTol * std::max(1.0, b.abs().max().item<double>());
  EXPECT_LE(d, tol) << what << ": max |diff| " << d;
}

struct Ref {
  torch::Tensor x, w, b, r;  // input, weight (out, in), bias, output projection
};
Ref make_ref(int64_t in, int64_t out) {
  torch::manual_seed(11);
  return {torch::randn({kB, kT, in}), torch::randn({out, in}) * 0.3, torch::randn({out}), torch::randn({kB, kT, out})};
}

// Reference: y, dx, dw, db of y = x w^T + b with loss (y * r).sum().
struct Grads {
  torch::Tensor y, dx, dw, db;
};
Grads reference(const Ref& ref) {
  auto x = ref.x.clone().requires_grad_(true);
  auto w = ref.w.clone().requires_grad_(true);
  auto b = ref.b.clone().requires_grad_(true);
  auto y = F::linear(x, w, b);
  (y * ref.r).sum().backward();
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

class TpColumn : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(TpColumn, MatchesUnsplitLinear) {
  const auto [gather_output, sp] = GetParam();
  auto g = world();
  const int n = g->size(), rank = g->rank();
  const auto ref = make_ref(kIn, kOut);
  const auto want = reference(ref);
  ColumnParallelOptions o;
  o.gather_output = gather_output;
  o.sequence_parallel = sp;
  ColumnParallelLinear layer(kIn, kOut, g, o);
  {
    torch::NoGradGuard ng;
    layer->weight.copy_(cut(ref.w, {0}, rank, n));
    layer->bias.copy_(cut(ref.b, {0}, rank, n));
  }
  auto x = (sp ? own_slice(ref.x, 1, rank, n) : ref.x.clone()).requires_grad_(true);
  auto y = layer(x);
  // The loss is split like y: its sum over ranks is the reference loss.
  const auto r = gather_output ? ref.r / n : own_slice(ref.r, -1, rank, n);
  (y * r).sum().backward();
  expect_close(y.detach(), gather_output ? want.y : own_slice(want.y, -1, rank, n), "output");
  // gather_output: each rank's loss holds 1/n of every column, so every gradient is 1/n.
  const double s = gather_output ? 1.0 / n : 1.0;
  expect_close(x.grad(), (sp ? own_slice(want.dx, 1, rank, n) : want.dx) * s, "input gradient");
  expect_close(layer->weight.grad(), cut(want.dw, {0}, rank, n) * s, "weight gradient");
  expect_close(layer->bias.grad(), cut(want.db, {0}, rank, n) * s, "bias gradient");
}

INSTANTIATE_TEST_SUITE_P(Options, TpColumn,
                         ::testing::Values(std::make_tuple(false, false), std::make_tuple(true, false),
                                           std::make_tuple(false, true)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "gather_output" : "parallel_output") +
                                  (std::get<1>(info.param) ? "_sequence_parallel" : "");
                         });

class TpRow : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(TpRow, MatchesUnsplitLinear) {
  const auto [input_is_parallel, sp] = GetParam();
  auto g = world();
  const int n = g->size(), rank = g->rank();
  const auto ref = make_ref(kIn, kOut);
  const auto want = reference(ref);
  RowParallelOptions o;
  o.input_is_parallel = input_is_parallel;
  o.sequence_parallel = sp;
  RowParallelLinear layer(kIn, kOut, g, o);
  {
    torch::NoGradGuard ng;
    layer->weight.copy_(cut(ref.w, {1}, rank, n));
    layer->bias.copy_(ref.b);
  }
  auto x = (input_is_parallel ? own_slice(ref.x, -1, rank, n) : ref.x.clone()).requires_grad_(true);
  auto y = layer(x);
  // Without sequence parallelism y is the full output on every rank: each rank's loss is
  // 1/n of the reference's. With it, each rank holds its positions.
  const auto r = sp ? own_slice(ref.r, 1, rank, n) : ref.r / n;
  (y * r).sum().backward();
  expect_close(y.detach(), sp ? own_slice(want.y, 1, rank, n) : want.y, "output");
  const double s = sp ? 1.0 : 1.0 / n;
  expect_close(x.grad(), (input_is_parallel ? own_slice(want.dx, -1, rank, n) : want.dx) * s, "input gradient");
  expect_close(layer->weight.grad(), cut(want.dw, {1}, rank, n) * s, "weight gradient");
  expect_close(layer->bias.grad(), want.db * s, "bias gradient");
}

INSTANTIATE_TEST_SUITE_P(Options, TpRow,
                         ::testing::Values(std::make_tuple(true, false), std::make_tuple(false, false),
                                           std::make_tuple(true, true)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "parallel_input" : "full_input") +
                                  (std::get<1>(info.param) ? "_sequence_parallel" : "");
                         });

// Column then row (an MLP), with and without sequence parallelism, against the unsplit
// MLP: the pair needs exactly one all-reduce (or one all-gather + one reduce-scatter).
TEST(TpMlp, ColumnThenRowMatchesUnsplitAndCountsCollectives) {
  auto g = world();
  const int n = g->size(), rank = g->rank();
  torch::manual_seed(3);
  const auto x0 = torch::randn({kB, kT, kIn}), w1 = torch::randn({4 * kIn, kIn}) * 0.2, b1 = torch::randn({4 * kIn});
  const auto w2 = torch::randn({kIn, 4 * kIn}) * 0.2, b2 = torch::randn({kIn}), r = torch::randn({kB, kT, kIn});
  auto xr = x0.clone().requires_grad_(true);
  auto W1 = w1.clone().requires_grad_(true), W2 = w2.clone().requires_grad_(true), B2 = b2.clone().requires_grad_(true);
  auto yr = F::linear(torch::gelu(F::linear(xr, W1, b1), "tanh"), W2, B2);
  (yr * r).sum().backward();
  for (bool sp : {false, true}) {
    ColumnParallelOptions co;
    co.sequence_parallel = sp;
    RowParallelOptions ro;
    ro.sequence_parallel = sp;
    ColumnParallelLinear fc(kIn, 4 * kIn, g, co);
    RowParallelLinear proj(4 * kIn, kIn, g, ro);
    {
      torch::NoGradGuard ng;
      fc->weight.copy_(cut(w1, {0}, rank, n));
      fc->bias.copy_(cut(b1, {0}, rank, n));
      proj->weight.copy_(cut(w2, {1}, rank, n));
      proj->bias.copy_(b2);
    }
    auto x = (sp ? own_slice(x0, 1, rank, n) : x0.clone()).requires_grad_(true);
    const int64_t seq0 = g->sequence();
    auto y = proj(torch::gelu(fc(x), "tanh"));
    const int64_t fwd = g->sequence() - seq0;
    (y * (sp ? own_slice(r, 1, rank, n) : r / n)).sum().backward();
    const std::string tag = sp ? "sequence parallel: " : "tensor parallel: ";
    if (n > 1) {
      // Forward: one all-reduce, or one all-gather and one reduce-scatter.
      EXPECT_EQ(fwd, sp ? 2 : 1) << tag << "collectives in forward";
    }
    const double s = sp ? 1.0 : 1.0 / n;
    expect_close(y.detach(), sp ? own_slice(yr.detach(), 1, rank, n) : yr.detach(), tag + "output");
    expect_close(x.grad(), (sp ? own_slice(xr.grad(), 1, rank, n) : xr.grad()) * s, tag + "input gradient");
    expect_close(fc->weight.grad(), cut(W1.grad(), {0}, rank, n) * s, tag + "fc weight gradient");
    expect_close(proj->weight.grad(), cut(W2.grad(), {1}, rank, n) * s, tag + "proj weight gradient");
    expect_close(proj->bias.grad(), B2.grad() * s, tag + "proj bias gradient");
  }
}

// A vocabulary of 255 (divides by neither 2 nor 4) padded to 256: lookups and the
// weight gradient equal the unsplit embedding's; the padding row is never selected.
TEST(TpVocabEmbedding, PaddedVocabularyMatchesUnsplit) {
  auto g = world();
  const int n = g->size(), rank = g->rank();
  constexpr int64_t V = 255, C = 8;
  torch::manual_seed(5);
  const auto w = torch::randn({V, C});
  auto idx = torch::randint(0, V, {kB, kT});
  idx[0][0] = V - 1;  // the last real row (on the last rank, next to the padding)
  idx[1][0] = 0;
  const auto r = torch::randn({kB, kT, C});
  auto W = w.clone().requires_grad_(true);
  auto yr = F::embedding(idx, W);
  (yr * r).sum().backward();

  for (bool sp : {false, true}) {
    VocabParallelEmbedding emb(V, C, g, /*pad_multiple=*/1, sp);
    EXPECT_EQ(emb->padded_size, padded_vocab(V, n));
    EXPECT_EQ(emb->weight.size(0), emb->padded_size / n);
    const SplitSpec spec{0, 1, emb->padded_size};
    {
      torch::NoGradGuard ng;
      emb->weight.copy_(cut(w, spec, rank, n));
    }
    auto y = emb(idx);
    (y * (sp ? own_slice(r, 1, rank, n) : r / n)).sum().backward();
    const std::string tag = sp ? "sequence parallel: " : "";
    const double s = sp ? 1.0 : 1.0 / n;
    expect_close(y.detach(), sp ? own_slice(yr.detach(), 1, rank, n) : yr.detach(), tag + "lookup");
    expect_close(emb->weight.grad(), cut(W.grad(), spec, rank, n) * s, tag + "weight gradient");
    // Padding rows (ids >= V) get no gradient.
    if (emb->vocab_end > V) {
      const int64_t first = V - emb->vocab_start;
      EXPECT_EQ(emb->weight.grad().narrow(0, first, emb->vocab_end - V).abs().max().item<double>(), 0.0) << tag;
    }
    // Joining the slices gives back the (V, C) table.
    expect_close(gather_full(emb->weight.detach(), spec, V, g), w, tag + "gather_full");
  }
}

// Vocab-parallel cross entropy: the padded vocabulary's last columns hold huge logits
// that would dominate the loss if they were not masked; ignored targets (-1) and a target
// in the last real column. Loss and logit gradient equal F::cross_entropy over V columns.
TEST(TpCrossEntropy, PaddedVocabularyMatchesUnsplit) {
  auto g = world();
  const int n = g->size(), rank = g->rank();
  constexpr int64_t V = 255, N = 12;
  const int64_t Vp = padded_vocab(V, n, 4);  // 256
  torch::manual_seed(9);
  auto logits = torch::randn({N, Vp}) * 3;
  logits.narrow(1, V, Vp - V).fill_(50.0);  // padding: must not count
  auto targets = torch::randint(0, V, {N});
  targets[0] = V - 1;
  targets[1] = -1;
  targets[5] = -1;
  auto L = logits.narrow(1, 0, V).clone().requires_grad_(true);
  auto want = F::cross_entropy(L, targets, F::CrossEntropyFuncOptions().ignore_index(-1));
  want.backward();

  auto mine = own_slice(logits, 1, rank, n).requires_grad_(true);
  auto loss = vocab_parallel_cross_entropy(mine, targets, V, g);
  (loss * 2.0).backward();  // the incoming gradient scales the logit gradient
  EXPECT_NEAR(loss.item<double>(), want.item<double>(), kTol);
  auto full_grad = torch::cat({L.grad() * 2.0, torch::zeros({N, Vp - V})}, 1);
  expect_close(mine.grad(), own_slice(full_grad, 1, rank, n), "logit gradient");
}

TEST(TpCrossEntropy, AllTargetsIgnoredGivesZero) {
  auto g = world();
  auto logits = torch::randn({3, 8}).requires_grad_(true);
  auto loss = vocab_parallel_cross_entropy(logits, torch::full({3}, -1, torch::kLong), 8 * g->size(), g);
  loss.backward();
  EXPECT_EQ(loss.item<double>(), 0.0);
  EXPECT_EQ(logits.grad().abs().max().item<double>(), 0.0);
}

// Gather-then-scatter along the sequence is the identity; both mappings' backwards are
// each other's forwards (reduce-scatter of a gathered gradient sums n copies).
TEST(TpMappings, SequenceGatherAndReduceScatterAreConjugate) {
  auto g = world();
  const int n = g->size(), rank = g->rank();
  torch::manual_seed(2);
  const auto full = torch::randn({kB, kT, 4});
  auto x = own_slice(full, 1, rank, n).requires_grad_(true);
  auto y = gather_from_sequence(x, g, 1);
  expect_close(y.detach(), full, "all-gather along the sequence");
  y.sum().backward();
  expect_close(x.grad(), torch::full_like(x, static_cast<double>(n)), "reduce-scatter of the gradient");

  auto z = full.clone().requires_grad_(true);
  auto s = reduce_scatter_to_sequence(z, g, 1);
  expect_close(s.detach(), own_slice(full, 1, rank, n) * n, "reduce-scatter along the sequence");
  (s * 2).sum().backward();
  expect_close(z.grad(), torch::full_like(full, 2.0), "all-gather of the gradient");
}

TEST(TpLayers, SizesThatDoNotDivideAreConfigErrors) {
  auto g = world();
  if (g->size() == 1) GTEST_SKIP() << "every size divides by one rank: needs 2 or more ranks";
  const int n = g->size();
  EXPECT_THROW(ColumnParallelLinear(8, 8 * n + 1, g), zt::ConfigError);
  EXPECT_THROW(RowParallelLinear(8 * n + 1, 8, g), zt::ConfigError);
  ColumnParallelOptions qkv;
  qkv.blocks = 3;
  EXPECT_THROW(ColumnParallelLinear(8, 3 * (2 * n + 1), g, qkv), zt::ConfigError);  // blocks of 2n+1
  EXPECT_THROW(cut(torch::zeros({6 * n + 3, 2}), {0, 3, 0}, 0, n), zt::ConfigError);
}

}  // namespace
}  // namespace test_tp_layers
}  // namespace zt::tp
