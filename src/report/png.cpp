// RGB raster drawing and bitmap-font text of png.h, and the PNG encoding through
// stb_image_write (third_party/stb, public domain / MIT).
#include "report/png.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "report/font.h"

// The implementation lives in this file only; its functions are static here. The header
// is on a SYSTEM include path (CMakeLists.txt), so the project's warnings skip it.
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb/stb_image_write.h>

namespace zt::report {
namespace {

// ---- text ----------------------------------------------------------------------------

// Decodes UTF-8 one code point at a time; a malformed byte yields U+FFFD (drawn as '?').
class Utf8Reader {
 public:
  explicit Utf8Reader(std::string_view s) : s_(s) {}
  bool done() const { return pos_ >= s_.size(); }
  char32_t next() {
    const auto lead = static_cast<unsigned char>(s_[pos_++]);
    if (lead < 0x80) return lead;
    int extra = 0;
    char32_t cp = 0;
    if ((lead & 0xE0) == 0xC0) {
      extra = 1;
      cp = lead & 0x1Fu;
    } else if ((lead & 0xF0) == 0xE0) {
      extra = 2;
      cp = lead & 0x0Fu;
    } else if ((lead & 0xF8) == 0xF0) {
      extra = 3;
      cp = lead & 0x07u;
    } else {
      return kReplacement;
    }
    for (int i = 0; i < extra; ++i) {
      if (done()) return kReplacement;
      const auto cont = static_cast<unsigned char>(s_[pos_]);
      if ((cont & 0xC0) != 0x80) return kReplacement;
      cp = (cp << 6) | (cont & 0x3Fu);
      ++pos_;
    }
    return cp;
  }

 private:
  static constexpr char32_t kReplacement = 0xFFFD;
  std::string_view s_;
  size_t pos_ = 0;
};

size_t code_points(std::string_view s) {
  size_t n = 0;
  for (Utf8Reader rd(s); !rd.done(); rd.next()) ++n;
  return n;
}

// Calls plot(u, v) for each set font pixel of `s`, in unscaled text coordinates
// (u along the text, v down from the top of the text box).
template <class Plot>
void for_each_text_pixel(std::string_view s, Plot&& plot) {
  int pen = 0;
  for (Utf8Reader rd(s); !rd.done(); pen += kGlyphAdvance) {
    const GlyphRows& rows = glyph(rd.next());
    for (int v = 0; v < kGlyphHeight; ++v) {
      for (int u = 0; u < kGlyphWidth; ++u) {
        if ((rows[static_cast<size_t>(v)] >> (kGlyphWidth - 1 - u)) & 1u) plot(pen + u, v);
      }
    }
  }
}

}  // namespace

// ---- Image ---------------------------------------------------------------------------

Image::Image(int w, int h, Rgb background) : width(w), height(h) {
  if (w < 0 || h < 0) {
    throw std::invalid_argument("report::Image: negative size " + std::to_string(w) + "x" +
                                std::to_string(h));
  }
  const size_t n = static_cast<size_t>(w) * static_cast<size_t>(h);
  rgb.resize(n * 3);
  for (size_t i = 0; i < n; ++i) {
    rgb[3 * i] = background.r;
    rgb[3 * i + 1] = background.g;
    rgb[3 * i + 2] = background.b;
  }
}

Rgb Image::at(int x, int y) const {
  if (!contains(x, y)) {
    throw std::out_of_range("report::Image::at(" + std::to_string(x) + ", " + std::to_string(y) +
                            ") outside " + std::to_string(width) + "x" + std::to_string(height));
  }
  const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3;
  return {rgb[i], rgb[i + 1], rgb[i + 2]};
}

void Image::set(int x, int y, Rgb c) {
  if (!contains(x, y)) return;
  const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3;
  rgb[i] = c.r;
  rgb[i + 1] = c.g;
  rgb[i + 2] = c.b;
}

void Image::fill_rect(int x, int y, int w, int h, Rgb c) {
  const int x0 = std::max(x, 0), y0 = std::max(y, 0);
  const int x1 = std::min(x + w, width), y1 = std::min(y + h, height);
  for (int yy = y0; yy < y1; ++yy) {
    for (int xx = x0; xx < x1; ++xx) set(xx, yy, c);
  }
}

void Image::hline(int x0, int x1, int y, Rgb c) {
  if (x0 > x1) std::swap(x0, x1);
  fill_rect(x0, y, x1 - x0 + 1, 1, c);
}

void Image::vline(int x, int y0, int y1, Rgb c) {
  if (y0 > y1) std::swap(y0, y1);
  fill_rect(x, y0, 1, y1 - y0 + 1, c);
}

void Image::line(int x0, int y0, int x1, int y1, Rgb c) {
  // Bresenham over all octants.
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    set(x0, y0, c);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

// ---- text ----------------------------------------------------------------------------

int text_width(std::string_view s, int scale) {
  scale = std::max(scale, 1);
  const auto n = static_cast<int>(code_points(s));
  return n == 0 ? 0 : (n * kGlyphAdvance - (kGlyphAdvance - kGlyphWidth)) * scale;
}

int text_height(int scale) { return kGlyphHeight * std::max(scale, 1); }

void draw_text(Image& img, int x, int y, std::string_view s, Rgb c, int scale) {
  scale = std::max(scale, 1);
  for_each_text_pixel(s, [&](int u, int v) { img.fill_rect(x + u * scale, y + v * scale, scale, scale, c); });
}

void draw_text_vertical(Image& img, int x, int y, std::string_view s, Rgb c, int scale) {
  scale = std::max(scale, 1);
  const int len = text_width(s, 1);
  // Counter-clockwise: text column u goes up from the bottom, text row v goes right.
  for_each_text_pixel(s, [&](int u, int v) {
    img.fill_rect(x + v * scale, y + (len - 1 - u) * scale, scale, scale, c);
  });
}

// ---- PNG -----------------------------------------------------------------------------

namespace {
void append_bytes(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  const auto* p = static_cast<const uint8_t*>(data);
  out->insert(out->end(), p, p + size);
}
}  // namespace

std::vector<uint8_t> encode_png(const Image& img) {
  if (img.width <= 0 || img.height <= 0) {
    throw std::invalid_argument("report::encode_png: empty image (" + std::to_string(img.width) + "x" +
                                std::to_string(img.height) + ")");
  }
  const size_t row_bytes = static_cast<size_t>(img.width) * 3;
  if (img.rgb.size() != row_bytes * static_cast<size_t>(img.height)) {
    throw std::invalid_argument("report::encode_png: pixel buffer holds " + std::to_string(img.rgb.size()) +
                                " bytes, expected " + std::to_string(row_bytes * static_cast<size_t>(img.height)));
  }
  std::vector<uint8_t> png;
  // 8-bit RGB; stb picks each row's filter and compresses at its default level 8.
  if (stbi_write_png_to_func(append_bytes, &png, img.width, img.height, 3, img.rgb.data(),
                             static_cast<int>(row_bytes)) == 0) {
    throw std::runtime_error("report::encode_png: stb_image_write failed on a " + std::to_string(img.width) + "x" +
                             std::to_string(img.height) + " image (out of memory?)");
  }
  return png;
}

void write_png(const std::string& path, const Image& img) {
  const std::vector<uint8_t> png = encode_png(img);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    throw std::runtime_error("report::write_png: cannot open " + path + ": " + std::strerror(errno));
  }
  const size_t written = std::fwrite(png.data(), 1, png.size(), f);
  const int err = written == png.size() ? 0 : errno;
  if (std::fclose(f) != 0 || written != png.size()) {
    throw std::runtime_error("report::write_png: cannot write " + path + ": " +
                             std::strerror(err != 0 ? err : errno));
  }
}

}  // namespace zt::report
