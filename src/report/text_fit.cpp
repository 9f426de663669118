// Fitting text into boxes for the report charts (see text_fit.h).
#include "report/text_fit.h"

#include <algorithm>

namespace zt::report {
namespace {

constexpr int kLarge = 2;

std::string trim_right(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

std::string truncate_text(std::string_view s, int max_w, int scale) {
  if (text_width(s, scale) <= max_w) return std::string(s);
  std::string cut(s);
  while (!cut.empty() && text_width(cut + "..", scale) > max_w) {
    // Drop the last code point: its continuation bytes, then its lead (or ASCII) byte.
    while (!cut.empty() && (static_cast<unsigned char>(cut.back()) & 0xC0) == 0x80) cut.pop_back();
    if (!cut.empty()) cut.pop_back();
  }
  return cut.empty() ? std::string() : cut + "..";
}

std::vector<std::string> wrap_text(std::string_view s, int max_w, int scale) {
  std::vector<std::string> pieces;
  std::string cur;
  for (char ch : s) {
    cur += ch;
    if (ch != ' ' && ch != '-' && ch != '_' && ch != '/' && ch != ',') continue;
    pieces.push_back(cur);
    cur.clear();
  }
  if (!cur.empty()) pieces.push_back(cur);
  std::vector<std::string> lines;
  std::string line;
  for (const std::string& p : pieces) {
    if (!line.empty() && text_width(trim_right(line + p), scale) > max_w) {
      lines.push_back(trim_right(line));
      line.clear();
    }
    line += p;
  }
  if (!trim_right(line).empty() || lines.empty()) lines.push_back(trim_right(line));
  return lines;
}

int widest(const std::vector<std::string>& lines, int scale) {
  int w = 0;
  for (const std::string& l : lines) w = std::max(w, text_width(l, scale));
  return w;
}

bool all_fit(const std::vector<std::string>& lines, int max_w, int scale) { return widest(lines, scale) <= max_w; }

std::vector<std::string> two_lines(const std::string& s, int max_w, int scale) {
  std::vector<std::string> lines = wrap_text(s, max_w, scale);
  if (lines.size() <= 2 && all_fit(lines, max_w, scale)) return lines;
  size_t rest = std::min(lines[0].size(), s.size());
  while (rest < s.size() && s[rest] == ' ') ++rest;
  return {truncate_text(lines[0], max_w, scale),
          truncate_text(std::string_view(s).substr(rest), max_w, scale)};
}

int line_pitch(int scale) { return text_height(scale) + scale; }

int TextBlock::height() const {
  if (lines.empty()) return 0;
  return vertical ? text_width(lines[0], scale) : static_cast<int>(lines.size()) * line_pitch(scale) - scale;
}

int TextBlock::width() const { return vertical ? text_height(scale) : widest(lines, scale); }

TextBlock fit_block(std::string_view s, int max_w, int max_lines, int max_tall) {
  for (int scale : {kLarge, 1}) {
    for (int lines : {1, max_lines}) {
      TextBlock b{wrap_text(s, lines == 1 ? 1 << 30 : max_w, scale), scale, false};
      if (static_cast<int>(b.lines.size()) <= lines && all_fit(b.lines, max_w, scale)) return b;
    }
  }
  const bool big = text_height(kLarge) <= max_w && text_width(s, kLarge) <= max_tall;
  const int scale = big ? kLarge : 1;
  return TextBlock{{truncate_text(s, max_tall, scale)}, scale, true};
}

void draw_block(Image& img, const TextBlock& b, int cx, int top, Rgb c) {
  if (b.vertical) {
    draw_text_vertical(img, cx - text_height(b.scale) / 2, top, b.lines[0], c, b.scale);
    return;
  }
  for (size_t i = 0; i < b.lines.size(); ++i) {
    const int y = top + static_cast<int>(i) * line_pitch(b.scale);
    draw_text(img, cx - text_width(b.lines[i], b.scale) / 2, y, b.lines[i], c, b.scale);
  }
}

}  // namespace zt::report
