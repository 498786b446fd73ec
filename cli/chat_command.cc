#include "cli/chat_command.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "client/client.h"
#include "coordinator/chat_prompt.h"
#include "cli/client_flags.h"

namespace loom::coordinator {
namespace {

constexpr char kUsage[] =
    "usage: loom chat [flags]\n"
    "  chats with a running cluster: one message per line, /exit quits\n"
    "  --model PATH           the served model's GGUF file, for its chat template\n"
    "                         (default: the file the coordinator names, if on this machine)\n"
    "  --system TEXT          a system message at the start of the conversation\n";

int Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "loom chat: %s\n", error.c_str());
  std::fprintf(stderr, "%s%s%s", kUsage, kGenerationFlagsHelp, kClientFlagsHelp);
  return 2;
}

// The chat template of `model_path`, else of the file the coordinator serves when this
// machine has it, else the plain transcript (with a note on stderr).
std::unique_ptr<ChatPrompt> LoadChatPrompt(client::Client& client, std::string model_path) {
  if (model_path.empty()) {
    absl::StatusOr<std::vector<client::ModelDescription>> models = client.ListModels();
    std::error_code error;
    if (models.ok() && !models->empty() && std::filesystem::exists(models->front().path, error)) {
      model_path = models->front().path;
    }
  }
  if (!model_path.empty()) {
    absl::StatusOr<std::unique_ptr<ChatPrompt>> prompt = ChatPrompt::FromGguf(model_path);
    if (prompt.ok()) return *std::move(prompt);
    std::fprintf(stderr, "loom chat: %s\n", prompt.status().ToString().c_str());
  }
  std::fprintf(stderr,
               "loom chat: no chat template (pass --model PATH): using a plain transcript\n");
  return ChatPrompt::Transcript();
}

}  // namespace

int RunChatCommand(int argc, char** argv) {
  client::ClientOptions options;
  client::GenerateRequest request = client::GenerateRequest::FromText("", 512);
  std::string model_path;
  std::string system_message;
  for (int i = 1; i < argc;) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      Usage("");
      return 0;
    }
    absl::StatusOr<int> used = ParseClientFlag(argc, argv, i, options);
    if (used.ok() && *used == 0) used = ParseGenerationFlag(argc, argv, i, request);
    if (!used.ok()) return Usage(std::string(used.status().message()));
    if (*used > 0) {
      i += *used;
    } else if ((arg == "--model" || arg == "--system") && i + 1 < argc) {
      (arg == "--model" ? model_path : system_message) = argv[i + 1];
      i += 2;
    } else {
      return Usage("unknown flag or missing value: " + arg);
    }
  }

  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "loom chat: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<ChatPrompt> prompt = LoadChatPrompt(**client, model_path);
  for (const std::string& stop : prompt->StopStrings()) request.stop.push_back(stop);

  std::vector<common::ChatMessage> messages;
  if (!system_message.empty()) messages.push_back({"system", system_message});
  const bool interactive = isatty(STDIN_FILENO) != 0;
  std::string line;
  while (true) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    messages.push_back({"user", line});
    absl::StatusOr<std::string> text = prompt->Render(messages);
    if (!text.ok()) {
      std::fprintf(stderr, "loom chat: %s\n", text.status().ToString().c_str());
      return 1;
    }
    request.text = *std::move(text);
    absl::StatusOr<client::Completion> reply =
        (*client)->Generate(request, [](const client::GenerateChunk& chunk) {
          std::fwrite(chunk.text.data(), 1, chunk.text.size(), stdout);
          std::fflush(stdout);
          return true;
        });
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (!reply.ok() || reply->finish_reason == client::FinishReason::kError) {
      std::fprintf(stderr, "loom chat: %s\n",
                   reply.ok() ? reply->error_message.c_str() : reply.status().ToString().c_str());
      // The turn failed: forget it, so the next message continues a consistent history.
      messages.pop_back();
      continue;
    }
    messages.push_back({"assistant", reply->text});
  }
  return 0;
}

}  // namespace loom::coordinator
