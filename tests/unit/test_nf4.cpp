// NF4 quantization (src/quant/nf4.h) against hand-computed values and, byte for byte,
// against bitsandbytes 0.50.2's quantize_4bit(nf4, blocksize 64, compress_statistics) via
// tests/fixtures/nf4/nf4_bnb.safetensors (made by scripts/make_nf4_fixture.py on CPU).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "io/safetensors.h"
#include "quant/nf4.h"
#include "zerotrain/error.h"

namespace zt_test_nf4 {

using namespace zt::quant;

namespace {

std::string fixture_path() {
  return std::string(ZT_SOURCE_DIR) + "/tests/fixtures/nf4/nf4_bnb.safetensors";
}

uint8_t code_at(const Nf4Tensor& q, int64_t i) {
  const uint8_t b = q.packed.data_ptr<uint8_t>()[i / 2];
  return (i % 2 == 0) ? (b >> 4) : (b & 0x0F);
}

// Weights of `shape` (seeded normal, varied scales per row, one all-zero block when there
// are at least two blocks).
torch::Tensor weights(const std::vector<int64_t>& shape, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor x = at::randn(shape, g);
  if (x.dim() == 2) x = x * at::rand({shape[0], 1}, g).mul(3.0).add(0.01);
  if (x.numel() >= 2 * kNf4BlockSize) x.view(-1).narrow(0, kNf4BlockSize, kNf4BlockSize).zero_();
  return x;
}

// Element bits (4- or 2-byte dtypes) as int32, for exact comparisons.
torch::Tensor bits_of(const torch::Tensor& t) {
  return t.element_size() == 4 ? t.contiguous().view(torch::kInt32) : t.contiguous().view(torch::kInt16).to(torch::kInt32);
}

}  // namespace

TEST(Nf4, CodeTableIsBitsandbytes) {
  const auto& c = nf4_code();
  EXPECT_EQ(c[0], -1.0f);
  EXPECT_EQ(c[7], 0.0f);
  EXPECT_EQ(c[15], 1.0f);
  EXPECT_FLOAT_EQ(c[1], -0.6961928009986877f);
  EXPECT_FLOAT_EQ(c[8], 0.07958029955625534f);
  EXPECT_FLOAT_EQ(c[14], 0.7229568362236023f);
  for (size_t i = 1; i < c.size(); ++i) EXPECT_LT(c[i - 1], c[i]);
  const auto& d = dynamic_map_code();
  for (size_t i = 1; i < d.size(); ++i) EXPECT_LE(d[i - 1], d[i]);
  EXPECT_EQ(d[255], 1.0f);
  EXPECT_NEAR(d[0], -0.99297f, 1e-5);
}

TEST(Nf4, EncodeNearestTiesGoLower) {
  const auto& c = nf4_code();
  for (uint8_t i = 0; i < 16; ++i) EXPECT_EQ(nf4_encode(c[i]), i);
  // 0.0397... is between 0 (code 7) and 0.0796 (code 8): just below the midpoint -> 7.
  EXPECT_EQ(nf4_encode(0.039f), 7);
  EXPECT_EQ(nf4_encode(0.041f), 8);
  const float mid = (c[7] + c[8]) / 2.0f;
  EXPECT_EQ(nf4_encode(mid), 7);  // exactly on the midpoint: the lower code
  EXPECT_EQ(nf4_encode(std::nextafter(mid, 1.0f)), 8);
  EXPECT_EQ(nf4_encode(-0.9f), 0);
  EXPECT_EQ(nf4_encode(0.9f), 15);
}

TEST(Nf4, HandComputedBlockAndPacking) {
  // One partial block of 5: absmax 2; scaled {1, -0.5, 0, 0.25, -1} -> codes
  // {15, 2 (-0.525 nearest -0.5), 7, 10 (0.246), 0}; packed high nibble first, odd count
  // padded with code 7.
  const torch::Tensor x = torch::tensor({2.0f, -1.0f, 0.0f, 0.5f, -2.0f});
  const Nf4Tensor q = quantize_nf4(x);
  ASSERT_EQ(q.packed.numel(), 3);
  const uint8_t* p = q.packed.data_ptr<uint8_t>();
  EXPECT_EQ(p[0], (15 << 4) | 2);
  EXPECT_EQ(p[1], (7 << 4) | 10);
  EXPECT_EQ(p[2], (0 << 4) | 7);
  EXPECT_FLOAT_EQ(q.offset, 2.0f);  // mean of one absmax
  // absmax - offset = 0 -> dynamic code of 0 and absmax2 0; dequant gives absmax 2 back.
  const torch::Tensor d = dequantize_nf4(q);
  const auto& c = nf4_code();
  const float want[5] = {2.0f * c[15], 2.0f * c[2], 0.0f, 2.0f * c[10], 2.0f * c[0]};
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(d[i].item<float>(), want[i]) << i;
}

TEST(Nf4, BlocksAreIndependent) {
  // Two blocks of 64 with absmax 1 and 100: codes depend only on the own block's absmax.
  torch::Tensor x = torch::zeros({128});
  x[0] = 1.0f;
  x[1] = 0.5f;
  x[64] = 100.0f;
  x[65] = 50.0f;
  const Nf4Tensor q = quantize_nf4(x);
  EXPECT_EQ(code_at(q, 0), 15);
  EXPECT_EQ(code_at(q, 1), nf4_encode(0.5f));
  EXPECT_EQ(code_at(q, 64), 15);
  EXPECT_EQ(code_at(q, 65), nf4_encode(0.5f));
  EXPECT_EQ(code_at(q, 2), 7);
  EXPECT_EQ(q.qabsmax.numel(), 2);
  EXPECT_EQ(q.absmax2.numel(), 1);
  EXPECT_FLOAT_EQ(q.offset, 50.5f);
  const torch::Tensor d = dequantize_nf4(q);
  EXPECT_NEAR(d[64].item<float>(), 100.0f, 0.5f);  // absmax error from the 8-bit stats
  EXPECT_NEAR(d[0].item<float>(), 1.0f, 0.5f);
}

TEST(Nf4, MatchesBitsandbytesByteForByte) {
  const auto f = zt::io::load_safetensors(fixture_path());
  const int cases = 6;
  for (int i = 0; i < cases; ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const auto s = std::to_string(i);
    const torch::Tensor x = f.at("in_" + s);
    const Nf4Tensor q = quantize_nf4(x);
    EXPECT_TRUE(torch::equal(q.packed, f.at("packed_" + s))) << "packed codes differ, n=" << x.numel();
    // The 8-bit codes of the absmaxes: bitsandbytes' C binary search can take the other
    // neighbour at a near tie (seen here: v = -0.0775 between -0.0789 and -0.0761), so
    // at most 1% of the codes (min 1) may differ, by one index. Known gap, see docs/lora.md.
    const torch::Tensor qd = (q.qabsmax.to(torch::kInt32) - f.at("qabsmax_" + s).to(torch::kInt32)).abs();
    EXPECT_LE(qd.max().item<int>(), 1);
    EXPECT_LE(qd.gt(0).sum().item<int64_t>(), std::max<int64_t>(1, qd.numel() / 100));
    EXPECT_TRUE(torch::equal(q.absmax2, f.at("absmax2_" + s)));
    EXPECT_EQ(q.offset, f.at("offset_" + s)[0].item<float>());
    const torch::Tensor code2 = f.at("code2_" + s);
    for (int64_t k = 0; k < 256; ++k) ASSERT_EQ(code2[k].item<float>(), dynamic_map_code()[k]) << k;
    // Dequantization of bitsandbytes' own state equals its dequantize_4bit.
    Nf4Tensor bq = q;
    bq.qabsmax = f.at("qabsmax_" + s);
    const torch::Tensor d = dequantize_nf4(bq);
    EXPECT_TRUE(torch::allclose(d, f.at("deq_" + s), 1e-6, 1e-7))
        << "max diff " << (d - f.at("deq_" + s)).abs().max().item<float>();
  }
}

// [NF4 On Device]: the torch-op dequantization (the form used on the CPU, and on a GPU
// without the kernels) equals the reference dequantize_nf4(q).to(dtype) bit for bit: odd
// counts, partial last blocks of 64 and of 256 absmaxes, an all-zero block, 2-D shapes.
TEST(Nf4, TorchOpDequantEqualsTheReferenceBitForBit) {
  const std::vector<std::vector<int64_t>> shapes = {{1}, {7}, {64}, {100}, {37, 131}, {64 * 300 + 37}, {96, 200}};
  uint64_t seed = 40;
  for (const auto& shape : shapes) {
    const torch::Tensor x = weights(shape, ++seed);
    const Nf4Tensor q = quantize_nf4(x);
    const torch::Tensor ref = dequantize_nf4(q);
    ASSERT_EQ(ref.sizes(), x.sizes());
    for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
      SCOPED_TRACE(::testing::Message() << "shape " << x.sizes() << " " << dt);
      const torch::Tensor got = dequantize_nf4_torch(q, dt);
      ASSERT_EQ(got.sizes(), x.sizes());
      ASSERT_EQ(got.scalar_type(), dt);
      EXPECT_TRUE(torch::equal(bits_of(got), bits_of(ref.to(dt)))) << "bits differ";
      // On the CPU, dequantize_nf4_as is the torch-op form.
      EXPECT_TRUE(torch::equal(bits_of(dequantize_nf4_as(q, dt)), bits_of(ref.to(dt))));
    }
  }
  // A malformed state is an error naming the sizes, not an out-of-bounds read.
  Nf4Tensor bad = quantize_nf4(weights({100}, 3));
  bad.qabsmax = bad.qabsmax.narrow(0, 0, 1);
  EXPECT_THROW(dequantize_nf4_torch(bad, torch::kFloat32), zt::ConfigError);
}

// The quantizer spreads blocks over the intra-op threads: the result is the same with one
// thread (grains of 1024 blocks; 3001 blocks here, under torch's serial-mean threshold of
// 32768, so the offset's sum runs the same way too).
TEST(Nf4, QuantizeDoesNotDependOnTheThreadCount) {
  const torch::Tensor x = weights({64 * 3000 + 13}, 7);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Nf4Tensor one = quantize_nf4(x);
  at::set_num_threads(std::max(2, threads));
  const Nf4Tensor many = quantize_nf4(x);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.packed, many.packed));
  EXPECT_TRUE(torch::equal(one.qabsmax, many.qabsmax));
  EXPECT_TRUE(torch::equal(one.absmax2, many.absmax2));
  EXPECT_EQ(one.offset, many.offset);
}

}  // namespace zt_test_nf4
