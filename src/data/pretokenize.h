// Pre-tokenizer patterns of byte-level BPE tokenizers, matched by hand instead of by a
// regex engine (std::regex has no \p{L}): each pattern below is an ordered alternation,
// and the matcher tries its alternatives in order at each position exactly as a
// backtracking engine (Oniguruma, which Hugging Face tokenizers uses) would, so the
// pieces are the same. Character classes come from data/unicode.h.
//
//   kGpt2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//           (GPT-2, RoBERTa; what ByteLevel with use_regex=true applies)
//   kLlama3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+      (Llama 3, cl100k)
//   kQwen2  as kLlama3 with \p{N} (one digit) instead of \p{N}{1,3}   (Qwen2, Qwen2.5)
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zt::data {

enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

// The regex text of a pattern, as it appears in a tokenizer.json.
const char* split_pattern_regex(SplitPattern p);
const char* split_pattern_name(SplitPattern p);  // "gpt2", "llama3", "qwen2"
// The pattern whose regex text is `regex`; nullopt for any other regex.
std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex);

// Appends to `out` the pieces of `text` (consecutive, covering every byte): the matches
// of the pattern, as the Split pre-tokenizer with behavior "Isolated" returns them.
void split_words(SplitPattern p, std::string_view text, std::vector<std::string_view>& out);

}  // namespace zt::data
