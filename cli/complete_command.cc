#include "cli/complete_command.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

#include "client/client.h"
#include "cli/client_flags.h"
#include "cli/command_line.h"

namespace loom::cli {

int RunCompleteCommand(int argc, char** argv) {
  client::ClientOptions options;
  client::GenerateRequest request = client::GenerateRequest::FromText("", 64);
  bool stream = false;
  bool have_prompt = false;
  cli::CommandLine command_line("loom complete",
                                "loom complete PROMPT: generate a completion of PROMPT ('-': "
                                "stdin) on a running cluster");
  CLI::App& app = command_line.app();
  app.add_option("prompt", request.text, "the prompt; '-' reads it from stdin")
      ->default_str("required");
  cli::AddBool(app, "--stream", stream, "print the text as it is generated");
  app.add_flag_callback("--ignore-eos", [&request] { request.ignore_eos = true; },
                        "generate --max-tokens even past the end-of-sequence token "
                        "(default: off)");
  AddGenerationFlags(app, request);
  AddClientFlags(app, options);
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return *exit_code;
  have_prompt = app.get_option("prompt")->count() > 0;
  if (!have_prompt) return command_line.Fail("a PROMPT is required");
  if (request.text == "-") {
    request.text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }

  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "loom complete: %s\n", client.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<client::Completion> completion;
  if (stream) {
    completion = (*client)->Generate(request, [](const client::GenerateChunk& chunk) {
      std::fwrite(chunk.text.data(), 1, chunk.text.size(), stdout);
      std::fflush(stdout);
      return true;
    });
  } else {
    completion = (*client)->Generate(request);
    if (completion.ok()) std::fwrite(completion->text.data(), 1, completion->text.size(), stdout);
  }
  if (!completion.ok()) {
    if (stream) std::fputs("\n", stdout);
    std::fprintf(stderr, "loom complete: %s\n", completion.status().ToString().c_str());
    return 1;
  }
  std::fputs("\n", stdout);
  std::fprintf(
      stderr, "finish: %s; prompt tokens: %d, completion tokens: %d, cached: %d%s%s\n",
      std::string(client::FinishReasonName(completion->finish_reason)).c_str(),
      completion->usage.prompt_tokens, completion->usage.completion_tokens,
      completion->usage.cached_prompt_tokens,
      completion->error_message.empty() ? "" : "; error: ", completion->error_message.c_str());
  return completion->finish_reason == client::FinishReason::kError ? 1 : 0;
}

}  // namespace loom::cli
