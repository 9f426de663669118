// Bitmap font for the report charts (src/report): the 95 printable ASCII characters,
// drawn for this project on a 5x9 pixel cell (7 rows above the baseline, 2 below for
// descenders), one bit per pixel. Text drawing itself is in png.h.
#pragma once
#include <array>
#include <cstdint>

namespace zt::report {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 9;   // rows 0..6 above the baseline, 7..8 descenders
inline constexpr int kGlyphAdvance = 6;  // glyph plus one blank column

// One glyph: rows top to bottom, bit 4 of each row is the leftmost pixel.
using GlyphRows = std::array<uint8_t, kGlyphHeight>;

// The glyph of a Unicode code point. Printable ASCII maps to itself; a few common
// typographic characters map to an ASCII look-alike (dashes to '-', U+00D7 to 'x',
// micro sign to 'u', no-break space to ' '); everything else draws as '?'.
const GlyphRows& glyph(char32_t c);

}  // namespace zt::report
