#include "api/inference_service.h"

#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "api/chat_request.h"
#include "api/reasoning_parser.h"
#include "common/grpc_status.h"
#include "common/unicode.h"
#include "engine/request_validation.h"

namespace loom::api {
namespace {

using loom::v1::GenerateResponse;

// A Generate call answered before any output: validation failed, or nothing can serve.
class FinishedReactor final : public grpc::ServerWriteReactor<GenerateResponse> {
 public:
  explicit FinishedReactor(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

// One Generate call streaming a Request's output (gRPC's callback API: no thread waits
// per stream). Output is taken from the request's OutputQueue when the queue's listener
// says some arrived (a Wake on the pump), when a write completes, or when the flush
// interval ends (a WakeAt); at most one write is in flight, and output that arrives
// meanwhile joins the next message. Lives until OnDone and the last pump reference.
class InferenceService::GenerateStream final
    : public grpc::ServerWriteReactor<GenerateResponse>,
      public StreamPump::Stream,
      public std::enable_shared_from_this<GenerateStream> {
 public:
  GenerateStream(grpc::CallbackServerContext* context, std::shared_ptr<engine::Request> request,
                 int32_t prompt_tokens, StreamPump& pump, absl::Duration interval,
                 ToolsRequest tools, std::optional<bool> reasoning_starts_inside)
      : context_(context),
        request_(std::move(request)),
        prompt_tokens_(prompt_tokens),
        tools_(std::move(tools)),
        reasoning_starts_inside_(reasoning_starts_inside),
        pump_(pump),
        interval_(interval) {}

  // Starts streaming (the request was placed); returns the reactor for gRPC.
  static grpc::ServerWriteReactor<GenerateResponse>* Start(std::shared_ptr<GenerateStream> stream) {
    GenerateStream* raw = stream.get();
    raw->self_ = std::move(stream);
    // The listener runs with the queue locked; OnDone clears it before self_ goes.
    raw->request_->outputs().SetListener([raw] { raw->pump_.Wake(raw->shared_from_this()); });
    raw->Pump();
    return raw;
  }

  void Pump() override {
    Action action = Action::kNone;
    absl::Time wake_at = absl::InfinitePast();
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || write_in_flight_) return;
      if (cancelled_) {
        action = FinishLocked();
      } else if (std::optional<engine::OutputEvent> event =
                     request_->outputs().TryPop(hold_until_)) {
        action = WriteLocked(*std::move(event));
      } else if (hold_until_ > absl::Now() && timer_at_ != hold_until_) {
        // Holding: the tokens queued meanwhile go out when the interval ends.
        timer_at_ = wake_at = hold_until_;
      }
    }
    if (wake_at != absl::InfinitePast()) pump_.WakeAt(shared_from_this(), wake_at);
    Act(action);
  }

  void OnWriteDone(bool ok) override {
    Action action = Action::kNone;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok) {
        // The call is gone (the client left, or it was cancelled): so is the request.
        cancelled_ = true;
        if (finish_status_.ok()) {
          finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        }
      }
      if (cancelled_) {
        action = FinishLocked();
      } else if (interval_ > absl::ZeroDuration()) {
        hold_until_ = absl::Now() + interval_;
      }
    }
    if (action != Action::kNone) {
      request_->Cancel();
      Act(action);
      return;
    }
    Pump();
  }

  // The client cancelled, or the call's deadline passed (gRPC cancels it then).
  void OnCancel() override {
    request_->Cancel();
    Action action = Action::kNone;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (std::chrono::system_clock::now() >= context_->deadline()) {
        finish_status_ = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                      "the request did not finish before its deadline");
      } else if (finish_status_.ok()) {
        finish_status_ =
            grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request");
      }
      if (!write_in_flight_) action = FinishLocked();
    }
    Act(action);
  }

  void OnDone() override {
    request_->outputs().SetListener(nullptr);
    // A stream that ended without its final event leaves nothing to wait for it.
    if (!final_written_) request_->Cancel();
    std::shared_ptr<GenerateStream> self = std::move(self_);
  }

 private:
  enum class Action { kNone, kWrite, kWriteAndFinish, kFinish };

  Action FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return Action::kNone;
    finished_ = true;
    return Action::kFinish;
  }

  // Fills response_ from `event`; the write starts once the lock is released.
  Action WriteLocked(engine::OutputEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    completion_tokens_ += static_cast<int32_t>(event.token_ids.size());
    response_.Clear();
    response_.set_request_id(request_->request_id());
    if (tools_.parses_reply() || reasoning_starts_inside_.has_value()) reply_ += event.text;
    response_.set_text(std::move(event.text));
    response_.mutable_token_ids()->Add(event.token_ids.begin(), event.token_ids.end());
    for (loom::v1::SequenceOutput& logprob : event.logprobs) {
      *response_.add_logprobs() = std::move(logprob);
    }
    response_.set_replica_id(event.replica_id);
    if (event.retryable && !wrote_any_) {
      // Nothing reached the client: end the call UNAVAILABLE, which clients retry.
      finish_status_ = grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrFormat("the request could not be completed: %s", event.error_message));
      final_written_ = true;
      return FinishLocked();
    }
    wrote_any_ = true;
    write_in_flight_ = true;
    if (!event.final()) return Action::kWrite;
    response_.set_finish_reason(event.finish_reason);
    response_.set_error_message(event.error_message);
    response_.set_prompt_tokens(prompt_tokens_);
    response_.set_completion_tokens(completion_tokens_);
    response_.set_cached_prompt_tokens(event.cached_prompt_tokens);
    response_.set_num_draft_tokens(event.num_draft_tokens);
    response_.set_num_accepted_tokens(event.num_accepted_tokens);
    const std::vector<int32_t>& prompt_ids = request_->params().prompt_ids;
    for (size_t i = 1; i < event.prompt_logprobs.size() && i < prompt_ids.size(); ++i) {
      if (!event.prompt_logprobs[i]) continue;
      loom::v1::PromptTokenLogprob* out = response_.add_prompt_logprobs();
      out->set_token_id(prompt_ids[i]);
      out->set_logprob(static_cast<float>(event.prompt_logprobs[i]->logprob));
      out->set_rank(event.prompt_logprobs[i]->rank);
      out->mutable_top_logprobs()->Add(event.prompt_logprobs[i]->top.begin(),
                                       event.prompt_logprobs[i]->top.end());
    }
    if ((tools_.parses_reply() || reasoning_starts_inside_.has_value()) &&
        event.finish_reason != loom::v1::FINISH_REASON_ERROR &&
        event.finish_reason != loom::v1::FINISH_REASON_ABORT) {
      // The reasoning (--reasoning-parser: the <think> part; gpt-oss: its analysis channel)
      // and the calls in the rest of the reply, as /v1/chat/completions splits them.
      std::optional<std::string> reasoning;
      if (reasoning_starts_inside_.has_value()) {
        ReasoningSplit split = SplitReasoning(reply_, *reasoning_starts_inside_);
        reasoning = std::move(split.reasoning);
        reply_ = std::move(split.content);
      }
      // Calls only where the chat parses its reply (tools, or gpt-oss's channels).
      ChatReply reply;
      if (tools_.parses_reply()) {
        reply = ParseChatReply(tools_, reply_);
      } else {
        reply.content = std::move(reply_);
      }
      for (const ParsedToolCall& call : reply.calls) {
        loom::v1::ToolCall* out = response_.add_tool_calls();
        out->set_id(NewToolCallId());
        out->set_name(call.name);
        out->set_arguments(call.arguments);
      }
      response_.set_content(std::move(reply.content));
      if (reply.reasoning) reasoning = std::move(reply.reasoning);
      if (reasoning) response_.set_reasoning_content(*std::move(reasoning));
    }
    finished_ = true;
    final_written_ = true;
    return Action::kWriteAndFinish;
  }

  // Starts what the locked section decided, unlocked: gRPC may run a reaction inline.
  void Act(Action action) {
    switch (action) {
      case Action::kNone:
        return;
      case Action::kWrite:
        StartWrite(&response_);
        return;
      case Action::kWriteAndFinish:
        StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
        return;
      case Action::kFinish: {
        grpc::Status status;
        {
          absl::MutexLock lock(&mu_);
          status = finish_status_;
        }
        Finish(std::move(status));
        return;
      }
    }
  }

  grpc::CallbackServerContext* const context_;
  const std::shared_ptr<engine::Request> request_;
  const int32_t prompt_tokens_;
  bool wrote_any_ ABSL_GUARDED_BY(mu_) = false;  // a message went to the client
  const ToolsRequest tools_;  // a chat's tools: the final message carries the parsed calls
  // A chat under --reasoning-parser: whether its reply starts inside the thinking.
  const std::optional<bool> reasoning_starts_inside_;
  StreamPump& pump_;
  const absl::Duration interval_;
  std::shared_ptr<GenerateStream> self_;  // set from Start until OnDone

  absl::Mutex mu_;
  // One write at a time.
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish or the final write was started
  bool final_written_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);  // for a cancelled call
  absl::Time hold_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // next message not before
  absl::Time timer_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();    // WakeAt already asked
  int32_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::string reply_ ABSL_GUARDED_BY(mu_);  // with active tools: the text so far
  // The message being written: filled under mu_ while no write is in flight, then read by
  // gRPC until OnWriteDone (or OnDone after the final one).
  GenerateResponse response_;
};

InferenceService::InferenceService(coordinator::Cluster& cluster, const ServedModel& model,
                                   const common::ModelConfig& config,
                                   const common::Tokenizer& tokenizer,
                                   coordinator::CoordinatorMetrics* metrics,
                                   absl::Duration stream_interval, ApiKeys api_keys)
    : cluster_(cluster),
      model_(model),
      config_(config),
      tokenizer_(tokenizer),
      eos_ids_(tokenizer.EndOfGenerationIds()),
      metrics_(metrics),
      stream_interval_(stream_interval),
      api_keys_(std::move(api_keys)),
      embedder_(cluster, config, tokenizer, metrics) {}

InferenceService::~InferenceService() = default;

grpc::ServerWriteReactor<GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const loom::v1::GenerateRequest* request) {
  if (absl::Status allowed = CheckApiKey(*context); !allowed.ok()) {
    return new FinishedReactor(common::ToGrpcStatus(allowed));
  }
  if (grpc::Status following = coordinator::FollowingStatus(election_.load(), *context);
      !following.ok()) {
    return new FinishedReactor(std::move(following));
  }
  if (cluster_.draining()) {
    return new FinishedReactor(common::ToGrpcStatus(
        absl::UnavailableError("the coordinator is shutting down (draining)")));
  }
  if (absl::Status known = CheckModel(request->model()); !known.ok()) {
    return new FinishedReactor(common::ToGrpcStatus(known));
  }
  // A chat (messages) becomes a token-id prompt here, rendered and constrained as the
  // OpenAI chat endpoint does.
  std::optional<loom::v1::GenerateRequest> chat;
  ToolsRequest tools;
  std::optional<bool> reasoning_starts_inside;
  if (HasChatFields(*request)) {
    chat = *request;
    std::string rendered;
    absl::StatusOr<ToolsRequest> prepared =
        PrepareChatRequest(*chat, tokenizer_, chat_template_, &rendered);
    if (!prepared.ok()) return new FinishedReactor(common::ToGrpcStatus(prepared.status()));
    tools = *std::move(prepared);
    request = &*chat;
    if (reasoning_ != ReasoningFormat::kNone)
      reasoning_starts_inside = ReasoningStartsInside(rendered);
  }
  absl::StatusOr<engine::RequestParams> params =
      engine::ValidateGenerateRequest(*request, config_, tokenizer_);
  if (!params.ok()) return new FinishedReactor(common::ToGrpcStatus(params.status()));
  const int32_t prompt_tokens = static_cast<int32_t>(params->prompt_ids.size());
  const std::string request_id =
      request->request_id().empty()
          ? absl::StrFormat("req-%d", next_request_number_.fetch_add(1))
          : request->request_id();
  auto live = std::make_shared<engine::Request>(request_id, cluster_.NextSeqId(),
                                                *std::move(params), tokenizer_, eos_ids_);
  live->set_metrics(metrics_);
  if (absl::Status placed = cluster_.Submit(live); !placed.ok()) {
    // A full queue is answered at once (admission never waits for a step), with HTTP's
    // Retry-After as trailing metadata: seconds before a retry is likely admitted.
    if (placed.code() == absl::StatusCode::kResourceExhausted) {
      context->AddTrailingMetadata("retry-after", "1");
    }
    if (metrics_ != nullptr) metrics_->RecordRejected(placed);
    return new FinishedReactor(common::ToGrpcStatus(placed));
  }
  if (metrics_ != nullptr) metrics_->RecordRequestParams(1, live->params().max_tokens);
  return GenerateStream::Start(std::make_shared<GenerateStream>(
      context, std::move(live), prompt_tokens, pump_, stream_interval_, std::move(tools),
      reasoning_starts_inside));
}

absl::Status InferenceService::CheckApiKey(const grpc::ServerContextBase& context) const {
  if (!api_keys_.enabled()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  const absl::string_view value =
      found == metadata.end() ? absl::string_view()
                              : absl::string_view(found->second.data(), found->second.size());
  return api_keys_.Authorizes(value) ? absl::OkStatus() : ApiKeys::Refusal();
}

absl::Status InferenceService::CheckModel(const std::string& requested) const {
  if (model_.Matches(requested)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrFormat("the model '%s' does not exist; this server serves '%s'",
                                             requested, model_.id));
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext* context,
                                        const loom::v1::TokenizeRequest* request,
                                        loom::v1::TokenizeResponse* response) {
  if (absl::Status allowed = CheckApiKey(*context); !allowed.ok())
    return common::ToGrpcStatus(allowed);
  if (absl::Status known = CheckModel(request->model()); !known.ok())
    return common::ToGrpcStatus(known);
  const std::vector<int32_t> ids = tokenizer_.Encode(request->text(), request->add_special_tokens(),
                                                     request->parse_special());
  response->mutable_token_ids()->Add(ids.begin(), ids.end());
  response->set_max_model_len(static_cast<int32_t>(config_.context_length));
  return grpc::Status::OK;
}

grpc::Status InferenceService::Embed(grpc::ServerContext* context,
                                     const loom::v1::EmbedRequest* request,
                                     loom::v1::EmbedResponse* response) {
  if (absl::Status allowed = CheckApiKey(*context); !allowed.ok())
    return common::ToGrpcStatus(allowed);
  if (grpc::Status following = coordinator::FollowingStatus(election_.load(), *context);
      !following.ok()) {
    return following;
  }
  if (cluster_.draining()) {
    return common::ToGrpcStatus(
        absl::UnavailableError("the coordinator is shutting down (draining)"));
  }
  if (absl::Status known = CheckModel(request->model()); !known.ok())
    return common::ToGrpcStatus(known);
  std::vector<loom::v1::GenerateRequest> inputs(request->inputs_size());
  for (int i = 0; i < request->inputs_size(); ++i) {
    const loom::v1::EmbedInput& input = request->inputs(i);
    if (input.has_token_ids()) {
      *inputs[i].mutable_token_ids() = input.token_ids();
    } else {
      inputs[i].set_text(input.text());
    }
  }
  absl::StatusOr<EmbeddingBatch> batch =
      embedder_.Embed(inputs, [context] { return context->IsCancelled(); });
  if (!batch.ok()) {
    if (batch.status().code() == absl::StatusCode::kCancelled &&
        std::chrono::system_clock::now() >= context->deadline()) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "the embeddings were not done before the call's deadline");
    }
    return common::ToGrpcStatus(batch.status());
  }
  for (size_t i = 0; i < batch->vectors.size(); ++i) {
    loom::v1::Embedding* embedding = response->add_embeddings();
    embedding->mutable_values()->Add(batch->vectors[i].begin(), batch->vectors[i].end());
    embedding->set_prompt_tokens(static_cast<int32_t>(batch->input_tokens[i]));
  }
  response->set_prompt_tokens(batch->prompt_tokens);
  return grpc::Status::OK;
}

grpc::Status InferenceService::Detokenize(grpc::ServerContext* context,
                                          const loom::v1::DetokenizeRequest* request,
                                          loom::v1::DetokenizeResponse* response) {
  if (absl::Status allowed = CheckApiKey(*context); !allowed.ok())
    return common::ToGrpcStatus(allowed);
  if (absl::Status known = CheckModel(request->model()); !known.ok())
    return common::ToGrpcStatus(known);
  const std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  absl::StatusOr<std::string> text = tokenizer_.Decode(ids, request->skip_special_tokens());
  if (!text.ok()) return common::ToGrpcStatus(text.status());
  // A proto string must be UTF-8: ids that end inside a character (or a lone byte token)
  // give U+FFFD there, as /detokenize and streamed text do.
  response->set_text(common::SanitizeUtf8(*text));
  return grpc::Status::OK;
}

grpc::Status InferenceService::ListModels(grpc::ServerContext* context,
                                          const loom::v1::ListModelsRequest*,
                                          loom::v1::ListModelsResponse* response) {
  if (absl::Status allowed = CheckApiKey(*context); !allowed.ok())
    return common::ToGrpcStatus(allowed);
  *response->add_models() = model_.ToProto();
  return grpc::Status::OK;
}

grpc::Status InferenceService::GetClusterState(grpc::ServerContext* context,
                                               const loom::v1::GetClusterStateRequest*,
                                               loom::v1::ClusterState* response) {
  if (absl::Status allowed = CheckApiKey(*context); !allowed.ok())
    return common::ToGrpcStatus(allowed);
  *response = cluster_.Status();
  response->set_model(model_.id);
  return grpc::Status::OK;
}

}  // namespace loom::api
