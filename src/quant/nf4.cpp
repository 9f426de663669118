#include "quant/nf4.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/aten.h"
#include "kernels/nf4.h"
#include "log/log.h"
#include "zerotrain/error.h"

namespace zt::quant {

const std::array<float, 16>& nf4_code() {
  static const std::array<float, 16> code = {
      -0x1.0000000000000p+0f, -0x1.6473620000000p-1f, -0x1.0cd6600000000p-1f, -0x1.9465400000000p-2f,
      -0x1.23449a0000000p-2f, -0x1.7a6a7e0000000p-3f, -0x1.74f0e20000000p-4f, 0x0.0p+0f,
      0x1.45f5fe0000000p-4f, 0x1.4995c60000000p-3f, 0x1.f809ba0000000p-3f, 0x1.5a06740000000p-2f,
      0x1.c349700000000p-2f, 0x1.200f560000000p-1f, 0x1.7227660000000p-1f, 0x1.0000000000000p+0f,
  };
  return code;
}

const std::array<float, 256>& dynamic_map_code() {
  static const std::array<float, 256> code = {
    -0x1.fc66660000000p-1f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f, -0x1.e6cccc0000000p-1f,
    -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f, -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f,
    -0x1.c2cccc0000000p-1f, -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f,
    -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f, -0x1.9066660000000p-1f,
    -0x1.8933340000000p-1f, -0x1.8200000000000p-1f, -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f,
    -0x1.6c66680000000p-1f, -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f,
    -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f, -0x1.3a00000000000p-1f,
    -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f, -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f,
    -0x1.1600000000000p-1f, -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f,
    -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f, -0x1.c733340000000p-2f,
    -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f, -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f,
    -0x1.7f33340000000p-2f, -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f,
    -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f, -0x1.1a66680000000p-2f,
    -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f, -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f,
    -0x1.a4cccc0000000p-3f, -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f,
    -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f, -0x1.b666680000000p-4f,
    -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f, -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f,
    -0x1.65c2900000000p-4f, -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f,
    -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f, -0x1.151eba0000000p-4f,
    -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f, -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f,
    -0x1.b70a3e0000000p-5f, -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f,
    -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f, -0x1.15c2900000000p-5f,
    -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f, -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f,
    -0x1.451eba0000000p-6f, -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f,
    -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f, -0x1.072b020000000p-7f,
    -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f, -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f,
    -0x1.56041a0000000p-8f, -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f,
    -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f, -0x1.4fdf3a0000000p-10f,
    -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f, -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f,
    -0x1.02de020000000p-11f, -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f,
    -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f, -0x1.64840c0000000p-16f,
    -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f, -0x1.27476e0000000p-21f, 0x0.0p+0f,
    0x1.27476e0000000p-21f, 0x1.b435280000000p-19f, 0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f,
    0x1.6f00680000000p-15f, 0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f,
    0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f, 0x1.3dd9820000000p-11f,
    0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f, 0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f,
    0x1.e353f80000000p-10f, 0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f,
    0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f, 0x1.7ae1480000000p-8f,
    0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f, 0x1.e978d40000000p-8f, 0x1.072b020000000p-7f,
    0x1.19999a0000000p-7f, 0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f,
    0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f, 0x1.7333340000000p-6f,
    0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f, 0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f,
    0x1.2cccce0000000p-5f, 0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f,
    0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f, 0x1.ce147a0000000p-5f,
    0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f, 0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f,
    0x1.20a3d60000000p-4f, 0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f,
    0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f, 0x1.7147ae0000000p-4f,
    0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f, 0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f,
    0x1.f000000000000p-4f, 0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f,
    0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f, 0x1.c1999a0000000p-3f,
    0x1.de66660000000p-3f, 0x1.fb33320000000p-3f, 0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f,
    0x1.28cccc0000000p-2f, 0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f,
    0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f, 0x1.8d99980000000p-2f,
    0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f, 0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f,
    0x1.d599980000000p-2f, 0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f,
    0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f, 0x1.1d33340000000p-1f,
    0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f, 0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f,
    0x1.4133340000000p-1f, 0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f,
    0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f, 0x1.73999a0000000p-1f,
    0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f, 0x1.8933340000000p-1f, 0x1.9066660000000p-1f,
    0x1.97999a0000000p-1f, 0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f,
    0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f, 0x1.ca00000000000p-1f,
    0x1.d133340000000p-1f, 0x1.d866660000000p-1f, 0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f,
    0x1.ee00000000000p-1f, 0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f
  };
  return code;
}

namespace {

// fp32 midpoints between consecutive NF4 values, computed as bitsandbytes does
// ((code[i] + code[i+1]) / 2 in fp32).
const std::array<float, 15>& nf4_bounds() {
  static const std::array<float, 15> b = [] {
    std::array<float, 15> r{};
    const auto& c = nf4_code();
    for (size_t i = 0; i < 15; ++i) r[i] = (c[i] + c[i + 1]) / 2.0f;
    return r;
  }();
  return b;
}

// Elements per at::parallel_for grain in the quantizers (about 100 us of work a grain).
constexpr int64_t kQuantGrainElements = 1 << 16;

// Nearest dynamic-map value; ties -> lower index.
uint8_t dynamic_encode(float v) {
  const auto& c = dynamic_map_code();
  // first index with c[i] >= v
  auto it = std::lower_bound(c.begin(), c.end(), v);
  if (it == c.begin()) return 0;
  if (it == c.end()) return 255;
  const size_t hi = static_cast<size_t>(it - c.begin());
  const size_t lo = hi - 1;
  return static_cast<uint8_t>(std::fabs(v - c[hi]) < std::fabs(v - c[lo]) ? hi : lo);
}


// The double quantization's offset, absmax.mean(), made independent of the intra-op thread
// count: a float sum over 32768 (ATen's GRAIN_SIZE) or more elements is split over the
// threads, and its rounding follows the split (a 4096 x 14336 matrix, 917504 absmaxes, gave
// another offset, hence other 8-bit codes, on 1 and 2 threads). Under 16384 values this is
// absmax.mean() itself (one serial reduction: bitsandbytes' fixtures are that size); above,
// the fp32 sums of 16384-value chunks (each serial), summed in order, over n.
float nf4_absmax_mean(const torch::Tensor& absmax) {
  constexpr int64_t kSerialChunk = 16384;
  const int64_t n = absmax.numel();
  if (n < kSerialChunk) return absmax.mean().item<float>();
  const int64_t chunks = (n + kSerialChunk - 1) / kSerialChunk;
  ZT_ASSERT(chunks < kSerialChunk, "nf4: ", n, " absmaxes");
  auto parts = torch::empty({chunks}, absmax.options());
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t a = c * kSerialChunk;
    parts[c] = absmax.narrow(0, a, std::min(kSerialChunk, n - a)).sum();
  }
  return (parts.sum() / static_cast<double>(n)).item<float>();
}
}  // namespace

uint8_t nf4_encode(float v) {
  // torch.bucketize(right=False): the number of bounds strictly below v.
  const auto& b = nf4_bounds();
  uint8_t q = 0;
  for (float bound : b) q += static_cast<uint8_t>(v > bound);
  return q;
}

std::pair<torch::Tensor, torch::Tensor> quantize_blockwise_dynamic(const torch::Tensor& x,
                                                                   int64_t blocksize) {
  ZT_CHECK_T(blocksize > 0, ConfigError, "quantize_blockwise: blocksize must be > 0, got ", blocksize);
  const torch::Tensor xf = x.detach().to(torch::kCPU, torch::kFloat32).contiguous().reshape(-1);
  const int64_t n = xf.numel();
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  torch::Tensor codes = torch::empty({n}, torch::kUInt8);
  torch::Tensor absmax = torch::empty({blocks}, torch::kFloat32);
  const float* px = xf.data_ptr<float>();
  uint8_t* pc = codes.data_ptr<uint8_t>();
  float* pa = absmax.data_ptr<float>();
  // Blocks are independent: spread them over the intra-op threads (same codes for any count).
  at::parallel_for(0, blocks, std::max<int64_t>(1, kQuantGrainElements / blocksize), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t s = b * blocksize, e = std::min(n, s + blocksize);
      float m = 0.0f;
      for (int64_t i = s; i < e; ++i) m = std::max(m, std::fabs(px[i]));
      pa[b] = m;
      const float inv = 1.0f / m;
      for (int64_t i = s; i < e; ++i) {
        // bitsandbytes divides 0 by 0 for an all-zero block; the NaN lands on code 0.
        pc[i] = m > 0.0f ? dynamic_encode(std::clamp(px[i] * inv, -1.0f, 1.0f)) : 0;
      }
    }
  });
  return {codes, absmax};
}

torch::Tensor dequantize_blockwise_dynamic(const torch::Tensor& codes, const torch::Tensor& absmax,
                                           int64_t blocksize) {
  const torch::Tensor c = codes.to(torch::kCPU).contiguous().reshape(-1);
  const torch::Tensor a = absmax.to(torch::kCPU, torch::kFloat32).contiguous();
  const int64_t n = c.numel();
  ZT_CHECK_T(c.scalar_type() == torch::kUInt8, ConfigError, "dequantize_blockwise: codes must be uint8");
  ZT_CHECK_T(a.numel() == (n + blocksize - 1) / blocksize, ConfigError, "dequantize_blockwise: ",
             n, " codes need ", (n + blocksize - 1) / blocksize, " absmax values, got ", a.numel());
  torch::Tensor out = torch::empty({n}, torch::kFloat32);
  const auto& map = dynamic_map_code();
  const uint8_t* pc = c.data_ptr<uint8_t>();
  const float* pa = a.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) po[i] = map[pc[i]] * pa[i / blocksize];
  return out;
}

Nf4Tensor quantize_nf4(const torch::Tensor& x) {
  ZT_CHECK_T(x.is_floating_point(), ConfigError, "quantize_nf4: expected a floating tensor, got ",
             x.scalar_type());
  const torch::Tensor xf = x.detach().to(torch::kCPU, torch::kFloat32).contiguous().reshape(-1);
  const int64_t n = xf.numel();
  ZT_CHECK_T(n > 0, ConfigError, "quantize_nf4: empty tensor");
  const int64_t blocks = (n + kNf4BlockSize - 1) / kNf4BlockSize;
  Nf4Tensor q;
  q.shape = x.sizes().vec();
  q.numel = n;
  q.packed = torch::zeros({(n + 1) / 2}, torch::kUInt8);
  torch::Tensor absmax = torch::empty({blocks}, torch::kFloat32);
  const float* px = xf.data_ptr<float>();
  uint8_t* pp = q.packed.data_ptr<uint8_t>();
  float* pa = absmax.data_ptr<float>();
  const int64_t full = n / kNf4BlockSize;
  // Blocks are independent and each owns whole bytes of `packed` (64 is even): spread them
  // over the intra-op threads (same codes for any thread count).
  at::parallel_for(0, blocks, kQuantGrainElements / kNf4BlockSize, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t s = b * kNf4BlockSize, e = std::min(n, s + kNf4BlockSize);
      float m = 0.0f;
      for (int64_t i = s; i < e; ++i) m = std::max(m, std::fabs(px[i]));
      pa[b] = m;
      const float am = std::max(m, 1e-38f);
      const float inv = 1.0f / am;
      for (int64_t i = s; i < e; ++i) {
        const float scaled = b < full ? px[i] * inv : px[i] / am;
        const uint8_t c = nf4_encode(std::clamp(scaled, -1.0f, 1.0f));
        pp[i / 2] |= static_cast<uint8_t>((i % 2 == 0) ? (c << 4) : c);
      }
    }
  });
  if (n % 2) pp[n / 2] |= nf4_encode(0.0f);  // bitsandbytes pads with a zero
  // Double quantization of the absmaxes.
  q.offset = nf4_absmax_mean(absmax);
  auto [codes, absmax2] = quantize_blockwise_dynamic(absmax - q.offset, kNf4StatsBlockSize);
  q.qabsmax = codes;
  q.absmax2 = absmax2;
  return q;
}

torch::Tensor dequantize_nf4(const Nf4Tensor& q) {
  const int64_t blocks = (q.numel + kNf4BlockSize - 1) / kNf4BlockSize;
  ZT_CHECK_T(q.packed.numel() == (q.numel + 1) / 2 && q.qabsmax.numel() == blocks, ConfigError,
             "dequantize_nf4: ", q.numel, " elements need ", (q.numel + 1) / 2, " packed bytes and ",
             blocks, " absmax codes, got ", q.packed.numel(), " and ", q.qabsmax.numel());
  const torch::Tensor absmax =
      dequantize_blockwise_dynamic(q.qabsmax, q.absmax2, kNf4StatsBlockSize) + q.offset;
  const torch::Tensor packed = q.packed.to(torch::kCPU).contiguous();
  torch::Tensor out = torch::empty({q.numel}, torch::kFloat32);
  const auto& code = nf4_code();
  const uint8_t* pp = packed.data_ptr<uint8_t>();
  const float* pa = absmax.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, q.numel, kQuantGrainElements, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const uint8_t c = (i % 2 == 0) ? (pp[i / 2] >> 4) : (pp[i / 2] & 0x0F);
      po[i] = code[c] * pa[i / kNf4BlockSize];
    }
  });
  return out.reshape(q.shape);
}

// ---- [NF4 On Device] -------------------------------------------------------------------

namespace {

void check_nf4_sizes(const Nf4Tensor& q, const char* who) {
  const int64_t blocks = (q.numel + kNf4BlockSize - 1) / kNf4BlockSize;
  const int64_t blocks2 = (blocks + kNf4StatsBlockSize - 1) / kNf4StatsBlockSize;
  ZT_CHECK_T(q.packed.numel() == (q.numel + 1) / 2 && q.qabsmax.numel() == blocks && q.absmax2.numel() == blocks2,
             ConfigError, who, ": ", q.numel, " elements need ", (q.numel + 1) / 2, " packed bytes, ", blocks,
             " absmax codes and ", blocks2, " second-level absmaxes, got ", q.packed.numel(), ", ",
             q.qabsmax.numel(), " and ", q.absmax2.numel());
  ZT_CHECK_T(q.packed.scalar_type() == torch::kUInt8 && q.qabsmax.scalar_type() == torch::kUInt8 &&
                 q.absmax2.scalar_type() == torch::kFloat32,
             ConfigError, who, ": expected uint8 codes and fp32 absmax2, got ", q.packed.scalar_type(), ", ",
             q.qabsmax.scalar_type(), ", ", q.absmax2.scalar_type());
  ZT_CHECK_T(q.qabsmax.device() == q.packed.device() && q.absmax2.device() == q.packed.device(), ConfigError, who,
             ": the NF4 tensors are on different devices (", q.packed.device(), ", ", q.qabsmax.device(), ", ",
             q.absmax2.device(), ")");
}

// (256, 2): the two NF4 values of each packed byte (high nibble first), fp32.
torch::Tensor nf4_byte_table() {
  static const torch::Tensor t = [] {
    const auto& code = nf4_code();
    auto r = torch::empty({256, 2}, torch::kFloat32);
    float* p = r.data_ptr<float>();
    for (int b = 0; b < 256; ++b) {
      p[2 * b] = code[b >> 4];
      p[2 * b + 1] = code[b & 0x0F];
    }
    return r;
  }();
  return t;
}

}  // namespace

bool nf4_on(const Nf4Tensor& q, const torch::Device& device) {
  return q.packed.device() == device && q.qabsmax.device() == device && q.absmax2.device() == device;
}

Nf4Tensor nf4_to(const Nf4Tensor& q, const torch::Device& device) {
  if (nf4_on(q, device)) return q;
  Nf4Tensor r = q;
  r.packed = q.packed.to(device);
  r.qabsmax = q.qabsmax.to(device);
  r.absmax2 = q.absmax2.to(device);
  return r;
}

torch::Tensor dequantize_nf4_torch(const Nf4Tensor& q, torch::ScalarType dtype) {
  check_nf4_sizes(q, "dequantize_nf4_torch");
  const torch::Device dev = q.packed.device();
  const int64_t blocks = q.qabsmax.numel();
  // The same operations, in the same order and rounding, as dequantize_blockwise_dynamic and
  // dequantize_nf4: absmax = code2[q] * absmax2[b / 256] (one fp32 product), + offset.
  const auto& map = dynamic_map_code();
  const torch::Tensor code2 = torch::tensor(at::ArrayRef<float>(map.data(), map.size())).to(dev);
  const torch::Tensor a2 = q.absmax2.repeat_interleave(kNf4StatsBlockSize).narrow(0, 0, blocks);
  const torch::Tensor absmax = code2.index_select(0, q.qabsmax.to(torch::kInt32)) * a2 + q.offset;
  // Each byte's two values, then one fp32 product with its block's absmax.
  torch::Tensor v = nf4_byte_table().to(dev).index_select(0, q.packed.to(torch::kInt32)).reshape(-1);
  const int64_t padded = blocks * kNf4BlockSize;
  if (v.numel() < padded) v = torch::constant_pad_nd(v, {0, padded - v.numel()});
  const torch::Tensor w = (v.view({blocks, kNf4BlockSize}) * absmax.unsqueeze(1)).reshape(-1).narrow(0, 0, q.numel);
  return w.to(dtype).reshape(q.shape);
}

torch::Tensor dequantize_nf4_as(const Nf4Tensor& q, torch::ScalarType dtype) {
  const torch::Device dev = q.packed.device();
  if (!dev.is_cuda()) return dequantize_nf4_torch(q, dtype);
  if (!kernels::kernels_available()) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      log::warn("qlora: zerotrain was built without its CUDA kernels; NF4 weights are dequantized on the GPU with "
                "torch ops (an fp32 copy of each weight per call) instead of kernels::nf4_dequantize");
    }
    return dequantize_nf4_torch(q, dtype);
  }
  check_nf4_sizes(q, "dequantize_nf4_as");
  ZT_CHECK_T(kernels::dtype_supported(dtype), ConfigError, "dequantize_nf4_as: fp32, bf16 or fp16 only, not ", dtype);
  const c10::DeviceGuard guard(dev);
  const torch::Tensor packed = q.packed.contiguous(), qabsmax = q.qabsmax.contiguous(), absmax2 = q.absmax2.contiguous();
  torch::Tensor out = torch::empty({q.numel}, torch::TensorOptions().dtype(dtype).device(dev));
  kernels::Nf4DequantArgs a;
  a.packed = packed.data_ptr<uint8_t>();
  a.qabsmax = qabsmax.data_ptr<uint8_t>();
  a.absmax2 = absmax2.data_ptr<float>();
  a.offset = q.offset;
  a.numel = q.numel;
  a.nf4_code = nf4_code().data();
  a.code2 = dynamic_map_code().data();
  a.out = out.data_ptr();
  a.type = kernels::dtype_of(dtype);
  kernels::nf4_dequantize(a, kernels::current_stream(dev));
  return out.view(q.shape);
}

}  // namespace zt::quant
