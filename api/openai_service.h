#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "api/http_message.h"
#include "api/http_responder.h"
#include "api/reasoning_parser.h"
#include "api/served_model.h"
#include "api/stream_pump.h"
#include "common/formats/model_config.h"
#include "common/jinja/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/metrics.h"

namespace loom::api {

class OpenAiAnswers;  // api/openai_answer

/// The OpenAI-compatible endpoints: POST /v1/completions and /v1/chat/completions
/// (streaming as Server-Sent Events or one JSON body) and GET /v1/models. A request runs
/// as one loom Request per prompt and sample (n), placed on the Cluster like a gRPC
/// Generate; a client that disconnects cancels them all (their KV blocks are freed at the
/// replica's next step). Errors are OpenAI error bodies with 4xx for the client's
/// mistakes, 429 (Retry-After) for a full queue and 503 when nothing can serve.
/// Thread-safe (one instance serves every HTTP thread).
class OpenAiService {
 public:
  /// `chat_template` may be null (chat requests are then 400). A choice's output is taken
  /// at most once per `stream_interval` (the first and the final pieces at once).
  OpenAiService(coordinator::Cluster& cluster, const ServedModel& model,
                const common::ModelConfig& config, const common::Tokenizer& tokenizer,
                const common::ChatTemplate* chat_template,
                coordinator::CoordinatorMetrics* metrics = nullptr,
                absl::Duration stream_interval = absl::ZeroDuration(),
                std::optional<uint64_t> seed = std::nullopt);

  /// Chat replies split into `reasoning_content` and `content` (--reasoning-parser). Call
  /// before serving.
  void set_reasoning_format(ReasoningFormat format) { reasoning_ = format; }
  const ServedModel& model() const { return model_; }

  ~OpenAiService();  // Shutdown()s

  /// Where answers are rendered (the HTTP server's threads). Call before serving.
  void set_pump(StreamPump* pump) { pump_ = pump; }
  /// Detaches the answers still open from their requests (cancelled) and from the pump,
  /// which may then go. Call once serving ended.
  void Shutdown();

  void Completions(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  void ChatCompletions(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  void Models(const HttpRequest& request, HttpResponse& response);
  /// GET /v1/models/{id} (kModelsPrefix + id; ids may hold '/'): the served model's entry
  /// when `id` names it (as a request's "model" may), else a 404 error.
  void Model(const HttpRequest& request, HttpResponse& response);
  static constexpr char kModelsPrefix[] = "/v1/models/";
  /// POST /tokenize (vLLM's shape): `prompt` (string) or `messages` (rendered by the chat
  /// template), `add_special_tokens` (default true) -> {count, max_model_len, tokens}.
  void Tokenize(const HttpRequest& request, HttpResponse& response);
  /// POST /detokenize: `tokens` (ids) -> {prompt}.
  void Detokenize(const HttpRequest& request, HttpResponse& response);

  /// Writes an OpenAI error body and the HTTP status for `status` (InvalidArgument 400,
  /// NotFound 404, ResourceExhausted 429 with Retry-After, Unavailable 503, ...).
  static void WriteError(const absl::Status& status, HttpResponse& response);
  /// The HTTP status an absl status becomes.
  static int HttpStatusOf(const absl::Status& status);

 private:
  void Handle(bool chat, const HttpRequest& request, std::shared_ptr<HttpResponder> responder);

  coordinator::Cluster& cluster_;
  const ServedModel& model_;
  const common::ModelConfig& config_;
  const common::Tokenizer& tokenizer_;
  const common::ChatTemplate* chat_template_;
  const std::vector<int32_t> eos_ids_;
  coordinator::CoordinatorMetrics* metrics_;
  const absl::Duration stream_interval_;  // >= 0
  std::atomic<uint64_t> next_id_{1};
  // The seed of a sample whose request set none: drawn from `seed_` (HttpOptions::seed)
  // when set, else random.
  uint64_t UnseededSeed();
  const std::optional<uint64_t> seed_;
  ReasoningFormat reasoning_ = ReasoningFormat::kNone;
  StreamPump* pump_ = nullptr;
  const std::unique_ptr<OpenAiAnswers> answers_;  // the answers in progress
  std::atomic<uint64_t> unseeded_count_{0};
};

}  // namespace loom::api
