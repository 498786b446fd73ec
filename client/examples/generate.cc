// Generates a completion with the Loom C++ client:
//   generate [--address HOST:PORT] [--max-tokens N] [--stream] PROMPT
// Prints the completion (as it streams with --stream), then the finish reason and token
// counts on stderr. Exit status: 0 on success, 1 when the call failed, 2 on bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "client/client.h"

int main(int argc, char** argv) {
  loom::client::ClientOptions options;  // 127.0.0.1:50051, plaintext
  std::string prompt;
  int max_tokens = 64;
  bool stream = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--address" && i + 1 < argc) {
      options.address = argv[++i];
    } else if (arg == "--max-tokens" && i + 1 < argc) {
      max_tokens = std::atoi(argv[++i]);
    } else if (arg == "--stream") {
      stream = true;
    } else if (prompt.empty() && arg.rfind("--", 0) != 0) {
      prompt = arg;
    } else {
      std::fprintf(stderr,
                   "usage: generate [--address HOST:PORT] [--max-tokens N] [--stream] PROMPT\n");
      return 2;
    }
  }
  if (prompt.empty()) {
    std::fprintf(stderr,
                 "usage: generate [--address HOST:PORT] [--max-tokens N] [--stream] PROMPT\n");
    return 2;
  }

  auto client = loom::client::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "generate: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const auto request = loom::client::GenerateRequest::FromText(prompt, max_tokens);
  absl::StatusOr<loom::client::Completion> completion;
  if (stream) {
    completion = (*client)->Generate(request, [](const loom::client::GenerateChunk& chunk) {
      std::fputs(chunk.text.c_str(), stdout);
      std::fflush(stdout);
      return true;  // keep going
    });
  } else {
    completion = (*client)->Generate(request);
    if (completion.ok()) std::fputs(completion->text.c_str(), stdout);
  }
  if (!completion.ok()) {
    std::fprintf(stderr, "generate: %s\n", completion.status().ToString().c_str());
    return 1;
  }
  std::fputs("\n", stdout);
  std::fprintf(stderr, "finish: %s, prompt tokens: %d, completion tokens: %d\n",
               std::string(loom::client::FinishReasonName(completion->finish_reason)).c_str(),
               completion->usage.prompt_tokens, completion->usage.completion_tokens);
  return 0;
}
