// SentencePiece BPE models (Llama 2, Mistral): a reader of the .model file (the
// ModelProto protobuf, parsed by hand: pieces with scores and types, the trainer's
// model type and byte_fallback, the normalizer's flags) and the BPE encoding of
// sentencepiece's bpe_model.cc, giving the ids SentencePieceProcessor.encode gives.
//
// Supported: model_type BPE; the normalizer with or without a precompiled charsmap
// ("identity" as Llama 2 and Mistral ship, "nmt_nfkc" / "nmt_nfkc_cf" as sentencepiece
// trains by default, or a user rule TSV) with add_dummy_prefix, remove_extra_whitespaces
// and escape_whitespaces; a denormalizer charsmap (applied by decode); user-defined
// symbols (never split); byte_fallback (<0xXX> pieces for characters outside the
// vocabulary). Anything else (a unigram model, treat_whitespace_as_suffix) and a
// malformed charsmap are ConfigErrors naming the model.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace zt::data {

class SentencePieceTokenizer {
 public:
  enum class PieceType : uint8_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  struct Piece {
    std::string text;
    float score = 0;
    PieceType type = PieceType::kNormal;
  };

  static SentencePieceTokenizer from_file(const std::string& path);
  // `proto`: the serialized ModelProto (the .model file's bytes).
  SentencePieceTokenizer(std::string_view proto, const std::string& name);

  // The ids of `text` (no BOS/EOS: SentencePieceProcessor.encode's default).
  std::vector<int32_t> encode(std::string_view text) const;
  // The text of the ids: byte pieces become their bytes, "▁" a space, the dummy prefix
  // space is dropped, control pieces vanish, unknown is the unk surface (" ⁇ ").
  std::string decode(std::span<const int32_t> ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  const Piece& piece(int32_t id) const;
  int32_t piece_to_id(std::string_view piece) const;  // unk id when absent
  int32_t unk_id() const { return unk_id_; }
  int32_t bos_id() const { return bos_id_; }  // -1 when the model has no <s>
  int32_t eos_id() const { return eos_id_; }  // -1 when the model has no </s>

 private:
  // A NormalizerSpec: its flags and its precompiled charsmap, decoded (see
  // [SentencePiece Charsmap] in sentencepiece.cpp).
  struct Normalizer {
    std::vector<uint32_t> trie;  // Darts-clone double array (units); empty: no charsmap
    std::string pool;            // the normalized strings, each NUL-terminated
    bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
  };
  void read_normalizer(std::string_view spec, Normalizer& n) const;
  // sentencepiece's Normalizer::Normalize; `user_symbols`: user-defined symbols pass whole.
  std::string normalize(const Normalizer& n, std::string_view text, bool user_symbols) const;
  // The normalized form of the first character (or rule, or user symbol) of `s`, and how
  // many bytes of `s` it stands for.
  std::pair<std::string_view, size_t> normalize_prefix(const Normalizer& n, std::string_view s,
                                                       bool user_symbols) const;
  size_t user_symbol_at(std::string_view s, size_t i) const;  // its length, 0 if none

  std::string name_;
  std::vector<Piece> pieces_;
  std::unordered_map<std::string, int32_t> normal_;    // NORMAL, USER_DEFINED, UNUSED pieces
  std::unordered_map<std::string, int32_t> reserved_;  // CONTROL, UNKNOWN, BYTE pieces
  std::vector<std::string> user_symbols_;
  int32_t byte_ids_[256];
  int32_t unk_id_ = -1, bos_id_ = -1, eos_id_ = -1;
  bool byte_fallback_ = false;
  Normalizer normalizer_;
  Normalizer denormalizer_;  // used only when it has a charsmap, as sentencepiece does
  std::string unk_surface_ = " \xE2\x81\x87 ";
};

}  // namespace zt::data
