// Bar charts rendered to PNG for the benchmark reports (src/report): grouped or stacked
// bars per category, "nice" y ticks from 0, legend, per-bar values, optional failure
// notes, per-category markers and a reference line. Torch-free, no external libraries.
#pragma once
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "report/png.h"

namespace zt::report {

struct BarSeries {
  std::string name;
  std::vector<double> values;  // one per category; NaN = no bar
};

struct BarChart {
  std::string title;                       // top centre
  std::string y_label;                     // e.g. "GiB per GPU", drawn vertically at the left
  std::vector<std::string> categories;     // x groups
  std::vector<BarSeries> series;           // side by side in each group, or stacked
  bool stacked = false;
  std::vector<std::string> category_notes;  // empty, or one per category ("" = none),
                                            // e.g. "OOM in backward", drawn in the group
  double reference = NAN;                   // optional dashed horizontal line
  std::string reference_label;
  std::vector<double> markers;              // empty, or one per category (NaN = none): a
  std::string marker_label;                 // thick tick across the group, in the legend
  std::string footnote;                     // small text bottom-left
};

// Where render_bar_chart put things, in pixels, for tests and for callers that want to
// annotate the image further.
struct BarBox {
  size_t category = 0;
  size_t series = 0;
  int x = 0;  // the filled rectangle [x, x + w) x [y, y + h); y is its top
  int y = 0;
  int w = 0;
  int h = 0;
  double value = 0;
};

struct ChartLayout {
  // The axes box: value 0 is the row plot_bottom (the x axis), y_top the row plot_top.
  int plot_left = 0;
  int plot_top = 0;
  int plot_right = 0;
  int plot_bottom = 0;
  double y_top = 1;
  std::vector<double> ticks;     // the y tick values, 0 first
  std::vector<int> group_left;   // per category: the group's columns [left, right)
  std::vector<int> group_right;
  std::vector<BarBox> bars;      // every bar (stacked: every segment) with a value > 0

  int y_of(double value) const;  // the row of `value` (clamped to the axes box)
};

// The series colours: Okabe-Ito's colour-blind-safe palette (blue, orange, green,
// vermillion, sky blue, purple, yellow) then wine; repeats after 8 series.
Rgb series_color(size_t i);
// Tick values 0, s, 2s, ... up to the first multiple of s >= max_value, with the step s
// in {1, 2, 2.5, 5} x 10^k chosen to give 4 to 8 intervals. max_value <= 0, NaN or
// infinite counts as 1.
std::vector<double> nice_ticks(double max_value);
// A bar value as printed above a bar: about 3 significant digits, no trailing zeros,
// k/M/G suffix from 10000 on ("34.6", "1234", "12.3k", "0.0123").
std::string format_value(double v);

// Throws std::invalid_argument when a series, category_notes (non-empty) or markers
// (non-empty) does not have one entry per category, when a value or marker is negative
// or infinite, or when the image is smaller than 200x150.
Image render_bar_chart(const BarChart& c, int width = 1400, int height = 700);
Image render_bar_chart(const BarChart& c, ChartLayout& layout, int width = 1400, int height = 700);
// render_bar_chart then write_png (which throws std::runtime_error naming the path).
void write_bar_chart_png(const std::string& path, const BarChart& c, int width = 1400, int height = 700);

}  // namespace zt::report
