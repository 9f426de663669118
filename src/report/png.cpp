// RGB raster drawing, bitmap-font text and the PNG encoder of png.h (per-row filters, an
// own deflate: LZ77 hash chains + dynamic/fixed Huffman codes, or stored blocks; table
// CRC-32, Adler-32); no external libraries.
#include "report/png.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <utility>

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
std::vector<uint8_t> zlib_stored(const uint8_t* raw, size_t n) {
  std::vector<uint8_t> z;
  const size_t blocks = std::max<size_t>(1, (n + kMaxStoredBlock - 1) / kMaxStoredBlock);
  z.reserve(n + blocks * 5 + 6);
  z.push_back(0x78);  // CM = 8 (deflate), CINFO = 7 (32 KiB window)
  z.push_back(0x01);  // FLEVEL = 0, no dictionary; 0x7801 is a multiple of 31
  size_t pos = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t len = std::min(kMaxStoredBlock, n - pos);
    const bool last = b + 1 == blocks;
    z.push_back(last ? 0x01 : 0x00);  // BFINAL, BTYPE = 00; the rest of the byte is padding
    const auto len16 = static_cast<uint16_t>(len);
    const auto nlen16 = static_cast<uint16_t>(~len16);
    z.push_back(static_cast<uint8_t>(len16 & 0xFF));
    z.push_back(static_cast<uint8_t>(len16 >> 8));
    z.push_back(static_cast<uint8_t>(nlen16 & 0xFF));
    z.push_back(static_cast<uint8_t>(nlen16 >> 8));
    if (len > 0) z.insert(z.end(), raw + pos, raw + pos + len);
    pos += len;
  }
  put_u32(z, adler32(raw, n));
  return z;
}

// ---- deflate (RFC 1951): LZ77 over a 32 KiB window + Huffman codes -------------------
//
// The match finder hashes 3 bytes into chains of earlier positions (at most kMaxChain
// candidates, newest first) with one step of lazy matching, as zlib does. Symbols are
// collected into blocks of up to kBlockSymbols; each block is written in whichever of
// dynamic Huffman (length-limited codes by package-merge), fixed Huffman or stored form
// is smallest.

constexpr size_t kWindow = 32768;  // the largest distance deflate can code
constexpr size_t kMinMatch = 3;
constexpr size_t kMaxMatch = 258;
constexpr unsigned kHashBits = 15;
constexpr int kMaxChain = 32;        // candidates tried per position (bounds the time on noise)
constexpr size_t kLazyBelow = 64;    // look one position ahead only after a shorter match
constexpr size_t kBlockSymbols = 1u << 15;
constexpr int64_t kNoPos = -1;

constexpr int kNumLitLen = 286;  // 0..255 literals, 256 end of block, 257..285 lengths
constexpr int kNumDist = 30;
constexpr int kNumCodeLen = 19;
constexpr int kEndOfBlock = 256;
constexpr int kMaxBits = 15;
constexpr int kMaxCodeLenBits = 7;

constexpr std::array<uint16_t, 29> kLengthBase = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                                  31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr std::array<uint8_t, 29> kLengthExtra = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                                  2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr std::array<uint16_t, 30> kDistBase = {1,    2,    3,    4,    5,    7,     9,     13,    17,    25,
                                                33,   49,   65,   97,   129,  193,   257,   385,   513,   769,
                                                1025, 1537, 2049, 3073, 4097, 6145,  8193,  12289, 16385, 24577};
constexpr std::array<uint8_t, 30> kDistExtra = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                                6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
// The order in which a dynamic block header lists the code-length code's lengths.
constexpr std::array<uint8_t, 19> kCodeLenOrder = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

// Length 3..258 -> index into kLengthBase (symbol - 257).
constexpr std::array<uint8_t, kMaxMatch + 1> make_length_index() {
  std::array<uint8_t, kMaxMatch + 1> t{};
  for (size_t len = kMinMatch; len <= kMaxMatch; ++len) {
    size_t i = 0;
    while (i + 1 < kLengthBase.size() && kLengthBase[i + 1] <= len) ++i;
    t[len] = static_cast<uint8_t>(i);
  }
  return t;
}
constexpr std::array<uint8_t, kMaxMatch + 1> kLengthIndex = make_length_index();

// Distance 1..32768 -> distance code: two codes per power of two from 5 on.
constexpr int dist_code(uint32_t dist) {
  const uint32_t x = dist - 1;
  if (x < 4) return static_cast<int>(x);
  const int b = std::bit_width(x) - 1;
  return 2 * b + static_cast<int>((x >> (b - 1)) & 1u);
}
constexpr bool dist_codes_match_table() {
  for (uint32_t d = 1; d <= kWindow; ++d) {
    const int c = dist_code(d);
    if (c < 0 || c >= kNumDist || d < kDistBase[static_cast<size_t>(c)] ||
        d - kDistBase[static_cast<size_t>(c)] >= (1u << kDistExtra[static_cast<size_t>(c)])) {
      return false;
    }
  }
  return true;
}
static_assert(dist_codes_match_table());

// Bits go out least significant first (RFC 1951 section 3.1.1).
class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>& out) : out_(out) {}
  // The low n (<= 32) bits of `bits`.
  void put(uint32_t bits, unsigned n) {
    acc_ |= static_cast<uint64_t>(bits) << count_;
    count_ += n;
    while (count_ >= 8) {
      out_.push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      count_ -= 8;
    }
  }
  void align() {
    if (count_ > 0) put(0, 8 - count_);
  }

 private:
  std::vector<uint8_t>& out_;
  uint64_t acc_ = 0;
  unsigned count_ = 0;
};

// Optimal prefix-code lengths of at most max_bits bits for `freq` (package-merge).
// Symbols of frequency 0 get length 0. Needs 2 <= used symbols <= 2^max_bits, which makes
// the code complete (Kraft sum exactly 1).
std::vector<uint8_t> limited_code_lengths(const std::vector<uint32_t>& freq, int max_bits) {
  struct Item {
    uint64_t weight;
    int symbol;    // >= 0: a leaf
    int32_t a, b;  // a package of two items of the previous list
  };
  std::vector<Item> items;
  std::vector<int32_t> leaves;
  for (size_t s = 0; s < freq.size(); ++s) {
    if (freq[s] > 0) {
      items.push_back({freq[s], static_cast<int>(s), -1, -1});
      leaves.push_back(static_cast<int32_t>(items.size() - 1));
    }
  }
  std::vector<uint8_t> lengths(freq.size(), 0);
  const size_t n = leaves.size();
  if (n < 2) {
    for (int32_t l : leaves) lengths[static_cast<size_t>(items[static_cast<size_t>(l)].symbol)] = 1;
    return lengths;
  }
  std::stable_sort(leaves.begin(), leaves.end(), [&](int32_t x, int32_t y) {
    return items[static_cast<size_t>(x)].weight < items[static_cast<size_t>(y)].weight;
  });
  std::vector<std::vector<int32_t>> lists(static_cast<size_t>(max_bits));
  lists[0] = leaves;
  for (size_t level = 1; level < lists.size(); ++level) {
    const std::vector<int32_t>& prev = lists[level - 1];
    std::vector<int32_t> packages;
    for (size_t i = 0; i + 1 < prev.size(); i += 2) {
      const uint64_t w = items[static_cast<size_t>(prev[i])].weight + items[static_cast<size_t>(prev[i + 1])].weight;
      items.push_back({w, -1, prev[i], prev[i + 1]});
      packages.push_back(static_cast<int32_t>(items.size() - 1));
    }
    std::vector<int32_t>& merged = lists[level];
    merged.reserve(leaves.size() + packages.size());
    std::merge(leaves.begin(), leaves.end(), packages.begin(), packages.end(), std::back_inserter(merged),
               [&](int32_t x, int32_t y) {
                 return items[static_cast<size_t>(x)].weight < items[static_cast<size_t>(y)].weight;
               });
  }
  // Each appearance of a leaf among the first 2n - 2 items of the last list (packages
  // expanded) adds one bit to its symbol's code.
  std::vector<int32_t> stack(lists.back().begin(), lists.back().begin() + static_cast<std::ptrdiff_t>(2 * n - 2));
  while (!stack.empty()) {
    const Item& it = items[static_cast<size_t>(stack.back())];
    stack.pop_back();
    if (it.symbol >= 0) {
      ++lengths[static_cast<size_t>(it.symbol)];
    } else {
      stack.push_back(it.a);
      stack.push_back(it.b);
    }
  }
  return lengths;
}

// Lengths for a block's code: at least two symbols get a code (as zlib does), so every
// code is complete and a lone distance code still takes one bit.
std::vector<uint8_t> block_code_lengths(std::vector<uint32_t> freq, int max_bits) {
  size_t used = 0;
  for (uint32_t f : freq) used += f > 0 ? 1 : 0;
  for (size_t s = 0; used < 2 && s < freq.size(); ++s) {
    if (freq[s] == 0) {
      freq[s] = 1;
      ++used;
    }
  }
  return limited_code_lengths(freq, max_bits);
}

struct HuffCode {
  std::vector<uint16_t> code;  // bit-reversed, ready for BitWriter::put
  std::vector<uint8_t> len;
};

// The canonical code of RFC 1951 section 3.2.2 for the given lengths.
HuffCode canonical_code(const std::vector<uint8_t>& lengths) {
  std::array<uint16_t, kMaxBits + 2> count{}, next{};
  for (uint8_t l : lengths) ++count[l];
  count[0] = 0;
  uint32_t code = 0;
  for (size_t bits = 1; bits <= kMaxBits; ++bits) {
    code = (code + count[bits - 1]) << 1;
    next[bits] = static_cast<uint16_t>(code);
  }
  HuffCode h{std::vector<uint16_t>(lengths.size(), 0), lengths};
  for (size_t s = 0; s < lengths.size(); ++s) {
    const uint8_t l = lengths[s];
    if (l == 0) continue;
    const uint32_t c = next[l]++;
    uint32_t rev = 0;
    for (uint8_t i = 0; i < l; ++i) rev |= ((c >> i) & 1u) << (l - 1 - i);
    h.code[s] = static_cast<uint16_t>(rev);
  }
  return h;
}

const HuffCode& fixed_litlen_code() {
  static const HuffCode code = [] {
    std::vector<uint8_t> l(288);
    for (size_t s = 0; s < l.size(); ++s) l[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : 8;
    return canonical_code(l);
  }();
  return code;
}

const HuffCode& fixed_dist_code() {
  static const HuffCode code = canonical_code(std::vector<uint8_t>(30, 5));
  return code;
}

// One LZ77 symbol: a literal (dist == 0, value in litlen) or a match (length, distance).
struct Symbol {
  uint16_t litlen;
  uint16_t dist;
};

// Run-length coding of code lengths (symbols 0..15 as they are, 16 = repeat the previous
// length 3..6 times, 17 = 3..10 zeros, 18 = 11..138 zeros), appended to `out` as
// (symbol, extra bits value) pairs.
void rle_code_lengths(const uint8_t* l, size_t n, std::vector<std::pair<uint8_t, uint8_t>>& out) {
  for (size_t i = 0; i < n;) {
    const uint8_t v = l[i];
    size_t run = 1;
    while (i + run < n && l[i + run] == v) ++run;
    i += run;
    if (v == 0) {
      while (run >= 11) {
        const size_t r = std::min<size_t>(run, 138);
        out.emplace_back(18, static_cast<uint8_t>(r - 11));
        run -= r;
      }
      if (run >= 3) {
        out.emplace_back(17, static_cast<uint8_t>(run - 3));
        run = 0;
      }
    } else {
      out.emplace_back(v, 0);
      --run;
      while (run >= 3) {
        const size_t r = std::min<size_t>(run, 6);
        out.emplace_back(16, static_cast<uint8_t>(r - 3));
        run -= r;
      }
    }
    for (; run > 0; --run) out.emplace_back(v, 0);
  }
}

class Deflater {
 public:
  Deflater(const uint8_t* data, size_t n, std::vector<uint8_t>& out)
      : data_(data), n_(n), bits_(out), head_(size_t{1} << kHashBits, kNoPos), prev_(kWindow, kNoPos) {}

  void run() {
    symbols_.reserve(kBlockSymbols + 1);
    size_t pos = 0;
    Match cur = search(pos);
    while (pos < n_) {
      if (cur.len < kMinMatch) {
        literal(pos);
        cur = search(++pos);
        continue;
      }
      if (cur.len < kLazyBelow) {
        const Match next = search(pos + 1);
        if (next.len > cur.len) {
          literal(pos);
          ++pos;
          cur = next;
          continue;
        }
      }
      match(cur);
      pos += cur.len;
      cur = search(pos);
    }
    flush_block(true);
    bits_.align();
  }

 private:
  struct Match {
    size_t len = 0;
    size_t dist = 0;
  };

  uint32_t hash(size_t p) const {
    const uint32_t v = uint32_t{data_[p]} | (uint32_t{data_[p + 1]} << 8) | (uint32_t{data_[p + 2]} << 16);
    return (v * 2654435761u) >> (32 - kHashBits);
  }

  void insert(size_t p) {
    const uint32_t h = hash(p);
    prev_[p & (kWindow - 1)] = head_[h];
    head_[h] = static_cast<int64_t>(p);
  }

  // The longest match for position p among earlier positions (p itself not yet in the
  // chains), then p goes into the chains. Positions before p not yet hashed (inside
  // emitted matches) are hashed first, so every position is hashed exactly once.
  Match search(size_t p) {
    if (p + kMinMatch > n_) return {};
    for (; next_insert_ < p; ++next_insert_) insert(next_insert_);
    Match best;
    const size_t max_len = std::min(kMaxMatch, n_ - p);
    const int64_t limit = static_cast<int64_t>(p) - static_cast<int64_t>(kWindow);
    int64_t cand = head_[hash(p)];
    for (int chain = kMaxChain; cand != kNoPos && cand >= limit && chain > 0; --chain) {
      const auto c = static_cast<size_t>(cand);
      if (best.len == 0 || data_[c + best.len] == data_[p + best.len]) {
        const size_t len = common_prefix(data_ + c, data_ + p, max_len);
        if (len > best.len) {
          best = {len, p - c};
          if (len == max_len) break;
        }
      }
      cand = prev_[c & (kWindow - 1)];
    }
    insert(p);
    next_insert_ = p + 1;
    if (best.len < kMinMatch) best = {};
    return best;
  }

  static size_t common_prefix(const uint8_t* a, const uint8_t* b, size_t max_len) {
    size_t i = 0;
    for (; i + 8 <= max_len; i += 8) {
      uint64_t x = 0, y = 0;
      std::memcpy(&x, a + i, 8);
      std::memcpy(&y, b + i, 8);
      if (x != y) break;
    }
    while (i < max_len && a[i] == b[i]) ++i;
    return i;
  }

  void literal(size_t pos) {
    symbols_.push_back({data_[pos], 0});
    block_bytes_ += 1;
    if (symbols_.size() >= kBlockSymbols) flush_block(false);
  }

  void match(const Match& m) {
    symbols_.push_back({static_cast<uint16_t>(m.len), static_cast<uint16_t>(m.dist)});
    block_bytes_ += m.len;
    if (symbols_.size() >= kBlockSymbols) flush_block(false);
  }

  // Writes the collected symbols as one block (or, when stored is smallest, as stored
  // blocks of the same bytes).
  void flush_block(bool final) {
    std::vector<uint32_t> lit_freq(kNumLitLen, 0), dist_freq(kNumDist, 0);
    for (const Symbol& s : symbols_) {
      if (s.dist == 0) {
        ++lit_freq[s.litlen];
      } else {
        ++lit_freq[257u + kLengthIndex[s.litlen]];
        ++dist_freq[static_cast<size_t>(dist_code(s.dist))];
      }
    }
    lit_freq[kEndOfBlock] = 1;

    // Dynamic code and its header.
    const std::vector<uint8_t> lit_len = block_code_lengths(lit_freq, kMaxBits);
    const std::vector<uint8_t> dist_len = block_code_lengths(dist_freq, kMaxBits);
    size_t hlit = kNumLitLen, hdist = kNumDist;
    while (hlit > 257 && lit_len[hlit - 1] == 0) --hlit;
    while (hdist > 1 && dist_len[hdist - 1] == 0) --hdist;
    std::vector<std::pair<uint8_t, uint8_t>> cl_syms;
    rle_code_lengths(lit_len.data(), hlit, cl_syms);
    rle_code_lengths(dist_len.data(), hdist, cl_syms);
    std::vector<uint32_t> cl_freq(kNumCodeLen, 0);
    for (const auto& [sym, extra] : cl_syms) ++cl_freq[sym];
    const std::vector<uint8_t> cl_len = block_code_lengths(cl_freq, kMaxCodeLenBits);
    size_t hclen = kNumCodeLen;
    while (hclen > 4 && cl_len[kCodeLenOrder[hclen - 1]] == 0) --hclen;

    // Sizes in bits of the three forms.
    auto data_bits = [&](const std::vector<uint8_t>& ll, const std::vector<uint8_t>& dl) {
      uint64_t bits = 0;
      for (size_t s = 0; s < kNumLitLen; ++s) {
        bits += uint64_t{lit_freq[s]} * ll[s];
        if (s >= 257) bits += uint64_t{lit_freq[s]} * kLengthExtra[s - 257];
      }
      for (size_t d = 0; d < kNumDist; ++d) bits += uint64_t{dist_freq[d]} * (dl[d] + kDistExtra[d]);
      return bits;
    };
    uint64_t dynamic_bits = 3 + 5 + 5 + 4 + 3 * hclen + data_bits(lit_len, dist_len);
    for (const auto& [sym, extra] : cl_syms) {
      dynamic_bits += cl_len[sym] + (sym == 16 ? 2u : sym == 17 ? 3u : sym == 18 ? 7u : 0u);
    }
    const uint64_t fixed_bits = 3 + data_bits(fixed_litlen_code().len, fixed_dist_code().len);
    const size_t stored_blocks = std::max<size_t>(1, (block_bytes_ + kMaxStoredBlock - 1) / kMaxStoredBlock);
    const uint64_t stored_bits = 8 * uint64_t{block_bytes_} + stored_blocks * (3 + 7 + 32);

    if (stored_bits < std::min(dynamic_bits, fixed_bits)) {
      write_stored(final);
    } else if (fixed_bits <= dynamic_bits) {
      bits_.put(final ? 1u : 0u, 1);
      bits_.put(1, 2);
      write_symbols(fixed_litlen_code(), fixed_dist_code());
    } else {
      bits_.put(final ? 1u : 0u, 1);
      bits_.put(2, 2);
      bits_.put(static_cast<uint32_t>(hlit - 257), 5);
      bits_.put(static_cast<uint32_t>(hdist - 1), 5);
      bits_.put(static_cast<uint32_t>(hclen - 4), 4);
      for (size_t i = 0; i < hclen; ++i) bits_.put(cl_len[kCodeLenOrder[i]], 3);
      const HuffCode cl = canonical_code(cl_len);
      for (const auto& [sym, extra] : cl_syms) {
        bits_.put(cl.code[sym], cl.len[sym]);
        if (sym >= 16) bits_.put(extra, sym == 16 ? 2u : sym == 17 ? 3u : 7u);
      }
      write_symbols(canonical_code(lit_len), canonical_code(dist_len));
    }
    block_start_ += block_bytes_;
    block_bytes_ = 0;
    symbols_.clear();
  }

  void write_symbols(const HuffCode& lit, const HuffCode& dist) {
    for (const Symbol& s : symbols_) {
      if (s.dist == 0) {
        bits_.put(lit.code[s.litlen], lit.len[s.litlen]);
        continue;
      }
      const size_t li = kLengthIndex[s.litlen];
      bits_.put(lit.code[257 + li], lit.len[257 + li]);
      bits_.put(static_cast<uint32_t>(s.litlen - kLengthBase[li]), kLengthExtra[li]);
      const auto dc = static_cast<size_t>(dist_code(s.dist));
      bits_.put(dist.code[dc], dist.len[dc]);
      bits_.put(static_cast<uint32_t>(s.dist - kDistBase[dc]), kDistExtra[dc]);
    }
    bits_.put(lit.code[kEndOfBlock], lit.len[kEndOfBlock]);
  }

  void write_stored(bool final) {
    size_t pos = block_start_;
    const size_t end = block_start_ + block_bytes_;
    do {
      const size_t len = std::min(kMaxStoredBlock, end - pos);
      bits_.put(final && pos + len == end ? 1u : 0u, 1);
      bits_.put(0, 2);
      bits_.align();
      bits_.put(static_cast<uint32_t>(len), 16);
      bits_.put(static_cast<uint32_t>(len ^ 0xFFFFu), 16);
      for (size_t i = 0; i < len; ++i) bits_.put(data_[pos + i], 8);
      pos += len;
    } while (pos < end);
  }

  const uint8_t* data_;
  size_t n_;
  BitWriter bits_;
  std::vector<int64_t> head_;  // hash -> newest position with that hash
  std::vector<int64_t> prev_;  // position % window -> the previous position with its hash
  size_t next_insert_ = 0;
  std::vector<Symbol> symbols_;
  size_t block_start_ = 0;  // the block's first input byte
  size_t block_bytes_ = 0;  // input bytes its symbols cover
};

// zlib stream (RFC 1950) of compressed deflate blocks.
std::vector<uint8_t> zlib_deflate(const uint8_t* raw, size_t n) {
  std::vector<uint8_t> z;
  z.reserve(n / 8 + 64);
  z.push_back(0x78);  // CM = 8 (deflate), CINFO = 7 (32 KiB window)
  z.push_back(0x9C);  // FLEVEL = 2 (default), no dictionary; 0x789C is a multiple of 31
  Deflater(raw, n, z).run();
  put_u32(z, adler32(raw, n));
  return z;
}

// PNG filters (PNG spec section 9) for 3-byte pixels: the filtered row from the row and the
// one above it (all zeros for the first row).
uint8_t paeth(int a, int b, int c) {
  const int p = a + b - c;
  const int pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return static_cast<uint8_t>(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

void filter_row(int type, const uint8_t* row, const uint8_t* up, size_t n, uint8_t* out) {
  constexpr size_t bpp = 3;
  const size_t head = std::min(bpp, n);  // pixels with no left neighbour: a = c = 0
  switch (type) {
    case 1:  // Sub
      for (size_t i = 0; i < head; ++i) out[i] = row[i];
      for (size_t i = bpp; i < n; ++i) out[i] = static_cast<uint8_t>(row[i] - row[i - bpp]);
      break;
    case 2:  // Up
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(row[i] - up[i]);
      break;
    case 3:  // Average
      for (size_t i = 0; i < head; ++i) out[i] = static_cast<uint8_t>(row[i] - up[i] / 2);
      for (size_t i = bpp; i < n; ++i) out[i] = static_cast<uint8_t>(row[i] - (row[i - bpp] + up[i]) / 2);
      break;
    case 4:  // Paeth
      for (size_t i = 0; i < head; ++i) out[i] = static_cast<uint8_t>(row[i] - up[i]);
      for (size_t i = bpp; i < n; ++i) out[i] = static_cast<uint8_t>(row[i] - paeth(row[i - bpp], up[i], up[i - bpp]));
      break;
    default:  // None
      std::memcpy(out, row, n);
      break;
  }
}

// Scanlines each led by its filter type: 0 (None) for every row, or per row the filter
// whose output has the smallest sum of absolute values as signed bytes (the heuristic of
// the PNG spec, section 12.8).
std::vector<uint8_t> filtered_scanlines(const Image& img, bool choose_filters) {
  const size_t row_bytes = static_cast<size_t>(img.width) * 3;
  const size_t rows = static_cast<size_t>(img.height);
  std::vector<uint8_t> raw((row_bytes + 1) * rows);
  std::vector<uint8_t> trial(row_bytes);
  const std::vector<uint8_t> zeros(row_bytes, 0);
  for (size_t y = 0; y < rows; ++y) {
    const uint8_t* row = img.rgb.data() + y * row_bytes;
    const uint8_t* up = y > 0 ? row - row_bytes : zeros.data();
    uint8_t* dst = raw.data() + y * (row_bytes + 1);
    dst[0] = 0;
    std::memcpy(dst + 1, row, row_bytes);
    if (!choose_filters) continue;
    auto cost = [](const uint8_t* p, size_t n) {
      uint64_t s = 0;
      for (size_t i = 0; i < n; ++i) s += static_cast<uint32_t>(std::abs(static_cast<int>(static_cast<int8_t>(p[i]))));
      return s;
    };
    uint64_t best = cost(dst + 1, row_bytes);
    for (int type = 1; type <= 4 && best > 0; ++type) {
      filter_row(type, row, up, row_bytes, trial.data());
      const uint64_t c = cost(trial.data(), row_bytes);
      if (c < best) {
        best = c;
        dst[0] = static_cast<uint8_t>(type);
        std::memcpy(dst + 1, trial.data(), row_bytes);
      }
    }
  }
  return raw;
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

std::vector<uint8_t> zlib_compress(const uint8_t* data, size_t n, PngCompression mode) {
  static const uint8_t kNothing = 0;
  if (data == nullptr) data = &kNothing;  // n == 0
  return mode == PngCompression::stored ? zlib_stored(data, n) : zlib_deflate(data, n);
}

std::vector<uint8_t> encode_png(const Image& img, PngCompression mode) {
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
  const std::vector<uint8_t> raw = filtered_scanlines(img, mode == PngCompression::deflate);

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
  put_chunk(png, "IDAT", zlib_compress(raw.data(), raw.size(), mode));
  put_chunk(png, "IEND", {});
  return png;
}

void write_png(const std::string& path, const Image& img, PngCompression mode) {
  const std::vector<uint8_t> png = encode_png(img, mode);
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
