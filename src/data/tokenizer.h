// Byte-level tokenizer: token id = byte value, so the vocabulary is 256 and any text
// (any bytes) round-trips exactly. Used with gpt2-tiny (vocab_size 256).
#pragma once
#include <torch/torch.h>

#include <string>
#include <string_view>

namespace zt::data {

struct ByteTokenizer {
  static constexpr int64_t kVocabSize = 256;
  // (N) int64 ids in [0, 256).
  torch::Tensor encode(std::string_view text) const;
  // Any integer tensor (flattened, any device) of ids in [0, 256); throws naming the
  // first out-of-range id otherwise.
  std::string decode(const torch::Tensor& ids) const;
};

}  // namespace zt::data
