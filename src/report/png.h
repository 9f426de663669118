// A small RGB raster for the report charts (src/report) and its PNG encoder, with no
// external libraries: 8-bit RGB PNG whose IDAT is a zlib stream compressed by an own
// deflate (LZ77 + Huffman codes), or of stored (uncompressed) blocks on request. Also
// draws text with the bitmap font of font.h. Torch-free.
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

// Standard CRC-32 (ISO-HDLC, as in PNG and zlib); pass a previous result as `crc` to
// continue over more bytes.
uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0);
// Adler-32 (zlib); pass a previous result as `adler` to continue over more bytes.
uint32_t adler32(const uint8_t* data, size_t n, uint32_t adler = 1);

// How the image data is compressed. deflate (the default): each row gets the PNG filter
// (None, Sub, Up, Average, Paeth) whose output has the smallest sum of absolute values,
// then LZ77 over a 32 KiB window with, per block, dynamic or fixed Huffman codes (or
// stored, whichever is smallest); a 1400x700 chart takes about 10 KB. stored: filter None
// and stored deflate blocks, about width * height * 3 bytes, readable without inflating.
enum class PngCompression { stored, deflate };

// A zlib stream (RFC 1950: header, deflate data per RFC 1951, Adler-32) of `n` bytes,
// as encode_png writes it into IDAT. `data` may be null when n is 0.
std::vector<uint8_t> zlib_compress(const uint8_t* data, size_t n, PngCompression mode = PngCompression::deflate);

// The whole PNG file. Throws std::invalid_argument for an empty image or one whose
// pixel buffer does not hold width * height * 3 bytes.
std::vector<uint8_t> encode_png(const Image& img, PngCompression mode = PngCompression::deflate);
// Writes encode_png(img, mode) to `path`; throws std::runtime_error naming the path when
// the file cannot be written.
void write_png(const std::string& path, const Image& img, PngCompression mode = PngCompression::deflate);

}  // namespace zt::report
