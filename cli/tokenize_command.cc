#include "cli/tokenize_command.h"

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/gguf_file.h"
#include "common/hf_model.h"
#include "common/tokenizer.h"

namespace loom::coordinator {
namespace {

constexpr char kTokenizeUsage[] =
    "usage: loom tokenize --model PATH [--no-special] [--no-parse-special] TEXT\n"
    "  prints the token ids of TEXT (\"-\" reads standard input)\n"
    "  --no-special        do not add BOS/EOS\n"
    "  --no-parse-special  treat special-token text such as <|im_start|> as plain text\n";

constexpr char kDetokenizeUsage[] =
    "usage: loom detokenize --model PATH [--skip-special] IDS...\n"
    "  prints the text of the token ids\n"
    "  --skip-special  leave out control tokens such as <|im_end|>\n";

struct Arguments {
  std::string model_path;
  std::vector<std::string> positional;
  std::vector<std::string> flags;  // "--no-special" etc., validated by the caller
};

// Parses `--model PATH`, `--model=PATH`, `--flag` and positionals (everything after
// "--" is positional). Returns false on a malformed option.
bool ParseArguments(int argc, char** argv, Arguments* args) {
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (only_positional || arg == "-" || arg.size() < 2 || arg.substr(0, 2) != "--") {
      args->positional.emplace_back(arg);
    } else if (arg == "--") {
      only_positional = true;
    } else if (arg == "--model") {
      if (i + 1 >= argc) return false;
      args->model_path = argv[++i];
    } else if (arg.substr(0, 8) == "--model=") {
      args->model_path = std::string(arg.substr(8));
    } else {
      args->flags.emplace_back(arg);
    }
  }
  return !args->model_path.empty();
}

std::unique_ptr<common::Tokenizer> LoadTokenizer(const std::string& path, const char* command) {
  auto gguf = common::OpenModelFile(path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "loom %s: %s\n", command, gguf.status().ToString().c_str());
    return nullptr;
  }
  auto tokenizer = common::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "loom %s: %s: %s\n", command, path.c_str(),
                 tokenizer.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*tokenizer);
}

}  // namespace

int RunTokenizeCommand(int argc, char** argv) {
  Arguments args;
  bool add_special = true;
  bool parse_special = true;
  bool ok = ParseArguments(argc, argv, &args) && args.positional.size() == 1;
  for (const std::string& flag : args.flags) {
    if (flag == "--no-special") {
      add_special = false;
    } else if (flag == "--no-parse-special") {
      parse_special = false;
    } else {
      ok = false;
    }
  }
  if (!ok) {
    std::fputs(kTokenizeUsage, stderr);
    return 2;
  }
  std::string text = args.positional[0];
  if (text == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  auto tokenizer = LoadTokenizer(args.model_path, "tokenize");
  if (tokenizer == nullptr) return 1;
  const std::vector<int32_t> ids = tokenizer->Encode(text, add_special, parse_special);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line.push_back(' ');
    line += std::to_string(ids[i]);
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

int RunDetokenizeCommand(int argc, char** argv) {
  Arguments args;
  bool skip_special = false;
  bool ok = ParseArguments(argc, argv, &args) && !args.positional.empty();
  for (const std::string& flag : args.flags) {
    if (flag == "--skip-special") {
      skip_special = true;
    } else {
      ok = false;
    }
  }
  std::vector<int32_t> ids;
  for (const std::string& arg : args.positional) {
    for (absl::string_view field : absl::StrSplit(arg, absl::ByAnyChar(", "), absl::SkipEmpty())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(field, &id)) {
        std::fprintf(stderr, "loom detokenize: '%s' is not a token id\n",
                     std::string(field).c_str());
        ok = false;
      }
      ids.push_back(id);
    }
  }
  if (!ok) {
    std::fputs(kDetokenizeUsage, stderr);
    return 2;
  }
  auto tokenizer = LoadTokenizer(args.model_path, "detokenize");
  if (tokenizer == nullptr) return 1;
  auto text = tokenizer->Decode(ids, skip_special);
  if (!text.ok()) {
    std::fprintf(stderr, "loom detokenize: %s\n", text.status().ToString().c_str());
    return 1;
  }
  text->push_back('\n');
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace loom::coordinator
