// report/png and report/chart: PNG round trips (stb_image_write's files read back by
// stb_image, tests/support/png_reader.h), text drawing, nice ticks, and chart geometry
// read back from the rendered pixels.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "report/chart.h"
#include "report/font.h"
#include "report/png.h"
#include "report/text_fit.h"
#include "support/png_reader.h"

namespace zt_test_chart {

namespace {

using zt::report::BarChart;
using zt::report::ChartLayout;
using zt::report::Image;
using zt::report::Rgb;

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr Rgb kWhite{255, 255, 255};

using zt::test::decode_png;
using zt::test::DecodedPng;

// Deterministic bytes with no structure (a 64-bit LCG's high bits).
std::vector<uint8_t> noise_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(seed >> 56);
  }
  return v;
}

Image pattern_image(int w, int h) {
  Image img(w, h);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      img.set(x, y, {static_cast<uint8_t>(x * 7 + y), static_cast<uint8_t>(y * 13), static_cast<uint8_t>(x ^ y)});
    }
  }
  return img;
}

fs::path temp_png(const std::string& name) {
  return fs::temp_directory_path() / ("zt_test_chart_" + std::to_string(::getpid()) + "_" + name + ".png");
}

// ---- pixel queries --------------------------------------------------------------------

// Topmost row in columns [x0, x1) and rows [y0, y1) holding colour c, or -1.
int topmost(const Image& img, Rgb c, int x0, int x1, int y0, int y1) {
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      if (img.at(x, y) == c) return y;
    }
  }
  return -1;
}

int count_colour(const Image& img, Rgb c, int x0, int x1, int y0, int y1) {
  int n = 0;
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) n += img.at(x, y) == c ? 1 : 0;
  }
  return n;
}

BarChart grouped_chart() {
  BarChart c;
  c.title = "grouped";
  c.y_label = "GiB per GPU";
  c.categories = {"big", "half", "failed"};
  c.series = {{"a", {40, 20, kNaN}}, {"b", {10, kNaN, kNaN}}};
  return c;
}

}  // namespace

// ---- PNG ------------------------------------------------------------------------------

TEST(Png, RoundTripThroughIndependentReader) {
  for (auto [w, h] : {std::pair{200, 150}, std::pair{1, 1}, std::pair{301, 7}, std::pair{2, 3}}) {
    const Image img = pattern_image(w, h);
    const std::vector<uint8_t> png = zt::report::encode_png(img);
    const DecodedPng d = decode_png(png);
    EXPECT_EQ(d.channels, 3) << "8-bit RGB";
    EXPECT_FALSE(d.sixteen_bit);
    ASSERT_EQ(d.img.width, w);
    ASSERT_EQ(d.img.height, h);
    EXPECT_TRUE(d.img.rgb == img.rgb) << "pixels differ after the round trip, " << w << "x" << h;
    EXPECT_EQ(png, zt::report::encode_png(img)) << "deterministic";
  }
  // The pattern compresses: a tenth of the raw size.
  EXPECT_LT(zt::report::encode_png(pattern_image(200, 150)).size(), 200u * 150u * 3u / 10u);
  // Noise (every filter type pays off somewhere) round-trips too.
  Image noisy(300, 120);
  noisy.rgb = noise_bytes(noisy.rgb.size(), 3);
  for (int y = 0; y < noisy.height; y += 3) {
    for (int x = 0; x < noisy.width; ++x) noisy.set(x, y, {static_cast<uint8_t>(x), static_cast<uint8_t>(y), 9});
  }
  EXPECT_TRUE(decode_png(zt::report::encode_png(noisy)).img.rgb == noisy.rgb);
  // The reader does fail: a cut file, a broken signature.
  std::vector<uint8_t> png = zt::report::encode_png(pattern_image(20, 20));
  EXPECT_THROW(decode_png(std::vector<uint8_t>(png.begin(), png.begin() + static_cast<long>(png.size() / 2))),
               std::runtime_error);
  png[1] = 'X';
  EXPECT_THROW(decode_png(png), std::runtime_error);
}

TEST(Png, RejectsEmptyOrInconsistentImages) {
  EXPECT_THROW(zt::report::encode_png(Image()), std::invalid_argument);
  Image img(4, 4);
  img.rgb.pop_back();
  EXPECT_THROW(zt::report::encode_png(img), std::invalid_argument);
  EXPECT_THROW(Image(-1, 3), std::invalid_argument);
}

TEST(Png, WritePngWritesTheSignatureAndNamesThePathOnFailure) {
  const fs::path path = temp_png("sig");
  zt::report::write_png(path.string(), pattern_image(10, 10));
  std::ifstream in(path, std::ios::binary);
  std::vector<char> head(8);
  in.read(head.data(), 8);
  ASSERT_EQ(in.gcount(), 8);
  const std::vector<char> sig = {'\x89', 'P', 'N', 'G', '\r', '\n', '\x1a', '\n'};
  EXPECT_EQ(head, sig);
  in.close();
  fs::remove(path);

  const std::string bad = "/nonexistent-dir-zt/x.png";
  try {
    zt::report::write_png(bad, pattern_image(2, 2));
    FAIL() << "write_png to a missing directory did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

TEST(Png, DrawingClipsToTheImage) {
  Image img(10, 10);
  img.fill_rect(-5, -5, 100, 6, {1, 2, 3});  // rows -5..0
  img.fill_rect(3, 3, 0, 5, {1, 2, 3});      // empty
  img.line(-20, 5, 30, 5, {4, 5, 6});
  img.set(10, 10, {7, 8, 9});
  // 'H' (#...# on its top row) at scale 3 from x = -3: its right stem covers columns 9..11.
  zt::report::draw_text(img, -3, 8, "Hello", {0, 0, 0}, 3);
  EXPECT_EQ(img.rgb.size(), 300u);
  EXPECT_EQ(img.at(0, 0), (Rgb{1, 2, 3}));
  EXPECT_EQ(img.at(9, 1), kWhite);
  EXPECT_EQ(img.at(3, 3), kWhite);
  EXPECT_EQ(img.at(9, 5), (Rgb{4, 5, 6}));
  EXPECT_EQ(img.at(9, 9), (Rgb{0, 0, 0}));
  EXPECT_EQ(img.at(5, 9), kWhite);
  EXPECT_THROW(img.at(10, 0), std::out_of_range);
  Image diag(5, 5);
  diag.line(4, 4, 0, 0, {0, 0, 0});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(diag.at(i, i), (Rgb{0, 0, 0}));
  EXPECT_EQ(diag.at(1, 0), kWhite);
}

// ---- text -----------------------------------------------------------------------------

TEST(Png, FontHasDistinctGlyphsAndUnknownIsQuestionMark) {
  std::set<zt::report::GlyphRows> seen;
  for (char32_t c = 33; c <= 126; ++c) {
    const zt::report::GlyphRows& g = zt::report::glyph(c);
    bool any = false;
    for (uint8_t row : g) {
      any = any || row != 0;
      EXPECT_EQ(row & ~0x1Fu, 0u) << "glyph " << static_cast<int>(c) << " wider than 5 pixels";
    }
    EXPECT_TRUE(any) << "glyph " << static_cast<int>(c) << " is blank";
    seen.insert(g);
  }
  EXPECT_EQ(seen.size(), 94u) << "two printable glyphs look the same";
  EXPECT_EQ(zt::report::glyph(1), zt::report::glyph(U'?'));
  EXPECT_EQ(zt::report::glyph(0x4E2D), zt::report::glyph(U'?'));
  EXPECT_EQ(zt::report::glyph(0x2014), zt::report::glyph(U'-'));
}

TEST(Png, TextWidthBoundsAndRotation) {
  EXPECT_EQ(zt::report::text_width("", 2), 0);
  EXPECT_EQ(zt::report::text_width("abc", 1), 17);
  EXPECT_EQ(zt::report::text_width("abc", 2), 34);
  EXPECT_EQ(zt::report::text_width("\xc3\xa9t\xc3\xa9", 1), 17) << "UTF-8 counts code points";
  EXPECT_EQ(zt::report::text_height(3), 27);

  const std::string s = "gAp|9";
  const int w = zt::report::text_width(s, 2), h = zt::report::text_height(2);
  Image horiz(w + 10, h + 10);
  zt::report::draw_text(horiz, 5, 5, s, {0, 0, 0}, 2);
  int inked = 0;
  for (int y = 0; y < horiz.height; ++y) {
    for (int x = 0; x < horiz.width; ++x) {
      if (horiz.at(x, y) == kWhite) continue;
      ++inked;
      EXPECT_TRUE(x >= 5 && x < 5 + w && y >= 5 && y < 5 + h) << "ink outside the text box at " << x << "," << y;
    }
  }
  EXPECT_GT(inked, 50);
  // Vertical = the horizontal text turned 90 degrees counter-clockwise.
  Image vert(h + 10, w + 10);
  zt::report::draw_text_vertical(vert, 5, 5, s, {0, 0, 0}, 2);
  for (int u = 0; u < w; ++u) {
    for (int v = 0; v < h; ++v) {
      ASSERT_EQ(horiz.at(5 + u, 5 + v), vert.at(5 + v, 5 + w - 1 - u)) << "u=" << u << " v=" << v;
    }
  }
  // Unknown characters draw as '?'.
  Image q1(20, 20), q2(20, 20);
  zt::report::draw_text(q1, 2, 2, "\x01", {0, 0, 0});
  zt::report::draw_text(q2, 2, 2, "?", {0, 0, 0});
  EXPECT_TRUE(q1.rgb == q2.rgb);
}

TEST(Png, TextFitting) {
  using zt::report::text_width;
  EXPECT_EQ(zt::report::truncate_text("short", 100, 1), "short");
  const std::string cut = zt::report::truncate_text("configuration-name", 50, 1);
  EXPECT_LE(text_width(cut, 1), 50);
  EXPECT_EQ(cut, "config..") << "8 characters are 47 pixels, 9 are 53";
  // Multi-byte characters are cut whole: 5 code points (29 pixels) into 23 -> "a\u00e9..".
  EXPECT_EQ(zt::report::truncate_text("a\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 23, 1), "a\xc3\xa9..");
  EXPECT_EQ(zt::report::truncate_text("abc", 5, 1), "");
  EXPECT_EQ(zt::report::wrap_text("fsdp2-reshard", 60, 1), (std::vector<std::string>{"fsdp2-", "reshard"}));
  EXPECT_EQ(zt::report::wrap_text("OOM in backward", 60, 1), (std::vector<std::string>{"OOM in", "backward"}));
  EXPECT_EQ(zt::report::wrap_text("one line", 1000, 2), (std::vector<std::string>{"one line"}));
  // fit_block: scale 2 when it fits, then wrapped, then scale 1, then vertical.
  EXPECT_EQ(zt::report::fit_block("z3-offp", 100, 2, 200).scale, 2);
  const zt::report::TextBlock wrapped = zt::report::fit_block("fsdp2-reshard", 90, 2, 200);
  EXPECT_EQ(wrapped.scale, 2);
  EXPECT_EQ(wrapped.lines.size(), 2u);
  EXPECT_LE(wrapped.width(), 90);
  const zt::report::TextBlock vertical = zt::report::fit_block("unbreakablename", 20, 2, 60);
  EXPECT_TRUE(vertical.vertical);
  EXPECT_LE(vertical.height(), 60);
}

// ---- chart ----------------------------------------------------------------------------

TEST(Chart, NiceTicksAndValueFormat) {
  for (double m : {0.0, -3.0, kNaN, 0.003, 1.0, 7.0, 8.0, 8.01, 139.8, 12345.0, 4.2e9}) {
    const std::vector<double> t = zt::report::nice_ticks(m);
    ASSERT_GE(t.size(), 5u) << m;
    ASSERT_LE(t.size(), 9u) << m;
    EXPECT_EQ(t[0], 0.0);
    const double step = t[1];
    for (size_t i = 1; i < t.size(); ++i) EXPECT_NEAR(t[i] - t[i - 1], step, step * 1e-9) << m;
    const double eff = std::isfinite(m) && m > 0 ? m : 1.0;
    EXPECT_GE(t.back(), eff * (1 - 1e-12)) << m;
    EXPECT_LT(t[t.size() - 2], eff) << "one interval too many for " << m;
    const double mant = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::fabs(mant - 1) < 1e-9 || std::fabs(mant - 2) < 1e-9 || std::fabs(mant - 2.5) < 1e-9 ||
                std::fabs(mant - 5) < 1e-9)
        << "step " << step << " for " << m;
  }
  EXPECT_EQ(zt::report::nice_ticks(139.8).back(), 140.0);
  EXPECT_EQ(zt::report::format_value(0), "0");
  EXPECT_EQ(zt::report::format_value(34.56), "34.6");
  EXPECT_EQ(zt::report::format_value(34.0), "34");
  EXPECT_EQ(zt::report::format_value(1234.4), "1234");
  EXPECT_EQ(zt::report::format_value(12345), "12.3k");
  EXPECT_EQ(zt::report::format_value(0.012345), "0.0123");
  EXPECT_EQ(zt::report::format_value(2.5e7), "25M");
}

TEST(Chart, GroupedBarHeightsAndMissingValuesReadFromPixels) {
  ChartLayout L;
  const Image img = zt::report::render_bar_chart(grouped_chart(), L, 900, 500);
  ASSERT_EQ(img.width, 900);
  ASSERT_EQ(img.height, 500);
  ASSERT_EQ(L.group_left.size(), 3u);
  const Rgb a = zt::report::series_color(0), b = zt::report::series_color(1);
  ASSERT_NE(a, b);
  auto top_in = [&](size_t g, Rgb c) {
    return topmost(img, c, L.group_left[g], L.group_right[g], L.plot_top, L.plot_bottom);
  };
  const int top_big = top_in(0, a), top_half = top_in(1, a);
  ASSERT_GE(top_big, 0) << "no bar of series a in group 0";
  ASSERT_GE(top_half, 0) << "no bar of series a in group 1";
  EXPECT_LT(top_big, top_half) << "40 must reach higher than 20";
  const int h_big = L.plot_bottom - top_big, h_half = L.plot_bottom - top_half;
  EXPECT_NEAR(h_big, 2 * h_half, 2);
  EXPECT_NEAR(h_big, 40 / L.y_top * (L.plot_bottom - L.plot_top), 1.5);
  EXPECT_GE(top_in(0, b), 0) << "series b has a bar in group 0";
  EXPECT_GT(top_in(0, b), top_big) << "10 is lower than 40";
  EXPECT_EQ(top_in(1, b), -1) << "NaN in group 1 drew a bar";
  for (size_t s = 0; s < 8; ++s) {
    EXPECT_EQ(top_in(2, zt::report::series_color(s)), -1) << "all-NaN group 2 has pixels of series " << s;
  }
  EXPECT_EQ(L.bars.size(), 3u);
  // Every bar lies inside its group and the axes box.
  for (const zt::report::BarBox& bar : L.bars) {
    EXPECT_GE(bar.x, L.group_left[bar.category]);
    EXPECT_LE(bar.x + bar.w, L.group_right[bar.category]);
    EXPECT_GE(bar.y, L.plot_top);
    EXPECT_EQ(bar.y + bar.h, L.plot_bottom);
  }
  // The legend shows both colours above the axes box.
  EXPECT_GT(count_colour(img, a, 0, img.width, 0, L.plot_top), 0);
  EXPECT_GT(count_colour(img, b, 0, img.width, 0, L.plot_top), 0);
}

TEST(Chart, StackedSegmentsSitOnEachOther) {
  BarChart c;
  c.stacked = true;
  c.categories = {"x", "y"};
  c.series = {{"forward", {30, 10}}, {"backward", {60, kNaN}}, {"step", {10, 10}}};
  ChartLayout L;
  const Image img = zt::report::render_bar_chart(c, L);
  const int cx = (L.group_left[0] + L.group_right[0]) / 2;
  auto rows_of = [&](Rgb col) {
    int lo = img.height, hi = -1;
    for (int y = L.plot_top; y <= L.plot_bottom; ++y) {
      if (img.at(cx, y) == col) lo = std::min(lo, y), hi = std::max(hi, y);
    }
    return std::pair{lo, hi};
  };
  const auto f = rows_of(zt::report::series_color(0)), bw = rows_of(zt::report::series_color(1)),
             st = rows_of(zt::report::series_color(2));
  ASSERT_GE(f.second, 0);
  ASSERT_GE(bw.second, 0);
  ASSERT_GE(st.second, 0);
  EXPECT_LT(bw.second, f.first) << "backward sits above forward";
  EXPECT_LT(st.second, bw.first) << "step sits above backward";
  EXPECT_EQ(f.second, L.plot_bottom - 1);
  const double px_per_unit = (L.plot_bottom - L.plot_top) / L.y_top;
  EXPECT_NEAR(L.plot_bottom - st.first, 100 * px_per_unit, 1.5) << "stack height is the total";
  // Group y: forward 10 + step 10 (backward NaN) = 20.
  const int top_y = topmost(img, zt::report::series_color(2), L.group_left[1], L.group_right[1], L.plot_top,
                            L.plot_bottom);
  EXPECT_NEAR(L.plot_bottom - top_y, 20 * px_per_unit, 1.5);
  EXPECT_EQ(count_colour(img, zt::report::series_color(1), L.group_left[1], L.group_right[1], L.plot_top,
                         L.plot_bottom),
            0);
}

TEST(Chart, MarkersReferenceAndNotesAreDrawn) {
  BarChart c = grouped_chart();
  c.markers = {45, kNaN, 30};
  c.marker_label = "estimate";
  c.reference = 47;  // not on a grid row
  c.reference_label = "capacity";
  c.category_notes = {"", "", "OOM in backward"};
  c.footnote = "test footnote";
  ChartLayout L;
  const Image img = zt::report::render_bar_chart(c, L, 1000, 500);
  EXPECT_GE(L.y_top, 47);
  const Rgb black{0, 0, 0};
  const int my = L.y_of(45);
  const int mid0 = (L.group_left[0] + L.group_right[0]) / 2;
  EXPECT_EQ(img.at(mid0, my), black) << "marker tick missing in group 0";
  const int mid1 = (L.group_left[1] + L.group_right[1]) / 2;
  EXPECT_EQ(img.at(mid1, my), kWhite) << "NaN marker drew a tick in group 1";
  // Group 2 has no bars, but a marker at 30 and a note.
  const int mid2 = (L.group_left[2] + L.group_right[2]) / 2;
  EXPECT_EQ(img.at(mid2, L.y_of(30)), black);
  const int inked = static_cast<int>(L.plot_bottom - L.plot_top) * (L.group_right[2] - L.group_left[2]) -
                    count_colour(img, kWhite, L.group_left[2], L.group_right[2], L.plot_top, L.plot_bottom);
  EXPECT_GT(inked, 100) << "the note left no ink in its group";
  // The reference line: dashed, so some but not all columns of its row are dark.
  const int ry = L.y_of(47);
  int dashes = 0;
  for (int x = L.plot_left + 1; x < L.plot_right; ++x) {
    const Rgb p = img.at(x, ry);
    dashes += p.r + p.g + p.b < 400 ? 1 : 0;
  }
  EXPECT_GT(dashes, (L.plot_right - L.plot_left) / 3);
  EXPECT_LT(dashes, L.plot_right - L.plot_left - 10);
}

TEST(Chart, RejectsBadInput) {
  BarChart c = grouped_chart();
  c.series[1].values.pop_back();
  try {
    zt::report::render_bar_chart(c);
    FAIL() << "size mismatch did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("series 'b'"), std::string::npos) << e.what();
  }
  c = grouped_chart();
  c.markers = {1, 2};
  EXPECT_THROW(zt::report::render_bar_chart(c), std::invalid_argument);
  c = grouped_chart();
  c.category_notes = {"x"};
  EXPECT_THROW(zt::report::render_bar_chart(c), std::invalid_argument);
  c = grouped_chart();
  c.series[0].values[0] = -1;
  EXPECT_THROW(zt::report::render_bar_chart(c), std::invalid_argument);
  c.series[0].values[0] = std::numeric_limits<double>::infinity();
  EXPECT_THROW(zt::report::render_bar_chart(c), std::invalid_argument);
  c = grouped_chart();
  c.reference = -5;
  EXPECT_THROW(zt::report::render_bar_chart(c), std::invalid_argument);
  EXPECT_THROW(zt::report::render_bar_chart(grouped_chart(), 100, 100), std::invalid_argument);
}

TEST(Chart, DegenerateChartsRenderInsideTheImage) {
  std::vector<BarChart> charts(5);
  charts[0].title = "empty";
  charts[1].categories = {"a", "b"};
  charts[1].series = {{"x", {kNaN, kNaN}}};
  charts[1].category_notes = {"failed", ""};
  charts[2].categories = {"only"};
  charts[2].series = {{"x", {3}}};
  charts[3].categories = {"tiny", "huge"};
  charts[3].series = {{"x", {1e-6, 1e6}}, {"y", {0, 2e6}}};
  charts[3].stacked = true;
  for (int i = 0; i < 16; ++i) {
    charts[4].categories.push_back("configuration-" + std::to_string(i));
    charts[4].series.resize(3);
    for (auto& s : charts[4].series) s.values.push_back(i + 0.5);
  }
  charts[4].title = std::string(300, 'T');
  charts[4].footnote = std::string(500, 'f');
  for (const BarChart& c : charts) {
    for (auto [w, h] : {std::pair{1400, 700}, std::pair{200, 150}}) {
      ChartLayout L;
      Image img;
      ASSERT_NO_THROW(img = zt::report::render_bar_chart(c, L, w, h)) << c.title;
      EXPECT_EQ(img.width, w);
      EXPECT_EQ(img.rgb.size(), static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
      EXPECT_TRUE(L.plot_left >= 0 && L.plot_right < w && L.plot_top >= 0 && L.plot_bottom < h);
    }
  }
  // A positive value far below the axis range still shows as at least one row.
  ChartLayout L;
  zt::report::render_bar_chart(charts[3], L);
  ASSERT_FALSE(L.bars.empty());
  EXPECT_EQ(L.bars[0].value, 1e-6);
  EXPECT_GE(L.bars[0].h, 1);
}

TEST(Chart, WriteBarChartPngWritesADecodablePng) {
  const fs::path path = temp_png("chart");
  zt::report::write_bar_chart_png(path.string(), grouped_chart(), 640, 360);
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  fs::remove(path);
  const DecodedPng d = decode_png(bytes);
  EXPECT_EQ(d.img.width, 640);
  EXPECT_EQ(d.img.height, 360);
  EXPECT_TRUE(d.img.rgb == zt::report::render_bar_chart(grouped_chart(), 640, 360).rgb);
}

TEST(Chart, FullSizeChartPngIsSmall) {
  // The bench charts are 1400x700 (2.9 MB of pixels); flat colour compresses to a few KB.
  BarChart c = grouped_chart();
  c.categories.clear();
  c.series = {{"forward", {}}, {"backward", {}}, {"step", {}}};
  for (int i = 0; i < 10; ++i) {
    c.categories.push_back("config-" + std::to_string(i));
    for (size_t p = 0; p < 3; ++p) {
      c.series[p].values.push_back(i == 7 ? kNaN : 5.0 + 3.1 * i * static_cast<double>(p + 1));
    }
    c.markers.push_back(i == 7 ? kNaN : 8.0 + 6.0 * i);
    c.category_notes.push_back(i == 7 ? "OOM in backward" : "");
  }
  c.marker_label = "estimate";
  c.reference = 139.8;
  c.reference_label = "device memory";
  c.footnote = "footnote";
  const Image img = zt::report::render_bar_chart(c);
  const std::vector<uint8_t> png = zt::report::encode_png(img);
  EXPECT_LT(png.size(), 50000u);
  const DecodedPng d = decode_png(png);
  EXPECT_TRUE(d.img.rgb == img.rgb);
}

}  // namespace zt_test_chart
