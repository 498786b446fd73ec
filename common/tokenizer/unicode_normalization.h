#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace loom::common {

/// A Unicode normalization form (UAX #15), as tokenizer.json normalizers name them.
enum class NormalizationForm { kNone, kNfc, kNfd, kNfkc, kNfkd };

/// "NFC", "NFD", "NFKC", "NFKD" (tokenizer.json's normalizer types) or "" / "none";
/// InvalidArgument naming anything else.
absl::StatusOr<NormalizationForm> ParseNormalizationForm(std::string_view name);

/// The name ParseNormalizationForm reads ("" for kNone).
std::string_view NormalizationFormName(NormalizationForm form);

/// `text` in normalization form `form` (libutf8proc). Text that is not valid UTF-8 is
/// returned unchanged (a tokenizer's bytes are never dropped). Thread-safe.
std::string Normalize(std::string_view text, NormalizationForm form);

}  // namespace loom::common
