#pragma once

#include <cstdint>
#include <vector>

#include "cli/bench_report.h"

namespace loom::cli {

/// The API `loom bench` drives: one request at a time per calling thread. Implementations
/// are safe to call from many client threads at once.
class BenchClient {
 public:
  virtual ~BenchClient() = default;

  /// Sends one streaming request for `prompt` (token ids), `max_tokens` generated with EOS
  /// ignored, waits at most `timeout_s`, and fills `sample` (times in seconds from the send).
  /// Returns the generated token ids where the API streams them, else an empty vector.
  virtual std::vector<int32_t> Run(const std::vector<int32_t>& prompt, int32_t max_tokens,
                                   double timeout_s, RequestSample& sample) = 0;

  /// Whether Run returns the generated ids (multi-turn sessions append them to the prompt).
  virtual bool ReturnsTokenIds() const = 0;
};

}  // namespace loom::cli
