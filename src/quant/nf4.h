// NF4 4-bit quantization as bitsandbytes defines it (the storage format of QLoRA's frozen
// base weights): quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True).
//
// [NF4 Format]
// - The 16 NF4 code values (bitsandbytes' table, nf4_code()) in [-1, 1], code 7 = 0.
// - The flattened input is cut in blocks of 64 (the last may be partial); each block's
//   absmax = max |x| (an all-zero block uses 1e-38, so its codes are all 7).
// - Each element's code = the NF4 value nearest to x/absmax (clamped to [-1, 1]); a value
//   exactly on a midpoint between two codes takes the lower code (torch.bucketize with
//   right=False over the fp32 midpoints, as bitsandbytes' quantize_4bit). Full blocks scale
//   by x * (1/absmax), a partial last block by x / absmax, as bitsandbytes does.
// - Two codes per byte, the first element in the high nibble; an odd count is padded by a
//   zero (code 7) in the low nibble of the last byte.
// - Double quantization (compress_statistics): offset = mean of the absmaxes (fp32);
//   (absmax - offset) is quantized blockwise in blocks of 256 with the 8-bit signed dynamic
//   map (bitsandbytes' create_dynamic_map(), dynamic_map_code()): per block its absmax2 =
//   max |v|, each code = nearest map value to v * (1/absmax2) (ties to the lower index; an
//   all-zero block gets code 0, as bitsandbytes' 0/0 does). bitsandbytes' C search can
//   differ by one index at near ties (docs/lora.md).
// - Dequantization: absmax = code2[q] * absmax2[block] + offset; x = nf4[c] * absmax.
#pragma once
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <vector>

namespace zt::quant {

inline constexpr int64_t kNf4BlockSize = 64;
inline constexpr int64_t kNf4StatsBlockSize = 256;

// bitsandbytes' NF4 table (backends/utils.py _NF4_QUANT_TABLE), ascending.
const std::array<float, 16>& nf4_code();
// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), ascending.
const std::array<float, 256>& dynamic_map_code();

// Index of the NF4 value nearest to v (v already scaled into [-1, 1]); ties -> lower code.
uint8_t nf4_encode(float v);

struct Nf4Tensor {
  std::vector<int64_t> shape;      // the original shape
  int64_t numel = 0;
  torch::Tensor packed;            // uint8 [ceil(numel/2)]
  torch::Tensor qabsmax;           // uint8 [ceil(numel/64)] (double-quantized absmaxes)
  torch::Tensor absmax2;           // float32 [ceil(nblocks/256)]
  float offset = 0.0f;             // mean of the fp32 absmaxes
};

// Blockwise 8-bit quantization with the dynamic map (bitsandbytes' quantize_blockwise on a
// float32 CPU tensor). Returns {codes uint8 [n], absmax float32 [ceil(n/blocksize)]}.
std::pair<torch::Tensor, torch::Tensor> quantize_blockwise_dynamic(const torch::Tensor& x,
                                                                   int64_t blocksize);
torch::Tensor dequantize_blockwise_dynamic(const torch::Tensor& codes, const torch::Tensor& absmax,
                                           int64_t blocksize);

// x: any float dtype, any device (copied to the CPU in fp32 and quantized there, the blocks
// spread over the intra-op threads with at::parallel_for; the codes do not depend on the
// thread count). The result lives on the CPU.
Nf4Tensor quantize_nf4(const torch::Tensor& x);
// The reference dequantization (the definition): float32 CPU tensor of the original shape,
// from q on any device.
torch::Tensor dequantize_nf4(const Nf4Tensor& q);

// [NF4 On Device]
// The same q with its three tensors on `device` (shape, numel and offset unchanged); q
// itself when they are there already.
Nf4Tensor nf4_to(const Nf4Tensor& q, const torch::Device& device);
// True when q's tensors live on `device`.
bool nf4_on(const Nf4Tensor& q, const torch::Device& device);
// dequant(q) in `dtype` (fp32, bf16 or fp16) on q's device, of the original shape; bit for
// bit dequantize_nf4(q).to(dtype). On a CUDA device with zerotrain's kernels:
// kernels::nf4_dequantize (kernels/nf4.h), which writes the dtype directly (no fp32 copy),
// on the current stream; elsewhere dequantize_nf4_torch (a CUDA device without the
// kernels says so once in the log).
torch::Tensor dequantize_nf4_as(const Nf4Tensor& q, torch::ScalarType dtype);
// The torch-op form (index_select on the tables; any device; an fp32 intermediate of the
// weight's size), bit for bit dequantize_nf4(q).to(dtype).
torch::Tensor dequantize_nf4_torch(const Nf4Tensor& q, torch::ScalarType dtype);

}  // namespace zt::quant
