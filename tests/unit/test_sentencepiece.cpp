// SentencePiece BPE (data/sentencepiece.h) against the `sentencepiece` package: the model
// and ids in tests/fixtures/spm were made by scripts/make_spm_fixture.py (Llama 2 style:
// BPE, byte_fallback, split_digits, identity normalization, 2000 pieces, two
// user-defined symbols) for the lines of tests/fixtures/bpe/test.txt.
#include <gtest/gtest.h>

#include <algorithm>

#include <fstream>
#include <sstream>

#include "data/sentencepiece.h"
#include "zerotrain/error.h"

namespace zt_test_sentencepiece {

using zt::data::SentencePieceTokenizer;

namespace {

const std::string kSpm = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/spm/";
const std::string kBpe = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/bpe/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text, size_t max) {
  std::vector<std::string> out;
  size_t start = 0;
  while (out.size() < max) {
    const size_t nl = text.find('\n', start);
    out.push_back(text.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return out;
}

}  // namespace

TEST(SentencePiece, ReadsTheModel) {
  const auto sp = SentencePieceTokenizer::from_file(kSpm + "spm.model");
  EXPECT_EQ(sp.vocab_size(), 2000);
  EXPECT_EQ(sp.unk_id(), 0);
  EXPECT_EQ(sp.bos_id(), 1);
  EXPECT_EQ(sp.eos_id(), 2);
  EXPECT_EQ(sp.piece(sp.piece_to_id("<0x41>")).type, SentencePieceTokenizer::PieceType::kByte);
  EXPECT_EQ(sp.piece(sp.piece_to_id("<|im_start|>")).type, SentencePieceTokenizer::PieceType::kUserDefined);
}

TEST(SentencePiece, IdsEqualSentencePieceLineByLine) {
  const auto sp = SentencePieceTokenizer::from_file(kSpm + "spm.model");
  const std::string raw = read_file(kSpm + "expected.u16");
  std::vector<std::vector<int32_t>> want(1);
  for (size_t i = 0; i + 1 < raw.size(); i += 2) {
    const int32_t id = static_cast<uint8_t>(raw[i]) | (static_cast<uint8_t>(raw[i + 1]) << 8);
    if (id == 65535) want.emplace_back();
    else want.back().push_back(id);
  }
  want.pop_back();  // after the last separator
  const auto lines = lines_of(read_file(kBpe + "test.txt"), 2000);
  ASSERT_EQ(lines.size(), want.size());
  size_t ids = 0, mismatched = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto got = sp.encode(lines[i]);
    ids += got.size();
    if (got != want[i] && ++mismatched <= 3) ADD_FAILURE() << "line " << i << ": '" << lines[i] << "'";
    EXPECT_EQ(sp.decode(got), lines[i]) << "line " << i;
  }
  EXPECT_EQ(mismatched, 0u);
  EXPECT_GT(ids, 50000u);
}

TEST(SentencePiece, ByteFallbackAndUserSymbols) {
  const auto sp = SentencePieceTokenizer::from_file(kSpm + "spm.model");
  // A character the 2000 pieces do not hold comes out as its UTF-8 bytes.
  const auto ids = sp.encode("\xF0\x9F\xA6\x9C");  // U+1F99C parrot
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[ids.size() - 4], sp.piece_to_id("<0xF0>"));
  EXPECT_EQ(sp.decode(ids), "\xF0\x9F\xA6\x9C");
  const auto u = sp.encode("a<|im_start|>b");
  EXPECT_NE(std::find(u.begin(), u.end(), sp.piece_to_id("<|im_start|>")), u.end());
}

TEST(SentencePiece, BadFilesAreNamed) {
  EXPECT_THROW(SentencePieceTokenizer::from_file(kSpm + "missing.model"), zt::ConfigError);
  EXPECT_THROW(SentencePieceTokenizer(std::string_view("\x0a\xff\xff\xff\x0f", 5), "x.model"), zt::ConfigError);
  EXPECT_THROW(SentencePieceTokenizer(read_file(kBpe + "tokenizer.json"), "tokenizer.json"), zt::ConfigError);
}

}  // namespace zt_test_sentencepiece
