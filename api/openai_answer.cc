#include "api/openai_answer.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "api/chat_request.h"
#include "api/harmony_reply.h"
#include "api/openai_logprobs.h"
#include "api/openai_service.h"
#include "api/reasoning_parser.h"
#include "api/tool_call_parser.h"
#include "api/tool_call_stream.h"

namespace loom::api {
namespace {

// The reply of a finished choice with tools: its content (null when empty) and calls,
// cut to one when parallel calls are off.
struct ToolReply {
  Json content;
  std::vector<ParsedToolCall> calls;
  std::optional<std::string> reasoning;  // gpt-oss's analysis channel
  bool partial = false;  // `calls` were cut short by max_tokens (finish_reason stays "length")
};

ToolReply ParseReply(const ToolsRequest& tools, const std::string& text) {
  ChatReply parsed = ParseChatReply(tools, text);
  ToolReply out;
  out.content =
      parsed.content.empty() && !parsed.calls.empty() ? Json(nullptr) : Json(parsed.content);
  out.calls = std::move(parsed.calls);
  out.reasoning = std::move(parsed.reasoning);
  return out;
}

// ParseReply of a finished reply: when it was held to calls (tool_choice required or
// named) but cut by max_tokens, the calls as far as they came (as a stream shows them,
// and as OpenAI answers), not the call format's raw text as content.
ToolReply ParseFinalReply(const ToolsRequest& tools, const std::string& text, bool cut) {
  ToolReply reply = ParseReply(tools, text);
  const bool calls_only =
      tools.choice == ToolChoice::kRequired || tools.choice == ToolChoice::kNamed;
  if (!cut || !calls_only) return reply;
  // Cut: finish_reason stays "length" even when the calls parse whole (a closing tag may
  // be what was cut), and the raw call text is never content.
  reply.partial = true;
  reply.content = nullptr;
  if (!reply.calls.empty()) return reply;
  for (PartialToolCall& partial : PartialToolCalls(tools.format, text, tools.string_parameters)) {
    reply.calls.push_back({std::move(partial.name), std::move(partial.arguments)});
  }
  if (!tools.parallel && reply.calls.size() > 1) reply.calls.resize(1);
  return reply;
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
                   bool as_token_ids, Choice& choice, Json* delta_logprobs) {
  choice.completion_tokens += static_cast<int32_t>(event.token_ids.size());
  Choice delta;  // the new tokens' logprobs alone, for a streamed chunk
  delta.text_offset = choice.text_offset;
  for (const loom::v1::SequenceOutput& output : event.logprobs) {
    AppendLogprobs(chat, tokenizer, output, choice.logprobs, choice.text_offset, as_token_ids);
    if (delta_logprobs != nullptr) {
      AppendLogprobs(chat, tokenizer, output, delta.logprobs, delta.text_offset, as_token_ids);
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

// The error event of a streamed choice that failed.
std::string FailureEvent(const Choice& choice) {
  const absl::Status error = absl::UnavailableError(
      absl::StrFormat("the request could not be completed: %s", choice.error));
  return "data: " + Dump(OpenAiErrorJson(error, 503)) + "\n\n";
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
    if (tools.active())
      calls = PartialToolCalls(tools.format, choice.reply, tools.string_parameters);
    if (!tools.parallel && calls.size() > 1) calls.resize(1);
    for (size_t i = 0; i < calls.size(); ++i) {
      if (!call_chunks(i, calls[i].name, calls[i].arguments)) return false;
    }
    if (failed) {
      send(FailureEvent(choice));
      return false;
    }
    return true;
  }
  ToolReply reply =
      ParseFinalReply(tools, choice.reply, choice.finish == loom::v1::FINISH_REASON_LENGTH);
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
  return delta_chunk(Json::object(), reply.calls.empty() || reply.partial
                                         ? Json(engine::FinishReasonName(choice.finish))
                                         : Json("tool_calls"));
}

// A non-streaming request's answer once every choice finished: one JSON body, or the
// error that ended a choice.
HttpResponse WholeResponse(bool chat, const Run& run, const common::Tokenizer& tokenizer) {
  const OpenAiRequest& options = run.parsed;
  HttpResponse response;
  response.set_header(kRequestIdHeader, run.request_id);
  for (const Choice& choice : run.choices) {
    if (choice.finish == loom::v1::FINISH_REASON_ERROR ||
        choice.finish == loom::v1::FINISH_REASON_ABORT) {
      OpenAiService::WriteError(absl::UnavailableError(absl::StrFormat(
                                    "the request could not be completed: %s", choice.error)),
                                response);
      return response;
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
      ToolReply reply =
          ParseFinalReply(options.tools, text, choice.finish == loom::v1::FINISH_REASON_LENGTH);
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
          if (!reply.partial) finish = "function_call";
        } else {
          message["tool_calls"] = Json::array();
          for (const ParsedToolCall& call : reply.calls) {
            message["tool_calls"].push_back(ToolCallJson(call, NewToolCallId()));
          }
          if (!reply.partial) finish = "tool_calls";
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
                                         tokenizer, choice.logprobs, options.return_token_ids)
                          : choice.logprobs;
    if (options.prompt_logprobs >= 0) {
      // vLLM's places: each completion choice's, or the chat response's.
      Json scores =
          PromptLogprobs(prompt_ids, choice.prompt_logprobs, options.prompt_logprobs, tokenizer);
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
  return response;
}

// How long a stream may stay silent before a `: keep-alive` comment.
constexpr absl::Duration kKeepAlive = absl::Seconds(5);

}  // namespace

void OpenAiAnswers::Add(std::shared_ptr<OpenAiAnswer> answer) {
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      answers_.emplace(answer.get(), std::move(answer));
      return;
    }
  }
  answer->Detach();
}

void OpenAiAnswers::Remove(const OpenAiAnswer* answer) {
  std::shared_ptr<OpenAiAnswer> last;  // released outside the lock
  absl::MutexLock lock(&mu_);
  auto it = answers_.find(answer);
  if (it == answers_.end()) return;
  last = std::move(it->second);
  answers_.erase(it);
}

void OpenAiAnswers::DetachAll() {
  absl::flat_hash_map<const OpenAiAnswer*, std::shared_ptr<OpenAiAnswer>> open;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    open.swap(answers_);
  }
  for (auto& [raw, answer] : open) answer->Detach();
}

OpenAiAnswer::OpenAiAnswer(std::shared_ptr<Run> run, bool chat, const common::Tokenizer& tokenizer,
                           StreamPump& pump, std::shared_ptr<HttpResponder> responder,
                           OpenAiAnswers& answers)
    : run_(std::move(run)),
      chat_(chat),
      tokenizer_(tokenizer),
      pump_(pump),
      responder_(std::move(responder)),
      answers_(answers),
      last_write_(absl::Now()) {}

void OpenAiAnswer::Start(std::shared_ptr<Run> run, bool chat, const common::Tokenizer& tokenizer,
                         StreamPump& pump, std::shared_ptr<HttpResponder> responder,
                         OpenAiAnswers& answers) {
  std::shared_ptr<OpenAiAnswer> answer(
      new OpenAiAnswer(std::move(run), chat, tokenizer, pump, std::move(responder), answers));
  // The listeners run on producers' threads (an output queue's with its lock held): they
  // only queue a step.
  auto wake = [weak = std::weak_ptr<OpenAiAnswer>(answer), pump = &pump] {
    if (std::shared_ptr<OpenAiAnswer> live = weak.lock()) pump->Wake(std::move(live));
  };
  for (Choice& choice : answer->run_->choices) choice.request->outputs().SetListener(wake);
  answer->responder_->SetWakeup(wake);
  if (answer->run_->parsed.stream) {
    HttpResponse head;
    head.content_type = "text/event-stream";
    head.set_header("Cache-Control", "no-cache");
    head.set_header("X-Accel-Buffering", "no");
    head.set_header(kRequestIdHeader, answer->run_->request_id);
    answer->responder_->StartStream(std::move(head));
  }
  answers.Add(answer);
  answer->Pump();
}

void OpenAiAnswer::Pump() {
  {
    absl::MutexLock lock(&mu_);
    if (stepping_) {
      again_ = true;
      return;
    }
    stepping_ = true;
  }
  while (true) {
    while (Step()) {
    }
    absl::MutexLock lock(&mu_);
    if (!again_) {
      stepping_ = false;
      return;
    }
    again_ = false;
  }
}

bool OpenAiAnswer::Step() {
  if (ended_ || detached_.load()) return false;
  Run& run = *run_;
  const bool stream = run.parsed.stream;
  if (responder_->Closed()) {
    run.CancelAll();
    End(/*finished=*/false);
    return false;
  }
  // One write at a time: the client's connection wakes this when it is done.
  if (stream && responder_->Busy()) return false;
  run.PlaceFollowers();
  const absl::Time now = absl::Now();
  absl::Time next = absl::InfiniteFuture();
  bool took = false;
  for (Choice& choice : run.choices) {
    if (choice.finish != loom::v1::FINISH_REASON_UNSPECIFIED || !choice.placed) continue;
    std::optional<engine::OutputEvent> event = choice.request->outputs().TryPop(choice.hold_until);
    if (event.has_value()) {
      took = true;
      if (run.stream_interval > absl::ZeroDuration()) choice.hold_until = now + run.stream_interval;
      if (!stream) {
        choice.text +=
            Absorb(chat_, tokenizer_, *event, run_->parsed.return_token_ids, choice, nullptr);
      } else if (!StreamEvent(choice, *event)) {
        run.CancelAll();
        End(/*finished=*/false);
        return false;
      }
    }
    // Holding (a flush interval): what comes meanwhile is taken when it ends.
    if (choice.finish == loom::v1::FINISH_REASON_UNSPECIFIED && choice.hold_until > now) {
      next = std::min(next, choice.hold_until);
    }
  }
  if (run.done()) {
    End(/*finished=*/true);
    return false;
  }
  if (stream) {
    if (took) {
      last_write_ = now;
    } else if (now - last_write_ >= kKeepAlive) {
      if (!responder_->Write(": keep-alive\n\n")) {
        run.CancelAll();
        End(/*finished=*/false);
        return false;
      }
      last_write_ = now;
    }
    next = std::min(next, last_write_ + kKeepAlive);
  }
  if (next != absl::InfiniteFuture() && (timer_at_ <= now || next < timer_at_)) {
    timer_at_ = next;
    pump_.WakeAt(shared_from_this(), next);
  }
  // A taken event leaves its queue unarmed: look again (a stream, once its write is done).
  return took && !(stream && responder_->Busy());
}

Json OpenAiAnswer::ChunkBody(Json choices) const {
  Json body;
  body["id"] = run_->id;
  body["object"] = chat_ ? "chat.completion.chunk" : "text_completion";
  body["created"] = run_->created;
  body["model"] = run_->model;
  body["choices"] = std::move(choices);
  // With continuous_usage_stats every chunk says the usage so far (vLLM), else null until
  // the last.
  if (run_->parsed.include_usage) {
    body["usage"] = run_->parsed.continuous_usage ? run_->Usage() : Json(nullptr);
  }
  return body;
}

std::string OpenAiAnswer::Chunk(Json choices) const {
  return "data: " + Dump(ChunkBody(std::move(choices))) + "\n\n";
}

bool OpenAiAnswer::StreamEvent(Choice& choice, const engine::OutputEvent& event) {
  auto send = [this](const std::string& data) { return responder_->Write(data); };
  auto chunk = [this](Json choices) { return Chunk(std::move(choices)); };
  Json delta_logprobs;
  std::string text =
      Absorb(chat_, tokenizer_, event, run_->parsed.return_token_ids, choice, &delta_logprobs);
  const bool failed = choice.finish == loom::v1::FINISH_REASON_ERROR ||
                      choice.finish == loom::v1::FINISH_REASON_ABORT;
  Json out;
  out["index"] = choice.index;
  std::string reasoning;
  if (chat_ && choice.reasoning != nullptr) {
    ReasoningStream::Delta split = choice.reasoning->Add(text);
    if (choice.finish != loom::v1::FINISH_REASON_UNSPECIFIED) {
      ReasoningStream::Delta rest = choice.reasoning->Finish();
      split.reasoning += rest.reasoning;
      split.content += rest.content;
    }
    reasoning = std::move(split.reasoning);
    text = std::move(split.content);
  }
  if (chat_ && run_->parsed.tools.parses_reply()) {
    if (!reasoning.empty()) {
      Json head = Json::object();
      if (!choice.started) head["role"] = "assistant";
      head["reasoning_content"] = std::move(reasoning);
      choice.started = true;
      if (!send(chunk(Json::array({Json{{"index", choice.index},
                                        {"delta", std::move(head)},
                                        {"logprobs", nullptr},
                                        {"finish_reason", nullptr}}}))))
        return false;
    }
    return SendToolChunks(*run_, choice, text, std::move(delta_logprobs), failed, send, chunk);
  }
  if (chat_) {
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
    if (!choice.started && run_->parsed.echo) {
      text = run_->parsed.echo_texts[choice.prompt_index] + text;
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
    send(FailureEvent(choice));
    return false;
  }
  return true;
}

void OpenAiAnswer::End(bool finished) {
  ended_ = true;
  const Run& run = *run_;
  if (run.parsed.stream) {
    if (finished && run.parsed.include_usage) {
      Json body = ChunkBody(Json::array());
      body["usage"] = run.Usage();
      responder_->Write("data: " + Dump(body) + "\n\n");
    }
    responder_->Write("data: [DONE]\n\n");
    responder_->End();
  } else if (finished) {
    responder_->Respond(WholeResponse(chat_, run, tokenizer_));
  }
  Release();
}

void OpenAiAnswer::Release() {
  for (Choice& choice : run_->choices) choice.request->outputs().SetListener(nullptr);
  responder_->SetWakeup(nullptr);
  answers_.Remove(this);
}

void OpenAiAnswer::Detach() {
  detached_.store(true);
  run_->CancelAll();
  for (Choice& choice : run_->choices) choice.request->outputs().SetListener(nullptr);
  responder_->SetWakeup(nullptr);
}

}  // namespace loom::api
