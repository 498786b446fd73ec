#include "cli/chat_command.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "client/client.h"
#include "cli/chat_prompt.h"
#include "cli/client_flags.h"
#include "cli/command_line.h"

namespace loom::cli {
namespace {

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
  cli::CommandLine command_line(
      "loom chat", "loom chat: chat with a running cluster, one message per line (/exit quits)");
  CLI::App& app = command_line.app();
  cli::AddString(app, "--model", model_path,
                 "the served model's file, for its chat template (default: the file the "
                 "coordinator names, if on this machine)");
  cli::AddString(app, "--system", system_message,
                 "a system message at the start of the conversation");
  AddGenerationFlags(app, request);
  AddClientFlags(app, options);
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return *exit_code;

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

}  // namespace loom::cli
