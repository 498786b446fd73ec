#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cli/bench_client.h"

namespace loom::cli {

/// Splits a server-sent event stream (text/event-stream) into the data of its events: the
/// `data:` lines of an event joined by '\n', delivered when the blank line that ends the
/// event arrives. Comment lines (':') and other fields are skipped; "\r\n" line ends are
/// accepted. Not thread-safe (one per response).
class SseDataReader {
 public:
  /// Feeds the next received bytes; calls `on_data` once per event completed by them.
  void Feed(std::string_view bytes, const std::function<void(std::string_view)>& on_data);

 private:
  std::string pending_;  // bytes after the last complete line
  std::string data_;     // the current event's data so far
  bool has_data_ = false;
};

/// What the OpenAI client learns from GET /v1/models.
struct OpenAiServedModel {
  std::string id;          // the first model listed
  int64_t vocab_size = 0;  // llama.cpp's server reports it (data[0].meta.n_vocab); else 0
};

/// Reads the first model of `base_url`/v1/models (with `api_key` as a bearer token when not
/// empty). Unavailable when the server cannot be reached or answers with an error.
absl::StatusOr<OpenAiServedModel> FetchOpenAiModel(const std::string& base_url,
                                                   const std::string& api_key, double timeout_s);

/// `loom bench --api openai`: streaming POST /v1/completions with the prompt as token
/// ids (exact lengths on every server), temperature 0, ignore_eos and
/// stream_options.include_usage, the request vLLM's benchmark_serving sends to an OpenAI
/// server. Output tokens come from the usage chunk (else one per text chunk); TTFT is the
/// first chunk with text; ITL holds the gaps between text chunks. One HTTP connection per
/// request, so any number of client threads may call Run at once.
/// `num_speculative_tokens` >= 0 goes in each body (Loom's extension); -1: not sent.
std::unique_ptr<BenchClient> MakeOpenAiBenchClient(const std::string& base_url,
                                                   const std::string& model,
                                                   const std::string& api_key,
                                                   int64_t num_speculative_tokens = -1);

}  // namespace loom::cli
