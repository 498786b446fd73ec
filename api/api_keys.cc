#include "api/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace loom::api {

ApiKeys::Digest ApiKeys::Hash(absl::string_view key) {
  Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest.data());
  return digest;
}

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::vector<std::string>& keys,
                                      const std::vector<std::string>& key_files,
                                      const char* environment_key) {
  ApiKeys loaded;
  auto add = [&loaded](absl::string_view key, const std::string& source) -> absl::Status {
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: an API key may not be empty", source));
    }
    const Digest digest = Hash(key);
    if (std::find(loaded.digests_.begin(), loaded.digests_.end(), digest) ==
        loaded.digests_.end()) {
      loaded.digests_.push_back(digest);
    }
    return absl::OkStatus();
  };
  for (const std::string& key : keys) {
    if (absl::Status added = add(key, "--api-key"); !added.ok()) return added;
  }
  for (const std::string& path : key_files) {
    std::ifstream file(path);
    std::stringstream text;
    if (!file || !(text << file.rdbuf())) {
      return absl::NotFoundError(absl::StrFormat("--api-key-file: cannot read '%s'", path));
    }
    bool any = false;
    for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line.front() == '#') continue;
      if (absl::Status added = add(line, "--api-key-file " + path); !added.ok()) return added;
      any = true;
    }
    if (!any) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--api-key-file: '%s' holds no key (one per line)", path));
    }
  }
  if (loaded.digests_.empty() && environment_key != nullptr && *environment_key != '\0') {
    if (absl::Status added = add(environment_key, "LOOM_API_KEY"); !added.ok()) return added;
  }
  return loaded;
}

bool ApiKeys::Matches(absl::string_view key) const {
  const Digest presented = Hash(key);
  // Every digest is compared (no early exit) with a comparison whose time does not depend
  // on where the bytes differ.
  int matched = 0;
  for (const Digest& digest : digests_) {
    matched |= CRYPTO_memcmp(digest.data(), presented.data(), digest.size()) == 0;
  }
  return matched != 0;
}

bool ApiKeys::Authorizes(absl::string_view authorization) const {
  if (digests_.empty()) return true;
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return false;
  }
  return Matches(absl::StripAsciiWhitespace(authorization.substr(kScheme.size())));
}

absl::Status ApiKeys::Refusal() {
  return absl::UnauthenticatedError(
      "invalid or missing API key: send it as 'Authorization: Bearer <key>'");
}

}  // namespace loom::api
