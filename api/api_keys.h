#pragma once

#include <array>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::api {

/// The API keys a client must present (`--api-key`, `--api-key-file`, LOOM_API_KEY), as a
/// bearer token: `Authorization: Bearer KEY` on HTTP, metadata `authorization: Bearer KEY`
/// on the gRPC Inference service. Only SHA-256 digests of the keys are kept, and a
/// presented key is hashed and compared with every digest in constant time, so neither
/// the time taken nor a core dump tells the keys. None configured: everything is open.
/// Immutable after Load; thread-safe.
class ApiKeys {
 public:
  /// No keys: Authorizes always answers true.
  ApiKeys() = default;

  /// The keys of `keys`, of each file of `key_files` (one key per line; blank lines and
  /// lines starting with '#' are skipped; surrounding whitespace is trimmed) and, when
  /// neither gives any, `environment_key` (LOOM_API_KEY's value; null or empty: none).
  /// InvalidArgument for an empty key, NotFound for a file that cannot be read (neither
  /// message contains a key).
  static absl::StatusOr<ApiKeys> Load(const std::vector<std::string>& keys,
                                      const std::vector<std::string>& key_files,
                                      const char* environment_key);

  /// True when keys are configured (requests must then present one).
  bool enabled() const { return !digests_.empty(); }
  /// How many distinct keys are configured.
  size_t size() const { return digests_.size(); }

  /// True when `authorization` (an Authorization header's or metadata's value) is
  /// "Bearer KEY" (the scheme case-insensitive) with KEY one of the keys, or when no keys
  /// are configured. Constant time in the keys.
  bool Authorizes(absl::string_view authorization) const;

  /// The error for a request that Authorizes refused: Unauthenticated, never echoing what
  /// was presented.
  static absl::Status Refusal();

 private:
  using Digest = std::array<unsigned char, 32>;  // SHA-256
  static Digest Hash(absl::string_view key);
  bool Matches(absl::string_view key) const;

  std::vector<Digest> digests_;  // distinct
};

}  // namespace loom::api
