// RGB raster drawing, bitmap-font text and the PNG encoder of png.h (stored-block zlib,
// table CRC-32, Adler-32); no external libraries.
#include "report/png.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "report/font.h"

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

// ---- PNG -----------------------------------------------------------------------------

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[n] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

constexpr uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
constexpr size_t kMaxStoredBlock = 65535;

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

void put_chunk(std::vector<uint8_t>& out, const char (&type)[5], const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put_u32(out, crc32(out.data() + type_at, out.size() - type_at));
}

// zlib stream (RFC 1950) of stored deflate blocks (RFC 1951 section 3.2.4).
std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& raw) {
  std::vector<uint8_t> z;
  const size_t blocks = std::max<size_t>(1, (raw.size() + kMaxStoredBlock - 1) / kMaxStoredBlock);
  z.reserve(raw.size() + blocks * 5 + 6);
  z.push_back(0x78);  // CM = 8 (deflate), CINFO = 7 (32 KiB window)
  z.push_back(0x01);  // FLEVEL = 0, no dictionary; 0x7801 is a multiple of 31
  size_t pos = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t len = std::min(kMaxStoredBlock, raw.size() - pos);
    const bool last = b + 1 == blocks;
    z.push_back(last ? 0x01 : 0x00);  // BFINAL, BTYPE = 00; the rest of the byte is padding
    const auto len16 = static_cast<uint16_t>(len);
    const auto nlen16 = static_cast<uint16_t>(~len16);
    z.push_back(static_cast<uint8_t>(len16 & 0xFF));
    z.push_back(static_cast<uint8_t>(len16 >> 8));
    z.push_back(static_cast<uint8_t>(nlen16 & 0xFF));
    z.push_back(static_cast<uint8_t>(nlen16 >> 8));
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(pos),
             raw.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  }
  put_u32(z, adler32(raw.data(), raw.size()));
  return z;
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

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t n, uint32_t adler) {
  constexpr uint32_t kMod = 65521;
  constexpr size_t kRun = 5552;  // the longest run whose sums cannot overflow 32 bits
  uint32_t a = adler & 0xFFFFu, b = adler >> 16;
  while (n > 0) {
    const size_t run = std::min(n, kRun);
    for (size_t i = 0; i < run; ++i) {
      a += data[i];
      b += a;
    }
    a %= kMod;
    b %= kMod;
    data += run;
    n -= run;
  }
  return (b << 16) | a;
}

std::vector<uint8_t> encode_png(const Image& img) {
  if (img.width <= 0 || img.height <= 0) {
    throw std::invalid_argument("report::encode_png: empty image (" + std::to_string(img.width) + "x" +
                                std::to_string(img.height) + ")");
  }
  const size_t row_bytes = static_cast<size_t>(img.width) * 3;
  const size_t rows = static_cast<size_t>(img.height);
  if (img.rgb.size() != row_bytes * rows) {
    throw std::invalid_argument("report::encode_png: pixel buffer holds " + std::to_string(img.rgb.size()) +
                                " bytes, expected " + std::to_string(row_bytes * rows));
  }
  // Scanlines, each led by filter type 0 (None).
  std::vector<uint8_t> raw;
  raw.reserve((row_bytes + 1) * rows);
  for (size_t y = 0; y < rows; ++y) {
    raw.push_back(0);
    const auto row = img.rgb.begin() + static_cast<std::ptrdiff_t>(y * row_bytes);
    raw.insert(raw.end(), row, row + static_cast<std::ptrdiff_t>(row_bytes));
  }

  std::vector<uint8_t> ihdr;
  put_u32(ihdr, static_cast<uint32_t>(img.width));
  put_u32(ihdr, static_cast<uint32_t>(img.height));
  ihdr.push_back(8);  // bit depth
  ihdr.push_back(2);  // colour type: truecolour (RGB)
  ihdr.push_back(0);  // compression: deflate
  ihdr.push_back(0);  // filter method 0
  ihdr.push_back(0);  // no interlace

  std::vector<uint8_t> png(std::begin(kSignature), std::end(kSignature));
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", zlib_stored(raw));
  put_chunk(png, "IEND", {});
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
