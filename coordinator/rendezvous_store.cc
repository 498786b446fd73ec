#include "coordinator/rendezvous_store.h"

#include "absl/strings/str_format.h"

namespace loom::coordinator {

absl::Status RendezvousStore::Set(const std::string& key, std::string value) {
  if (key.empty()) return absl::InvalidArgumentError("a store key must not be empty");
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("store value of %d bytes exceeds %d", value.size(), kMaxValueBytes));
  }
  absl::MutexLock lock(&mu_);
  if (values_.size() >= kMaxKeys && !values_.contains(key)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("the rendezvous store holds its maximum of %d keys", kMaxKeys));
  }
  values_[key] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RendezvousStore::Get(const std::vector<std::string>& keys,
                                                              absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::string missing;
  auto all_there = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& key : keys) {
      if (!values_.contains(key)) {
        missing = key;
        return false;
      }
    }
    return true;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&all_there), timeout)) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "rendezvous key '%s' was not set within %d ms", missing, absl::ToInt64Milliseconds(timeout)));
  }
  std::vector<std::string> values;
  for (const std::string& key : keys) values.push_back(values_[key]);
  return values;
}

}  // namespace loom::coordinator
