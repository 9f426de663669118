// Byte-level BPE (data/bpe_tokenizer.h) against Hugging Face `tokenizers`: the fixture in
// tests/fixtures/bpe was made by scripts/make_bpe_fixture.py (a 3000-token BPE trained
// with `tokenizers` on a 1.2 MB corpus; test.txt; the ids `tokenizers` gives for it under
// the GPT-2, Llama 3 and Qwen2 pre-tokenizers). Ids must match exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/bpe_tokenizer.h"
#include "data/normalize.h"
#include "data/pretokenize.h"
#include "data/unicode.h"
#include "zerotrain/error.h"

namespace zt_test_bpe_tokenizer {

using namespace zt::data;
using nlohmann::json;

namespace {

const std::string kDir = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/bpe/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<int32_t> read_u16(const std::string& path) {
  const std::string raw = read_file(path);
  std::vector<int32_t> ids(raw.size() / 2);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<uint8_t>(raw[2 * i]) | (static_cast<uint8_t>(raw[2 * i + 1]) << 8);
  }
  return ids;
}

json variant_json(const json& base, const json& v) {
  json j = base;
  for (const char* k : {"pre_tokenizer", "post_processor"}) {
    if (v.contains(k)) j[k] = v[k];
  }
  if (v.contains("ignore_merges")) j["model"]["ignore_merges"] = v["ignore_merges"];
  return j;
}

// Index and context of the first difference, for a readable failure.
std::string first_diff(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return "";
  std::ostringstream os;
  os << "first difference at id " << i << " of " << got.size() << " (want " << want.size() << "): got";
  for (size_t k = i; k < std::min(got.size(), i + 6); ++k) os << " " << got[k];
  os << " | want";
  for (size_t k = i; k < std::min(want.size(), i + 6); ++k) os << " " << want[k];
  return os.str();
}

std::vector<std::string> split(SplitPattern p, std::string_view text) {
  std::vector<std::string_view> v;
  split_words(p, text, v);
  return {v.begin(), v.end()};
}

}  // namespace

TEST(Unicode, ClassesOfTheTable) {
  EXPECT_EQ(char_class('a'), CharClass::kLetter);
  EXPECT_EQ(char_class(0x4E2D), CharClass::kLetter);   // 中
  EXPECT_EQ(char_class('7'), CharClass::kNumber);
  EXPECT_EQ(char_class(0xBD), CharClass::kNumber);     // ½ (No)
  EXPECT_EQ(char_class(0x2167), CharClass::kNumber);   // Ⅷ (Nl)
  EXPECT_EQ(char_class(' '), CharClass::kSpace);
  EXPECT_EQ(char_class(0x85), CharClass::kSpace);
  EXPECT_EQ(char_class(0x3000), CharClass::kSpace);
  EXPECT_EQ(char_class(0x1C), CharClass::kOther);      // Python's isspace says yes; Oniguruma's \s no
  EXPECT_EQ(char_class('!'), CharClass::kOther);
  EXPECT_EQ(char_class(0x1F600), CharClass::kOther);   // 😀
  EXPECT_EQ(char_class(0x20000), CharClass::kLetter);  // CJK extension B, outside the BMP table
  EXPECT_EQ(char_class(0x110000), CharClass::kOther);
}

TEST(Unicode, Utf8DecodingTakesMalformedBytesOneAtATime) {
  int len = 0;
  EXPECT_EQ(decode_utf8("\xE4\xB8\xAD", 0, len), 0x4E2Du);
  EXPECT_EQ(len, 3);
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80", 0, len), 0x1F600u);
  EXPECT_EQ(len, 4);
  EXPECT_EQ(decode_utf8("\xC0\xAF", 0, len), 0xFFFFFFFFu);  // overlong
  EXPECT_EQ(len, 1);
  EXPECT_EQ(decode_utf8("\xE4\xB8", 0, len), 0xFFFFFFFFu);  // truncated
  EXPECT_EQ(len, 1);
  EXPECT_EQ(decode_utf8("\xED\xA0\x80", 0, len), 0xFFFFFFFFu);  // surrogate
}

// Hand-checked splits of the two pattern families (what `tokenizers` gives for them).
TEST(PreTokenize, Gpt2Pattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split(SplitPattern::kGpt2, "Hello world's 123  x\n\n"),
            (V{"Hello", " world", "'s", " 123", " ", " x", "\n\n"}));
  EXPECT_EQ(split(SplitPattern::kGpt2, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split(SplitPattern::kGpt2, "IT'S ok?!"), (V{"IT", "'", "S", " ok", "?!"}));
  EXPECT_EQ(split(SplitPattern::kGpt2, "12345abc"), (V{"12345", "abc"}));
}

TEST(PreTokenize, Llama3Pattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split(SplitPattern::kLlama3, "Hello world's 12345  x\n\n"),
            (V{"Hello", " world", "'s", " ", "123", "45", " ", " x", "\n\n"}));
  EXPECT_EQ(split(SplitPattern::kLlama3, "IT'S 'ſ x'ſt"), (V{"IT", "'S", " '", "ſ", " x", "'ſ", "t"}));
  EXPECT_EQ(split(SplitPattern::kLlama3, "a  \n  b"), (V{"a", "  \n", " ", " b"}));
  EXPECT_EQ(split(SplitPattern::kLlama3, "x.\n\ny"), (V{"x", ".\n\n", "y"}));
  EXPECT_EQ(split(SplitPattern::kQwen2, "12345"), (V{"1", "2", "3", "4", "5"}));
}

class BpeFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = json::parse(read_file(kDir + "tokenizer.json"));
    variants_ = json::parse(read_file(kDir + "variants.json"));
    text_ = read_file(kDir + "test.txt");
  }
  json base_, variants_;
  std::string text_;
};

TEST_F(BpeFixture, IdsEqualHuggingFaceForEveryPreTokenizer) {
  for (const auto& [name, v] : variants_.items()) {
    SCOPED_TRACE(name);
    BpeTokenizer tok(variant_json(base_, v), name);
    const std::string text = text_.substr(0, v.at("text_bytes").get<size_t>());
    const auto want = read_u16(kDir + "expected_" + name + ".u16");
    ASSERT_GT(want.size(), 10000u);
    const auto got = tok.encode(text, v.at("add_special_tokens").get<bool>());
    EXPECT_EQ(first_diff(got, want), "");
  }
}

TEST_F(BpeFixture, VariantsUseTheirPatterns) {
  // Guards the test above against a variant silently running the default pre-tokenizer.
  EXPECT_EQ(BpeTokenizer(variant_json(base_, variants_["gpt2"])).pre_tokenizer_patterns(),
            std::vector<std::string>{"gpt2"});
  EXPECT_EQ(BpeTokenizer(variant_json(base_, variants_["llama3"])).pre_tokenizer_patterns(),
            std::vector<std::string>{"llama3"});
  EXPECT_EQ(BpeTokenizer(variant_json(base_, variants_["qwen2"])).pre_tokenizer_patterns(),
            std::vector<std::string>{"qwen2"});
  EXPECT_EQ(BpeTokenizer(variant_json(base_, variants_["gpt2_prefix_space"])).pre_tokenizer_patterns(),
            (std::vector<std::string>{"prefix_space", "gpt2"}));
}

TEST_F(BpeFixture, DecodeRoundTripsAndSpecialTokensStayWhole) {
  const BpeTokenizer tok(base_, "tokenizer.json");
  const auto ids = tok.encode(text_);
  EXPECT_EQ(tok.decode(ids), text_);
  const auto eot = tok.token_to_id("<|endoftext|>");
  ASSERT_TRUE(eot.has_value());
  EXPECT_EQ(tok.end_of_text_id(), eot);
  EXPECT_EQ(tok.encode("a<|endoftext|>b"), (std::vector<int32_t>{tok.encode("a")[0], *eot, tok.encode("b")[0]}));
  EXPECT_EQ(tok.decode(tok.encode("x<|endoftext|>y"), /*skip_special_tokens=*/true), "xy");
  // Malformed UTF-8 is carried byte by byte.
  const std::string bad = "ok \xFF\xC0 done \xE4\xB8";
  EXPECT_EQ(tok.decode(tok.encode(bad)), bad);
  EXPECT_EQ(tok.vocab_size(), 3000);
}

TEST_F(BpeFixture, BatchEqualsOneByOne) {
  const BpeTokenizer tok(base_);
  std::vector<std::string> docs;
  for (size_t i = 0; i < text_.size(); i += 5000) docs.push_back(text_.substr(i, 5000));
  const auto batch = tok.encode_batch(docs, 3);
  ASSERT_EQ(batch.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(batch[i], tok.encode(docs[i])) << i;
}

TEST_F(BpeFixture, UnsupportedPiecesAreNamed) {
  json j = base_;
  // A normalizer other than the Unicode forms, also inside a Sequence.
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  EXPECT_THROW(
      {
        try {
          BpeTokenizer t(j, "x.json");
        } catch (const zt::ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("normalizer 'Lowercase' is not supported (NFC, NFD, NFKC, NFKD"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      zt::ConfigError);
  j["normalizer"] = {{"type", "Sequence"}};
  EXPECT_THROW(BpeTokenizer(j, "x.json"), zt::ConfigError);
  j = base_;
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}};
  EXPECT_THROW(BpeTokenizer(j, "x.json"), zt::ConfigError);
  j = base_;
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_THROW(BpeTokenizer(j, "x.json"), zt::ConfigError);
  j = base_;
  j["model"]["merges"].push_back("nosuch token");
  EXPECT_THROW(BpeTokenizer(j, "x.json"), zt::ConfigError);
  EXPECT_THROW(BpeTokenizer::from_file(kDir + "missing.json"), zt::ConfigError);
  const BpeTokenizer tok(base_);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{5000}), zt::Error);
}

// [Normalizer] (data/normalize.h): the fixture's tokenizer.json with each normalizer and two
// added tokens (a normalized one, "\uFB01x", matched as "fix" under NFKC; a non-normalized
// one, "e\u0301!", matched on the raw text before NFC composes it) gives the ids
// `tokenizers` 0.23.3 gives (scripts/make_bpe_normalizer_fixture.py) for normalize.txt:
// 20 000 characters of test.txt, the same in NFD, and edge cases (decomposed accents,
// Hangul jamo, mark reordering, singletons, compatibility characters, marks after special
// tokens).
TEST(BpeNormalizer, IdsEqualHuggingFaceForEveryForm) {
  const json base = json::parse(read_file(kDir + "tokenizer.json"));
  const json fx = json::parse(read_file(kDir + "normalizers.json"));
  const std::string text = read_file(kDir + "normalize.txt");
  ASSERT_EQ(fx["forms"].size(), 5u);
  for (const auto& [name, f] : fx["forms"].items()) {
    SCOPED_TRACE(name);
    json j = base;
    j["normalizer"] = f["normalizer"];
    for (const auto& a : fx["added_tokens"]) j["added_tokens"].push_back(a);
    const BpeTokenizer tok(j, name);
    EXPECT_FALSE(tok.normalizer_forms().empty());
    const auto want = read_u16(kDir + "expected_norm_" + name + ".u16");
    ASSERT_EQ(want.size(), f["ids"].get<size_t>());
    EXPECT_EQ(first_diff(tok.encode(text), want), "");
    const auto& edge = fx["edge"];
    for (size_t i = 0; i < edge.size(); ++i) {
      const std::string e = edge[i].get<std::string>();
      EXPECT_EQ(tok.normalize(e), f["edge_normalized"][i].get<std::string>()) << i;
      EXPECT_EQ(tok.encode(e), f["edge_ids"][i].get<std::vector<int32_t>>()) << i;
    }
  }
}

// The same facts by hand, from the vocabulary: text whose normal form differs tokenizes
// under the normalizer exactly as its normal form does without one, and not as itself.
TEST(BpeNormalizer, NormalizedTextGivesTheIdsOfItsNormalForm) {
  const json base = json::parse(read_file(kDir + "tokenizer.json"));
  auto with = [&](const json& norm) {
    json j = base;
    j["normalizer"] = norm;
    return BpeTokenizer(j, "n.json");
  };
  const BpeTokenizer plain(base), nfc = with({{"type", "NFC"}}), nfkc = with({{"type", "NFKC"}}),
      nfd = with({{"type", "NFD"}});
  EXPECT_EQ(nfc.normalizer_forms(), std::vector<std::string>{"NFC"});
  struct Case {
    const BpeTokenizer* tok;
    const char* in;
    const char* normal;
  };
  for (const Case& c : {
           Case{&nfc, "Cafe\u0301", "Caf\u00e9"},                   // decomposed e + acute
           Case{&nfc, "\u1112\u1161\u11ab\u1100\u1173\u11af", "\ud55c\uae00"},  // Hangul jamo -> syllables
           Case{&nfc, "\u212b \u2126", "\u00c5 \u03a9"},               // singletons: Angstrom, Ohm
           Case{&nfc, "a\u0301\u0323", "\u1ea1\u0301"},              // marks reordered, then composed
           Case{&nfkc, "\ufb01ne \uff21\uff22 \u2460 x\u00b2", "fine AB 1 x2"},  // compatibility characters
           Case{&nfd, "\u00e9t\u00e9", "e\u0301te\u0301"},
       }) {
    SCOPED_TRACE(c.in);
    EXPECT_EQ(c.tok->normalize(c.in), c.normal);
    EXPECT_EQ(c.tok->encode(c.in), plain.encode(c.normal));
    EXPECT_NE(plain.encode(c.in), plain.encode(c.normal));  // the normalizer makes the difference
  }
  // Special tokens are split out of the raw text first: a mark after <|im_end|> stays alone.
  const auto end = *plain.token_to_id("<|im_end|>");
  std::vector<int32_t> want = plain.encode("\u00e9");
  want.push_back(end);
  for (int32_t t : plain.encode("\u0301")) want.push_back(t);
  EXPECT_EQ(nfc.encode("e\u0301<|im_end|>\u0301"), want);
  // Malformed UTF-8 is carried byte by byte; each bad byte ends a run of normalization.
  EXPECT_EQ(unicode_normalize("e\u0301\xFF\u0301e\u0301 \xE4\xB8", UnicodeForm::kNFC),
            "\u00e9\xFF\u0301\u00e9 \xE4\xB8");
  EXPECT_EQ(nfc.decode(nfc.encode("e\u0301\xFFok")), "\u00e9\xFFok");
  EXPECT_EQ(unicode_normalize("plain ascii", UnicodeForm::kNFKD), "plain ascii");
  EXPECT_EQ(unicode_normalize("\u00e9", UnicodeForm::kNFC), "\u00e9");
}

}  // namespace zt_test_bpe_tokenizer
