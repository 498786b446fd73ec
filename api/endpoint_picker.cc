#include "api/endpoint_picker.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "api/openai_request.h"
#include "api/openai_run.h"
#include "common/json_depth.h"
#include "engine/request_validation.h"

namespace loom::api {
namespace {

namespace ext_proc = envoy::service::ext_proc::v3;

// A body past this is refused (413) rather than held: the HTTP API's own default limit.
constexpr size_t kMaxBodyBytes = 64 << 20;
constexpr char kSubsetNamespace[] = "envoy.lb.subset_hint";
constexpr char kSubsetKey[] = "x-gateway-destination-endpoint-subset";
constexpr char kEndpointNamespace[] = "envoy.lb";

std::string HeaderValue(const ext_proc::HeaderValue& header) {
  return header.value().empty() ? header.raw_value() : header.value();
}

void SetHeader(ext_proc::HeaderMutation& mutation, const std::string& key,
               const std::string& value) {
  ext_proc::HeaderValueOption* option = mutation.add_set_headers();
  option->mutable_header()->set_key(key);
  option->mutable_header()->set_raw_value(value);
  option->set_append_action(ext_proc::HeaderValueOption::OVERWRITE_IF_EXISTS_OR_ADD);
}

// The subset of endpoints the proxy allows, when it sent one.
std::optional<std::vector<std::string>> SubsetHint(const ext_proc::ProcessingRequest& request) {
  const auto& filters = request.metadata_context().filter_metadata();
  auto space = filters.find(kSubsetNamespace);
  if (space == filters.end()) return std::nullopt;
  auto list = space->second.fields().find(kSubsetKey);
  if (list == space->second.fields().end()) return std::nullopt;
  std::vector<std::string> subset;
  if (list->second.has_list_value()) {
    for (const google::protobuf::Value& value : list->second.list_value().values()) {
      if (value.has_string_value()) subset.push_back(value.string_value());
    }
  } else if (list->second.has_string_value()) {
    subset.push_back(list->second.string_value());
  }
  return subset;
}

absl::Status StatusOfHttp(int status, const std::string& message) {
  switch (status) {
    case 404:
      return absl::NotFoundError(message);
    case 413:
      return absl::InvalidArgumentError(message);
    case 429:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::UnavailableError(message);
  }
}

}  // namespace

EndpointPicker::EndpointPicker(coordinator::Cluster& cluster, const ServedModel& model,
                               const common::ModelConfig& config,
                               const common::Tokenizer& tokenizer,
                               const common::ChatTemplate* chat_template,
                               const coordinator::LeaderElection* election, std::string self_host,
                               int http_port, coordinator::CoordinatorMetrics* metrics)
    : cluster_(cluster),
      model_(model),
      config_(config),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      election_(election),
      self_host_(std::move(self_host)),
      http_port_(http_port),
      metrics_(metrics) {}

std::string EndpointPicker::LeaderEndpoint() const {
  if (election_ == nullptr || election_->leading()) {
    return absl::StrFormat("%s:%d", self_host_, http_port_);
  }
  const std::string leader = election_->LeaderAddress();  // its gRPC address
  const size_t colon = leader.rfind(':');
  if (leader.empty() || colon == std::string::npos) return "";
  return absl::StrFormat("%s:%d", leader.substr(0, colon), http_port_);
}

EndpointPicker::Decision EndpointPicker::Decide(std::string_view path, const std::string& body,
                                                const std::vector<std::string>* subset) const {
  Decision decision;
  decision.endpoint = LeaderEndpoint();
  if (decision.endpoint.empty()) {
    decision.status = 503;
    decision.message = "no coordinator of this pool leads";
    return decision;
  }
  if (subset != nullptr &&
      std::find(subset->begin(), subset->end(), decision.endpoint) == subset->end()) {
    decision.status = 503;
    decision.message = absl::StrFormat(
        "the leading coordinator %s is not among the %d endpoints the gateway allows",
        decision.endpoint, subset->size());
    return decision;
  }
  const bool chat = path.rfind("/v1/chat/completions", 0) == 0;
  const bool completion = path.rfind("/v1/completions", 0) == 0;
  // A standby knows no replica; what the body cannot tell (other routes, a body the API
  // will refuse with its own 400) goes to the leader unscored.
  if (body.empty() || !(chat || completion) || (election_ != nullptr && !election_->leading()) ||
      !common::CheckJsonNestingDepth(body, "the request body").ok()) {
    return decision;
  }
  absl::StatusOr<OpenAiRequest> parsed =
      ParseOpenAiRequest(chat ? OpenAiEndpoint::kChatCompletions : OpenAiEndpoint::kCompletions,
                         body, tokenizer_, chat_template_);
  if (!parsed.ok() || parsed->prompts.empty()) return decision;
  if (!model_.Matches(parsed->model)) {
    decision.status = 404;
    decision.message = absl::StrFormat("the model '%s' does not exist; this pool serves '%s'",
                                       parsed->model, model_.id);
    return decision;
  }
  absl::StatusOr<engine::RequestParams> params =
      engine::ValidateGenerateRequest(parsed->prompts.front(), config_, tokenizer_);
  if (!params.ok()) return decision;
  absl::StatusOr<coordinator::Cluster::Placement> placed =
      cluster_.Pick(params->prompt_ids, params->cache_salt);
  if (!placed.ok()) {
    decision.status = placed.status().code() == absl::StatusCode::kResourceExhausted ? 429 : 503;
    decision.message = std::string(placed.status().message());
    return decision;
  }
  decision.replica_id = placed->replica_id;
  decision.cached_tokens = placed->cached_tokens;
  return decision;
}

// One ext_proc stream (one HTTP request through the proxy). Reads one message at a time
// and queues its answers; writes go out one at a time, in order.
class EndpointPicker::Stream final
    : public grpc::ServerBidiReactor<ext_proc::ProcessingRequest, ext_proc::ProcessingResponse> {
 public:
  explicit Stream(const EndpointPicker& picker) : picker_(picker) {
    {
      absl::MutexLock lock(&mu_);
      reading_ = true;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
    }
    if (!ok) {  // the proxy is done with this request (or gone)
      FinishWhenWritten(grpc::Status::OK);
      return;
    }
    grpc::Status handled = Handle(request_);
    request_.Clear();
    if (!handled.ok()) {
      FinishWhenWritten(std::move(handled));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (finish_status_.has_value() || finished_) return;  // refused: nothing more to read
      reading_ = true;  // before the read starts: a failed write then leaves the finish to it
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) {
        outbox_.pop_front();
      } else {
        outbox_.clear();
        if (!finish_status_.has_value()) {
          finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the proxy went away");
        }
      }
    }
    Pump();
  }

  void OnDone() override { delete this; }

 private:
  // Queues `response` for writing.
  void Send(ext_proc::ProcessingResponse response) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || finish_status_.has_value()) return;
      outbox_.push_back(std::move(response));
    }
    Pump();
  }
  // Ends the stream once what is queued has been written.
  void FinishWhenWritten(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (!finish_status_.has_value()) finish_status_ = std::move(status);
    }
    Pump();
  }
  // Starts the next write, or the finish once nothing is queued and no read is pending (a
  // pending read completes, failing, when the stream breaks, and finishes then). Decided
  // under mu_, started outside it: gRPC may run a reaction inline.
  void Pump() {
    const ext_proc::ProcessingResponse* write = nullptr;
    grpc::Status finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!outbox_.empty()) {
        writing_ = true;
        write = &outbox_.front();  // a deque keeps it in place while others are queued
      } else if (finish_status_.has_value() && !reading_) {
        finished_ = true;
        finish = *finish_status_;
      } else {
        return;
      }
    }
    if (write != nullptr) {
      StartWrite(write);
    } else {
      Finish(std::move(finish));
    }
  }

  grpc::Status Handle(const ext_proc::ProcessingRequest& request) {
    if (!configured_) {
      configured_ = true;
      if (request.has_protocol_config()) {
        request_mode_ = request.protocol_config().request_body_mode();
        response_mode_ = request.protocol_config().response_body_mode();
      }
    }
    switch (request.request_case()) {
      case ext_proc::ProcessingRequest::kRequestHeaders:
        return OnRequestHeaders(request);
      case ext_proc::ProcessingRequest::kRequestBody:
        return OnRequestBody(request.request_body());
      case ext_proc::ProcessingRequest::kRequestTrailers:
        if (!decided_) SendDecision(AfterBody());
        Send(TrailersResponse(/*request=*/true));
        return grpc::Status::OK;
      case ext_proc::ProcessingRequest::kResponseHeaders: {
        ext_proc::ProcessingResponse response;
        response.mutable_response_headers()->mutable_response();
        Send(std::move(response));
        return grpc::Status::OK;
      }
      case ext_proc::ProcessingRequest::kResponseBody: {
        ext_proc::ProcessingResponse response;
        ext_proc::CommonResponse* common = response.mutable_response_body()->mutable_response();
        if (response_mode_ == ext_proc::FULL_DUPLEX_STREAMED) {
          // In full duplex the proxy forwards what comes back: the chunk, unchanged.
          ext_proc::StreamedBodyResponse* streamed =
              common->mutable_body_mutation()->mutable_streamed_response();
          streamed->set_body(request.response_body().body());
          streamed->set_end_of_stream(request.response_body().end_of_stream());
        }
        Send(std::move(response));
        return grpc::Status::OK;
      }
      case ext_proc::ProcessingRequest::kResponseTrailers:
        Send(TrailersResponse(/*request=*/false));
        return grpc::Status::OK;
      case ext_proc::ProcessingRequest::REQUEST_NOT_SET:
        break;
    }
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a ProcessingRequest must carry headers, a body or trailers");
  }

  grpc::Status OnRequestHeaders(const ext_proc::ProcessingRequest& request) {
    if (seen_headers_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "the request's headers came twice on one stream");
    }
    seen_headers_ = true;
    for (const ext_proc::HeaderValue& header : request.request_headers().headers().headers()) {
      if (absl::AsciiStrToLower(header.key()) == ":path") path_ = HeaderValue(header);
    }
    subset_ = SubsetHint(request);
    const bool no_body = request.request_headers().end_of_stream() ||
                         request_mode_ == ext_proc::NONE || request_mode_ == ext_proc::STREAMED;
    if (no_body) {
      SendDecision(Answer::kHeaders);
    } else if (request_mode_ != ext_proc::FULL_DUPLEX_STREAMED) {
      // BUFFERED: the headers wait in the proxy for the body; the pick rides on its answer.
      ext_proc::ProcessingResponse response;
      response.mutable_request_headers()->mutable_response();
      Send(std::move(response));
    }
    return grpc::Status::OK;
  }

  grpc::Status OnRequestBody(const ext_proc::HttpBody& body) {
    if (!seen_headers_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a request body came before the request's headers");
    }
    if (decided_) {  // STREAMED: picked from the headers; the chunks pass
      ext_proc::ProcessingResponse response;
      response.mutable_request_body()->mutable_response();
      Send(std::move(response));
      return grpc::Status::OK;
    }
    if (body_.size() + body.body().size() > kMaxBodyBytes) {
      SendRefusal(413, absl::StrFormat("the request body exceeds %d bytes", kMaxBodyBytes));
      return grpc::Status::OK;
    }
    body_ += body.body();
    const bool whole = body.end_of_stream() || request_mode_ == ext_proc::BUFFERED ||
                       request_mode_ == ext_proc::BUFFERED_PARTIAL;
    if (whole) SendDecision(AfterBody());
    return grpc::Status::OK;
  }

  // Where the decision goes: the headers' response (no body), the headers' response and
  // then the body sent back whole (full duplex), or the body's response (buffered).
  enum class Answer { kHeaders, kHeadersThenBody, kBody };
  Answer AfterBody() const {
    return request_mode_ == ext_proc::FULL_DUPLEX_STREAMED ? Answer::kHeadersThenBody
                                                           : Answer::kBody;
  }

  void SendDecision(Answer answer) {
    decided_ = true;
    const EndpointPicker::Decision decision =
        picker_.Decide(path_, body_, subset_.has_value() ? &*subset_ : nullptr);
    if (picker_.metrics_ != nullptr) {
      picker_.metrics_->RecordEndpointPick(decision.status == 404        ? "not_found"
                                           : decision.status == 429      ? "queue_full"
                                           : decision.status != 0        ? "unavailable"
                                           : decision.replica_id.empty() ? "unscored"
                                                                         : "scored");
    }
    if (decision.status != 0) {
      SendRefusal(decision.status, decision.message);
      return;
    }
    ext_proc::CommonResponse common;
    ext_proc::HeaderMutation* mutation = common.mutable_header_mutation();
    SetHeader(*mutation, kDestinationHeader, decision.endpoint);
    if (decision.replica_id.empty()) {
      mutation->add_remove_headers(kReplicaHeader);  // never a client's own choice
    } else {
      SetHeader(*mutation, kReplicaHeader, decision.replica_id);
    }
    common.set_clear_route_cache(true);
    ext_proc::ProcessingResponse response;
    google::protobuf::Struct* lb =
        (*response.mutable_dynamic_metadata()->mutable_fields())[kEndpointNamespace]
            .mutable_struct_value();
    (*lb->mutable_fields())[kDestinationHeader].set_string_value(decision.endpoint);
    if (answer == Answer::kBody) {
      *response.mutable_request_body()->mutable_response() = std::move(common);
      Send(std::move(response));
      return;
    }
    *response.mutable_request_headers()->mutable_response() = std::move(common);
    Send(std::move(response));
    if (answer == Answer::kHeadersThenBody) {
      ext_proc::ProcessingResponse body;
      ext_proc::StreamedBodyResponse* streamed = body.mutable_request_body()
                                                     ->mutable_response()
                                                     ->mutable_body_mutation()
                                                     ->mutable_streamed_response();
      streamed->set_body(body_);
      streamed->set_end_of_stream(true);
      Send(std::move(body));
    }
  }

  void SendRefusal(int status, const std::string& message) {
    decided_ = true;
    ext_proc::ProcessingResponse response;
    ext_proc::ImmediateResponse* immediate = response.mutable_immediate_response();
    immediate->mutable_status()->set_code(status);
    immediate->set_body(Dump(OpenAiErrorJson(StatusOfHttp(status, message), status)));
    immediate->set_details(message);
    SetHeader(*immediate->mutable_headers(), "content-type", "application/json");
    if (status == 429) SetHeader(*immediate->mutable_headers(), "retry-after", "1");
    Send(std::move(response));
    FinishWhenWritten(grpc::Status::OK);
  }

  static ext_proc::ProcessingResponse TrailersResponse(bool request) {
    ext_proc::ProcessingResponse response;
    if (request) {
      response.mutable_request_trailers();
    } else {
      response.mutable_response_trailers();
    }
    return response;
  }

  const EndpointPicker& picker_;
  // The reader's state (one read at a time).
  ext_proc::ProcessingRequest request_;
  bool configured_ = false;
  ext_proc::BodySendMode request_mode_ = ext_proc::FULL_DUPLEX_STREAMED;
  ext_proc::BodySendMode response_mode_ = ext_proc::FULL_DUPLEX_STREAMED;
  bool seen_headers_ = false;
  bool decided_ = false;
  std::string path_;
  std::string body_;
  std::optional<std::vector<std::string>> subset_;
  // The writer's state.
  absl::Mutex mu_;
  std::deque<ext_proc::ProcessingResponse> outbox_ ABSL_GUARDED_BY(mu_);  // front: writing
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a read is pending
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerBidiReactor<ext_proc::ProcessingRequest, ext_proc::ProcessingResponse>*
EndpointPicker::Process(grpc::CallbackServerContext*) {
  return new Stream(*this);
}

}  // namespace loom::api
