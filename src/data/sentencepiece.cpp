#include "data/sentencepiece.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <queue>
#include <sstream>

#include "data/unicode.h"
#include "zerotrain/error.h"

namespace zt::data {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 '▁'

// A protobuf wire-format reader: just enough for ModelProto.
class ProtoReader {
 public:
  ProtoReader(std::string_view data, const std::string& name) : d_(data), name_(name) {}
  bool done() const { return pos_ >= d_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      ZT_CHECK_T(pos_ < d_.size(), ConfigError, "sentencepiece model '", name_, "': truncated varint at byte ", pos_);
      const auto b = static_cast<uint8_t>(d_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw ConfigError(detail::cat("sentencepiece model '", name_, "': varint longer than 10 bytes at ", pos_));
  }
  // The next field's number and wire type.
  std::pair<uint32_t, uint32_t> tag() {
    const uint64_t t = varint();
    return {static_cast<uint32_t>(t >> 3), static_cast<uint32_t>(t & 7)};
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    ZT_CHECK_T(n <= d_.size() - pos_, ConfigError, "sentencepiece model '", name_, "': a field of ", n,
               " bytes runs past the end at byte ", pos_, " (not a .model file?)");
    auto s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  float fixed32_float() {
    ZT_CHECK_T(d_.size() - pos_ >= 4, ConfigError, "sentencepiece model '", name_, "': truncated float");
    float f;
    std::memcpy(&f, d_.data() + pos_, 4);
    pos_ += 4;
    return f;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0: varint(); break;
      case 1: advance(8); break;
      case 2: bytes(); break;
      case 5: advance(4); break;
      default:
        throw ConfigError(detail::cat("sentencepiece model '", name_, "': wire type ", wire, " at byte ", pos_,
                                      " (not a .model file?)"));
    }
  }

 private:
  void advance(size_t n) {
    ZT_CHECK_T(d_.size() - pos_ >= n, ConfigError, "sentencepiece model '", name_, "': truncated field");
    pos_ += n;
  }
  std::string_view d_;
  std::string name_;
  size_t pos_ = 0;
};

}  // namespace

SentencePieceTokenizer SentencePieceTokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ZT_CHECK_T(f.good(), ConfigError, "sentencepiece model: cannot open '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string data = ss.str();
  return SentencePieceTokenizer(data, path);
}

SentencePieceTokenizer::SentencePieceTokenizer(std::string_view proto, const std::string& name) : name_(name) {
  int64_t model_type = 1;  // UNIGRAM unless the trainer spec says otherwise
  bool whitespace_suffix = false;
  ProtoReader r(proto, name);
  while (!r.done()) {
    const auto [field, wire] = r.tag();
    if (field == 1 && wire == 2) {  // SentencePiece
      ProtoReader p(r.bytes(), name);
      Piece piece;
      while (!p.done()) {
        const auto [f, w] = p.tag();
        if (f == 1 && w == 2) piece.text = std::string(p.bytes());
        else if (f == 2 && w == 5) piece.score = p.fixed32_float();
        else if (f == 3 && w == 0) piece.type = static_cast<PieceType>(p.varint());
        else p.skip(w);
      }
      pieces_.push_back(std::move(piece));
    } else if (field == 2 && wire == 2) {  // TrainerSpec
      ProtoReader t(r.bytes(), name);
      while (!t.done()) {
        const auto [f, w] = t.tag();
        if (f == 3 && w == 0) model_type = static_cast<int64_t>(t.varint());
        else if (f == 35 && w == 0) byte_fallback_ = t.varint() != 0;
        else if (f == 24 && w == 0) whitespace_suffix = t.varint() != 0;
        else if (f == 44 && w == 2) unk_surface_ = std::string(t.bytes());
        else t.skip(w);
      }
    } else if (field == 3 && wire == 2) {  // NormalizerSpec
      read_normalizer(r.bytes(), normalizer_);
    } else if (field == 5 && wire == 2) {  // NormalizerSpec of the denormalizer
      read_normalizer(r.bytes(), denormalizer_);
    } else {
      r.skip(wire);
    }
  }
  ZT_CHECK_T(!pieces_.empty(), ConfigError, "sentencepiece model '", name_, "' has no pieces (not a .model file?)");
  ZT_CHECK_T(model_type == 2, ConfigError, "sentencepiece model '", name_, "': model_type ", model_type,
             " is not supported (BPE = 2 only; unigram models such as T5's are not)");
  ZT_CHECK_T(!whitespace_suffix, ConfigError, "sentencepiece model '", name_,
             "': treat_whitespace_as_suffix is not supported");
  for (auto& b : byte_ids_) b = -1;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    const auto id = static_cast<int32_t>(i);
    const bool normal = p.type == PieceType::kNormal || p.type == PieceType::kUserDefined || p.type == PieceType::kUnused;
    const bool fresh = (normal ? normal_ : reserved_).emplace(p.text, id).second;
    ZT_CHECK_T(fresh, ConfigError, "sentencepiece model '", name_, "': piece '", p.text, "' appears twice");
    if (p.type == PieceType::kUserDefined) user_symbols_.push_back(p.text);
    if (p.type == PieceType::kUnknown) unk_id_ = id;
    if (p.type == PieceType::kControl && p.text == "<s>") bos_id_ = id;
    if (p.type == PieceType::kControl && p.text == "</s>") eos_id_ = id;
    if (p.type == PieceType::kByte) {
      unsigned b = 0;
      ZT_CHECK_T(p.text.size() == 6 && std::sscanf(p.text.c_str(), "<0x%02X>", &b) == 1, ConfigError,
                 "sentencepiece model '", name_, "': byte piece '", p.text, "' is not <0xXX>");
      byte_ids_[b] = id;
    }
  }
  ZT_CHECK_T(unk_id_ >= 0, ConfigError, "sentencepiece model '", name_, "' has no unknown piece");
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      ZT_CHECK_T(byte_ids_[b] >= 0, ConfigError, "sentencepiece model '", name_,
                 "': byte_fallback is on but byte piece ", b, " is missing");
    }
  }
}

const SentencePieceTokenizer::Piece& SentencePieceTokenizer::piece(int32_t id) const {
  ZT_CHECK(id >= 0 && id < vocab_size(), "sentencepiece model '", name_, "': no piece has id ", id, " (vocabulary ",
           vocab_size(), ")");
  return pieces_[static_cast<size_t>(id)];
}

int32_t SentencePieceTokenizer::piece_to_id(std::string_view piece) const {
  const std::string k(piece);
  if (auto it = reserved_.find(k); it != reserved_.end()) return it->second;
  if (auto it = normal_.find(k); it != normal_.end()) return it->second;
  return unk_id_;
}

size_t SentencePieceTokenizer::user_symbol_at(std::string_view s, size_t i) const {
  size_t best = 0;
  for (const auto& u : user_symbols_) {
    if (u.size() > best && s.compare(i, u.size(), u) == 0) best = u.size();
  }
  return best;
}

// [SentencePiece Charsmap] A NormalizerSpec's precompiled_charsmap (normalizer.cc,
// Encode/DecodePrecompiledCharsMap) is: a uint32 (little-endian) byte size of the trie;
// the trie, a Darts-clone double array of uint32 units whose keys are UTF-8 sources and
// whose values are offsets into the pool; the pool, the normalized strings each ended by
// NUL. Normalizing takes, at each position, the longest trie key that is a prefix of the
// rest (an empty target deletes the source); where none matches, one UTF-8 character is
// copied (a malformed byte becomes U+FFFD). Each Darts unit packs: bits 0-7 the label
// (bit 31 set on a leaf, so no byte label matches it), bit 8 "a leaf hangs off this
// node", bits 10-31 the offset to the children (shifted left by 8 when bit 9 is set); a
// leaf's bits 0-30 are its value. From node p, the child for byte b is p ^ offset(p) ^ b,
// and a node's leaf is at p ^ offset(p) (label 0).
void SentencePieceTokenizer::read_normalizer(std::string_view spec, Normalizer& n) const {
  ProtoReader r(spec, name_);
  std::string rule;
  std::string_view blob;
  while (!r.done()) {
    const auto [f, w] = r.tag();
    if (f == 1 && w == 2) rule = std::string(r.bytes());
    else if (f == 2 && w == 2) blob = r.bytes();
    else if (f == 3 && w == 0) n.add_dummy_prefix = r.varint() != 0;
    else if (f == 4 && w == 0) n.remove_extra_whitespaces = r.varint() != 0;
    else if (f == 5 && w == 0) n.escape_whitespaces = r.varint() != 0;
    else r.skip(w);
  }
  if (blob.empty()) return;  // no charsmap: characters pass unchanged ("identity")
  auto bad = [&](auto&&... why) {
    return ConfigError(detail::cat("sentencepiece model '", name_, "': the precompiled charsmap of normalizer '", rule,
                                   "' (", blob.size(), " bytes) is malformed: ", why...));
  };
  if (blob.size() <= 4) throw bad("shorter than its 4-byte header");
  uint32_t trie_bytes = 0;
  for (int k = 3; k >= 0; --k) trie_bytes = (trie_bytes << 8) | static_cast<uint8_t>(blob[static_cast<size_t>(k)]);
  if (trie_bytes == 0 || trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4) {
    throw bad("its header gives a trie of ", trie_bytes, " bytes (a positive multiple of 4 up to ", blob.size() - 4,
              " expected)");
  }
  n.trie.resize(trie_bytes / 4);
  for (size_t u = 0; u < n.trie.size(); ++u) {
    const auto* b = reinterpret_cast<const uint8_t*>(blob.data() + 4 + 4 * u);
    n.trie[u] = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  n.pool = std::string(blob.substr(4 + trie_bytes));
  if (!n.pool.empty() && n.pool.back() != '\0') throw bad("its string pool does not end with NUL");
}

std::pair<std::string_view, size_t> SentencePieceTokenizer::normalize_prefix(const Normalizer& n, std::string_view s,
                                                                             bool user_symbols) const {
  if (user_symbols) {
    if (const size_t u = user_symbol_at(s, 0); u > 0) return {s.substr(0, u), u};
  }
  if (!n.trie.empty()) {
    // Darts commonPrefixSearch; sentencepiece keeps the first 32 matches (kMaxTrieResultsSize) and takes the longest.
    const auto& t = n.trie;
    auto unit = [&](size_t p) {
      ZT_CHECK_T(p < t.size(), ConfigError, "sentencepiece model '", name_,
                 "': the precompiled charsmap is malformed (trie node ", p, " of ", t.size(), " units)");
      return t[p];
    };
    auto offset = [](uint32_t u) -> size_t { return (u >> 10) << ((u & (1u << 9)) >> 6); };
    size_t p = offset(unit(0));
    size_t best_len = 0, matches = 0;
    uint32_t best_value = 0;
    for (size_t i = 0; i < s.size() && matches < 32; ++i) {
      const auto b = static_cast<uint8_t>(s[i]);
      p ^= b;
      const uint32_t u = unit(p);
      if ((u & ((1u << 31) | 0xFFu)) != b) break;
      p ^= offset(u);
      if ((u >> 8) & 1u) {
        best_len = i + 1;
        best_value = unit(p) & ((1u << 31) - 1);
        ++matches;
      }
    }
    if (best_len > 0) {
      ZT_CHECK_T(best_value < n.pool.size(), ConfigError, "sentencepiece model '", name_,
                 "': the precompiled charsmap is malformed (string offset ", best_value, " past its pool of ",
                 n.pool.size(), " bytes)");
      return {std::string_view(n.pool.c_str() + best_value), best_len};  // the pool ends with NUL
    }
  }
  int len = 0;
  const uint32_t cp = decode_utf8(s, 0, len);
  if (cp == 0xFFFFFFFFu) return {std::string_view("\xEF\xBF\xBD"), 1};  // one bad byte -> U+FFFD
  return {s.substr(0, static_cast<size_t>(len)), static_cast<size_t>(len)};
}

// sentencepiece's Normalizer::Normalize: leading spaces (after normalization) dropped,
// the dummy prefix added, each prefix normalized (normalize_prefix) with the spaces that
// start it dropped after a space, spaces escaped to U+2581, trailing spaces dropped.
std::string SentencePieceTokenizer::normalize(const Normalizer& n, std::string_view in, bool user_symbols) const {
  std::string out;
  if (n.remove_extra_whitespaces) {
    while (!in.empty()) {
      const auto [sp, len] = normalize_prefix(n, in, user_symbols);
      if (sp != " ") break;
      in.remove_prefix(len);
    }
  }
  if (in.empty()) return out;
  const std::string_view ws = n.escape_whitespaces ? kSpaceSymbol : std::string_view(" ");
  if (n.add_dummy_prefix) out += ws;
  bool prev_space = n.remove_extra_whitespaces;
  while (!in.empty()) {
    auto [sp, len] = normalize_prefix(n, in, user_symbols);
    while (prev_space && !sp.empty() && sp.front() == ' ') sp.remove_prefix(1);
    if (!sp.empty()) {
      for (char c : sp) {
        if (c == ' ') out += ws;
        else out += c;
      }
      prev_space = sp.back() == ' ';
    }
    in.remove_prefix(len);
    if (!n.remove_extra_whitespaces) prev_space = false;
  }
  if (n.remove_extra_whitespaces) {
    while (out.size() >= ws.size() && out.compare(out.size() - ws.size(), ws.size(), ws) == 0) {
      out.resize(out.size() - ws.size());
    }
  }
  return out;
}

// bpe_model.cc's Model::Encode: symbols are characters (user-defined symbols whole and
// frozen); the adjacent pair whose concatenation is a piece with the highest score
// merges first, leftmost among equals; stale pairs are skipped by their length. Pieces of
// type UNUSED are split back into the pair that made them.
std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  const std::string norm = normalize(normalizer_, text, /*user_symbols=*/true);
  struct Sym {
    int32_t prev, next;
    bool freeze;
    std::string_view piece;
  };
  std::vector<Sym> sy;
  for (size_t i = 0; i < norm.size();) {
    size_t n = user_symbol_at(norm, i);
    const bool freeze = n > 0;
    if (!freeze) {
      int len = 0;
      decode_utf8(norm, i, len);
      n = static_cast<size_t>(len);
    }
    const auto idx = static_cast<int32_t>(sy.size());
    sy.push_back({idx - 1, i + n < norm.size() ? idx + 1 : -1, freeze, std::string_view(norm).substr(i, n)});
    i += n;
  }
  struct Pair {
    int32_t left, right;
    float score;
    size_t size;
  };
  auto worse = [](const Pair& a, const Pair& b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
  std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> agenda(worse);
  std::unordered_map<std::string, std::pair<std::string, std::string>> rev_merge;
  std::string buf;
  auto maybe_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Sym& a = sy[static_cast<size_t>(l)];
    const Sym& b = sy[static_cast<size_t>(r)];
    if (a.freeze || b.freeze) return;
    buf.assign(a.piece.data(), a.piece.size() + b.piece.size());  // adjacent in `norm`
    auto it = normal_.find(buf);
    if (it == normal_.end()) return;
    const Piece& p = pieces_[static_cast<size_t>(it->second)];
    agenda.push({l, r, p.score, buf.size()});
    if (p.type == PieceType::kUnused) rev_merge[buf] = {std::string(a.piece), std::string(b.piece)};
  };
  for (size_t i = 1; i < sy.size(); ++i) maybe_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!agenda.empty()) {
    const Pair top = agenda.top();
    agenda.pop();
    Sym& l = sy[static_cast<size_t>(top.left)];
    Sym& r = sy[static_cast<size_t>(top.right)];
    if (l.piece.empty() || r.piece.empty() || l.piece.size() + r.piece.size() != top.size) continue;
    l.piece = std::string_view(l.piece.data(), l.piece.size() + r.piece.size());
    l.next = r.next;
    if (r.next >= 0) sy[static_cast<size_t>(r.next)].prev = top.left;
    r.piece = std::string_view();
    maybe_add(l.prev, top.left);
    maybe_add(top.left, l.next);
  }
  std::vector<int32_t> out;
  auto emit = [&](std::string_view w) {
    const int32_t id = piece_to_id(w);
    if (id == unk_id_ && byte_fallback_) {
      for (char c : w) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    } else if (id == unk_id_ && !out.empty() && out.back() == unk_id_) {
      // Consecutive unknown pieces are merged into one (sentencepiece does so without byte fallback).
    } else {
      out.push_back(id);
    }
  };
  auto resegment = [&](std::string_view w, auto&& self) -> void {
    const int32_t id = piece_to_id(w);
    if (id != unk_id_ && pieces_[static_cast<size_t>(id)].type == PieceType::kUnused) {
      auto it = rev_merge.find(std::string(w));
      if (it != rev_merge.end()) {
        self(it->second.first, self);
        self(it->second.second, self);
        return;
      }
    }
    emit(w);
  };
  for (int32_t k = sy.empty() ? -1 : 0; k >= 0; k = sy[static_cast<size_t>(k)].next) {
    resegment(sy[static_cast<size_t>(k)].piece, resegment);
  }
  return out;
}

// sentencepiece's DecodeIds: a run of byte pieces becomes its characters (each byte of
// malformed UTF-8 a U+FFFD); while nothing has been written, a leading U+2581 is dropped
// (once when whitespace is kept, until text appears when extra whitespace is removed);
// the denormalizer's charsmap, if any, is applied to the whole text.
std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out, bytes;
  auto flush_bytes = [&] {
    for (size_t i = 0; i < bytes.size();) {
      int len = 0;
      if (decode_utf8(bytes, i, len) == 0xFFFFFFFFu) {
        out += "\xEF\xBF\xBD";
      } else {
        out.append(bytes, i, static_cast<size_t>(len));
      }
      i += static_cast<size_t>(len);
    }
    bytes.clear();
  };
  const bool strip_bos_ws = normalizer_.add_dummy_prefix || normalizer_.remove_extra_whitespaces;
  bool at_bos = true, bos_ws_seen = false;
  for (int32_t id : ids) {
    const Piece& p = piece(id);
    if (p.type == PieceType::kByte) {
      bytes += static_cast<char>(std::stoi(p.text.substr(3, 2), nullptr, 16));
      continue;
    }
    flush_bytes();
    if (bos_ws_seen || !out.empty()) at_bos = false;
    bos_ws_seen = false;
    switch (p.type) {
      case PieceType::kControl: break;
      case PieceType::kUnknown: out += unk_surface_; break;
      default: {
        std::string_view t = p.text;
        if (at_bos && strip_bos_ws && t.substr(0, kSpaceSymbol.size()) == kSpaceSymbol) {
          t.remove_prefix(kSpaceSymbol.size());
          bos_ws_seen = !normalizer_.remove_extra_whitespaces;
        }
        for (size_t i = 0; i < t.size();) {
          if (t.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
            out += ' ';
            i += kSpaceSymbol.size();
          } else {
            out += t[i++];
          }
        }
      }
    }
  }
  flush_bytes();
  if (!denormalizer_.trie.empty()) out = normalize(denormalizer_, out, /*user_symbols=*/false);
  return out;
}

}  // namespace zt::data
