#include "cli/complete_command.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "client/client.h"
#include "cli/client_flags.h"

namespace loom::coordinator {
namespace {

constexpr char kUsage[] =
    "usage: loom complete [flags] PROMPT\n"
    "  generates a completion of PROMPT (\"-\" reads standard input) on a running cluster\n"
    "  --stream               print the text as it arrives\n"
    "  --ignore-eos           keep generating past the end-of-sequence token\n";

int Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "loom complete: %s\n", error.c_str());
  std::fprintf(stderr, "%s%s%s", kUsage, kGenerationFlagsHelp, kClientFlagsHelp);
  return 2;
}

}  // namespace

int RunCompleteCommand(int argc, char** argv) {
  client::ClientOptions options;
  client::GenerateRequest request = client::GenerateRequest::FromText("", 64);
  bool stream = false;
  bool have_prompt = false;
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
      continue;
    }
    if (arg == "--stream") {
      stream = true;
    } else if (arg == "--ignore-eos") {
      request.ignore_eos = true;
    } else if (!have_prompt && (arg == "-" || arg.rfind("--", 0) != 0)) {
      request.text = arg;
      have_prompt = true;
    } else {
      return Usage("unknown flag or extra argument: " + arg);
    }
    ++i;
  }
  if (!have_prompt) return Usage("a PROMPT is required");
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

}  // namespace loom::coordinator
