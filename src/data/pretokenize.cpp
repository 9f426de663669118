#include "data/pretokenize.h"

#include "data/unicode.h"

namespace zt::data {
namespace {

constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// One decoded character: its code point, class and byte length. Past the end: cp 0,
// len 0, class kOther with `end` set, so class tests fail there as a regex would.
struct Ch {
  uint32_t cp = 0;
  CharClass cls = CharClass::kOther;
  int len = 0;
  bool end = true;
  bool is(CharClass c) const { return !end && cls == c; }
  bool other() const { return !end && cls == CharClass::kOther; }
  bool newline() const { return !end && (cp == '\r' || cp == '\n'); }
};

Ch at(std::string_view s, size_t i) {
  Ch c;
  if (i >= s.size()) return c;
  c.end = false;
  c.cp = decode_utf8(s, i, c.len);
  c.cls = char_class(c.cp);
  return c;
}

// End of the run of characters of class `k` starting at byte i.
size_t run(std::string_view s, size_t i, CharClass k) {
  for (Ch c = at(s, i); c.is(k); c = at(s, i)) i += static_cast<size_t>(c.len);
  return i;
}
size_t run_other(std::string_view s, size_t i) {
  for (Ch c = at(s, i); c.other(); c = at(s, i)) i += static_cast<size_t>(c.len);
  return i;
}

// 's|'t|'re|'ve|'m|'ll|'d at i (which holds '\''); case-insensitive under Unicode simple
// case folding when `fold` (the only non-ASCII letter that folds onto one of these is
// U+017F LATIN SMALL LETTER LONG S -> s). Returns the match's byte length or 0.
size_t contraction(std::string_view s, size_t i, bool fold) {
  auto lower = [&](const Ch& c) -> uint32_t {
    if (c.end) return 0;
    if (!fold) return c.cp;
    if (c.cp >= 'A' && c.cp <= 'Z') return c.cp + 32;
    if (c.cp == 0x17F) return 's';
    return c.cp;
  };
  const Ch a = at(s, i + 1);
  const uint32_t la = lower(a);
  if (la == 's' || la == 't' || la == 'm' || la == 'd') return 1 + static_cast<size_t>(a.len);
  const Ch b = at(s, i + 1 + static_cast<size_t>(a.len));
  const uint32_t lb = lower(b);
  if ((la == 'r' && lb == 'e') || (la == 'v' && lb == 'e') || (la == 'l' && lb == 'l')) {
    return 1 + static_cast<size_t>(a.len + b.len);
  }
  return 0;
}

// \s+(?!\S)|\s+ at i (a space character): the whole run when it ends the text, else
// the run less its last character when that leaves at least one, else the run.
size_t trailing_space(std::string_view s, size_t i, size_t j) {
  if (j >= s.size()) return j - i;
  const Ch first = at(s, i);
  if (j - i > static_cast<size_t>(first.len)) {
    // Back off one character: find the start of the run's last character.
    size_t k = j - 1;
    while (k > i && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
    return k - i;
  }
  return j - i;
}

size_t match_gpt2(std::string_view s, size_t i) {
  const Ch c = at(s, i);
  if (c.cp == '\'') {
    if (size_t n = contraction(s, i, /*fold=*/false)) return n;
  }
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
  const size_t j = c.cp == ' ' ? i + 1 : i;
  const Ch d = c.cp == ' ' ? at(s, j) : c;
  if (d.is(CharClass::kLetter)) return run(s, j, CharClass::kLetter) - i;
  if (d.is(CharClass::kNumber)) return run(s, j, CharClass::kNumber) - i;
  if (d.other()) return run_other(s, j) - i;
  if (c.is(CharClass::kSpace)) return trailing_space(s, i, run(s, i, CharClass::kSpace));
  // Unreachable: every character is a letter, number, space or other. Take it alone.
  return static_cast<size_t>(c.len);
}

size_t match_llama3(std::string_view s, size_t i, int max_digits) {
  const Ch c = at(s, i);
  if (c.cp == '\'') {
    if (size_t n = contraction(s, i, /*fold=*/true)) return n;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.is(CharClass::kLetter)) return run(s, i, CharClass::kLetter) - i;
  if (!c.is(CharClass::kNumber) && !c.newline()) {
    const size_t j = i + static_cast<size_t>(c.len);
    if (at(s, j).is(CharClass::kLetter)) return run(s, j, CharClass::kLetter) - i;
  }
  // \p{N}{1,max}
  if (c.is(CharClass::kNumber)) {
    size_t j = i;
    Ch d = c;
    for (int k = 0; k < max_digits && d.is(CharClass::kNumber); ++k) {
      j += static_cast<size_t>(d.len);
      d = at(s, j);
    }
    return j - i;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  {
    const size_t j = c.cp == ' ' ? i + 1 : i;
    if (at(s, j).other()) {
      size_t k = run_other(s, j);
      while (k < s.size() && (s[k] == '\r' || s[k] == '\n')) ++k;
      return k - i;
    }
  }
  if (c.is(CharClass::kSpace)) {
    const size_t j = run(s, i, CharClass::kSpace);
    // \s*[\r\n]+ : up to and including the run's last \r or \n.
    for (size_t k = j; k > i; --k) {
      if (s[k - 1] == '\r' || s[k - 1] == '\n') return k - i;
    }
    return trailing_space(s, i, j);
  }
  return static_cast<size_t>(c.len);
}

}  // namespace

const char* split_pattern_regex(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2: return kGpt2Regex;
    case SplitPattern::kLlama3: return kLlama3Regex;
    case SplitPattern::kQwen2: return kQwen2Regex;
  }
  return "";
}

const char* split_pattern_name(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2: return "gpt2";
    case SplitPattern::kLlama3: return "llama3";
    case SplitPattern::kQwen2: return "qwen2";
  }
  return "";
}

std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  for (auto p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    if (regex == split_pattern_regex(p)) return p;
  }
  return std::nullopt;
}

void split_words(SplitPattern p, std::string_view text, std::vector<std::string_view>& out) {
  size_t i = 0;
  while (i < text.size()) {
    size_t n = 0;
    switch (p) {
      case SplitPattern::kGpt2: n = match_gpt2(text, i); break;
      case SplitPattern::kLlama3: n = match_llama3(text, i, 3); break;
      case SplitPattern::kQwen2: n = match_llama3(text, i, 1); break;
    }
    if (n == 0) n = 1;  // never stall (cannot happen: every alternative consumes)
    out.push_back(text.substr(i, n));
    i += n;
  }
}

}  // namespace zt::data
