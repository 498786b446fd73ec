// Drives loom::client against a running cluster for tests/client/cpp_client_test.py, and
// prints one JSON object with what happened:
//   client_tool generate     --address A --prompt P [--max-tokens N] [--timeout S]
//                            [--ignore-eos] [--logprobs K] [--max-attempts M] [--backoff-ms B]
//                            [--stream]
//   client_tool stream-cancel --address A --prompt P --max-tokens N --cancel-after TOKENS
//   client_tool info         --address A --text T   (tokenize, detokenize, models, state)
// Every mode takes --api-key K (sent as `authorization: Bearer K`).
//   client_tool chat         --address A --request JSON [--stream]   (Client::Chat; JSON:
//                            {"messages": [OpenAI messages], "tools": [{"name",
//                            "description", "parameters": {schema}}], "tool_choice":
//                            {"mode", "function"}, "max_tokens", "temperature", "seed",
//                            "parallel_tool_calls"})
// Exit status 0 whenever the driver ran (the JSON says how the calls ended), 2 on bad usage.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "client/client.h"
#include "nlohmann/json.hpp"

namespace {

using loom::client::Client;
using loom::client::GenerateRequest;
using nlohmann::json;

struct Args {
  std::string mode;
  std::string address;
  std::string prompt;
  std::string text;
  std::string api_key;
  std::string request;
  int max_tokens = 16;
  double timeout_s = 0;
  bool ignore_eos = false;
  bool stream = false;
  int logprobs = -1;
  int max_attempts = 5;
  int backoff_ms = 100;
  int cancel_after = 4;
};

bool ParseArgs(int argc, char** argv, Args& args) {
  if (argc < 2) return false;
  args.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--ignore-eos") {
      args.ignore_eos = true;
      continue;
    }
    if (flag == "--stream") {
      args.stream = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string value = argv[++i];
    bool ok = true;
    if (flag == "--address") {
      args.address = value;
    } else if (flag == "--prompt") {
      args.prompt = value;
    } else if (flag == "--request") {
      args.request = value;
    } else if (flag == "--text") {
      args.text = value;
    } else if (flag == "--api-key") {
      args.api_key = value;
    } else if (flag == "--max-tokens") {
      ok = absl::SimpleAtoi(value, &args.max_tokens);
    } else if (flag == "--timeout") {
      ok = absl::SimpleAtod(value, &args.timeout_s);
    } else if (flag == "--logprobs") {
      ok = absl::SimpleAtoi(value, &args.logprobs);
    } else if (flag == "--max-attempts") {
      ok = absl::SimpleAtoi(value, &args.max_attempts);
    } else if (flag == "--backoff-ms") {
      ok = absl::SimpleAtoi(value, &args.backoff_ms);
    } else if (flag == "--cancel-after") {
      ok = absl::SimpleAtoi(value, &args.cancel_after);
    } else {
      return false;
    }
    if (!ok) return false;
  }
  return !args.address.empty();
}

json StatusJson(const absl::Status& status) {
  return {{"code", absl::StatusCodeToString(status.code())}, {"message", status.message()}};
}

json CompletionJson(const loom::client::Completion& c) {
  json logprobs = json::array();
  for (const loom::client::TokenLogprobs& l : c.logprobs) {
    logprobs.push_back({{"token_id", l.token_id}, {"logprob", l.logprob}, {"top", l.top.size()}});
  }
  return {{"text", c.text},
          {"token_ids", c.token_ids},
          {"finish_reason", loom::client::FinishReasonName(c.finish_reason)},
          {"prompt_tokens", c.usage.prompt_tokens},
          {"completion_tokens", c.usage.completion_tokens},
          {"cached_prompt_tokens", c.usage.cached_prompt_tokens},
          {"replica_id", c.replica_id},
          {"request_id", c.request_id},
          {"attempts", c.attempts},
          {"logprobs", logprobs}};
}

int RunChat(Client& client, const Args& args) {
  const json spec = json::parse(args.request);
  std::vector<loom::client::ChatMessage> messages;
  for (const json& m : spec.at("messages")) {
    loom::client::ChatMessage message;
    message.role = m.at("role").get<std::string>();
    if (m.contains("content") && m["content"].is_string()) message.content = m["content"].get<std::string>();
    message.name = m.value("name", "");
    message.tool_call_id = m.value("tool_call_id", "");
    for (const json& call : m.value("tool_calls", json::array())) {
      const json& function = call.at("function");
      message.tool_calls.push_back({call.value("id", ""), function.at("name").get<std::string>(),
                                    function.value("arguments", "{}")});
    }
    messages.push_back(std::move(message));
  }
  std::vector<loom::client::Tool> tools;
  for (const json& t : spec.value("tools", json::array())) {
    tools.push_back({t.at("name").get<std::string>(), t.value("description", ""),
                     t.contains("parameters") ? t["parameters"].dump() : std::string()});
  }
  loom::client::ToolChoice choice;
  if (spec.contains("tool_choice")) {
    choice.mode = spec["tool_choice"].value("mode", "");
    choice.function = spec["tool_choice"].value("function", "");
  }
  GenerateRequest options;
  options.max_tokens = spec.value("max_tokens", args.max_tokens);
  if (spec.contains("temperature")) options.sampling.temperature = spec["temperature"].get<float>();
  if (spec.contains("seed")) options.sampling.seed = spec["seed"].get<uint64_t>();
  if (spec.contains("parallel_tool_calls")) options.parallel_tool_calls = spec["parallel_tool_calls"].get<bool>();
  int chunks = 0;
  absl::StatusOr<loom::client::Completion> completion;
  if (args.stream) {
    // The streaming form of the same chat: Generate with the chat fields set.
    GenerateRequest request = options;
    request.messages = messages;
    request.tools = tools;
    request.tool_choice = choice;
    completion = client.Generate(request, [&](const loom::client::GenerateChunk&) {
      ++chunks;
      return true;
    });
  } else {
    completion = client.Chat(messages, tools, choice, options);
  }
  json out = StatusJson(completion.status());
  if (completion.ok()) {
    out["completion"] = CompletionJson(*completion);
    out["completion"]["content"] = completion->content;
    json calls = json::array();
    for (const loom::client::ToolCall& call : completion->tool_calls) {
      calls.push_back({{"id", call.id}, {"name", call.name}, {"arguments", call.arguments}});
    }
    out["completion"]["tool_calls"] = calls;
  }
  out["chunks"] = chunks;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int RunGenerate(Client& client, const Args& args) {
  GenerateRequest request = GenerateRequest::FromText(args.prompt, args.max_tokens);
  request.ignore_eos = args.ignore_eos;
  if (args.logprobs >= 0) request.sampling.num_logprobs = args.logprobs;
  loom::client::CallOptions call;
  if (args.timeout_s > 0) call.timeout = absl::Seconds(args.timeout_s);
  int chunks = 0;
  absl::StatusOr<loom::client::Completion> completion =
      args.stream ? client.Generate(
                        request,
                        [&](const loom::client::GenerateChunk&) {
                          ++chunks;
                          return true;
                        },
                        call)
                  : client.Generate(request, call);
  json out = StatusJson(completion.status());
  if (completion.ok()) out["completion"] = CompletionJson(*completion);
  out["chunks"] = chunks;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int RunStreamCancel(Client& client, const Args& args) {
  GenerateRequest request = GenerateRequest::FromText(args.prompt, args.max_tokens);
  request.ignore_eos = true;
  std::unique_ptr<loom::client::GenerateStream> stream = client.StartGenerate(request);
  size_t tokens = 0;
  json out;
  while (static_cast<int>(tokens) < args.cancel_after) {
    absl::StatusOr<std::optional<loom::client::GenerateChunk>> chunk = stream->Next();
    if (!chunk.ok() || !chunk->has_value()) {
      out["ended_early"] = chunk.ok() ? "finished" : chunk.status().ToString();
      break;
    }
    tokens += (*chunk)->token_ids.size();
  }
  stream->Cancel();
  // After Cancel() the stream ends with CANCELLED (chunks already in flight may come first).
  absl::Status end;
  while (true) {
    absl::StatusOr<std::optional<loom::client::GenerateChunk>> chunk = stream->Next();
    if (!chunk.ok() || !chunk->has_value()) {
      end = chunk.status();
      break;
    }
  }
  out["tokens_before_cancel"] = tokens;
  out["end"] = StatusJson(end);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int RunInfo(Client& client, const Args& args) {
  json out;
  absl::StatusOr<std::vector<int32_t>> ids = client.Tokenize(args.text);
  out["tokenize"] = StatusJson(ids.status());
  if (ids.ok()) {
    out["token_ids"] = *ids;
    absl::StatusOr<std::string> text = client.Detokenize(*ids, /*skip_special_tokens=*/true);
    out["detokenize"] = StatusJson(text.status());
    if (text.ok()) out["text"] = *text;
  }
  absl::StatusOr<loom::client::Embeddings> embeddings =
      client.Embed({loom::client::EmbedInput::Text(args.text),
                    loom::client::EmbedInput::Tokens(ids.ok() ? *ids : std::vector<int32_t>{})});
  out["embed"] = StatusJson(embeddings.status());
  if (embeddings.ok()) {
    out["embeddings"] = embeddings->vectors;
    out["embed_prompt_tokens"] = embeddings->prompt_tokens;
  }
  out["embed_invalid"] =
      StatusJson(client.Embed({loom::client::EmbedInput::Tokens({1 << 30})}).status());
  absl::StatusOr<std::string> invalid = client.Detokenize({1 << 30});
  out["detokenize_invalid"] = StatusJson(invalid.status());
  absl::StatusOr<std::vector<loom::client::ModelDescription>> models = client.ListModels();
  out["list_models"] = StatusJson(models.status());
  if (models.ok()) {
    for (const auto& m : *models) {
      out["models"].push_back({{"id", m.id},
                               {"architecture", m.architecture},
                               {"vocab_size", m.vocab_size},
                               {"context_length", m.context_length}});
    }
  }
  absl::StatusOr<loom::client::ClusterState> state = client.GetClusterState();
  out["cluster_state"] = StatusJson(state.status());
  if (state.ok()) {
    out["model"] = state->model;
    for (const auto& r : state->replicas) {
      out["replicas"].push_back({{"replica_id", r.replica_id},
                                 {"healthy", r.healthy},
                                 {"num_kv_blocks", r.num_kv_blocks},
                                 {"num_free_blocks", r.num_free_blocks}});
    }
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, args)) {
    std::fprintf(stderr, "usage: client_tool generate|stream-cancel|info --address A [flags]\n");
    return 2;
  }
  loom::client::ClientOptions options;
  options.address = args.address;
  options.api_key = args.api_key;
  options.retry.max_attempts = args.max_attempts;
  options.retry.initial_backoff = absl::Milliseconds(args.backoff_ms);
  options.retry.max_backoff = absl::Milliseconds(args.backoff_ms);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  if (!client.ok()) {
    std::printf("%s\n", StatusJson(client.status()).dump().c_str());
    return 0;
  }
  if (args.mode == "generate") return RunGenerate(**client, args);
  if (args.mode == "stream-cancel") return RunStreamCancel(**client, args);
  if (args.mode == "info") return RunInfo(**client, args);
  if (args.mode == "chat") return RunChat(**client, args);
  std::fprintf(stderr, "client_tool: unknown mode %s\n", args.mode.c_str());
  return 2;
}
