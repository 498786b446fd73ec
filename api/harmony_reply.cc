#include "api/harmony_reply.h"

#include <optional>

#include "common/json_depth.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kFunctions = "functions.";
constexpr std::string_view kEnds[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};

// One message of the reply: its header's channel and recipient, and its body.
struct Message {
  std::string channel;
  std::string recipient;
  std::string_view body;
  bool closed = false;  // its end token (or the next message) came
};

// `header` as "... to=NAME ..." gives NAME (up to a space or '<').
std::string Recipient(std::string_view header) {
  const size_t at = header.find("to=");
  if (at == std::string_view::npos) return "";
  size_t end = at + 3;
  while (end < header.size() && header[end] != ' ' && header[end] != '<') ++end;
  return std::string(header.substr(at + 3, end - at - 3));
}

std::string Channel(std::string_view header) {
  const size_t at = header.find(kChannel);
  if (at == std::string_view::npos) return "";
  size_t end = at + kChannel.size();
  while (end < header.size() && header[end] != ' ' && header[end] != '<') ++end;
  return std::string(header.substr(at + kChannel.size(), end - at - kChannel.size()));
}

// The messages whose header is complete (up to <|message|>), in order.
std::vector<Message> Messages(std::string_view text) {
  std::vector<Message> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t body = text.find(kMessage, pos);
    if (body == std::string_view::npos) break;
    const std::string_view header = text.substr(pos, body - pos);
    Message message;
    message.channel = Channel(header);
    message.recipient = Recipient(header);
    const size_t from = body + kMessage.size();
    size_t end = std::string_view::npos, next = text.size();
    for (std::string_view marker : kEnds) {
      const size_t at = text.find(marker, from);
      if (at < next) end = at, next = at;
    }
    message.closed = end != std::string_view::npos;
    message.body = text.substr(from, (message.closed ? end : text.size()) - from);
    out.push_back(message);
    if (!message.closed) break;
    pos = end;
    // Past the end token (a <|start|> opens the next message's header).
    if (text.substr(end, kStart.size()) != kStart) {
      for (std::string_view marker : kEnds) {
        if (text.substr(end, marker.size()) == marker) pos = end + marker.size();
      }
    }
  }
  return out;
}

bool IsCall(const Message& message) {
  return message.recipient.substr(0, kFunctions.size()) == kFunctions &&
         message.recipient.size() > kFunctions.size();
}

bool IsContent(const Message& message) {
  return message.channel == "final" ||
         (message.channel == "commentary" && message.recipient.empty());
}

// A body cut where a special token may be starting ("<|" with no closing "|>" yet).
std::string_view Settled(std::string_view body) {
  const size_t open = body.rfind("<|");
  if (open != std::string_view::npos && body.find("|>", open) == std::string_view::npos) {
    return body.substr(0, open);
  }
  if (!body.empty() && body.back() == '<') return body.substr(0, body.size() - 1);
  return body;
}

// A call body that is a JSON object, compacted as ParseToolCalls gives arguments.
std::optional<std::string> ObjectArguments(std::string_view body) {
  if (common::JsonNestingDepth(body) > common::kMaxJsonNestingDepth) return std::nullopt;
  const Json arguments = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!arguments.is_object()) return std::nullopt;
  return arguments.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

ParsedReply ParseHarmony(std::string_view text) {
  if (text.find(kChannel) == std::string_view::npos) return ParsedReply{text.size(), {}, {}, {}};
  ParsedReply out;
  std::string content, reasoning;
  for (const Message& message : Messages(text)) {
    if (IsCall(message)) {
      ParsedToolCall call;
      call.name = message.recipient.substr(kFunctions.size());
      std::optional<std::string> object = ObjectArguments(message.body);
      // The reply may end right after the arguments (<|call|> is an end-of-generation
      // token, not in the text); a body cut short of them is no call.
      if (!message.closed && !object) continue;
      call.arguments = object.value_or(std::string(message.body));
      out.calls.push_back(std::move(call));
    } else if (message.channel == "analysis") {
      reasoning += message.body;
    } else if (IsContent(message)) {
      content += message.body;
    }
  }
  out.content_end = 0;
  out.content = std::move(content);
  out.reasoning = std::move(reasoning);
  return out;
}

HarmonyText HarmonySoFar(std::string_view text) {
  HarmonyText out;
  if (text.find(kChannel) == std::string_view::npos) return out;
  for (const Message& message : Messages(text)) {
    const std::string_view body = message.closed ? message.body : Settled(message.body);
    if (message.channel == "analysis" && !IsCall(message)) {
      out.reasoning += body;
    } else if (IsContent(message)) {
      out.content += body;
    }
  }
  return out;
}

std::vector<PartialToolCall> HarmonyPartialCalls(std::string_view text) {
  std::vector<PartialToolCall> out;
  for (const Message& message : Messages(text)) {
    if (!IsCall(message)) continue;
    PartialToolCall call;
    call.name = message.recipient.substr(kFunctions.size());
    if (message.closed) {
      call.arguments = ObjectArguments(message.body).value_or(std::string(message.body));
      call.complete = true;
    } else {
      call.arguments = CompactJsonPrefix(message.body);
    }
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace loom::api
