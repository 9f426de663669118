// SentencePiece BPE (data/sentencepiece.h) against the `sentencepiece` package: the model
// and ids in tests/fixtures/spm were made by scripts/make_spm_fixture.py (Llama 2 style:
// BPE, byte_fallback, split_digits, identity normalization, 2000 pieces, two
// user-defined symbols) for the lines of tests/fixtures/bpe/test.txt. The charsmap models
// in tests/fixtures/spm_nfkc (nmt_nfkc, nmt_nfkc_cf with a denormalizer) were made by
// `scripts/make_spm_fixture.py --charsmap`.
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
const std::string kNfkc = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/spm_nfkc/";

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

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

std::vector<int32_t> ids_of(const std::string& s) {
  std::vector<int32_t> out;
  std::istringstream in(s);
  for (int32_t id; in >> id;) out.push_back(id);
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

// A protobuf length-delimited field.
std::string field(int number, const std::string& payload) {
  std::string out(1, static_cast<char>(number << 3 | 2));
  for (size_t n = payload.size(); ; n >>= 7) {
    out += static_cast<char>((n & 0x7F) | (n >= 0x80 ? 0x80 : 0));
    if (n < 0x80) break;
  }
  return out + payload;
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

// nmt_nfkc / nmt_nfkc_cf charsmaps: ids and decodes equal to sentencepiece's on lines of
// full-width forms, ligatures, compatibility characters, odd spaces, combining sequences,
// control characters, emoji, CJK, malformed UTF-8 and plain ASCII; the expected ids differ
// from identity normalization's (sentencepiece with the charsmap removed) on 12 of the
// 16 lines, so ignoring the charsmap fails this test.
class SentencePieceCharsmap : public testing::TestWithParam<int> {};

TEST_P(SentencePieceCharsmap, IdsAndDecodesEqualSentencePiece) {
  const int col = GetParam() * 3;  // expected.tsv: ids, decode (hex), identity ids; nfkc then nfkc_cf
  const auto sp = SentencePieceTokenizer::from_file(kNfkc + (GetParam() == 0 ? "nfkc.model" : "nfkc_cf.model"));
  auto lines = split(read_file(kNfkc + "test.txt"), '\n');
  auto rows = split(read_file(kNfkc + "expected.tsv"), '\n');
  lines.pop_back();  // after the last newline
  rows.pop_back();
  ASSERT_EQ(lines.size(), 16u);
  ASSERT_EQ(rows.size(), lines.size());
  size_t differ_from_identity = 0, same_as_identity = 0, ids = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto cols = split(rows[i], '\t');
    ASSERT_EQ(cols.size(), 6u) << "row " << i;
    const auto want = ids_of(cols[static_cast<size_t>(col)]);
    const auto identity = ids_of(cols[static_cast<size_t>(col) + 2]);
    const auto got = sp.encode(lines[i]);
    ids += got.size();
    EXPECT_EQ(got, want) << "line " << i << ": '" << lines[i] << "'";
    EXPECT_EQ(sp.decode(want), unhex(cols[static_cast<size_t>(col) + 1])) << "line " << i;
    (want != identity ? differ_from_identity : same_as_identity) += 1;
  }
  EXPECT_EQ(differ_from_identity, 12u);  // the charsmap matters on these lines
  EXPECT_EQ(same_as_identity, 4u);       // ASCII-only, the empty line: no charsmap entry hit
  EXPECT_GT(ids, 350u);
}

INSTANTIATE_TEST_SUITE_P(Rules, SentencePieceCharsmap, testing::Values(0, 1),
                         [](const auto& info) { return info.param == 0 ? "nmt_nfkc" : "nmt_nfkc_cf"; });

TEST(SentencePieceCharsmap, DenormalizerAppliesOnDecode) {
  // sentencepiece 0.2.x: the same text through both models; nfkc_cf's denormalizer maps
  // "fi" -> U+FB01, "1" -> U+2460, "..." -> U+2026, "kg" -> U+338F on decode.
  const std::string text = "\xEF\xAC\x81le 1 kg ... \xE2\x91\xA0";  // "ﬁle 1 kg ... ①"
  const auto nfkc = SentencePieceTokenizer::from_file(kNfkc + "nfkc.model");
  const auto cf = SentencePieceTokenizer::from_file(kNfkc + "nfkc_cf.model");
  EXPECT_EQ(nfkc.encode(text), (std::vector<int32_t>{289, 683, 308, 286, 510, 708, 414, 286}));
  EXPECT_EQ(nfkc.decode(nfkc.encode(text)), "file 1 kg ... 1");
  EXPECT_EQ(cf.encode(text), (std::vector<int32_t>{280, 719, 309, 291, 385, 744, 424, 291}));
  EXPECT_EQ(cf.decode(cf.encode(text)),
            "\xEF\xAC\x81le \xE2\x91\xA0 \xE3\x8E\x8F \xE2\x80\xA6 \xE2\x91\xA0");  // "ﬁle ① ㎏ … ①"
}

TEST(SentencePieceCharsmap, MalformedCharsmapIsAConfigErrorNamingTheModel) {
  // The identity model with a second NormalizerSpec (protobuf merges it) holding `blob`.
  const std::string base = read_file(kSpm + "spm.model");
  auto with_charsmap = [&](const std::string& blob) { return base + field(3, field(2, blob)); };
  const std::string units_past_end =
      std::string("\x04\x00\x00\x00", 4) + std::string("\x00\xFC\xFF\xFF", 4) + std::string("x\0", 2);
  for (const std::string& blob : {std::string("\x01\x00", 2),                                 // shorter than the header
                                  std::string("\x40\x00\x00\x00" "abcd\0", 9),                  // trie past the end
                                  std::string("\x06\x00\x00\x00" "abcdef\0", 11),               // not whole units
                                  std::string("\x04\x00\x00\x00\x00\x00\x00\x00" "ab", 10)}) {  // pool without NUL
    try {
      SentencePieceTokenizer sp(with_charsmap(blob), "bad.model");
      ADD_FAILURE() << "no error for a blob of " << blob.size() << " bytes";
    } catch (const zt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'bad.model'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("charsmap"), std::string::npos) << e.what();
    }
  }
  // A root whose children lie past the array: found when the trie is walked.
  const SentencePieceTokenizer sp(with_charsmap(units_past_end), "bad.model");
  try {
    sp.encode("a");
    ADD_FAILURE() << "no error for a trie node past the array";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'bad.model'"), std::string::npos) << e.what();
  }
}

}  // namespace zt_test_sentencepiece
