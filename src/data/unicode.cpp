#include "data/unicode.h"

#include <algorithm>
#include <array>

#include "data/unicode_tables.h"

namespace zt::data {
namespace {

using unicode_detail::kRanges;

CharClass lookup(uint32_t cp) {
  const auto* end = std::end(kRanges);
  const auto* it = std::upper_bound(std::begin(kRanges), end, cp,
                                    [](uint32_t c, const unicode_detail::CodeRange& r) { return c < r.first; });
  if (it == std::begin(kRanges)) return CharClass::kOther;
  --it;
  return cp <= it->last ? static_cast<CharClass>(it->cls) : CharClass::kOther;
}

// The Basic Multilingual Plane, one byte per code point: nearly all text is classified
// by one load; the rest binary-searches the ranges.
struct BmpTable {
  std::array<uint8_t, 0x10000> cls{};
  BmpTable() {
    for (const auto& r : kRanges) {
      for (uint32_t c = r.first; c <= r.last && c < 0x10000; ++c) cls[c] = r.cls;
    }
  }
};
const BmpTable& bmp() {
  static const BmpTable t;
  return t;
}

}  // namespace

CharClass char_class(uint32_t cp) {
  if (cp < 0x10000) return static_cast<CharClass>(bmp().cls[cp]);
  if (cp > 0x10FFFF) return CharClass::kOther;
  return lookup(cp);
}

const char* unicode_version() { return unicode_detail::kUnicodeVersion; }

}  // namespace zt::data
