// The few Unicode facts byte-level BPE needs: UTF-8 decoding and the character classes
// of the pre-tokenizer patterns (\p{L}, \p{N}, \s), from a table generated out of
// Python's unicodedata by scripts/gen_unicode_tables.py (src/data/unicode_tables.h).
#pragma once
#include <cstdint>
#include <string_view>

namespace zt::data {

enum class CharClass : uint8_t {
  kOther = 0,
  kSpace = 1,   // \s as Oniguruma (Hugging Face tokenizers) defines it: 9..13, U+0085, Zs, Zl, Zp
  kLetter = 2,  // \p{L}
  kNumber = 3,  // \p{N}
};

CharClass char_class(uint32_t cp);
const char* unicode_version();  // of the generated table, e.g. "14.0.0"

// Decodes the UTF-8 sequence at s[i]; sets `len` to its byte length (1..4). A byte that
// does not start a valid sequence (malformed, overlong, surrogate, truncated) decodes
// as one code point 0xFFFFFFFF of length 1, class kOther: byte-level tokenizers still
// carry every byte through.
inline uint32_t decode_utf8(std::string_view s, size_t i, int& len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  len = 1;
  if (b0 < 0x80) return b0;
  auto cont = [&](size_t k) { return k < s.size() && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80; };
  auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k]) & 0x3F); };
  if (b0 >= 0xC2 && b0 < 0xE0 && cont(i + 1)) {
    len = 2;
    return ((b0 & 0x1Fu) << 6) | at(i + 1);
  }
  if (b0 >= 0xE0 && b0 < 0xF0 && cont(i + 1) && cont(i + 2)) {
    const uint32_t cp = ((b0 & 0x0Fu) << 12) | (at(i + 1) << 6) | at(i + 2);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
      len = 3;
      return cp;
    }
  } else if (b0 >= 0xF0 && b0 < 0xF5 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    const uint32_t cp = ((b0 & 0x07u) << 18) | (at(i + 1) << 12) | (at(i + 2) << 6) | at(i + 3);
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
      len = 4;
      return cp;
    }
  }
  return 0xFFFFFFFFu;
}

}  // namespace zt::data
