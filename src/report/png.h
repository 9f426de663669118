// A small RGB raster for the report charts (src/report), drawn with lines, rectangles and
// the bitmap font of font.h, and written as an 8-bit RGB PNG by stb_image_write
// (third_party/stb). Torch-free.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zt::report {

struct Rgb {
  uint8_t r = 0;
  uint8_t g = 0;
  uint8_t b = 0;
  bool operator==(const Rgb&) const = default;
};

// Row-major, 3 bytes per pixel, (0, 0) top-left. Every drawing call clips to the image.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;

  Image() = default;
  // Throws std::invalid_argument for a negative size.
  Image(int w, int h, Rgb background = {255, 255, 255});

  bool contains(int x, int y) const { return x >= 0 && y >= 0 && x < width && y < height; }
  // The pixel at (x, y); throws std::out_of_range outside the image.
  Rgb at(int x, int y) const;
  void set(int x, int y, Rgb c);
  // The rectangle [x, x + w) x [y, y + h); nothing for w <= 0 or h <= 0.
  void fill_rect(int x, int y, int w, int h, Rgb c);
  void hline(int x0, int x1, int y, Rgb c);  // inclusive ends, either order
  void vline(int x, int y0, int y1, Rgb c);  // inclusive ends, either order
  void line(int x0, int y0, int x1, int y1, Rgb c);  // any direction, 1 pixel wide
};

// Text in the bitmap font (UTF-8; see font.h for what characters draw), `scale` pixels
// per font pixel (values below 1 count as 1). (x, y) is the top-left corner of the text
// box, which is text_width(s, scale) wide and text_height(scale) tall.
void draw_text(Image& img, int x, int y, std::string_view s, Rgb c, int scale = 1);
// The same text rotated 90 degrees counter-clockwise (reads bottom to top, letter tops
// to the left), for y-axis labels. (x, y) is the top-left corner of the rotated box,
// which is text_height(scale) wide and text_width(s, scale) tall.
void draw_text_vertical(Image& img, int x, int y, std::string_view s, Rgb c, int scale = 1);
int text_width(std::string_view s, int scale = 1);  // 0 for an empty string
int text_height(int scale = 1);                      // descenders included

// The whole PNG file (stb_image_write: per-row filters, deflate at its level 8). Throws
// std::invalid_argument for an empty image or one whose pixel buffer does not hold
// width * height * 3 bytes.
std::vector<uint8_t> encode_png(const Image& img);
// Writes encode_png(img) to `path`; throws std::runtime_error naming the path when the
// file cannot be written.
void write_png(const std::string& path, const Image& img);

}  // namespace zt::report
