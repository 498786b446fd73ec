#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom::coordinator {

/// The key-value store tensor-parallel ranks rendezvous through (behind the Coordinator
/// service's StoreSet/StoreGet): set overwrites, get waits for every key. Bounded, so a
/// misbehaving worker cannot grow it without limit. Thread-safe.
class RendezvousStore {
 public:
  static constexpr size_t kMaxKeys = 1 << 16;
  static constexpr size_t kMaxValueBytes = 1 << 20;

  /// InvalidArgument for an empty key or an oversized value; ResourceExhausted when full.
  absl::Status Set(const std::string& key, std::string value);
  /// The values of `keys`, waiting up to `timeout` for the missing ones
  /// (DeadlineExceeded naming one of them).
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::coordinator
