#include "api/openai_service.h"

#include <cctype>
#include <functional>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "api/chat_request.h"
#include "api/harmony_reply.h"
#include "api/openai_logprobs.h"
#include "api/openai_request.h"
#include "api/peer_connection.h"
#include "api/reasoning_parser.h"
#include "api/tool_call_parser.h"
#include "api/tool_call_stream.h"
#include "engine/request_validation.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

// OpenAI's temperature for requests that set none (when the model has no default).
constexpr float kOpenAiDefaultTemperature = 1.0f;

// ordered_json keeps the keys in the order OpenAI writes them (id, object, created...).
using Json = nlohmann::ordered_json;

// Token strings are raw bytes and may split a UTF-8 character: replace, never throw.
std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}


uint64_t RandomSeed() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator();
}

// One sample of one prompt: its loom Request and what has reached the client so far.
struct Choice {
  int index = 0;
  int prompt_index = 0;
  std::shared_ptr<engine::Request> request;
  std::string text;  // everything so far (non-streaming)
  Json logprobs;     // OpenAI logprobs object, accumulated; null when not asked
  int32_t completion_tokens = 0;
  loom::v1::FinishReason finish = loom::v1::FINISH_REASON_UNSPECIFIED;
  std::string error;
  int32_t cached_prompt_tokens = 0;  // from the final event
  // The prompt's scores, from the final event (echo with logprobs, prompt_logprobs).
  std::vector<std::optional<engine::PromptTokenLogprob>> prompt_logprobs;
  // n > 1: samples after the first wait for it (`leader`) to produce a token, by which
  // time the prompt's KV blocks are in the prefix cache and the samples share them
  // instead of each computing the prompt again. -1: placed at once.
  int leader = -1;
  bool placed = false;
  bool started = false;      // streaming: the first chunk (role, echo) went out
  std::string reply;         // streaming with tools: the whole reply so far
  size_t streamed = 0;       // streaming with tools: bytes of `reply` sent as content
  size_t reasoning_streamed = 0;                 // gpt-oss: bytes of its reasoning sent
  std::vector<std::string> call_ids;             // streaming with tools: calls sent so far
  std::vector<std::string> call_arguments_sent;  //   and their arguments sent
  int64_t text_offset = 0;   // completions logprobs: where the next token's text starts
  // Chat with --reasoning-parser: splits the streamed reply (whole replies are split at
  // the end, SplitReasoning). Null otherwise.
  std::shared_ptr<ReasoningStream> reasoning;
  absl::Time hold_until = absl::InfinitePast();  // its next output is not taken before
};

// Everything one HTTP request runs: its choices, the client's connection, and the
// numbers its response reports.
struct Run {
  OpenAiRequest parsed;
  std::string id;
  int64_t created = 0;
  std::string model;
  std::vector<Choice> choices;
  // Chat with --reasoning-parser: whether the reply starts inside the thinking (the
  // rendered prompt opened it). Unset: no reasoning parser.
  std::optional<bool> reasoning_starts_inside;
  int32_t prompt_tokens = 0;
  std::unique_ptr<PeerConnection> peer;
  std::function<absl::Status(const std::shared_ptr<engine::Request>&)> place;  // Cluster::Submit
  absl::Duration stream_interval;  // the least time between two outputs of a choice

  // Places the samples whose leader has produced output (or finished); a sample that
  // cannot be placed ends with an error event of its own.
  void PlaceFollowers() {
    for (Choice& choice : choices) {
      if (choice.placed) continue;
      const Choice& leader = choices[choice.leader];
      if (leader.completion_tokens == 0 && leader.finish == loom::v1::FINISH_REASON_UNSPECIFIED) {
        continue;
      }
      choice.placed = true;
      if (absl::Status placed = place(choice.request); !placed.ok()) {
        choice.request->Finish(loom::v1::FINISH_REASON_ERROR, std::string(placed.message()), "");
      }
    }
  }

  bool done() const {
    for (const Choice& choice : choices) {
      if (choice.finish == loom::v1::FINISH_REASON_UNSPECIFIED) return false;
    }
    return true;
  }
  void CancelAll() {
    for (Choice& choice : choices) {
      if (choice.request != nullptr && choice.placed) choice.request->Cancel();
    }
  }
  int32_t completion_tokens() const {
    int32_t total = 0;
    for (const Choice& choice : choices) total += choice.completion_tokens;
    return total;
  }
  Json Usage() const {
    Json usage;
    usage["prompt_tokens"] = prompt_tokens;
    usage["completion_tokens"] = completion_tokens();
    usage["total_tokens"] = prompt_tokens + completion_tokens();
    // Prompt tokens served from the prefix cache, once per prompt (its first sample's).
    int32_t cached = 0;
    std::vector<bool> counted(parsed.prompts.size(), false);
    for (const Choice& choice : choices) {
      if (counted[choice.prompt_index]) continue;
      counted[choice.prompt_index] = true;
      cached += choice.cached_prompt_tokens;
    }
    usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
    return usage;
  }
};

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

namespace {

Json ErrorJson(const absl::Status& status, int http_status) {
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

}  // namespace

void OpenAiService::WriteError(const absl::Status& status, httplib::Response& response) {
  const int http_status = HttpStatusOf(status);
  response.status = http_status;
  // Clients back off and retry a full queue; a second is about one step of a full batch
  // draining on a CPU worker.
  if (http_status == 429) response.set_header("Retry-After", "1");
  response.set_content(Dump(ErrorJson(status, http_status)), "application/json");
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
      seed_(seed) {}

uint64_t OpenAiService::UnseededSeed() {
  if (!seed_.has_value()) return RandomSeed();
  // SplitMix64 of (seed, how many unseeded samples came before): distinct per sample, the
  // same sequence on every run with the same --seed.
  uint64_t z = *seed_ + 0x9e3779b97f4a7c15ULL * (unseeded_count_.fetch_add(1) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void OpenAiService::Completions(const httplib::Request& request, httplib::Response& response) {
  Handle(/*chat=*/false, request, response);
}

void OpenAiService::ChatCompletions(const httplib::Request& request,
                                    httplib::Response& response) {
  Handle(/*chat=*/true, request, response);
}

void OpenAiService::Models(const httplib::Request&, httplib::Response& response) {
  Json model;
  model["id"] = model_.id;
  model["object"] = "model";
  model["created"] = model_.created;
  model["owned_by"] = "loom";
  model["root"] = model_.info.path();
  model["max_model_len"] = model_.info.context_length();
  Json list;
  list["object"] = "list";
  list["data"] = Json::array({model});
  response.set_content(Dump(list), "application/json");
}

namespace {

// The reply of a finished choice with tools: its content (null when empty) and calls,
// cut to one when parallel calls are off.
struct ToolReply {
  Json content;
  std::vector<ParsedToolCall> calls;
  std::optional<std::string> reasoning;  // gpt-oss's analysis channel
};

ToolReply ParseReply(const ToolsRequest& tools, const std::string& text) {
  ChatReply parsed = ParseChatReply(tools, text);
  ToolReply out;
  out.content = parsed.content.empty() && !parsed.calls.empty() ? Json(nullptr) : Json(parsed.content);
  out.calls = std::move(parsed.calls);
  out.reasoning = std::move(parsed.reasoning);
  return out;
}

Json ToolCallJson(const ParsedToolCall& call, const std::string& id) {
  Json out;
  out["id"] = id;
  out["type"] = "function";
  out["function"] = {{"name", call.name}, {"arguments", call.arguments}};
  return out;
}

// Takes what a choice's request produced since the last call into the choice; returns
// the new text (and leaves the new tokens' logprobs in `delta_logprobs` when asked).
std::string Absorb(bool chat, const common::Tokenizer& tokenizer, const engine::OutputEvent& event,
                   Choice& choice, Json* delta_logprobs) {
  choice.completion_tokens += static_cast<int32_t>(event.token_ids.size());
  Choice delta;  // the new tokens' logprobs alone, for a streamed chunk
  delta.text_offset = choice.text_offset;
  for (const loom::v1::SequenceOutput& output : event.logprobs) {
    AppendLogprobs(chat, tokenizer, output, choice.logprobs, choice.text_offset);
    if (delta_logprobs != nullptr) {
      AppendLogprobs(chat, tokenizer, output, delta.logprobs, delta.text_offset);
    }
  }
  if (delta_logprobs != nullptr) *delta_logprobs = std::move(delta.logprobs);
  if (event.final()) {
    choice.finish = event.finish_reason;
    choice.error = event.error_message;
    choice.cached_prompt_tokens = event.cached_prompt_tokens;
    choice.prompt_logprobs = event.prompt_logprobs;
  }
  return event.text;
}

// Waits for output of any unfinished choice and hands each event to `on_event`
// (false: stop, the client is gone). Ends when every choice finished (true) or the
// client went away (false; the choices are cancelled).
template <typename OnEvent>
bool Pump(Run& run, OnEvent&& on_event, absl::Duration keep_alive,
          const std::function<bool()>& send_keep_alive) {
  absl::Time last_write = absl::Now();
  const absl::Duration wait =
      run.choices.size() == 1 ? absl::Milliseconds(50) : absl::Milliseconds(5);
  while (!run.done()) {
    run.PlaceFollowers();
    bool any = false;
    for (Choice& choice : run.choices) {
      if (choice.finish != loom::v1::FINISH_REASON_UNSPECIFIED || !choice.placed) continue;
      std::optional<engine::OutputEvent> event =
          choice.request->outputs().Pop(wait, choice.hold_until);
      if (!event) continue;
      any = true;
      if (run.stream_interval > absl::ZeroDuration()) {
        choice.hold_until = absl::Now() + run.stream_interval;
      }
      if (!on_event(choice, *event)) {
        run.CancelAll();
        return false;
      }
    }
    if (run.peer != nullptr && run.peer->PeerClosed()) {
      run.CancelAll();
      return false;
    }
    if (any) {
      last_write = absl::Now();
    } else if (send_keep_alive && absl::Now() - last_write > keep_alive) {
      if (!send_keep_alive()) {
        run.CancelAll();
        return false;
      }
      last_write = absl::Now();
    }
  }
  return true;
}

// Streaming with tools: content is sent as soon as it cannot be part of a call; a call
// goes out as it is generated (api/tool_call_stream): one chunk with its index, id, type,
// name and empty arguments once its name is known, then its arguments as they grow (the
// formats whose calls are JSON; the others send each call's arguments whole when the
// reply ends). What the whole reply parses to decides the rest: content held back, the
// calls' remaining arguments, finish_reason "tool_calls". False: the client is gone or
// the request failed.
template <typename Send, typename MakeChunk>
bool SendToolChunks(Run& run, Choice& choice, const std::string& text, Json delta_logprobs,
                    bool failed, Send&& send, MakeChunk&& chunk) {
  choice.reply += text;
  auto delta_chunk = [&](Json delta, Json finish) {
    Json out;
    out["index"] = choice.index;
    out["delta"] = std::move(delta);
    out["logprobs"] = std::move(delta_logprobs);
    delta_logprobs = nullptr;
    out["finish_reason"] = std::move(finish);
    return send(chunk(Json::array({std::move(out)})));
  };
  // Call i's head (when not sent yet) and its arguments beyond what was sent.
  auto call_chunks = [&](size_t i, const std::string& name, const std::string& arguments) {
    if (i >= choice.call_ids.size()) {
      choice.call_ids.push_back(NewToolCallId());
      choice.call_arguments_sent.emplace_back();
      Json head;
      head["index"] = static_cast<int>(i);
      head["id"] = choice.call_ids[i];
      head["type"] = "function";
      head["function"] = {{"name", name}, {"arguments", ""}};
      if (!delta_chunk(Json{{"tool_calls", Json::array({std::move(head)})}}, nullptr)) return false;
    }
    std::string& sent = choice.call_arguments_sent[i];
    // Deltas only extend what went out (the final parse of a cut-short or malformed call
    // may disagree with what streamed; what went out stands).
    if (arguments.size() <= sent.size() || arguments.compare(0, sent.size(), sent) != 0)
      return true;
    Json more;
    more["index"] = static_cast<int>(i);
    more["function"] = {{"arguments", arguments.substr(sent.size())}};
    sent = arguments;
    return delta_chunk(Json{{"tool_calls", Json::array({std::move(more)})}}, nullptr);
  };
  Json delta = Json::object();
  if (!choice.started) {
    delta["role"] = "assistant";
    delta["content"] = "";
    choice.started = true;
  }
  const ToolsRequest& tools = run.parsed.tools;
  const bool final = choice.finish != loom::v1::FINISH_REASON_UNSPECIFIED;
  // gpt-oss: content and reasoning are channels, not a prefix of the reply.
  auto channel_deltas = [&](const std::string& content, const std::string& reasoning) {
    if (reasoning.size() > choice.reasoning_streamed) {
      delta["reasoning_content"] = reasoning.substr(choice.reasoning_streamed);
      choice.reasoning_streamed = reasoning.size();
    }
    if (content.size() > choice.streamed) {
      delta["content"] = content.substr(choice.streamed);
      choice.streamed = content.size();
    }
  };
  if (!final || failed) {
    if (tools.format == ToolCallFormat::kGptOss) {
      HarmonyText so_far = HarmonySoFar(choice.reply);
      channel_deltas(so_far.content, so_far.reasoning);
    } else if (const size_t safe = StreamableContent(tools.format, choice.reply);
               safe > choice.streamed) {
      delta["content"] = choice.reply.substr(choice.streamed, safe - choice.streamed);
      choice.streamed = safe;
    }
    if (!delta.empty() || !delta_logprobs.is_null()) {
      if (!delta_chunk(std::move(delta), nullptr)) return false;
    }
    std::vector<PartialToolCall> calls;
    if (tools.active()) calls = PartialToolCalls(tools.format, choice.reply);
    if (!tools.parallel && calls.size() > 1) calls.resize(1);
    for (size_t i = 0; i < calls.size(); ++i) {
      if (!call_chunks(i, calls[i].name, calls[i].arguments)) return false;
    }
    if (failed) {
      const absl::Status error = absl::UnavailableError(
          absl::StrFormat("the request could not be completed: %s", choice.error));
      send("data: " + Dump(ErrorJson(error, 503)) + "\n\n");
      return false;
    }
    return true;
  }
  ToolReply reply = ParseReply(tools, choice.reply);
  const bool streamed_calls = !choice.call_ids.empty();
  // Content: all of it without calls (unless calls already went out: the rest is theirs,
  // cut short), else what precedes the first call.
  const size_t content_end =
      reply.calls.empty() ? (streamed_calls ? choice.streamed : choice.reply.size())
                          : (reply.content.is_null() ? 0 : reply.content.get<std::string>().size());
  if (tools.format == ToolCallFormat::kGptOss) {
    channel_deltas(reply.content.is_string() ? reply.content.get<std::string>() : std::string(),
                   reply.reasoning.value_or(""));
  } else if (content_end > choice.streamed) {
    delta["content"] = choice.reply.substr(choice.streamed, content_end - choice.streamed);
    choice.streamed = content_end;
  }
  if (!delta.empty() || !delta_logprobs.is_null()) {
    if (!delta_chunk(std::move(delta), nullptr)) return false;
  }
  for (size_t i = 0; i < reply.calls.size(); ++i) {
    if (!call_chunks(i, reply.calls[i].name, reply.calls[i].arguments)) return false;
  }
  return delta_chunk(Json::object(), reply.calls.empty()
                                         ? Json(engine::FinishReasonName(choice.finish))
                                         : Json("tool_calls"));
}

// A non-streaming request's answer: every choice whole, then one JSON body.
void AnswerWhole(bool chat, Run& run, const common::Tokenizer& tokenizer,
                 httplib::Response& response) {
  const OpenAiRequest& options = run.parsed;
  const bool finished = Pump(
      run,
      [&](Choice& choice, const engine::OutputEvent& event) {
        choice.text += Absorb(chat, tokenizer, event, choice, nullptr);
        return true;
      },
      absl::InfiniteDuration(), nullptr);
  if (!finished) return;  // nobody to answer
  for (const Choice& choice : run.choices) {
    if (choice.finish == loom::v1::FINISH_REASON_ERROR ||
        choice.finish == loom::v1::FINISH_REASON_ABORT) {
      return OpenAiService::WriteError(absl::UnavailableError(absl::StrFormat(
                                           "the request could not be completed: %s", choice.error)),
                                       response);
    }
  }
  Json body;
  body["id"] = run.id;
  body["object"] = chat ? "chat.completion" : "text_completion";
  body["created"] = run.created;
  body["model"] = run.model;
  body["choices"] = Json::array();
  for (const Choice& choice : run.choices) {
    Json out;
    out["index"] = choice.index;
    const char* finish = engine::FinishReasonName(choice.finish);
    // Reasoning first (its text is never content or a tool call), then the tools.
    std::string text = choice.text;
    Json reasoning;
    if (chat && run.reasoning_starts_inside.has_value()) {
      ReasoningSplit split = SplitReasoning(choice.text, *run.reasoning_starts_inside);
      if (split.reasoning) reasoning = *split.reasoning;
      text = std::move(split.content);
    }
    if (chat && options.tools.parses_reply()) {
      ToolReply reply = ParseReply(options.tools, text);
      Json message;
      message["role"] = "assistant";
      message["content"] = reply.content;
      if (reply.reasoning) reasoning = *reply.reasoning;
      if (run.reasoning_starts_inside.has_value() || reply.reasoning) {
        message["reasoning_content"] = reasoning;
      }
      if (!reply.calls.empty()) {
        if (options.tools.legacy) {
          message["function_call"] = {{"name", reply.calls[0].name},
                                      {"arguments", reply.calls[0].arguments}};
          finish = "function_call";
        } else {
          message["tool_calls"] = Json::array();
          for (const ParsedToolCall& call : reply.calls) {
            message["tool_calls"].push_back(ToolCallJson(call, NewToolCallId()));
          }
          finish = "tool_calls";
        }
      }
      out["message"] = std::move(message);
    } else if (chat) {
      out["message"] = {{"role", "assistant"}, {"content", text}};
      if (run.reasoning_starts_inside.has_value()) {
        // vLLM's shape: no content when the reply was all reasoning.
        if (!reasoning.is_null() && text.empty()) out["message"]["content"] = nullptr;
        out["message"]["reasoning_content"] = reasoning;
      }
    } else {
      out["text"] =
          options.echo ? options.echo_texts[choice.prompt_index] + choice.text : choice.text;
    }
    const std::vector<int32_t>& prompt_ids = choice.request->params().prompt_ids;
    out["logprobs"] = !chat && options.echo && options.num_logprobs >= 0
                          ? EchoLogprobs(prompt_ids, choice.prompt_logprobs, options.num_logprobs,
                                         tokenizer, choice.logprobs)
                          : choice.logprobs;
    if (options.prompt_logprobs >= 0) {
      // vLLM's places: each completion choice's, or the chat response's.
      Json scores = PromptLogprobs(prompt_ids, choice.prompt_logprobs, options.prompt_logprobs,
                                   tokenizer);
      if (chat) {
        body["prompt_logprobs"] = std::move(scores);
      } else {
        out["prompt_logprobs"] = std::move(scores);
      }
    }
    out["finish_reason"] = finish;
    body["choices"].push_back(std::move(out));
  }
  body["usage"] = run.Usage();
  response.set_content(Dump(body), "application/json");
}

// A streaming request's answer: Server-Sent Events, one chunk per batch of new text per
// choice, keep-alive comments while nothing comes, the usage chunk and [DONE] at the end.
void AnswerStream(bool chat, std::shared_ptr<Run> run, const common::Tokenizer& tokenizer,
                  httplib::Response& response) {
  response.set_header("Cache-Control", "no-cache");
  response.set_header("X-Accel-Buffering", "no");
  response.set_chunked_content_provider(
      "text/event-stream",
      [run, chat, &tokenizer](size_t, httplib::DataSink& sink) {
        auto send = [&sink](const std::string& data) {
          return sink.write(data.data(), data.size());
        };
        auto chunk = [&](Json choices) {
          Json body;
          body["id"] = run->id;
          body["object"] = chat ? "chat.completion.chunk" : "text_completion";
          body["created"] = run->created;
          body["model"] = run->model;
          body["choices"] = std::move(choices);
          if (run->parsed.include_usage) body["usage"] = nullptr;
          return "data: " + Dump(body) + "\n\n";
        };
        const bool finished = Pump(
            *run,
            [&](Choice& choice, const engine::OutputEvent& event) {
              Json delta_logprobs;
              std::string text = Absorb(chat, tokenizer, event, choice, &delta_logprobs);
              const bool failed = choice.finish == loom::v1::FINISH_REASON_ERROR ||
                                  choice.finish == loom::v1::FINISH_REASON_ABORT;
              Json out;
              out["index"] = choice.index;
              std::string reasoning;
              if (chat && choice.reasoning != nullptr) {
                ReasoningStream::Delta split = choice.reasoning->Add(text);
                if (choice.finish != loom::v1::FINISH_REASON_UNSPECIFIED) {
                  ReasoningStream::Delta rest = choice.reasoning->Finish();
                  split.reasoning += rest.reasoning;
                  split.content += rest.content;
                }
                reasoning = std::move(split.reasoning);
                text = std::move(split.content);
              }
              if (chat && run->parsed.tools.parses_reply()) {
                if (!reasoning.empty()) {
                  Json head = Json::object();
                  if (!choice.started) head["role"] = "assistant";
                  head["reasoning_content"] = std::move(reasoning);
                  choice.started = true;
                  if (!send(chunk(Json::array({Json{{"index", choice.index}, {"delta", std::move(head)},
                                                     {"logprobs", nullptr}, {"finish_reason", nullptr}}}))))
                    return false;
                }
                return SendToolChunks(*run, choice, text, std::move(delta_logprobs), failed, send, chunk);
              }
              if (chat) {
                Json delta = Json::object();
                if (!choice.started) delta["role"] = "assistant";
                if (!reasoning.empty()) delta["reasoning_content"] = std::move(reasoning);
                if (!text.empty() || !choice.started) delta["content"] = text;
                // A reasoning parser holding back a possible tag: nothing to say yet.
                if (delta.empty() && delta_logprobs.is_null() && choice.reasoning != nullptr &&
                    choice.finish == loom::v1::FINISH_REASON_UNSPECIFIED) {
                  return true;
                }
                out["delta"] = std::move(delta);
              } else {
                if (!choice.started && run->parsed.echo) {
                  text = run->parsed.echo_texts[choice.prompt_index] + text;
                }
                out["text"] = text;
              }
              choice.started = true;
              out["logprobs"] = std::move(delta_logprobs);
              out["finish_reason"] = choice.finish == loom::v1::FINISH_REASON_UNSPECIFIED || failed
                                         ? Json(nullptr)
                                         : Json(engine::FinishReasonName(choice.finish));
              if (!send(chunk(Json::array({std::move(out)})))) return false;
              if (failed) {
                // Streaming already began: the error is an event, then the stream ends.
                const absl::Status error = absl::UnavailableError(
                    absl::StrFormat("the request could not be completed: %s", choice.error));
                send("data: " + Dump(ErrorJson(error, 503)) + "\n\n");
                return false;
              }
              return true;
            },
            absl::Seconds(5), [&] { return send(": keep-alive\n\n"); });
        if (finished && run->parsed.include_usage) {
          Json body;
          body["id"] = run->id;
          body["object"] = chat ? "chat.completion.chunk" : "text_completion";
          body["created"] = run->created;
          body["model"] = run->model;
          body["choices"] = Json::array();
          body["usage"] = run->Usage();
          send("data: " + Dump(body) + "\n\n");
        }
        send("data: [DONE]\n\n");
        sink.done();
        return true;
      },
      [run](bool) { run->CancelAll(); });
}

}  // namespace

void OpenAiService::Handle(bool chat, const httplib::Request& request,
                           httplib::Response& response) {
  const std::string content_type = request.get_header_value("Content-Type");
  if (content_type.rfind("application/json", 0) != 0) {
    WriteError(
        absl::InvalidArgumentError(absl::StrFormat(
            "the body must be JSON with Content-Type: application/json, got '%s'", content_type)),
        response);
    return;
  }
  absl::StatusOr<OpenAiRequest> parsed =
      ParseOpenAiRequest(chat ? OpenAiEndpoint::kChatCompletions : OpenAiEndpoint::kCompletions,
                         request.body, tokenizer_, chat_template_);
  if (!parsed.ok()) return WriteError(parsed.status(), response);
  if (!model_.Matches(parsed->model)) {
    return WriteError(
        absl::NotFoundError(absl::StrFormat(
            "the model '%s' does not exist; this server serves '%s'", parsed->model, model_.id)),
        response);
  }

  auto run = std::make_shared<Run>();
  run->parsed = *std::move(parsed);
  const uint64_t number = next_id_.fetch_add(1);
  run->id =
      absl::StrFormat("%s-%016x%04x", chat ? "chatcmpl" : "cmpl", RandomSeed(), number & 0xffff);
  run->created = absl::ToUnixSeconds(absl::Now());
  run->model = model_.id;
  if (chat && reasoning_ != ReasoningFormat::kNone) {
    run->reasoning_starts_inside = ReasoningStartsInside(run->parsed.echo_texts.front());
  }

  // Validate every prompt before placing any, so a bad one leaves nothing running.
  std::vector<engine::RequestParams> prompts;
  for (const loom::v1::GenerateRequest& prompt : run->parsed.prompts) {
    absl::StatusOr<engine::RequestParams> params =
        engine::ValidateGenerateRequest(prompt, config_, tokenizer_, kOpenAiDefaultTemperature);
    if (!params.ok()) return WriteError(params.status(), response);
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
      if (run->reasoning_starts_inside.has_value() && run->parsed.stream) {
        choice.reasoning = std::make_shared<ReasoningStream>(*run->reasoning_starts_inside);
      }
      if (s > 0) {
        choice.leader = choice.index - s;  // placed by Pump once the leader has output
      } else {
        if (absl::Status placed = cluster_.Submit(choice.request); !placed.ok()) {
          if (metrics_ != nullptr) metrics_->RecordRejected(placed);
          run->CancelAll();
          return WriteError(placed, response);
        }
        if (metrics_ != nullptr) {
          metrics_->RecordRequestParams(run->parsed.n, choice.request->params().max_tokens);
        }
        choice.placed = true;
      }
      run->choices.push_back(std::move(choice));
    }
  }
  run->peer = std::make_unique<PeerConnection>(request.local_addr, request.local_port,
                                               request.remote_addr, request.remote_port);
  run->stream_interval = stream_interval_;
  run->place = [cluster = &cluster_](const std::shared_ptr<engine::Request>& sample) {
    return cluster->Submit(sample);
  };
  if (!run->parsed.stream) return AnswerWhole(chat, *run, tokenizer_, response);
  AnswerStream(chat, std::move(run), tokenizer_, response);
}

}  // namespace loom::api
