#include "common/tokenizer/unicode_normalization.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"

namespace loom::common {

absl::StatusOr<NormalizationForm> ParseNormalizationForm(std::string_view name) {
  if (name.empty() || name == "none") return NormalizationForm::kNone;
  if (name == "NFC") return NormalizationForm::kNfc;
  if (name == "NFD") return NormalizationForm::kNfd;
  if (name == "NFKC") return NormalizationForm::kNfkc;
  if (name == "NFKD") return NormalizationForm::kNfkd;
  return absl::InvalidArgumentError(absl::StrCat("unknown normalization form '", std::string(name),
                                                 "' (known: NFC, NFD, NFKC, NFKD)"));
}

std::string_view NormalizationFormName(NormalizationForm form) {
  switch (form) {
    case NormalizationForm::kNone:
      return "";
    case NormalizationForm::kNfc:
      return "NFC";
    case NormalizationForm::kNfd:
      return "NFD";
    case NormalizationForm::kNfkc:
      return "NFKC";
    case NormalizationForm::kNfkd:
      return "NFKD";
  }
  return "";
}

std::string Normalize(std::string_view text, NormalizationForm form) {
  if (form == NormalizationForm::kNone || text.empty()) return std::string(text);
  // ASCII is invariant under every form: skip the library for the common case.
  bool ascii = true;
  for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalizationForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalizationForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalizationForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::kNone:
      break;
  }
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
      static_cast<utf8proc_ssize_t>(text.size()), &mapped, static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  if (length < 0) return std::string(text);  // invalid UTF-8 (or out of memory)
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
}

}  // namespace loom::common
