// Fitting text into boxes for the report charts (src/report): cutting with "..", word
// wrap, and TextBlock, a block of centred lines (or one vertical line) in the bitmap
// font of png.h, with fit_block choosing the most legible layout for a column.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "report/png.h"

namespace zt::report {

// `s` cut (on a UTF-8 boundary) and ended with ".." so it is at most max_w wide; `s`
// itself when it fits; "" when not even ".." fits.
std::string truncate_text(std::string_view s, int max_w, int scale);
// Greedy word wrap to max_w, breaking after ' ', '-', '_', '/' and ',' (spaces at line
// ends dropped). A piece wider than max_w stays whole on its own line: check the widths.
std::vector<std::string> wrap_text(std::string_view s, int max_w, int scale);
// `s` on at most two lines of max_w: wrapped, the rest cut with ".." where it is longer.
std::vector<std::string> two_lines(const std::string& s, int max_w, int scale);
int widest(const std::vector<std::string>& lines, int scale);
bool all_fit(const std::vector<std::string>& lines, int max_w, int scale);
int line_pitch(int scale);  // from one line's top to the next

// Lines centred on one column, or (vertical) one line rotated counter-clockwise.
struct TextBlock {
  std::vector<std::string> lines;
  int scale = 1;
  bool vertical = false;
  int height() const;
  int width() const;
};

// The most legible way to put `s` in a column max_w wide: scale 2 then 1, each on one
// line then wrapped to up to max_lines; else vertical, cut to at most max_tall long.
TextBlock fit_block(std::string_view s, int max_w, int max_lines, int max_tall);
// Draws `b` centred on column cx from row `top` down.
void draw_block(Image& img, const TextBlock& b, int cx, int top, Rgb c);

}  // namespace zt::report
