// Data: byte tokenizer, token datasets, PyTorch-compatible DistributedSampler, Loader
// (determinism, epochs, exact resume, error propagation).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "zerotrain/data/loader.h"
#include "zerotrain/data/sampler.h"
#include "zerotrain/error.h"

namespace zt_test_data {

namespace fs = std::filesystem;
using namespace zt::data;

namespace {

std::string temp_file(const std::string& tag, const std::string& content) {
  auto p = fs::temp_directory_path() / ("zt_data_" + std::to_string(::getpid()) + "_" + tag);
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}

std::vector<int64_t> to_vec(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kLong);
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace

TEST(DataTokenizer, ByteRoundTrip) {
  ByteTokenizer tok;
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  const std::string text = "héllo, wörld \xF0\x9F\x98\x80" + all;
  auto ids = tok.encode(text);
  EXPECT_EQ(ids.scalar_type(), torch::kLong);
  EXPECT_EQ(ids.numel(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(ids.max().item<int64_t>(), 255);
  EXPECT_EQ(ids[0].item<int64_t>(), 'h');
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.decode(ids.view({1, -1}).to(torch::kInt)), text);
  EXPECT_EQ(tok.decode(tok.encode("")), "");
  EXPECT_THROW(tok.decode(torch::tensor({65, 256})), zt::Error);
  EXPECT_THROW(tok.decode(torch::tensor({-1})), zt::Error);
}

TEST(DataTokenDataset, WindowsOfSeqPlusOne) {
  const auto path = temp_file("text", "abcdefghijk");  // 11 tokens
  TokenDataset ds(path, 4);
  EXPECT_EQ(ds.size(), 2);  // (11 - 1) / 4
  auto e0 = ds.get(0), e1 = ds.get(1);
  EXPECT_EQ(to_vec(e0.x), (std::vector<int64_t>{'a', 'b', 'c', 'd'}));
  EXPECT_EQ(to_vec(e0.y), (std::vector<int64_t>{'b', 'c', 'd', 'e'}));
  EXPECT_EQ(to_vec(e1.x), (std::vector<int64_t>{'e', 'f', 'g', 'h'}));
  EXPECT_EQ(to_vec(e1.y), (std::vector<int64_t>{'f', 'g', 'h', 'i'}));
  EXPECT_EQ(e0.x.scalar_type(), torch::kLong);
  EXPECT_THROW(ds.get(2), zt::Error);
  try {
    TokenDataset short_ds(path, 11);
    ADD_FAILURE();
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(TokenDataset("/nonexistent/zt_file", 4), zt::Error);
  fs::remove(path);
}

TEST(DataTokenDataset, Uint16Tokens) {
  std::string raw;
  for (uint16_t v : {50256, 1, 300, 65535, 7}) {
    raw.push_back(static_cast<char>(v & 0xff));
    raw.push_back(static_cast<char>(v >> 8));
  }
  const auto path = temp_file("u16", raw);
  TokenDataset ds(path, 2, TokenFormat::kUint16);
  EXPECT_EQ(ds.num_tokens(), 5);
  EXPECT_EQ(to_vec(ds.get(0).x), (std::vector<int64_t>{50256, 1}));
  EXPECT_EQ(to_vec(ds.get(1).y), (std::vector<int64_t>{65535, 7}));
  const auto odd = temp_file("u16odd", raw.substr(0, 3));
  EXPECT_THROW(TokenDataset(odd, 1, TokenFormat::kUint16), zt::Error);
  fs::remove(path);
  fs::remove(odd);
}

TEST(DataRandomTokens, DeterministicPerIndex) {
  RandomTokenDataset a(50257, 16, 42), b(50257, 16, 42), c(50257, 16, 43);
  auto e = a.get(7);
  EXPECT_TRUE(torch::equal(e.x, b.get(7).x));
  EXPECT_TRUE(torch::equal(e.y, b.get(7).y));
  EXPECT_FALSE(torch::equal(e.x, a.get(8).x));
  EXPECT_FALSE(torch::equal(e.x, c.get(7).x));
  EXPECT_TRUE(torch::equal(e.x.narrow(0, 1, 15), e.y.narrow(0, 0, 15)));  // y is x shifted
  EXPECT_GE(e.x.min().item<int64_t>(), 0);
  EXPECT_LT(e.x.max().item<int64_t>(), 50257);
}

TEST(DataSampler, PartitionsAreDisjointAndCovering) {
  for (int64_t world : {1, 2, 4, 5}) {
    std::set<int64_t> seen;
    size_t total = 0;
    for (int64_t r = 0; r < world; ++r) {
      DistributedSampler s(20, r, world, /*shuffle=*/true, /*seed=*/3);
      s.set_epoch(1);
      auto idx = s.indices();
      EXPECT_EQ(static_cast<int64_t>(idx.size()), 20 / world);
      EXPECT_EQ(s.num_samples(), 20 / world);
      seen.insert(idx.begin(), idx.end());
      total += idx.size();
    }
    EXPECT_EQ(seen.size(), 20u);  // disjoint (no duplicates) and covering
    EXPECT_EQ(total, 20u);
  }
}

TEST(DataSampler, PaddingDropLastAndEpochs) {
  // 10 samples over 3 ranks: padded to 12 (each rank 4) or dropped to 9 (each rank 3).
  std::set<int64_t> seen;
  for (int64_t r = 0; r < 3; ++r) {
    DistributedSampler s(10, r, 3, false, 0, false);
    auto idx = s.indices();
    EXPECT_EQ(idx.size(), 4u);
    seen.insert(idx.begin(), idx.end());
  }
  EXPECT_EQ(seen.size(), 10u);
  DistributedSampler padded(10, 2, 3, false);
  EXPECT_EQ(padded.indices(), (std::vector<int64_t>{2, 5, 8, 1}));  // 1 = wrapped padding (index 0, 1)
  DistributedSampler dropped(10, 2, 3, false, 7, true);
  EXPECT_EQ(dropped.indices(), (std::vector<int64_t>{2, 5, 8}));  // torch's answer
  // Same permutation as torch.utils.data.DistributedSampler(range(10), 3, 1, seed=7), epoch 2.
  DistributedSampler s(10, 1, 3, true, 7);
  auto e0 = s.indices();
  s.set_epoch(2);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{5, 6, 1, 0}));
  EXPECT_NE(s.indices(), e0);
  s.set_epoch(0);
  EXPECT_EQ(s.indices(), e0);
  EXPECT_THROW(DistributedSampler(10, 3, 3), zt::Error);
  EXPECT_THROW(DistributedSampler(2, 0, 3, true, 0, true), zt::Error);
}

namespace {

// Index i -> x = [i, i], y = [-i]: batches reveal exactly which indices they hold.
struct IndexDataset : Dataset {
  int64_t n;
  int64_t fail_at = -1;
  explicit IndexDataset(int64_t n_) : n(n_) {}
  int64_t size() const override { return n; }
  Example get(int64_t i) const override {
    if (i == fail_at) throw std::runtime_error("broken record");
    return {torch::full({2}, i, torch::kLong), torch::full({1}, -i, torch::kLong)};
  }
};

std::vector<std::vector<int64_t>> take(Loader& l, int n) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < n; ++i) out.push_back(to_vec(l.next().first.select(1, 0)));
  return out;
}

}  // namespace

TEST(DataLoader, BatchesFollowTheSamplerAcrossEpochs) {
  auto ds = std::make_shared<IndexDataset>(10);
  DistributedSampler s(10, 0, 1, true, 5);
  Loader l(ds, s, 3);
  EXPECT_EQ(l.batches_per_epoch(), 3);  // 10 / 3, last partial batch dropped
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    s.set_epoch(epoch);
    auto want = s.indices();
    for (int64_t b = 0; b < 3; ++b) {
      EXPECT_EQ(l.state(), (LoaderState{epoch, b}));
      auto [x, y] = l.next();
      EXPECT_EQ(l.epoch(), epoch);
      ASSERT_EQ(x.sizes(), torch::IntArrayRef({3, 2}));
      ASSERT_EQ(y.sizes(), torch::IntArrayRef({3, 1}));
      EXPECT_EQ(x.scalar_type(), torch::kLong);
      EXPECT_EQ(to_vec(x.select(1, 0)), std::vector<int64_t>(want.begin() + 3 * b, want.begin() + 3 * b + 3));
      EXPECT_TRUE(torch::equal(y.select(1, 0), -x.select(1, 0)));
    }
  }
}

TEST(DataLoader, SameSeedSameBatchesAndExactResume) {
  auto ds = std::make_shared<RandomTokenDataset>(256, 8, 1, 64);
  auto make = [&](uint64_t seed) { return std::make_unique<Loader>(ds, DistributedSampler(64, 1, 2, true, seed), 4); };
  auto a = make(9), b = make(9), c = make(10);
  for (int i = 0; i < 10; ++i) {  // 8 batches per epoch: crosses an epoch boundary
    auto [xa, ya] = a->next();
    auto [xb, yb] = b->next();
    EXPECT_EQ(xa.sizes(), torch::IntArrayRef({4, 8}));
    EXPECT_TRUE(torch::equal(xa, xb));
    EXPECT_TRUE(torch::equal(ya, yb));
    EXPECT_FALSE(torch::equal(xa, c->next().first));
  }
  // Resume: a fresh loader moved to a's position continues with a's batches.
  auto saved = a->state();
  EXPECT_EQ(saved, (LoaderState{1, 2}));
  auto expect = take(*a, 9);
  auto resumed = make(9);
  resumed->set_state(saved);
  EXPECT_EQ(take(*resumed, 9), expect);
  // Rewinding the same loader (discarding its prefetch) works too.
  a->set_state(saved);
  EXPECT_EQ(take(*a, 9), expect);
  EXPECT_THROW(a->set_state({0, 8}), zt::Error);
}

TEST(DataLoader, PartialLastBatchAndErrors) {
  auto ds = std::make_shared<IndexDataset>(10);
  LoaderOptions keep;
  keep.drop_last_batch = false;
  Loader l(ds, DistributedSampler(10, 0, 1, false), 4, torch::kCPU, keep);
  EXPECT_EQ(l.batches_per_epoch(), 3);
  EXPECT_EQ(take(l, 3), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));

  ds->fail_at = 5;
  Loader bad(ds, DistributedSampler(10, 0, 1, false), 2);
  take(bad, 2);  // indices 0..3 are fine
  try {
    bad.next();
    ADD_FAILURE();
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("example 5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("broken record"), std::string::npos) << e.what();
  }
  EXPECT_EQ(bad.state(), (LoaderState{0, 2}));  // the failed batch was not consumed
  EXPECT_THROW(Loader(ds, DistributedSampler(9, 0, 1), 2), zt::Error);   // sampler/dataset mismatch
  EXPECT_THROW(Loader(ds, DistributedSampler(10, 0, 1), 11), zt::Error);  // no full batch
  if (!torch::cuda::is_available()) EXPECT_THROW(Loader(ds, DistributedSampler(10, 0, 1), 2, torch::kCUDA), zt::Error);
}

TEST(DataLoader, CudaBatchesMatchCpuBatches) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto ds = std::make_shared<RandomTokenDataset>(50257, 64, 3, 256);
  Loader cpu(ds, DistributedSampler(256, 0, 1, true, 4), 8);
  Loader gpu(ds, DistributedSampler(256, 0, 1, true, 4), 8, torch::kCUDA);
  for (int i = 0; i < 40; ++i) {  // > one epoch (32 batches): pinned buffers get recycled
    auto [xc, yc] = cpu.next();
    auto [xg, yg] = gpu.next();
    ASSERT_TRUE(xg.is_cuda());
    // Consume on the current stream without a host sync first: the loader's event orders it.
    EXPECT_TRUE(torch::equal(xg.cpu(), xc));
    EXPECT_TRUE(torch::equal(yg.cpu(), yc));
  }
  EXPECT_EQ(gpu.state(), cpu.state());
}

}  // namespace zt_test_data
