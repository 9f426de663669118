#include "data/token_dataset.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>

#include "zerotrain/error.h"

namespace zt::data {
namespace {

// splitmix64: decorrelates neighbouring (seed, index) pairs before they seed mt19937.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

TokenDataset::TokenDataset(const std::string& path, int64_t seq, TokenFormat format) : name_(path), seq_(seq) {
  ZT_CHECK(seq > 0, "TokenDataset: seq must be positive, got ", seq);
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  ZT_CHECK(!ec, "TokenDataset: cannot read '", path, "': ", ec.message());
  const int64_t width = format == TokenFormat::kUint16 ? 2 : 1;
  ZT_CHECK(bytes % width == 0, "TokenDataset: '", path, "' has ", bytes,
           " bytes, not a whole number of uint16 tokens (truncated?)");
  auto raw = torch::empty({static_cast<int64_t>(bytes)}, torch::kUInt8);
  std::ifstream in(path, std::ios::binary);
  ZT_CHECK(in.good(), "TokenDataset: cannot open '", path, "'");
  in.read(static_cast<char*>(raw.data_ptr()), static_cast<std::streamsize>(bytes));
  ZT_CHECK(static_cast<uint64_t>(in.gcount()) == bytes, "TokenDataset: short read of '", path, "'");
  // uint16 ids widen to int32 (ATen's uint16 support is thin); x86 is little-endian.
  tokens_ = format == TokenFormat::kUint16 ? raw.view(torch::kUInt16).to(torch::kInt) : raw;
  check_length();
}

TokenDataset::TokenDataset(const torch::Tensor& tokens, int64_t seq, std::string name)
    : name_(std::move(name)), seq_(seq) {
  ZT_CHECK(seq > 0, "TokenDataset: seq must be positive, got ", seq);
  ZT_CHECK(tokens.dim() == 1 && !at::isFloatingType(tokens.scalar_type()), "TokenDataset '", name_,
           "': tokens must be a 1-D integer tensor, got ", tokens.sizes(), " ", tokens.scalar_type());
  tokens_ = tokens.detach().to(torch::kCPU).contiguous();
  check_length();
}

void TokenDataset::check_length() const {
  ZT_CHECK(num_tokens() >= seq_ + 1, "TokenDataset '", name_, "' holds ", num_tokens(),
           " tokens; one sample needs seq+1 = ", seq_ + 1, " (use a longer file or a shorter sequence)");
}

Example TokenDataset::get(int64_t index) const {
  ZT_CHECK(index >= 0 && index < size(), "TokenDataset '", name_, "': index ", index, " out of range [0, ", size(),
           ")");
  auto w = tokens_.narrow(0, index * seq_, seq_ + 1).to(torch::kLong);  // (seq+1)
  return {w.narrow(0, 0, seq_), w.narrow(0, 1, seq_)};
}

RandomTokenDataset::RandomTokenDataset(int64_t vocab, int64_t seq, uint64_t seed, int64_t size)
    : vocab_(vocab), seq_(seq), seed_(seed), size_(size) {
  ZT_CHECK(vocab > 0 && seq > 0 && size > 0, "RandomTokenDataset: vocab (", vocab, "), seq (", seq, ") and size (",
           size, ") must be positive");
}

Example RandomTokenDataset::get(int64_t index) const {
  ZT_CHECK(index >= 0 && index < size_, "RandomTokenDataset: index ", index, " out of range [0, ", size_, ")");
  // A private generator per call: no shared state, so any thread gets the same answer.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(mix(seed_ ^ mix(static_cast<uint64_t>(index))));
  auto w = torch::randint(vocab_, {seq_ + 1}, gen, torch::TensorOptions().dtype(torch::kLong));  // (seq+1)
  return {w.narrow(0, 0, seq_), w.narrow(0, 1, seq_)};
}

}  // namespace zt::data
