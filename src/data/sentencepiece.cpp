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
  std::string normalizer_name;
  bool charsmap = false;
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
      ProtoReader n(r.bytes(), name);
      while (!n.done()) {
        const auto [f, w] = n.tag();
        if (f == 1 && w == 2) normalizer_name = std::string(n.bytes());
        else if (f == 2 && w == 2) charsmap = !n.bytes().empty();
        else if (f == 3 && w == 0) add_dummy_prefix_ = n.varint() != 0;
        else if (f == 4 && w == 0) remove_extra_whitespaces_ = n.varint() != 0;
        else if (f == 5 && w == 0) escape_whitespaces_ = n.varint() != 0;
        else n.skip(w);
      }
    } else {
      r.skip(wire);
    }
  }
  ZT_CHECK_T(!pieces_.empty(), ConfigError, "sentencepiece model '", name_, "' has no pieces (not a .model file?)");
  ZT_CHECK_T(model_type == 2, ConfigError, "sentencepiece model '", name_, "': model_type ", model_type,
             " is not supported (BPE = 2 only; unigram models such as T5's are not)");
  ZT_CHECK_T(!charsmap, ConfigError, "sentencepiece model '", name_, "': normalizer '", normalizer_name,
             "' has a precompiled charsmap (NFKC-style normalization), which is not supported (identity only, as "
             "Llama 2 and Mistral use)");
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

// sentencepiece's Normalizer::Normalize without a charsmap: user-defined symbols are
// copied as they are, other characters one at a time (malformed UTF-8 becomes U+FFFD),
// spaces escaped to U+2581, the dummy prefix added, extra spaces removed when asked.
std::string SentencePieceTokenizer::normalize(std::string_view in) const {
  std::string out;
  if (in.empty()) return out;
  size_t i = 0;
  if (remove_extra_whitespaces_) {
    while (i < in.size() && in[i] == ' ') ++i;
    if (i == in.size()) return out;
  }
  auto add_ws = [&] {
    if (escape_whitespaces_) out += kSpaceSymbol;
    else out += ' ';
  };
  bool prev_space = remove_extra_whitespaces_;
  if (add_dummy_prefix_) add_ws();
  while (i < in.size()) {
    size_t n = user_symbol_at(in, i);
    std::string_view sp;
    if (n > 0) {
      sp = in.substr(i, n);
    } else {
      int len = 0;
      const uint32_t cp = decode_utf8(in, i, len);
      n = static_cast<size_t>(len);
      sp = cp == 0xFFFFFFFFu ? std::string_view("\xEF\xBF\xBD") : in.substr(i, n);
    }
    i += n;
    for (char c : sp) {
      if (c == ' ') {
        if (!prev_space || !remove_extra_whitespaces_) add_ws();
        prev_space = true;
      } else {
        out += c;
        prev_space = false;
      }
    }
  }
  if (remove_extra_whitespaces_) {
    // Drop trailing escaped spaces.
    const std::string ws = escape_whitespaces_ ? std::string(kSpaceSymbol) : std::string(" ");
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
  const std::string norm = normalize(text);
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

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    const Piece& p = piece(id);
    switch (p.type) {
      case PieceType::kControl: continue;
      case PieceType::kByte: out += static_cast<char>(std::stoi(p.text.substr(3, 2), nullptr, 16)); break;
      case PieceType::kUnknown: out += unk_surface_; break;
      default: {
        std::string_view t = p.text;
        if (first && add_dummy_prefix_ && t.substr(0, kSpaceSymbol.size()) == kSpaceSymbol) {
          t.remove_prefix(kSpaceSymbol.size());
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
    first = false;
  }
  return out;
}

}  // namespace zt::data
