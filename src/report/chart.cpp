// Bar chart rendering of chart.h: input checks, nice y ticks, the layout (title, legend,
// axes box, category labels, footnote), then the drawing with the bitmap font of png.h.
#include "report/chart.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string_view>
#include <tuple>

#include "report/text_fit.h"

namespace zt::report {
namespace {

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kText{34, 34, 34};
constexpr Rgb kMuted{96, 96, 96};
constexpr Rgb kGrid{226, 226, 226};
constexpr Rgb kAxis{64, 64, 64};
constexpr Rgb kMarker{0, 0, 0};
constexpr Rgb kReference{90, 90, 90};
constexpr Rgb kNote{170, 0, 30};

constexpr std::array<Rgb, 8> kPalette = {{
    {0, 114, 178},    // blue
    {230, 159, 0},    // orange
    {0, 158, 115},    // bluish green
    {213, 94, 0},     // vermillion
    {86, 180, 233},   // sky blue
    {204, 121, 167},  // reddish purple
    {240, 228, 66},   // yellow
    {136, 34, 85},    // wine
}};

constexpr int kPad = 12;         // image border
constexpr int kTitleScale = 3;
constexpr int kLabelScale = 2;   // legend, y label, ticks, category labels when they fit
constexpr int kLegendGap = 28;   // between legend entries
constexpr int kMinWidth = 200;
constexpr int kMinHeight = 150;
constexpr int kMaxBarWidth = 120;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// ---- input checks ----------------------------------------------------------------------

void check_value(const BarChart& c, double v, const std::string& what, size_t cat) {
  if (std::isnan(v) || (std::isfinite(v) && v >= 0)) return;
  throw std::invalid_argument("bar chart '" + c.title + "': " + what + " for category '" + c.categories[cat] +
                              "' is " + num(v) + "; bars need finite values >= 0 (NaN for none)");
}

void validate(const BarChart& c, int width, int height) {
  if (width < kMinWidth || height < kMinHeight) {
    throw std::invalid_argument("bar chart '" + c.title + "': image " + std::to_string(width) + "x" +
                                std::to_string(height) + " is smaller than " + std::to_string(kMinWidth) +
                                "x" + std::to_string(kMinHeight));
  }
  const size_t n = c.categories.size();
  auto check_size = [&](size_t got, const std::string& what) {
    if (got == n) return;
    throw std::invalid_argument("bar chart '" + c.title + "': " + what + " has " + std::to_string(got) +
                                " entries for " + std::to_string(n) + " categories");
  };
  for (const BarSeries& s : c.series) {
    check_size(s.values.size(), "series '" + s.name + "'");
    for (size_t i = 0; i < n; ++i) check_value(c, s.values[i], "value of series '" + s.name + "'", i);
  }
  if (!c.category_notes.empty()) check_size(c.category_notes.size(), "category_notes");
  if (!c.markers.empty()) {
    check_size(c.markers.size(), "markers");
    for (size_t i = 0; i < n; ++i) check_value(c, c.markers[i], "marker", i);
  }
  if (!std::isnan(c.reference) && !(std::isfinite(c.reference) && c.reference >= 0)) {
    throw std::invalid_argument("bar chart '" + c.title + "': reference is " + num(c.reference) +
                                "; it must be finite and >= 0 (NaN for none)");
  }
}

// Sum of a category's stacked values; NaN when it has none.
double stack_total(const BarChart& c, size_t cat) {
  double total = NAN;
  for (const BarSeries& s : c.series) {
    if (!std::isnan(s.values[cat])) total = (std::isnan(total) ? 0.0 : total) + s.values[cat];
  }
  return total;
}

double marker_at(const BarChart& c, size_t cat) { return c.markers.empty() ? NAN : c.markers[cat]; }

double data_max(const BarChart& c) {
  double m = 0;
  auto take = [&](double v) {
    if (!std::isnan(v)) m = std::max(m, v);
  };
  for (size_t i = 0; i < c.categories.size(); ++i) {
    if (c.stacked) {
      take(stack_total(c, i));
    } else {
      for (const BarSeries& s : c.series) take(s.values[i]);
    }
    take(marker_at(c, i));
  }
  take(c.reference);
  return m;
}

// ---- numbers ---------------------------------------------------------------------------

std::string strip_zeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// The fewest decimals (at most 6) that show `step` exactly.
int decimals_of(double step) {
  for (int d = 0; d < 6; ++d) {
    const double scaled = step * std::pow(10.0, d);
    if (std::fabs(scaled - std::round(scaled)) < 1e-6 * std::max(1.0, scaled)) return d;
  }
  return 6;
}

struct Suffix {
  double divisor;
  const char* text;
};

Suffix suffix_for(double magnitude) {
  if (magnitude >= 1e10) return {1e9, "G"};
  if (magnitude >= 1e7) return {1e6, "M"};
  if (magnitude >= 1e4) return {1e3, "k"};
  return {1, ""};
}

std::string tick_label(double t, double step, const Suffix& sfx) {
  if (t == 0) return "0";
  return fixed(t / sfx.divisor, decimals_of(step / sfx.divisor)) + sfx.text;
}

// Scale 3 on one line, else scale 2 then 1 on up to two lines.
TextBlock fit_title(const std::string& s, int max_w) {
  if (text_width(s, kTitleScale) <= max_w) return TextBlock{{s}, kTitleScale, false};
  TextBlock b{two_lines(s, max_w, kLabelScale), kLabelScale, false};
  return all_fit(b.lines, max_w, kLabelScale) ? b : TextBlock{two_lines(s, max_w, 1), 1, false};
}

// ---- layout ----------------------------------------------------------------------------

struct LegendItem {
  std::string text;
  Rgb color;
  bool marker = false;
  int width(int scale) const { return swatch(scale) + 6 + text_width(text, scale); }
  static int swatch(int scale) { return 8 * scale; }
};

struct Geometry {
  ChartLayout layout;
  TextBlock title;
  std::vector<std::vector<LegendItem>> legend_rows;
  int legend_scale = kLabelScale;
  int legend_y = 0;
  Suffix suffix{1, ""};
  double step = 1;
  int bar_w = 1;        // one bar (grouped) or the stack (stacked)
  int cluster_w = 1;    // all bars of one group
  int label_room = 1;   // widest horizontal value label over one bar
  int value_scale = 1;
  int value_headroom = 0;
  std::vector<TextBlock> category_labels;
  int category_labels_y = 0;
  std::string footnote;
  int footnote_y = 0;
};

std::vector<std::vector<LegendItem>> legend_rows(const BarChart& c, int max_w, int scale) {
  std::vector<LegendItem> items;
  for (size_t s = 0; s < c.series.size(); ++s) {
    const std::string& name = c.series[s].name;
    items.push_back({name.empty() ? "series " + std::to_string(s + 1) : name, series_color(s)});
  }
  const bool any_marker = std::any_of(c.markers.begin(), c.markers.end(), [](double m) { return !std::isnan(m); });
  if (any_marker) items.push_back({c.marker_label.empty() ? "marker" : c.marker_label, kMarker, true});
  if (items.size() == 1 && !items[0].marker && c.series[0].name.empty()) items.clear();
  std::vector<std::vector<LegendItem>> rows;
  int row_w = 0;
  for (LegendItem& it : items) {
    it.text = truncate_text(it.text, max_w - LegendItem::swatch(scale) - 6, scale);
    if (rows.empty() || row_w + kLegendGap + it.width(scale) > max_w) {
      rows.emplace_back();
      row_w = -kLegendGap;
    }
    row_w += kLegendGap + it.width(scale);
    rows.back().push_back(it);
  }
  return rows;
}

std::string value_text(const BarChart& c, size_t cat, size_t s) {
  const double v = c.stacked ? stack_total(c, cat) : c.series[s].values[cat];
  return std::isnan(v) ? std::string() : format_value(v);
}

Geometry plan(const BarChart& c, int width, int height) {
  Geometry g;
  ChartLayout& L = g.layout;
  const size_t n = c.categories.size();

  // Title and legend (scale 1 when scale 2 would take over a fifth of the height), top down.
  const int text_w = width - 2 * kPad;
  if (!c.title.empty()) g.title = fit_title(c.title, text_w);
  int y = kPad + (c.title.empty() ? 0 : g.title.height() + 10);
  g.legend_rows = legend_rows(c, text_w, kLabelScale);
  if (static_cast<int>(g.legend_rows.size()) * line_pitch(kLabelScale) > height / 5) {
    g.legend_scale = 1;
    g.legend_rows = legend_rows(c, text_w, 1);
  }
  g.legend_y = y;
  y += static_cast<int>(g.legend_rows.size()) * line_pitch(g.legend_scale) + 4;

  // Y range, then the left margin from the widest tick label.
  L.ticks = nice_ticks(data_max(c));
  L.y_top = L.ticks.back();
  g.step = L.ticks[1] - L.ticks[0];
  g.suffix = suffix_for(L.y_top);
  int tick_w = 0;
  for (double t : L.ticks) tick_w = std::max(tick_w, text_width(tick_label(t, g.step, g.suffix), kLabelScale));
  L.plot_left = kPad + (c.y_label.empty() ? 0 : text_height(kLabelScale) + 10) + tick_w + 10;
  L.plot_right = width - kPad - 8;

  // Groups and bars.
  const double group_w = n == 0 ? 0.0 : (L.plot_right - L.plot_left - 1) / static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) {
    L.group_left.push_back(L.plot_left + 1 + static_cast<int>(std::lround(static_cast<double>(i) * group_w)));
    L.group_right.push_back(L.plot_left + 1 + static_cast<int>(std::lround(static_cast<double>(i + 1) * group_w)));
  }
  const int k = c.stacked ? 1 : std::max(1, static_cast<int>(c.series.size()));
  const double share = c.stacked ? 0.6 : 0.8;
  g.bar_w = std::clamp(static_cast<int>(group_w * share) / k, 1, kMaxBarWidth);
  g.cluster_w = g.bar_w * k;
  // Side-by-side bars keep a few pixels between neighbouring labels.
  g.label_room = k > 1 ? g.bar_w - 4 : g.bar_w + 2;

  // Value labels: scale 2 when every label fits its bar, else 1.
  g.value_scale = kLabelScale;
  for (size_t i = 0; i < n && g.value_scale > 1; ++i) {
    for (size_t s = 0; s < (c.stacked ? 1 : c.series.size()); ++s) {
      if (text_width(value_text(c, i, s), kLabelScale) > g.label_room) g.value_scale = 1;
    }
  }
  g.value_headroom = text_height(g.value_scale) + 6;
  L.plot_top = y + g.value_headroom;

  // Bottom up: footnote, category labels, the x axis.
  int bottom = height - kPad;
  if (!c.footnote.empty()) {
    g.footnote = truncate_text(c.footnote, width - 2 * kPad, 1);
    g.footnote_y = bottom - text_height(1);
    bottom = g.footnote_y - 8;
  }
  const int label_w = std::max(1, static_cast<int>(group_w) - 6);
  int labels_h = 0;
  for (const std::string& cat : c.categories) {
    g.category_labels.push_back(fit_block(cat, label_w, 2, height / 4));
  }
  // One style for all labels: the least legible any of them needed.
  auto worse = [](const TextBlock& a, const TextBlock& b) {
    return std::tuple(a.vertical, -a.scale, a.lines.size()) < std::tuple(b.vertical, -b.scale, b.lines.size());
  };
  if (!g.category_labels.empty()) {
    const TextBlock style = *std::max_element(g.category_labels.begin(), g.category_labels.end(), worse);
    for (size_t i = 0; i < n; ++i) {
      TextBlock& b = g.category_labels[i];
      if (style.vertical) {
        b = TextBlock{{truncate_text(c.categories[i], height / 4, style.scale)}, style.scale, true};
      } else if (b.scale != style.scale) {
        b = TextBlock{wrap_text(c.categories[i], label_w, style.scale), style.scale, false};
      }
      labels_h = std::max(labels_h, b.height());
    }
  }
  // Degenerate sizes (tiny image, huge legend) overlap, but stay inside the image.
  L.plot_bottom = std::max(bottom - labels_h - 8, L.plot_top + 20);
  if (L.plot_bottom >= height - 1) {
    L.plot_bottom = height - 2;
    L.plot_top = std::max(0, std::min(L.plot_top, L.plot_bottom - 20));
  }
  g.category_labels_y = L.plot_bottom + 8;
  return g;
}

// ---- drawing ---------------------------------------------------------------------------

void draw_dashed_hline(Image& img, int x0, int x1, int y, Rgb c) {
  for (int x = x0; x <= x1; x += 16) img.fill_rect(x, y - 1, std::min(10, x1 - x + 1), 2, c);
}

void draw_legend(Image& img, const Geometry& g, int width) {
  const int scale = g.legend_scale, swatch = LegendItem::swatch(scale);
  const int cap = 7 * scale;  // swatches span the capital height
  int y = g.legend_y;
  for (const auto& row : g.legend_rows) {
    int row_w = -kLegendGap;
    for (const LegendItem& it : row) row_w += kLegendGap + it.width(scale);
    int x = (width - row_w) / 2;
    for (const LegendItem& it : row) {
      if (it.marker) {
        img.fill_rect(x, y + cap / 2 - 2, swatch, 4, it.color);
      } else {
        img.fill_rect(x, y, swatch, cap, it.color);
      }
      draw_text(img, x + swatch + 6, y, it.text, kText, scale);
      x += it.width(scale) + kLegendGap;
    }
    y += line_pitch(scale);
  }
}

// Value label above a bar: horizontal when it fits the bar, else vertical when there is
// room above the bar, else none; moved above the group's marker tick (row marker_y, or
// -1) when it would cross it. Returns the top row it used (bar_top when none).
int draw_value_label(Image& img, const Geometry& g, const std::string& text, int x, int w, int bar_top,
                     int marker_y) {
  if (text.empty()) return bar_top;
  const int limit = g.layout.plot_top - g.value_headroom + 2;
  const bool vertical = text_width(text, g.value_scale) > g.label_room;
  const int scale = vertical ? 1 : g.value_scale;
  const int along = text_width(text, scale), across = text_height(scale);
  const int tall = vertical ? along : across;
  int top = bar_top - 3 - tall;
  if (marker_y >= 0 && top <= marker_y + 3 && bar_top - 1 >= marker_y - 3) top = marker_y - 5 - tall;
  if (vertical && (across > g.label_room || top < limit)) return bar_top;
  if (vertical) {
    draw_text_vertical(img, x + (w - across) / 2, top, text, kText, scale);
  } else {
    draw_text(img, x + (w - along) / 2, top, text, kText, scale);
  }
  return top;
}

// The first column of category i's bars (centred in the group).
int cluster_left(const Geometry& g, size_t i) {
  const ChartLayout& L = g.layout;
  return L.group_left[i] + (L.group_right[i] - L.group_left[i] - g.cluster_w) / 2;
}

void draw_bars(Image& img, const BarChart& c, Geometry& g, std::vector<int>& group_top) {
  ChartLayout& L = g.layout;
  for (size_t i = 0; i < c.categories.size(); ++i) {
    const int x0 = cluster_left(g, i);
    const int gap = g.bar_w >= 4 ? 1 : 0;  // white column between neighbouring bars
    int top = L.plot_bottom;
    const int marker_y = std::isnan(marker_at(c, i)) ? -1 : L.y_of(marker_at(c, i));
    if (c.stacked) {
      double base = 0;
      for (size_t s = 0; s < c.series.size(); ++s) {
        const double v = c.series[s].values[i];
        if (std::isnan(v) || v <= 0) continue;
        const int y0 = L.y_of(base);
        const int y1 = std::min(L.y_of(base + v), y0 - 1);  // at least one row
        base += v;
        BarBox b{i, s, x0, y1, g.bar_w, y0 - y1, v};
        img.fill_rect(b.x, b.y, b.w, b.h, series_color(s));
        if (y0 != L.plot_bottom && b.h >= 3) img.hline(b.x, b.x + b.w - 1, y0 - 1, kWhite);  // segment seam
        L.bars.push_back(b);
        top = std::min(top, y1);
      }
      if (top < L.plot_bottom) {
        top = draw_value_label(img, g, value_text(c, i, 0), x0, g.bar_w, top, marker_y);
      }
    } else {
      for (size_t s = 0; s < c.series.size(); ++s) {
        const double v = c.series[s].values[i];
        if (std::isnan(v) || v <= 0) continue;
        const int y1 = std::min(L.y_of(v), L.plot_bottom - 1);
        BarBox b{i, s, x0 + static_cast<int>(s) * g.bar_w, y1, g.bar_w - gap, L.plot_bottom - y1, v};
        img.fill_rect(b.x, b.y, b.w, b.h, series_color(s));
        L.bars.push_back(b);
        top = std::min(top, draw_value_label(img, g, value_text(c, i, s), b.x, b.w, y1, marker_y));
      }
    }
    group_top[i] = top;
  }
}

void draw_note(Image& img, const BarChart& c, const Geometry& g, size_t i, int group_top) {
  const ChartLayout& L = g.layout;
  const int gl = L.group_left[i], gr = L.group_right[i];
  const int plot_h = L.plot_bottom - L.plot_top;
  const TextBlock b = fit_block(c.category_notes[i], std::max(1, gr - gl - 8), 3, plot_h - 16);
  int bottom = std::min(group_top, L.plot_bottom) - 8;
  const double m = marker_at(c, i);
  if (!std::isnan(m)) {
    const int my = L.y_of(m);
    if (my >= bottom - b.height() - 6 && my <= bottom + 6) bottom = my - 8;
  }
  const int top = std::max(bottom - b.height(), L.plot_top + 2);
  const int cx = (gl + gr) / 2;
  img.fill_rect(cx - b.width() / 2 - 3, top - 3, b.width() + 6, b.height() + 6, kWhite);
  draw_block(img, b, cx, top, kNote);
}

void draw_reference(Image& img, const BarChart& c, const Geometry& g) {
  const ChartLayout& L = g.layout;
  const int y = L.y_of(c.reference);
  draw_dashed_hline(img, L.plot_left + 1, L.plot_right, y, kReference);
  // Up to 4 significant digits: a capacity like 139.8 should not print as 140.
  const int magnitude = static_cast<int>(std::floor(std::log10(std::max(c.reference, 1e-3))));
  const int digits = std::clamp(3 - magnitude, 0, 6);
  const std::string v = strip_zeros(fixed(c.reference, digits));
  std::string label = c.reference_label.empty() ? v : c.reference_label + ": " + v;
  label = truncate_text(label, L.plot_right - L.plot_left - 12, kLabelScale);
  const int tw = text_width(label, kLabelScale), th = text_height(kLabelScale);
  const int x = L.plot_right - 6 - tw;
  const int above = y - 4 - th;
  const int ty = above >= L.plot_top - g.value_headroom + 2 ? above : y + 5;
  img.fill_rect(x - 3, ty - 2, tw + 6, th + 3, kWhite);
  draw_text(img, x, ty, label, kReference, kLabelScale);
}

}  // namespace

int ChartLayout::y_of(double value) const {
  const double frac = y_top > 0 ? value / y_top : 0.0;
  const auto y = static_cast<int>(std::lround(plot_bottom - frac * (plot_bottom - plot_top)));
  return std::clamp(y, plot_top, plot_bottom);
}

Rgb series_color(size_t i) { return kPalette[i % kPalette.size()]; }

std::vector<double> nice_ticks(double max_value) {
  if (!std::isfinite(max_value) || max_value <= 0) max_value = 1;
  const double base = std::pow(10.0, std::floor(std::log10(max_value / 8)));
  double step = base;
  long intervals = 0;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0, 20.0, 25.0, 50.0}) {
    step = m * base;
    intervals = std::max(1L, static_cast<long>(std::ceil(max_value / step * (1 - 1e-12))));
    if (intervals <= 8) break;
  }
  std::vector<double> ticks;
  for (long i = 0; i <= intervals; ++i) ticks.push_back(static_cast<double>(i) * step);
  return ticks;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (v == 0) return "0";
  const double a = std::fabs(v);
  const Suffix sfx = suffix_for(a);
  if (sfx.divisor > 1) return format_value(v / sfx.divisor) + sfx.text;
  if (a >= 100) return fixed(v, 0);
  if (a >= 10) return strip_zeros(fixed(v, 1));
  if (a >= 1) return strip_zeros(fixed(v, 2));
  if (a >= 1e-3) return strip_zeros(fixed(v, 2 - static_cast<int>(std::floor(std::log10(a)))));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2g", v);
  return buf;
}

Image render_bar_chart(const BarChart& c, int width, int height) {
  ChartLayout unused;
  return render_bar_chart(c, unused, width, height);
}

Image render_bar_chart(const BarChart& c, ChartLayout& layout, int width, int height) {
  validate(c, width, height);
  Geometry g = plan(c, width, height);
  const ChartLayout& L = g.layout;
  Image img(width, height, kWhite);

  // Grid and y ticks.
  for (double t : L.ticks) {
    const int y = L.y_of(t);
    if (t > 0) img.hline(L.plot_left + 1, L.plot_right, y, kGrid);
    img.hline(L.plot_left - 5, L.plot_left - 1, y, kAxis);
    const std::string label = tick_label(t, g.step, g.suffix);
    draw_text(img, L.plot_left - 8 - text_width(label, kLabelScale), y - 7 * kLabelScale / 2, label, kText,
              kLabelScale);
  }
  std::vector<int> group_top(c.categories.size(), L.plot_bottom);
  draw_bars(img, c, g, group_top);
  img.vline(L.plot_left, L.plot_top, L.plot_bottom, kAxis);
  img.hline(L.plot_left, L.plot_right, L.plot_bottom, kAxis);
  if (!std::isnan(c.reference)) draw_reference(img, c, g);
  for (size_t i = 0; i < c.categories.size(); ++i) {
    if (!c.category_notes.empty() && !c.category_notes[i].empty()) draw_note(img, c, g, i, group_top[i]);
    const double m = marker_at(c, i);
    if (!std::isnan(m)) img.fill_rect(cluster_left(g, i) - 4, L.y_of(m) - 2, g.cluster_w + 8, 4, kMarker);
    const int cx = (L.group_left[i] + L.group_right[i]) / 2;
    draw_block(img, g.category_labels[i], cx, g.category_labels_y, kText);
  }
  if (c.categories.empty()) {
    const char* empty = "no data";
    draw_text(img, (L.plot_left + L.plot_right - text_width(empty, kLabelScale)) / 2,
              (L.plot_top + L.plot_bottom) / 2, empty, kMuted, kLabelScale);
  }

  // Title, legend, y label, footnote.
  if (!g.title.lines.empty()) draw_block(img, g.title, width / 2, kPad, kText);
  draw_legend(img, g, width);
  if (!c.y_label.empty()) {  // centred on the axes box, as long as the image allows
    const int mid = (L.plot_top + L.plot_bottom) / 2;
    const int scale = text_width(c.y_label, kLabelScale) <= L.plot_bottom - L.plot_top ? kLabelScale : 1;
    const std::string label = truncate_text(c.y_label, 2 * std::min(mid - kPad, height - kPad - mid), scale);
    draw_text_vertical(img, kPad, mid - text_width(label, scale) / 2, label, kText, scale);
  }
  if (!g.footnote.empty()) draw_text(img, kPad, g.footnote_y, g.footnote, kMuted, 1);
  layout = std::move(g.layout);
  return img;
}

void write_bar_chart_png(const std::string& path, const BarChart& c, int width, int height) {
  write_png(path, render_bar_chart(c, width, height));
}

}  // namespace zt::report
