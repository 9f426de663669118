#include "data/tokenizer.h"

#include <cstring>

#include "zerotrain/error.h"

namespace zt::data {

torch::Tensor ByteTokenizer::encode(std::string_view text) const {
  auto bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  if (!text.empty()) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  return bytes.to(torch::kLong);
}

std::string ByteTokenizer::decode(const torch::Tensor& ids) const {
  ZT_CHECK(!at::isFloatingType(ids.scalar_type()) && ids.scalar_type() != torch::kBool,
           "ByteTokenizer::decode: ids must be an integer tensor, got ", ids.scalar_type());
  auto flat = ids.detach().to(torch::kCPU, torch::kLong).contiguous().view({-1});
  const int64_t* p = flat.data_ptr<int64_t>();
  std::string out(static_cast<size_t>(flat.numel()), '\0');
  for (int64_t i = 0; i < flat.numel(); ++i) {
    ZT_CHECK(p[i] >= 0 && p[i] < kVocabSize, "ByteTokenizer::decode: id ", p[i], " at position ", i,
             " is outside the byte vocabulary [0, 256)");
    out[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint8_t>(p[i]));
  }
  return out;
}

}  // namespace zt::data
