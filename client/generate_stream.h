#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "client/completion.h"

namespace loom::client {

/// One streaming Generate call (Client::StartGenerate). Read it with Next() on one thread;
/// Cancel() may come from any thread. Until the first chunk arrives, a call that fails
/// with UNAVAILABLE is started again after a backoff (the client's RetryPolicy, within the
/// call's deadline); after it, every error ends the stream. Destroying an unfinished
/// stream cancels the call, which frees its KV blocks on the server.
class GenerateStream {
 public:
  ~GenerateStream();
  GenerateStream(const GenerateStream&) = delete;
  GenerateStream& operator=(const GenerateStream&) = delete;

  /// Blocks for the next chunk. nullopt after the chunk with the finish reason; an error
  /// status when the call failed (CANCELLED after Cancel(), DEADLINE_EXCEEDED past the
  /// deadline, the server's status otherwise). Calls after the end repeat the outcome.
  /// Not thread-safe: one reader.
  absl::StatusOr<std::optional<GenerateChunk>> Next();

  /// Cancels the call (and any retry not yet started). Thread-safe, idempotent.
  void Cancel();

  /// Calls made so far (1 + retries).
  int attempts() const;

  struct Impl;

 private:
  explicit GenerateStream(std::unique_ptr<Impl> impl);
  friend std::unique_ptr<GenerateStream> MakeGenerateStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::client
