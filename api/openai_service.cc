#include "api/openai_service.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "api/chat_request.h"
#include "api/endpoint_picker.h"
#include "api/harmony_reply.h"
#include "api/openai_answer.h"
#include "api/openai_logprobs.h"
#include "api/openai_request.h"
#include "api/openai_run.h"
#include "api/reasoning_parser.h"
#include "engine/request_validation.h"

namespace loom::api {
namespace {

// OpenAI's temperature for requests that set none (when the model has no default).
constexpr float kOpenAiDefaultTemperature = 1.0f;

uint64_t RandomSeed() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator();
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Errors.

int OpenAiService::HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

Json OpenAiErrorJson(const absl::Status& status, int http_status) {
  const char* type = http_status == 401   ? "authentication_error"
                     : http_status == 404 ? "not_found_error"
                     : http_status == 429 ? "rate_limit_error"
                     : http_status < 500  ? "invalid_request_error"
                     : http_status == 503 ? "service_unavailable_error"
                                          : "internal_server_error";
  Json error;
  error["message"] = std::string(status.message());
  error["type"] = type;
  const std::string param = OpenAiErrorParam(status);
  error["param"] = param.empty() ? Json(nullptr) : Json(param);
  error["code"] = http_status == 401   ? Json("invalid_api_key")
                  : http_status == 404 ? Json("model_not_found")
                  : http_status == 429 ? Json("queue_full")
                                       : Json(nullptr);
  Json body;
  body["error"] = std::move(error);
  return body;
}

void OpenAiService::WriteError(const absl::Status& status, HttpResponse& response) {
  const int http_status = HttpStatusOf(status);
  response.status = http_status;
  // Clients back off and retry a full queue; a second is about one step of a full batch
  // draining on a CPU worker.
  if (http_status == 429) response.set_header("Retry-After", "1");
  response.set_content(Dump(OpenAiErrorJson(status, http_status)), "application/json");
}

// ---------------------------------------------------------------------------------------
// Requests.

OpenAiService::OpenAiService(coordinator::Cluster& cluster, const ServedModel& model,
                             const common::ModelConfig& config, const common::Tokenizer& tokenizer,
                             const common::ChatTemplate* chat_template,
                             coordinator::CoordinatorMetrics* metrics,
                             absl::Duration stream_interval, std::optional<uint64_t> seed)
    : cluster_(cluster),
      model_(model),
      config_(config),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      eos_ids_(tokenizer.EndOfGenerationIds()),
      metrics_(metrics),
      stream_interval_(stream_interval),
      seed_(seed),
      answers_(std::make_unique<OpenAiAnswers>()) {}

uint64_t OpenAiService::UnseededSeed() {
  if (!seed_.has_value()) return RandomSeed();
  // SplitMix64 of (seed, how many unseeded samples came before): distinct per sample, the
  // same sequence on every run with the same --seed.
  uint64_t z = *seed_ + 0x9e3779b97f4a7c15ULL * (unseeded_count_.fetch_add(1) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

OpenAiService::~OpenAiService() { Shutdown(); }

void OpenAiService::Shutdown() { answers_->DetachAll(); }

void OpenAiService::Completions(const HttpRequest& request,
                                std::shared_ptr<HttpResponder> responder) {
  Handle(/*chat=*/false, request, std::move(responder));
}

void OpenAiService::ChatCompletions(const HttpRequest& request,
                                    std::shared_ptr<HttpResponder> responder) {
  Handle(/*chat=*/true, request, std::move(responder));
}

namespace {

// A path segment with its %XX escapes decoded (the openai client sends "org/name" as
// "org%2Fname"); a malformed escape stays as it is.
std::string PercentDecoded(std::string_view text) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

// One entry of /v1/models: the served model.
Json ModelObject(const ServedModel& served) {
  Json model;
  model["id"] = served.id;
  model["object"] = "model";
  model["created"] = served.created;
  model["owned_by"] = "loom";
  model["root"] = served.info.path();
  model["max_model_len"] = served.info.context_length();
  return model;
}

}  // namespace

void OpenAiService::Models(const HttpRequest&, HttpResponse& response) {
  Json list;
  list["object"] = "list";
  list["data"] = Json::array({ModelObject(model_)});
  response.set_content(Dump(list), "application/json");
}

void OpenAiService::Model(const HttpRequest& request, HttpResponse& response) {
  const std::string id =
      PercentDecoded(std::string_view(request.path).substr(std::string_view(kModelsPrefix).size()));
  if (!model_.Matches(id)) {
    WriteError(absl::NotFoundError(absl::StrFormat(
                   "the model '%s' does not exist; this server serves '%s'", id, model_.id)),
               response);
    return;
  }
  response.set_content(Dump(ModelObject(model_)), "application/json");
}

namespace {

// A client's request id (the X-Request-Id header, else the body's request_id): 1 to 256
// visible ASCII characters, since it goes into a response header, ids and logs.
absl::Status CheckRequestId(const std::string& id, bool from_header) {
  const bool visible = std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
  if (!id.empty() && id.size() <= 256 && visible) return absl::OkStatus();
  const std::string what = from_header ? "the X-Request-Id header" : "'request_id'";
  return InvalidOpenAiParam(from_header ? "" : "request_id",
                            what + " must be 1 to 256 visible ASCII characters");
}

}  // namespace

void OpenAiService::Handle(bool chat, const HttpRequest& request,
                           std::shared_ptr<HttpResponder> responder) {
  std::string request_id = request.Header(kRequestIdHeader);
  auto refuse = [&responder, &request_id](const absl::Status& status) {
    HttpResponse response;
    if (!request_id.empty()) response.set_header(kRequestIdHeader, request_id);
    WriteError(status, response);
    responder->Respond(std::move(response));
  };
  const std::string content_type = request.Header("Content-Type");
  if (content_type.rfind("application/json", 0) != 0) {
    return refuse(absl::InvalidArgumentError(absl::StrFormat(
        "the body must be JSON with Content-Type: application/json, got '%s'", content_type)));
  }
  absl::StatusOr<OpenAiRequest> parsed =
      ParseOpenAiRequest(chat ? OpenAiEndpoint::kChatCompletions : OpenAiEndpoint::kCompletions,
                         request.body, tokenizer_, chat_template_);
  if (!parsed.ok()) return refuse(parsed.status());
  if (!model_.Matches(parsed->model)) {
    return refuse(absl::NotFoundError(absl::StrFormat(
        "the model '%s' does not exist; this server serves '%s'", parsed->model, model_.id)));
  }

  const bool from_header = !request_id.empty();
  if (!from_header) request_id = parsed->request_id;
  if (!request_id.empty()) {
    if (absl::Status valid = CheckRequestId(request_id, from_header); !valid.ok()) {
      request_id.clear();  // not echoed back
      return refuse(valid);
    }
  } else {
    request_id = absl::StrFormat("%016x%04x", RandomSeed(), next_id_.fetch_add(1) & 0xffff);
  }
  auto run = std::make_shared<Run>();
  run->parsed = *std::move(parsed);
  run->request_id = request_id;
  run->id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_id);
  run->created = absl::ToUnixSeconds(absl::Now());
  run->model = model_.id;
  if (chat && reasoning_ != ReasoningFormat::kNone) {
    run->reasoning_starts_inside = ReasoningStartsInside(run->parsed.echo_texts.front());
  }

  const std::string preferred_replica = request.Header(kReplicaHeader);
  // A batch that can never fit the queues is a 400 before any part takes a slot: every
  // prompt's first sample is queued at once, a prompt's other n - 1 once it has output.
  if (absl::Status fits = cluster_.CheckBatchFits(
          std::max<int64_t>(static_cast<int64_t>(run->parsed.prompts.size()), run->parsed.n - 1),
          "prompts (or samples of one prompt)");
      !fits.ok()) {
    return refuse(fits);
  }
  // Validate every prompt before placing any, so a bad one leaves nothing running.
  std::vector<engine::RequestParams> prompts;
  for (const loom::v1::GenerateRequest& prompt : run->parsed.prompts) {
    absl::StatusOr<engine::RequestParams> params =
        engine::ValidateGenerateRequest(prompt, config_, tokenizer_, kOpenAiDefaultTemperature);
    if (!params.ok()) return refuse(params.status());
    run->prompt_tokens += static_cast<int32_t>(params->prompt_ids.size());
    prompts.push_back(*std::move(params));
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int32_t s = 0; s < run->parsed.n; ++s) {
      engine::RequestParams params = prompts[p];
      // Each sample draws its own tokens: seed + sample index when the client seeded
      // the request (reproducible), a fresh random seed otherwise.
      params.sampling.set_seed(run->parsed.seed_given ? params.sampling.seed() + s
                                                      : UnseededSeed());
      Choice choice;
      choice.index = static_cast<int>(run->choices.size());
      choice.prompt_index = static_cast<int>(p);
      choice.request = std::make_shared<engine::Request>(
          absl::StrFormat("%s-%d", run->id, choice.index), cluster_.NextSeqId(), std::move(params),
          tokenizer_, eos_ids_);
      choice.request->set_metrics(metrics_);
      // An endpoint picker in front (api/endpoint_picker) chose the replica.
      choice.request->set_preferred_replica(preferred_replica);
      if (run->reasoning_starts_inside.has_value() && run->parsed.stream) {
        choice.reasoning = std::make_shared<ReasoningStream>(*run->reasoning_starts_inside);
      }
      if (s > 0) {
        choice.leader = choice.index - s;  // placed by Pump once the leader has output
      } else {
        if (absl::Status placed = cluster_.Submit(choice.request); !placed.ok()) {
          if (metrics_ != nullptr) metrics_->RecordRejected(placed);
          run->CancelAll();
          return refuse(placed);
        }
        if (metrics_ != nullptr) {
          metrics_->RecordRequestParams(run->parsed.n, choice.request->params().max_tokens);
        }
        choice.placed = true;
      }
      run->choices.push_back(std::move(choice));
    }
  }
  run->stream_interval = stream_interval_;
  run->place = [cluster = &cluster_](const std::shared_ptr<engine::Request>& sample) {
    return cluster->Submit(sample);
  };
  OpenAiAnswer::Start(std::move(run), chat, tokenizer_, *pump_, std::move(responder), *answers_);
}

}  // namespace loom::api
