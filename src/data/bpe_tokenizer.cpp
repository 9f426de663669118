#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <fstream>
#include <queue>
#include <thread>

#include "data/unicode.h"
#include "zerotrain/error.h"

namespace zt::data {
namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to
// U+0100.. in byte order, so every byte is one visible character.
struct ByteMap {
  uint32_t to_cp[256];
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    auto keep = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) to_cp[b] = keep(b) ? static_cast<uint32_t>(b) : 256 + n++;
    for (int b = 0; b < 256; ++b) to_byte[to_cp[b]] = static_cast<uint8_t>(b);
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The bytes a byte-level token string stands for; nullopt when a character is not one
// of the 256 byte characters (then the token is taken as its own UTF-8, as Hugging
// Face's ByteLevel decoder does).
std::optional<std::string> unbyte(std::string_view token) {
  const auto& m = byte_map();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    int len = 0;
    const uint32_t cp = decode_utf8(token, i, len);
    auto it = m.to_byte.find(cp);
    if (it == m.to_byte.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].get<std::string>() : ""; }

bool is_space_cp(uint32_t cp) { return char_class(cp) == CharClass::kSpace; }
bool is_word_cp(uint32_t cp) {
  const CharClass c = char_class(cp);
  return c == CharClass::kLetter || c == CharClass::kNumber;
}
// The code point that ends s (s non-empty, valid UTF-8 expected).
uint32_t last_cp(std::string_view s) {
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
  int len = 0;
  return decode_utf8(s, k, len);
}

}  // namespace

BpeTokenizer BpeTokenizer::from_file(const std::string& path) {
  std::ifstream f(path);
  ZT_CHECK_T(f.good(), ConfigError, "tokenizer: cannot open '", path, "'");
  json j;
  try {
    j = json::parse(f);
  } catch (const std::exception& e) {
    throw ConfigError(detail::cat("tokenizer: '", path, "' is not valid JSON: ", e.what()));
  }
  return BpeTokenizer(j, path);
}

BpeTokenizer::BpeTokenizer(const json& j, const std::string& name) : name_(name) {
  ZT_CHECK_T(j.is_object() && j.contains("model"), ConfigError, "tokenizer '", name_,
             "': not a Hugging Face tokenizer.json (no \"model\" key)");
  parse_normalizer(j.value("normalizer", json()));
  parse_model(j["model"]);
  parse_pre_tokenizer(j.value("pre_tokenizer", json()));
  const json& dec = j.value("decoder", json());
  ZT_CHECK_T(dec.is_null() || type_of(dec) == "ByteLevel", ConfigError, "tokenizer '", name_, "': decoder '",
             type_of(dec), "' is not supported (ByteLevel or null)");

  for (const json& t : j.value("added_tokens", json::array())) {
    AddedToken a;
    a.id = t.at("id").get<int32_t>();
    a.content = t.at("content").get<std::string>();
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    ZT_CHECK_T(a.id >= 0 && !a.content.empty(), ConfigError, "tokenizer '", name_, "': added token '", a.content,
               "' has id ", a.id);
    if (static_cast<size_t>(a.id) >= id_to_token_.size()) {
      id_to_token_.resize(static_cast<size_t>(a.id) + 1);
      is_special_.resize(static_cast<size_t>(a.id) + 1, 0);
    }
    id_to_token_[static_cast<size_t>(a.id)] = a.content;
    is_special_[static_cast<size_t>(a.id)] = a.special;
    added_.push_back(std::move(a));
  }
  for (auto& v : added_by_byte_) v.assign(256, {});
  for (size_t k = 0; k < added_.size(); ++k) {
    const auto& a = added_[k];
    // A normalized added token is matched on the normalized text by its normalized content.
    added_match_.push_back(a.normalized ? normalize(a.content) : a.content);
    if (added_match_.back().empty()) continue;
    added_by_byte_[a.normalized ? 1 : 0][static_cast<uint8_t>(added_match_.back()[0])].push_back(static_cast<int32_t>(k));
  }
  parse_post_processor(j.value("post_processor", json()));
}

void BpeTokenizer::parse_normalizer(const json& n) {
  if (n.is_null()) return;
  const std::string t = type_of(n);
  if (t == "Sequence") {
    ZT_CHECK_T(n.contains("normalizers") && n["normalizers"].is_array(), ConfigError, "tokenizer '", name_,
               "': normalizer Sequence has no \"normalizers\" list");
    for (const json& c : n["normalizers"]) parse_normalizer(c);
    return;
  }
  UnicodeForm f;
  ZT_CHECK_T(unicode_form_from_name(t, f), ConfigError, "tokenizer '", name_, "': normalizer '", t,
             "' is not supported (NFC, NFD, NFKC, NFKD, a Sequence of them, or \"normalizer\": null)");
  normalizers_.push_back(f);
}

std::vector<std::string> BpeTokenizer::normalizer_forms() const {
  std::vector<std::string> out;
  for (UnicodeForm f : normalizers_) out.emplace_back(unicode_form_name(f));
  return out;
}

std::string BpeTokenizer::normalize(std::string_view text) const {
  std::string out(text);
  for (UnicodeForm f : normalizers_) out = unicode_normalize(out, f);
  return out;
}

void BpeTokenizer::parse_model(const json& m) {
  ZT_CHECK_T(type_of(m) == "BPE" || (!m.contains("type") && m.contains("merges")), ConfigError, "tokenizer '",
             name_, "': model type '", type_of(m), "' is not supported (BPE only; SentencePiece .model files have "
             "their own reader)");
  const json& dropout = m.value("dropout", json());
  ZT_CHECK_T(dropout.is_null() || dropout.get<double>() == 0.0, ConfigError, "tokenizer '", name_,
             "': model.dropout ", dropout.dump(), " is not supported (BPE dropout is for training-time sampling)");
  ZT_CHECK_T(!m.value("byte_fallback", false), ConfigError, "tokenizer '", name_,
             "': model.byte_fallback is not supported (byte-level BPE needs no fallback)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = m.value(k, json());
    ZT_CHECK_T(v.is_null() || v.get<std::string>().empty(), ConfigError, "tokenizer '", name_, "': model.", k, " ",
               v.dump(), " is not supported");
  }
  ignore_merges_ = m.value("ignore_merges", false);
  fuse_unk_ = m.value("fuse_unk", false);

  for (const auto& [tok, id_json] : m.at("vocab").items()) {
    const auto id = id_json.get<int32_t>();
    ZT_CHECK_T(id >= 0, ConfigError, "tokenizer '", name_, "': vocab id ", id, " of '", tok, "' is negative");
    vocab_.emplace(tok, id);
    if (static_cast<size_t>(id) >= id_to_token_.size()) {
      id_to_token_.resize(static_cast<size_t>(id) + 1);
      is_special_.resize(static_cast<size_t>(id) + 1, 0);
    }
    id_to_token_[static_cast<size_t>(id)] = tok;
    if (auto raw = unbyte(tok)) raw_vocab_.emplace(std::move(*raw), id);
  }
  const json& unk = m.value("unk_token", json());
  if (!unk.is_null()) {
    auto it = vocab_.find(unk.get<std::string>());
    ZT_CHECK_T(it != vocab_.end(), ConfigError, "tokenizer '", name_, "': unk_token '", unk.get<std::string>(),
               "' is not in the vocabulary");
    unk_id_ = it->second;
  }
  const auto& bm = byte_map();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, bm.to_cp[b]);
    auto it = vocab_.find(s);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  int32_t rank = 0;
  for (const json& mj : m.at("merges")) {
    std::string a, b;
    if (mj.is_string()) {
      const auto s = mj.get<std::string>();
      const auto sp = s.find(' ');
      ZT_CHECK_T(sp != std::string::npos && sp > 0, ConfigError, "tokenizer '", name_, "': merge ", rank, " '", s,
                 "' is not two tokens separated by a space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      ZT_CHECK_T(mj.is_array() && mj.size() == 2, ConfigError, "tokenizer '", name_, "': merge ", rank, " ",
                 mj.dump(), " is not a pair");
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), inew = vocab_.find(a + b);
    ZT_CHECK_T(ia != vocab_.end() && ib != vocab_.end() && inew != vocab_.end(), ConfigError, "tokenizer '", name_,
               "': merge ", rank, " ('", a, "', '", b, "') names a token that is not in the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second);
    merges_.emplace(key, Merge{rank, inew->second});  // the first (best) rank of a repeated pair wins
    ++rank;
  }
}

void BpeTokenizer::parse_pre_tokenizer(const json& p) {
  bool byte_level = false;
  auto step = [&](const json& s, auto&& self) -> void {
    const std::string t = type_of(s);
    if (t == "Sequence") {
      for (const json& c : s.at("pretokenizers")) self(c, self);
    } else if (t == "ByteLevel") {
      byte_level = true;
      PreStep ps;
      ps.prefix_space = s.value("add_prefix_space", false);
      if (s.value("use_regex", true)) ps.split = SplitPattern::kGpt2;
      pre_.push_back(ps);
    } else if (t == "Split") {
      const json& pat = s.at("pattern");
      ZT_CHECK_T(pat.contains("Regex"), ConfigError, "tokenizer '", name_, "': Split pattern ", pat.dump(),
                 " is not supported (a Regex pattern is)");
      const auto re = pat["Regex"].get<std::string>();
      const auto sp = split_pattern_from_regex(re);
      ZT_CHECK_T(sp.has_value(), ConfigError, "tokenizer '", name_, "': Split regex '", re,
                 "' is not one of the supported patterns (GPT-2, Llama 3, Qwen2; see data/pretokenize.h)");
      ZT_CHECK_T(s.value("behavior", std::string("Isolated")) == "Isolated" && !s.value("invert", false),
                 ConfigError, "tokenizer '", name_, "': Split behavior '", s.value("behavior", std::string()),
                 "' / invert is not supported (Isolated, invert false)");
      PreStep ps;
      ps.split = *sp;
      pre_.push_back(ps);
    } else {
      throw ConfigError(detail::cat("tokenizer '", name_, "': pre_tokenizer '", t,
                                    "' is not supported (ByteLevel, Split, Sequence)"));
    }
  };
  if (!p.is_null()) step(p, step);
  ZT_CHECK_T(byte_level, ConfigError, "tokenizer '", name_,
             "': the pre_tokenizer has no ByteLevel step, so this is not a byte-level BPE (SentencePiece-style "
             "BPE tokenizer.json files are not supported)");
}

void BpeTokenizer::parse_post_processor(const json& p) {
  const std::string t = type_of(p);
  if (p.is_null() || t == "ByteLevel") return;
  auto ids_of = [&](const json& special_tokens, const std::string& tok) {
    const json& e = special_tokens.at(tok);
    std::vector<int32_t> ids;
    for (const json& i : e.at("ids")) ids.push_back(i.get<int32_t>());
    return ids;
  };
  auto template_processing = [&](const json& tp) {
    bool seen_a = false;
    for (const json& piece : tp.at("single")) {
      if (piece.contains("Sequence")) {
        ZT_CHECK_T(piece["Sequence"].at("id") == "A", ConfigError, "tokenizer '", name_,
                   "': template piece ", piece.dump(), " is not supported");
        seen_a = true;
      } else {
        auto ids = ids_of(tp.at("special_tokens"), piece.at("SpecialToken").at("id").get<std::string>());
        auto& dst = seen_a ? suffix_ids_ : prefix_ids_;
        dst.insert(dst.end(), ids.begin(), ids.end());
      }
    }
  };
  if (t == "TemplateProcessing") {
    template_processing(p);
  } else if (t == "Sequence") {
    for (const json& c : p.at("processors")) {
      const std::string ct = type_of(c);
      if (ct == "TemplateProcessing") template_processing(c);
      else if (ct != "ByteLevel") post_processor_error_ = ct;
    }
  } else {
    post_processor_error_ = t;
  }
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : added_) {
    if (a.content == token) return a.id;
  }
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeTokenizer::id_to_token(int32_t id) const {
  ZT_CHECK(id >= 0 && static_cast<size_t>(id) < id_to_token_.size() && !id_to_token_[static_cast<size_t>(id)].empty(),
           "tokenizer '", name_, "': no token has id ", id, " (vocabulary size ", vocab_size(), ")");
  return id_to_token_[static_cast<size_t>(id)];
}

std::optional<int32_t> BpeTokenizer::end_of_text_id() const {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>"}) {
    for (const auto& a : added_) {
      if (a.content == name) return a.id;
    }
  }
  return std::nullopt;
}

std::vector<std::string> BpeTokenizer::pre_tokenizer_patterns() const {
  std::vector<std::string> out;
  for (const auto& s : pre_) {
    if (s.prefix_space) out.push_back("prefix_space");
    if (s.split) out.push_back(split_pattern_name(*s.split));
  }
  return out;
}

// Hugging Face's AddedVocabulary::find_matches: leftmost-longest matches of the added
// tokens of one pass (normalized or not), then single_word / lstrip / rstrip.
void BpeTokenizer::split_added(std::string_view text, bool normalized_pass, std::vector<Segment>& out) const {
  const auto& by_byte = added_by_byte_[normalized_pass ? 1 : 0];
  size_t start_offset = 0;
  size_t i = 0;
  while (i < text.size()) {
    const auto& cands = by_byte[static_cast<uint8_t>(text[i])];
    const AddedToken* best = nullptr;
    const std::string* best_text = nullptr;
    for (int32_t k : cands) {
      const auto& a = added_[static_cast<size_t>(k)];
      const std::string& m = added_match_[static_cast<size_t>(k)];
      if (text.compare(i, m.size(), m) == 0 && (!best || m.size() > best_text->size())) {
        best = &a;
        best_text = &m;
      }
    }
    if (!best) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + best_text->size();
    i = stop;
    if (best->single_word) {
      const bool start_space = start == 0 || !is_word_cp(last_cp(text.substr(0, start)));
      int len = 0;
      const bool stop_space = stop == text.size() || !is_word_cp(decode_utf8(text, stop, len));
      if (!start_space || !stop_space) continue;
    }
    if (best->lstrip) {
      size_t s = start;
      while (s > 0) {
        const std::string_view head = text.substr(0, s);
        const uint32_t cp = last_cp(head);
        if (!is_space_cp(cp)) break;
        size_t k = s - 1;
        while (k > 0 && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
        s = k;
      }
      start = std::max(s, start_offset);
    }
    if (best->rstrip) {
      while (stop < text.size()) {
        int len = 0;
        if (!is_space_cp(decode_utf8(text, stop, len))) break;
        stop += static_cast<size_t>(len);
      }
      i = stop;
    }
    if (start > start_offset) out.push_back({-1, text.substr(start_offset, start - start_offset)});
    out.push_back({best->id, text.substr(start, stop - start)});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({-1, text.substr(start_offset)});
}

// BPE of one word (raw bytes), as Hugging Face's Word::merge_all without dropout: a
// heap of candidate merges, lowest rank first and leftmost among equals; a popped
// merge whose pair has changed since it was pushed is skipped.
void BpeTokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Sym> sy;
  sy.reserve(word.size());
  bool last_unk = false;
  for (char ch : word) {
    const int32_t id = byte_id_[static_cast<uint8_t>(ch)];
    if (id >= 0) {
      sy.push_back({id, 0, 0, true});
      last_unk = false;
    } else if (unk_id_) {
      if (!(fuse_unk_ && last_unk)) sy.push_back({*unk_id_, 0, 0, true});
      last_unk = true;
    }
  }
  const auto n = static_cast<int32_t>(sy.size());
  for (int32_t k = 0; k < n; ++k) {
    sy[static_cast<size_t>(k)].prev = k - 1;
    sy[static_cast<size_t>(k)].next = k + 1 < n ? k + 1 : -1;
  }
  auto find = [&](int32_t a, int32_t b) -> const Merge* {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Cand> heap;
  heap.reserve(static_cast<size_t>(n));
  auto push = [&](int32_t pos) {
    const Sym& l = sy[static_cast<size_t>(pos)];
    if (l.next < 0) return;
    if (const Merge* m = find(l.id, sy[static_cast<size_t>(l.next)].id)) {
      heap.push_back({m->rank, pos, m->new_id});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& l = sy[static_cast<size_t>(c.pos)];
    if (!l.alive || l.next < 0) continue;
    Sym& r = sy[static_cast<size_t>(l.next)];
    const Merge* m = find(l.id, r.id);
    if (!m || m->new_id != c.new_id) continue;
    l.id = c.new_id;
    r.alive = false;
    l.next = r.next;
    if (l.next >= 0) sy[static_cast<size_t>(l.next)].prev = c.pos;
    if (l.prev >= 0) push(l.prev);
    push(c.pos);
  }
  for (int32_t k = n > 0 ? 0 : -1; k >= 0; k = sy[static_cast<size_t>(k)].next) out.push_back(sy[static_cast<size_t>(k)].id);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out, BpeWordCache& cache) const {
  if (ignore_merges_) {
    auto it = raw_vocab_.find(std::string(word));
    if (it != raw_vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1 && byte_id_[static_cast<uint8_t>(word[0])] >= 0) {
    out.push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    return;
  }
  std::string key(word);
  auto it = cache.words.find(key);
  if (it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t before = out.size();
  bpe(word, out);
  if (cache.words.size() >= cache.capacity) cache.words.clear();
  cache.words.emplace(std::move(key), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out, BpeWordCache& cache,
                          bool add_special_tokens) const {
  if (add_special_tokens) {
    ZT_CHECK_T(post_processor_error_.empty(), ConfigError, "tokenizer '", name_, "': post_processor '",
               post_processor_error_, "' is not supported (encode without add_special_tokens, or use a "
               "TemplateProcessing post-processor)");
    out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());
  }
  std::deque<std::string> owned;  // normalized and prefixed pieces (stable addresses for the views)
  std::vector<Segment> first, segs;
  split_added(text, /*normalized_pass=*/false, first);
  for (const Segment& s : first) {
    if (s.added >= 0) {
      segs.push_back(s);
    } else if (normalizers_.empty()) {
      split_added(s.text, /*normalized_pass=*/true, segs);
    } else {  // [Normalizer]: normalize the text between non-normalized added tokens
      owned.push_back(normalize(s.text));
      split_added(owned.back(), /*normalized_pass=*/true, segs);
    }
  }
  std::vector<std::string_view> pieces, next;
  for (const Segment& s : segs) {
    if (s.added >= 0) {
      out.push_back(s.added);
      continue;
    }
    pieces.assign(1, s.text);
    for (const PreStep& st : pre_) {
      if (st.prefix_space) {
        for (auto& p : pieces) {
          if (p.empty() || p[0] != ' ') {
            owned.push_back(" " + std::string(p));
            p = owned.back();
          }
        }
      }
      if (st.split) {
        next.clear();
        for (auto p : pieces) split_words(*st.split, p, next);
        pieces.swap(next);
      }
    }
    for (auto p : pieces) {
      if (!p.empty()) encode_word(p, out, cache);
    }
  }
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  BpeWordCache cache;
  encode(text, out, cache, add_special_tokens);
  return out;
}

std::vector<std::vector<int32_t>> BpeTokenizer::encode_batch(const std::vector<std::string>& texts, int threads,
                                                             bool add_special_tokens) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min<int>(threads, static_cast<int>(std::max<size_t>(1, texts.size())));
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&] {
    BpeWordCache cache;
    try {
      for (size_t i = next++; i < texts.size(); i = next++) encode(texts[i], out[i], cache, add_special_tokens);
    } catch (...) {
      std::lock_guard lk(mu);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  for (int32_t id : ids) {
    const std::string& tok = id_to_token(id);
    if (skip_special_tokens && is_special_[static_cast<size_t>(id)]) continue;
    if (auto raw = unbyte(tok)) out += *raw;
    else out += tok;
  }
  return out;
}

}  // namespace zt::data
