// PNG reading for the chart tests through stb_image (third_party/stb, public domain /
// MIT): the file zerotrain's encoder wrote, decoded by a maintained reader that shares
// no code with it. Header-only: stb_image's functions are static in each test file
// that includes this (STB_IMAGE_STATIC), PNG only.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "report/png.h"

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_NO_STDIO
#include <stb/stb_image.h>

namespace zt::test {

struct DecodedPng {
  zt::report::Image img;  // 8-bit RGB pixels
  int channels = 0;       // colour channels the file declares (3 for RGB)
  bool sixteen_bit = false;
};

// Decodes a whole PNG file; throws std::runtime_error with stb_image's reason when the
// bytes are not a valid PNG.
inline DecodedPng decode_png(const std::vector<uint8_t>& png) {
  if (png.empty()) throw std::runtime_error("decode_png: no bytes");
  const int n = static_cast<int>(png.size());
  DecodedPng d;
  int w = 0, h = 0;
  if (!stbi_info_from_memory(png.data(), n, &w, &h, &d.channels)) {
    throw std::runtime_error(std::string("decode_png: ") + stbi_failure_reason());
  }
  d.sixteen_bit = stbi_is_16_bit_from_memory(png.data(), n) != 0;
  int comp = 0;
  stbi_uc* px = stbi_load_from_memory(png.data(), n, &w, &h, &comp, 3);
  if (px == nullptr) throw std::runtime_error(std::string("decode_png: ") + stbi_failure_reason());
  d.img.width = w;
  d.img.height = h;
  d.img.rgb.assign(px, px + static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  stbi_image_free(px);
  return d;
}

}  // namespace zt::test
