// A PNG reader for tests of report/png (test_chart, test_bench_sweep), written apart from
// the encoder so that the two check each other: chunk parsing with a bitwise CRC-32, a
// minimal inflate (RFC 1951: stored, fixed and dynamic Huffman blocks, decoded a bit at a
// time in the manner of zlib's puff.c) inside the zlib wrapper (RFC 1950, Adler-32), and
// the un-filtering of all five PNG filter types. 8-bit RGB, non-interlaced only. Every
// function throws std::runtime_error on anything it does not expect.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "report/png.h"

namespace zt::test {

inline uint32_t bitwise_crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

inline uint32_t slow_adler32(const std::vector<uint8_t>& d) {
  uint64_t a = 1, b = 0;
  for (uint8_t x : d) {
    a = (a + x) % 65521;
    b = (b + a) % 65521;
  }
  return static_cast<uint32_t>((b << 16) | a);
}

namespace inflate_detail {

[[noreturn]] inline void fail(const std::string& why) { throw std::runtime_error("inflate: " + why); }

class Bits {
 public:
  Bits(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  // `count` bits, the first one read as the least significant.
  uint32_t get(int count) {
    uint32_t v = 0;
    for (int i = 0; i < count; ++i) v |= static_cast<uint32_t>(bit()) << i;
    return v;
  }
  int bit() {
    if (byte_ >= n_) fail("input ends inside the deflate stream");
    const int b = (p_[byte_] >> bit_) & 1;
    if (++bit_ == 8) {
      bit_ = 0;
      ++byte_;
    }
    return b;
  }
  void skip_to_byte() {
    if (bit_ != 0) {
      bit_ = 0;
      ++byte_;
    }
  }
  uint8_t byte() {
    if (bit_ != 0) fail("byte read off a byte boundary");
    if (byte_ >= n_) fail("input ends inside a stored block");
    return p_[byte_++];
  }
  size_t consumed() const { return byte_ + (bit_ != 0 ? 1 : 0); }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t byte_ = 0;
  int bit_ = 0;
};

// A canonical Huffman code as counts per length and symbols in code order.
struct Huffman {
  std::array<int, 16> count{};
  std::vector<int> symbol;
};

// Builds the decoding tables; returns how many codes of the possible remain unused (0 for
// a complete code). An over-subscribed set of lengths is an error.
inline int build(Huffman& h, const int* lengths, int n) {
  h.count.fill(0);
  for (int s = 0; s < n; ++s) {
    if (lengths[s] < 0 || lengths[s] > 15) fail("code length out of range");
    ++h.count[static_cast<size_t>(lengths[s])];
  }
  int left = 1;
  for (size_t len = 1; len <= 15; ++len) {
    left <<= 1;
    left -= h.count[len];
    if (left < 0) fail("over-subscribed code");
  }
  std::array<int, 16> offs{};
  for (size_t len = 1; len < 15; ++len) offs[len + 1] = offs[len] + h.count[len];
  h.symbol.assign(static_cast<size_t>(n), 0);
  for (int s = 0; s < n; ++s) {
    if (lengths[s] != 0) h.symbol[static_cast<size_t>(offs[static_cast<size_t>(lengths[s])]++)] = s;
  }
  return left;
}

// Huffman codes are packed starting with their most significant bit.
inline int decode(Bits& in, const Huffman& h) {
  int code = 0, first = 0, index = 0;
  for (size_t len = 1; len <= 15; ++len) {
    code |= in.bit();
    const int count = h.count[len];
    if (code - count < first) return h.symbol[static_cast<size_t>(index + (code - first))];
    index += count;
    first += count;
    first <<= 1;
    code <<= 1;
  }
  fail("invalid Huffman code");
}

constexpr int kLenBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                              31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr int kLenExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr int kDistBase[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                               193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr int kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3,  3,  4,  4,  5,  5,  6,
                                6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

inline void codes(Bits& in, std::vector<uint8_t>& out, const Huffman& lit, const Huffman& dist) {
  for (;;) {
    const int sym = decode(in, lit);
    if (sym < 256) {
      out.push_back(static_cast<uint8_t>(sym));
      continue;
    }
    if (sym == 256) return;
    const int li = sym - 257;
    if (li >= 29) fail("invalid length symbol " + std::to_string(sym));
    const size_t len = static_cast<size_t>(kLenBase[li]) + in.get(kLenExtra[li]);
    const int ds = decode(in, dist);
    if (ds >= 30) fail("invalid distance symbol " + std::to_string(ds));
    const size_t d = static_cast<size_t>(kDistBase[ds]) + in.get(kDistExtra[ds]);
    if (d > out.size()) fail("distance " + std::to_string(d) + " reaches before the start");
    if (d > 32768) fail("distance beyond the 32 KiB window");
    for (size_t i = 0; i < len; ++i) out.push_back(out[out.size() - d]);
  }
}

}  // namespace inflate_detail

struct InflateStats {
  int stored_blocks = 0;
  int fixed_blocks = 0;
  int dynamic_blocks = 0;
};

// Inflates the raw deflate stream at `p`; `consumed` gets the bytes it took (the stream
// ends on a byte boundary).
inline std::vector<uint8_t> inflate(const uint8_t* p, size_t n, size_t& consumed, InflateStats* stats = nullptr) {
  using namespace inflate_detail;
  InflateStats local;
  InflateStats& st = stats != nullptr ? *stats : local;
  Bits in(p, n);
  std::vector<uint8_t> out;
  for (bool last = false; !last;) {
    last = in.bit() == 1;
    const uint32_t type = in.get(2);
    if (type == 0) {
      in.skip_to_byte();
      uint32_t len = in.byte();
      len |= uint32_t{in.byte()} << 8;
      uint32_t nlen = in.byte();
      nlen |= uint32_t{in.byte()} << 8;
      if (nlen != (~len & 0xFFFFu)) fail("stored block LEN/NLEN mismatch");
      for (uint32_t i = 0; i < len; ++i) out.push_back(in.byte());
      ++st.stored_blocks;
    } else if (type == 1) {
      static const auto fixed = [] {
        std::array<Huffman, 2> h;
        int l[288];
        for (int s = 0; s < 288; ++s) l[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : 8;
        build(h[0], l, 288);
        int d[30];
        for (int& x : d) x = 5;
        build(h[1], d, 30);
        return h;
      }();
      codes(in, out, fixed[0], fixed[1]);
      ++st.fixed_blocks;
    } else if (type == 2) {
      const int nlen = static_cast<int>(in.get(5)) + 257;
      const int ndist = static_cast<int>(in.get(5)) + 1;
      const int ncode = static_cast<int>(in.get(4)) + 4;
      if (nlen > 286 || ndist > 30) fail("bad dynamic block counts");
      static constexpr int kOrder[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
      int lengths[320] = {};
      for (int i = 0; i < ncode; ++i) lengths[kOrder[i]] = static_cast<int>(in.get(3));
      Huffman cl;
      if (build(cl, lengths, 19) != 0) fail("incomplete code-length code");
      for (int i = 0; i < nlen + ndist;) {
        const int sym = decode(in, cl);
        if (sym < 16) {
          lengths[i++] = sym;
          continue;
        }
        int value = 0, repeat = 0;
        if (sym == 16) {
          if (i == 0) fail("repeat with no previous length");
          value = lengths[i - 1];
          repeat = 3 + static_cast<int>(in.get(2));
        } else if (sym == 17) {
          repeat = 3 + static_cast<int>(in.get(3));
        } else {
          repeat = 11 + static_cast<int>(in.get(7));
        }
        if (i + repeat > nlen + ndist) fail("code lengths run past the end");
        while (repeat-- > 0) lengths[i++] = value;
      }
      if (lengths[256] == 0) fail("no end-of-block code");
      // Incomplete codes are allowed only as a single code of one bit (zlib's rule).
      Huffman lit, dist;
      int used = 0;
      for (int s = 0; s < nlen; ++s) used += lengths[s] != 0 ? 1 : 0;
      if (build(lit, lengths, nlen) != 0 && !(used == 1 && lit.count[1] == 1)) fail("incomplete literal/length code");
      used = 0;
      for (int s = 0; s < ndist; ++s) used += lengths[nlen + s] != 0 ? 1 : 0;
      if (build(dist, lengths + nlen, ndist) != 0 && used != 0 && !(used == 1 && dist.count[1] == 1)) {
        fail("incomplete distance code");
      }
      codes(in, out, lit, dist);
      ++st.dynamic_blocks;
    } else {
      fail("block type 3");
    }
  }
  consumed = in.consumed();
  return out;
}

// A whole zlib stream: header, deflate data, Adler-32, nothing after it.
inline std::vector<uint8_t> zlib_decompress(const std::vector<uint8_t>& z, InflateStats* stats = nullptr) {
  if (z.size() < 7) throw std::runtime_error("zlib: stream too short");
  const unsigned cmf = z[0], flg = z[1];
  if ((cmf & 0x0F) != 8 || (cmf >> 4) > 7 || (cmf * 256 + flg) % 31 != 0 || (flg & 0x20) != 0) {
    throw std::runtime_error("zlib: bad header");
  }
  size_t used = 0;
  std::vector<uint8_t> out = inflate(z.data() + 2, z.size() - 2, used, stats);
  const size_t at = 2 + used;
  if (at + 4 != z.size()) {
    throw std::runtime_error("zlib: " + std::to_string(z.size() - at) + " bytes after the deflate data, expected 4");
  }
  const uint32_t adler = (uint32_t{z[at]} << 24) | (uint32_t{z[at + 1]} << 16) | (uint32_t{z[at + 2]} << 8) | z[at + 3];
  if (adler != slow_adler32(out)) throw std::runtime_error("zlib: Adler-32 mismatch");
  return out;
}

struct DecodedPng {
  zt::report::Image img;
  std::vector<std::string> chunk_types;
  size_t idat_bytes = 0;                 // the zlib stream's size
  InflateStats blocks;                   // deflate blocks by type
  std::array<int, 5> filter_rows{};      // rows per filter type
};

inline uint32_t png_be32(const std::vector<uint8_t>& d, size_t at) {
  if (at + 4 > d.size()) throw std::runtime_error("PNG: truncated at " + std::to_string(at));
  return (uint32_t{d[at]} << 24) | (uint32_t{d[at + 1]} << 16) | (uint32_t{d[at + 2]} << 8) | d[at + 3];
}

inline DecodedPng decode_png(const std::vector<uint8_t>& png) {
  auto fail = [](const std::string& why) { throw std::runtime_error("PNG: " + why); };
  const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (png.size() < 8 || !std::equal(sig, sig + 8, png.begin())) fail("bad signature");
  DecodedPng out;
  std::vector<uint8_t> idat;
  uint32_t w = 0, h = 0;
  size_t at = 8;
  while (at < png.size()) {
    const uint32_t len = png_be32(png, at);
    if (at + 12 + len > png.size()) fail("chunk overruns the file");
    const std::string type(png.begin() + static_cast<long>(at + 4), png.begin() + static_cast<long>(at + 8));
    if (bitwise_crc32(png.data() + at + 4, len + 4) != png_be32(png, at + 8 + len)) fail("CRC mismatch in " + type);
    const std::vector<uint8_t> data(png.begin() + static_cast<long>(at + 8),
                                    png.begin() + static_cast<long>(at + 8 + len));
    if (type == "IDAT" && !out.chunk_types.empty() && out.chunk_types.back() != "IDAT" &&
        std::find(out.chunk_types.begin(), out.chunk_types.end(), "IDAT") != out.chunk_types.end()) {
      fail("IDAT chunks not consecutive");
    }
    out.chunk_types.push_back(type);
    if (type == "IHDR") {
      if (len != 13 || out.chunk_types.size() != 1) fail("IHDR length or position");
      w = png_be32(data, 0);
      h = png_be32(data, 4);
      if (w == 0 || h == 0) fail("zero size");
      if (data[8] != 8 || data[9] != 2 || data[10] != 0 || data[11] != 0 || data[12] != 0) fail("IHDR fields");
    } else if (type == "IDAT") {
      idat.insert(idat.end(), data.begin(), data.end());
    } else if (type == "IEND") {
      if (len != 0) fail("IEND not empty");
    }
    at += 12 + len;
  }
  if (out.chunk_types.empty() || out.chunk_types.front() != "IHDR" || out.chunk_types.back() != "IEND") {
    fail("chunk order");
  }
  if (idat.empty()) fail("no IDAT");
  out.idat_bytes = idat.size();
  const std::vector<uint8_t> raw = zlib_decompress(idat, &out.blocks);
  // Scanlines: a filter type byte, then 3 bytes per pixel filtered against the pixel to
  // the left (a), above (b) and above-left (c), all 0 outside the image.
  const size_t row = size_t{w} * 3, stride = row + 1;
  if (raw.size() != stride * h) {
    fail("inflated " + std::to_string(raw.size()) + " bytes, expected " + std::to_string(stride * h));
  }
  out.img = zt::report::Image(static_cast<int>(w), static_cast<int>(h));
  std::vector<uint8_t>& px = out.img.rgb;
  for (size_t y = 0; y < h; ++y) {
    const uint8_t type = raw[y * stride];
    if (type > 4) fail("filter type " + std::to_string(type) + " in row " + std::to_string(y));
    ++out.filter_rows[type];
    const uint8_t* src = raw.data() + y * stride + 1;
    uint8_t* cur = px.data() + y * row;
    const uint8_t* up = y > 0 ? cur - row : nullptr;
    for (size_t i = 0; i < row; ++i) {
      const int a = i >= 3 ? cur[i - 3] : 0;
      const int b = up != nullptr ? up[i] : 0;
      const int c = up != nullptr && i >= 3 ? up[i - 3] : 0;
      int pred = 0;
      if (type == 1) {
        pred = a;
      } else if (type == 2) {
        pred = b;
      } else if (type == 3) {
        pred = (a + b) >> 1;
      } else if (type == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      }
      cur[i] = static_cast<uint8_t>((src[i] + pred) & 0xFF);
    }
  }
  return out;
}

}  // namespace zt::test
