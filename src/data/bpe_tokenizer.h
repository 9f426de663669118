// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama 3, Qwen2 style),
// giving the ids `tokenizers` gives (Tokenizer.encode(text).ids) and decoding them.
//
// What a tokenizer.json may hold (anything else is a ConfigError naming the key):
//   normalizer     null, NFC, NFD, NFKC, NFKD, or a Sequence of those ([Normalizer] in
//                  data/normalize.h: applied to the text between non-normalized added tokens)
//   pre_tokenizer  ByteLevel (use_regex: the GPT-2 pattern; add_prefix_space), Split
//                  with the GPT-2, Llama 3 or Qwen2 regex and behavior "Isolated", or a
//                  Sequence of those (see data/pretokenize.h)
//   model          BPE with vocab and merges (either "a b" strings or [a, b] pairs),
//                  ignore_merges, unk_token, fuse_unk; no dropout, no byte_fallback,
//                  no continuing_subword_prefix / end_of_word_suffix
//   added_tokens   matched first (leftmost-longest, non-normalized ones before normalized
//                  ones), never merged; lstrip / rstrip / single_word honoured
//   post_processor null, ByteLevel, TemplateProcessing (its "single" template, applied
//                  when add_special_tokens is true)
//   decoder        ByteLevel or null
// The pre-tokenizer must include ByteLevel: this is a byte-level BPE, every byte of the
// input is covered by the 256 base symbols.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/normalize.h"
#include "data/pretokenize.h"

namespace zt::data {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Per-thread memo of word -> ids (Hugging Face keeps one too). Not thread-safe: use one
// per thread. Cleared when it grows past `capacity` words.
struct BpeWordCache {
  size_t capacity = 1 << 16;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

class BpeTokenizer {
 public:
  // Throws ConfigError naming the file and the key when it is not a supported byte-level BPE.
  static BpeTokenizer from_file(const std::string& path);
  explicit BpeTokenizer(const nlohmann::json& j, const std::string& name = "tokenizer.json");

  // Token ids of `text` (UTF-8). add_special_tokens applies the post-processor's
  // template (e.g. Llama 3's <|begin_of_text|>), as `tokenizers` does by default.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Appends the ids of `text` to `out`, memoising words in `cache`.
  void encode(std::string_view text, std::vector<int32_t>& out, BpeWordCache& cache,
              bool add_special_tokens = false) const;
  // Every text on `threads` threads (0: hardware concurrency); result i is encode(texts[i]).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts, int threads,
                                                 bool add_special_tokens = false) const;

  // The bytes the ids stand for (Hugging Face returns them as UTF-8, replacing invalid
  // sequences with U+FFFD; here they come back as they are). Throws on an unknown id.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One more than the largest id of the vocabulary and the added tokens.
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const;  // the token string as in tokenizer.json
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // The end-of-text token of the usual families, if present: <|endoftext|>,
  // <|end_of_text|>, </s>, <|im_end|> (the first that is an added token).
  std::optional<int32_t> end_of_text_id() const;
  // Pattern names of the pre-tokenizer's splits in order, e.g. {"llama3"} (for logs and tests).
  std::vector<std::string> pre_tokenizer_patterns() const;
  // The normalizer's forms in order, e.g. {"NFC"} (empty for "normalizer": null).
  std::vector<std::string> normalizer_forms() const;
  // `text` through the normalizer (the text itself when there is none).
  std::string normalize(std::string_view text) const;

 private:
  struct Merge {
    int32_t rank, new_id;
  };
  // A pre-tokenizer step: split by a pattern, or ByteLevel's prefix space (+ GPT-2 split).
  struct PreStep {
    bool prefix_space = false;
    std::optional<SplitPattern> split;
  };
  struct Segment {
    int32_t added = -1;  // an added token's id, or -1 for text
    std::string_view text;
  };

  void parse_model(const nlohmann::json& m);
  void parse_normalizer(const nlohmann::json& n);
  void parse_pre_tokenizer(const nlohmann::json& p);
  void parse_post_processor(const nlohmann::json& p);
  void split_added(std::string_view text, bool normalized_pass, std::vector<Segment>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out, BpeWordCache& cache) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;

  std::string name_;
  std::unordered_map<std::string, int32_t> vocab_;        // token string (byte-level chars) -> id
  std::unordered_map<std::string, int32_t> raw_vocab_;    // the bytes a model token stands for -> id
  std::unordered_map<uint64_t, Merge> merges_;            // (left id << 32 | right id) -> merge
  std::vector<std::string> id_to_token_;                  // token strings by id ("" for holes)
  std::vector<uint8_t> is_special_;                       // by id
  int32_t byte_id_[256];                                  // base symbol of each byte, -1 if absent
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::vector<PreStep> pre_;
  std::vector<AddedToken> added_;
  std::vector<std::string> added_match_;                  // by index into added_: the text matched (normalized
                                                          // content for a normalized token, as tokenizers does)
  std::vector<UnicodeForm> normalizers_;                  // applied in order
  std::vector<std::vector<int32_t>> added_by_byte_[2];    // [normalized] first byte -> indices into added_
  std::vector<int32_t> prefix_ids_, suffix_ids_;          // post-processor template around the text
  std::string post_processor_error_;                      // set when the template is unsupported
};

}  // namespace zt::data
