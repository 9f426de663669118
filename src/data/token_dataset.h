// Language-model datasets: windows of seq+1 tokens give (x, y) with y = x shifted by one.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "zerotrain/data/dataset.h"

namespace zt::data {

enum class TokenFormat {
  kBytes,   // every byte of the file is a token (ByteTokenizer ids), vocab 256
  kUint16,  // little-endian uint16 token ids (nanoGPT's train.bin), e.g. GPT-2 BPE
};

// The whole file as one token stream, cut into non-overlapping windows: sample i covers
// tokens [i*seq, i*seq + seq] (seq+1 tokens), so size() = (num_tokens - 1) / seq.
class TokenDataset : public Dataset {
 public:
  // Throws naming the file when it cannot be read or holds fewer than seq+1 tokens.
  TokenDataset(const std::string& path, int64_t seq, TokenFormat format = TokenFormat::kBytes);
  // From a 1-D integer tensor of token ids (copied to CPU).
  TokenDataset(const torch::Tensor& tokens, int64_t seq, std::string name = "tokens");

  int64_t size() const override { return (num_tokens() - 1) / seq_; }
  Example get(int64_t index) const override;  // x, y: (seq) int64
  int64_t num_tokens() const { return tokens_.numel(); }
  int64_t seq_len() const { return seq_; }

 private:
  void check_length() const;

  std::string name_;
  int64_t seq_;
  torch::Tensor tokens_;  // (N) uint8 or int32 on the CPU: compact, widened per window
};

// Uniform random tokens, a pure function of (seed, index): the same index gives the same
// window on every rank, thread and run. For throughput benchmarks at full vocab size.
class RandomTokenDataset : public Dataset {
 public:
  RandomTokenDataset(int64_t vocab, int64_t seq, uint64_t seed, int64_t size = int64_t{1} << 20);
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;  // x, y: (seq) int64 in [0, vocab)

 private:
  int64_t vocab_, seq_;
  uint64_t seed_;
  int64_t size_;
};

}  // namespace zt::data
