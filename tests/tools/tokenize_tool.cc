// Driver for tests/common/tokenizer_test.py: one process tokenizes many strings.
//
//   tokenize_tool --model PATH [--add-special] [--no-parse-special] < in.jsonl > out.jsonl
//
// Each input line is a JSON string; each output line is {"ids": [...], "decoded": "..."}
// where "decoded" is Decode(ids, skip_special=false) (invalid UTF-8 shown as U+FFFD).
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/formats/gguf_file.h"
#include "common/formats/hf_model.h"
#include "common/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  std::string model_path;
  bool add_special = false;
  bool parse_special = true;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--model" && i + 1 < argc) {
      model_path = argv[++i];
    } else if (arg == "--add-special") {
      add_special = true;
    } else if (arg == "--no-parse-special") {
      parse_special = false;
    } else {
      std::fprintf(stderr, "usage: tokenize_tool --model PATH [--add-special] [--no-parse-special]\n");
      return 2;
    }
  }
  if (model_path.empty()) {
    std::fprintf(stderr, "tokenize_tool: --model is required\n");
    return 2;
  }
  auto gguf = loom::common::OpenModelFile(model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "tokenize_tool: %s\n", gguf.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = loom::common::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "tokenize_tool: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json input = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!input.is_string()) {
      std::fprintf(stderr, "tokenize_tool: not a JSON string: %s\n", line.c_str());
      return 1;
    }
    const std::string text = input.get<std::string>();
    nlohmann::json output;
    output["ids"] = (*tokenizer)->Encode(text, add_special, parse_special);
    auto decoded = (*tokenizer)->Decode(output["ids"].get<std::vector<int32_t>>(), false);
    output["decoded"] = decoded.ok() ? *decoded : std::string();
    std::cout << output.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  return 0;
}
