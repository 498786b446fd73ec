#pragma once

// Python `str` semantics over UTF-8 bytes, for the Jinja interpreter: Python counts,
// slices and strips code points, and its notion of whitespace and case is Unicode's.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"

namespace loom::common::jinja {

/// Code points of `text`. A byte that is not valid UTF-8 becomes U+DC80..U+DCFF
/// (Python's surrogateescape) so that EncodeUtf8 gives the same bytes back.
std::u32string DecodeUtf8(absl::string_view text);

/// UTF-8 bytes of `code_points` (inverse of DecodeUtf8).
std::string EncodeUtf8(std::u32string_view code_points);

/// Appends the UTF-8 encoding of one code point to `out`.
void AppendUtf8(char32_t code_point, std::string& out);

/// Number of code points in `text` (Python's len(str)).
int64_t CodePointLength(absl::string_view text);

/// Python's str.isspace() for one code point (also what regex `\s` matches).
bool IsPySpace(char32_t c);

/// Python's str.strip/lstrip/rstrip. `chars` null: Unicode whitespace.
std::string PyStrip(absl::string_view text, const std::string* chars, bool left, bool right);

/// Python's str.upper() / str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and
/// Cyrillic (other scripts pass through unchanged, as they have no case or are rare).
std::string PyUpper(absl::string_view text);
std::string PyLower(absl::string_view text);

/// Python's str.title() and str.capitalize().
std::string PyTitle(absl::string_view text);
std::string PyCapitalize(absl::string_view text);

/// Python's str.splitlines() (keepends=False).
std::vector<std::string> PySplitLines(absl::string_view text);

/// Python's str.split(sep, maxsplit); `sep` null splits on runs of whitespace.
std::vector<std::string> PySplit(absl::string_view text, const std::string* sep, int64_t maxsplit);

/// Python's str.rsplit(sep, maxsplit).
std::vector<std::string> PyRSplit(absl::string_view text, const std::string* sep, int64_t maxsplit);

/// Python's str.replace(old, new, count); count < 0 replaces all.
std::string PyReplace(absl::string_view text, absl::string_view old_text,
                      absl::string_view new_text, int64_t count);

/// Python's repr(str): quoted with ' (or " when the text holds ' but no "), escapes.
std::string PyRepr(absl::string_view text);

/// JSON string literal as Python's json.dumps writes it (ensure_ascii as given).
void AppendJsonString(absl::string_view text, bool ensure_ascii, std::string& out);

/// Python's repr(float): shortest round-trip digits, 'e' notation outside 1e-4..1e16.
std::string PyFloatRepr(double value);

/// markupsafe.escape: & < > " ' become entities.
std::string HtmlEscape(absl::string_view text);

}  // namespace loom::common::jinja
