// Unicode normalization through utf8proc ([Normalizer] in data/normalize.h). Built outside
// the unity batches, with third_party/utf8proc as a system include (see CMakeLists.txt).
#include "data/normalize.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "data/unicode.h"
#include "zerotrain/error.h"

namespace zt::data {
namespace {

utf8proc_option_t utf8proc_options_of(UnicodeForm f) {
  switch (f) {
    case UnicodeForm::kNFC: return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    case UnicodeForm::kNFD: return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    case UnicodeForm::kNFKC:
      return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case UnicodeForm::kNFKD:
      return static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  }
  return UTF8PROC_STABLE;
}

// Appends the normalization of the valid UTF-8 run `run` to `out`.
void normalize_run_into(std::string_view run, UnicodeForm form, std::string& out) {
  if (run.empty()) return;
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          static_cast<utf8proc_ssize_t>(run.size()), &dst, utf8proc_options_of(form));
  std::unique_ptr<utf8proc_uint8_t, void (*)(void*)> owned(dst, std::free);
  ZT_CHECK(n >= 0, "unicode_normalize: utf8proc failed on valid UTF-8: ", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}

}  // namespace

const char* unicode_form_name(UnicodeForm f) {
  switch (f) {
    case UnicodeForm::kNFC: return "NFC";
    case UnicodeForm::kNFD: return "NFD";
    case UnicodeForm::kNFKC: return "NFKC";
    case UnicodeForm::kNFKD: return "NFKD";
  }
  return "?";
}

bool unicode_form_from_name(std::string_view name, UnicodeForm& out) {
  for (UnicodeForm f : {UnicodeForm::kNFC, UnicodeForm::kNFD, UnicodeForm::kNFKC, UnicodeForm::kNFKD}) {
    if (name == unicode_form_name(f)) {
      out = f;
      return true;
    }
  }
  return false;
}

std::string unicode_normalize(std::string_view text, UnicodeForm form) {
  // ASCII is the same in every form; below U+0300 (no lead byte >= 0xCC) nothing composes
  // or reorders, so NFC is the identity there too.
  const uint8_t limit = form == UnicodeForm::kNFC ? 0xCC : 0x80;
  bool identity = true;
  for (char c : text) {
    if (static_cast<uint8_t>(c) >= limit) {
      identity = false;
      break;
    }
  }
  if (identity) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t run = 0, i = 0;
  while (i < text.size()) {
    int len = 0;
    if (decode_utf8(text, i, len) == 0xFFFFFFFFu) {  // an invalid byte: kept, and ends the run
      normalize_run_into(text.substr(run, i - run), form, out);
      out += text[i];
      run = ++i;
      continue;
    }
    i += static_cast<size_t>(len);
  }
  normalize_run_into(text.substr(run), form, out);
  return out;
}

}  // namespace zt::data
