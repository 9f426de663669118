// Unicode normalization forms for the tokenizer.json `normalizer` (NFC, NFD, NFKC, NFKD,
// and a Sequence of them), through utf8proc (third_party/utf8proc, MIT, Unicode 17).
//
// [Normalizer] Hugging Face `tokenizers` normalizes each piece of the input that is not a
// non-normalized added token (so a special token such as <|im_end|> is matched on the raw
// text first), then matches the normalized added tokens (whose own content it normalizes
// too) on the normalized piece, then pre-tokenizes. BpeTokenizer does the same.
// Malformed UTF-8 (which a Python str cannot hold) is carried through byte by byte: each
// invalid byte ends the run of characters normalized together.
// Tables: `tokenizers` uses the normalization tables of an older Unicode (it leaves
// Dives Akuru U+11935 U+11930, composed since Unicode 13, apart), utf8proc those of
// Unicode 17; the results differ only for characters with decompositions assigned since
// (Dives Akuru, and the Unicode 16 scripts Tulu-Tigalari, Gurung Khema, Kirat Rai).
#pragma once
#include <string>
#include <string_view>

namespace zt::data {

enum class UnicodeForm { kNFC, kNFD, kNFKC, kNFKD };

// The tokenizer.json type name ("NFC", ...) of a form, and back (false: not one of them).
const char* unicode_form_name(UnicodeForm f);
bool unicode_form_from_name(std::string_view name, UnicodeForm& out);

// `text` in normalization form `form` (see [Normalizer] for malformed UTF-8).
std::string unicode_normalize(std::string_view text, UnicodeForm form);

}  // namespace zt::data
