#include "cli/tokenize_command.h"

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/command_line.h"
#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/tokenizer/tokenizer.h"

namespace loom::cli {
namespace {

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
  std::string model_path;
  std::string text;
  bool add_special = true;
  bool parse_special = true;
  cli::CommandLine command_line("loom tokenize",
                                "loom tokenize --model PATH TEXT: print the token ids of TEXT "
                                "('-' reads standard input)");
  CLI::App& app = command_line.app();
  cli::AddString(app, "--model", model_path, "the model whose tokenizer is used; required");
  app.add_option("text", text, "the text")->required();
  cli::AddBool(app, "--special", add_special, "add BOS/EOS (--no-special: do not)");
  cli::AddBool(app, "--parse-special", parse_special,
               "read special-token text such as <|im_start|> as those tokens "
               "(--no-parse-special: as plain text)");
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return *exit_code;
  if (model_path.empty()) return command_line.Fail("--model is required");
  if (text == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  auto tokenizer = LoadTokenizer(model_path, "tokenize");
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
  std::string model_path;
  std::vector<std::string> id_args;
  bool skip_special = false;
  cli::CommandLine command_line("loom detokenize",
                                "loom detokenize --model PATH IDS...: print the text of token "
                                "ids (separated by spaces or commas)");
  CLI::App& app = command_line.app();
  cli::AddString(app, "--model", model_path, "the model whose tokenizer is used; required");
  app.add_option("ids", id_args, "the token ids")->required();
  cli::AddBool(app, "--skip-special", skip_special,
               "leave out control tokens such as <|im_end|>");
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return *exit_code;
  if (model_path.empty()) return command_line.Fail("--model is required");
  std::vector<int32_t> ids;
  for (const std::string& arg : id_args) {
    for (absl::string_view field : absl::StrSplit(arg, absl::ByAnyChar(", "), absl::SkipEmpty())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(field, &id)) {
        return command_line.Fail("'" + std::string(field) + "' is not a token id");
      }
      ids.push_back(id);
    }
  }
  auto tokenizer = LoadTokenizer(model_path, "detokenize");
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

}  // namespace loom::cli
