// Renders one chat template for many contexts, for the jinja2 reference test.
// Usage: chat_template_tool TEMPLATE_FILE < contexts.jsonl
// Each stdin line is a JSON object (the template variables); each stdout line is
// {"text": ...} or {"error": ...}. A template that fails to parse answers every line with
// that error.

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "common/jinja/chat_template.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " TEMPLATE_FILE < contexts.jsonl\n";
    return 2;
  }
  std::ifstream file(argv[1], std::ios::binary);
  if (!file) {
    std::cerr << "cannot read " << argv[1] << "\n";
    return 2;
  }
  std::stringstream source;
  source << file.rdbuf();
  auto tmpl = loom::common::ChatTemplate::Parse(source.str());

  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::ordered_json answer;
    if (!tmpl.ok()) {
      answer["error"] = std::string(tmpl.status().message());
    } else {
      auto context = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (context.is_discarded()) {
        answer["error"] = "invalid JSON context";
      } else {
        auto text = (*tmpl)->RenderJson(context);
        if (text.ok()) {
          answer["text"] = *text;
        } else {
          answer["error"] = std::string(text.status().message());
        }
      }
    }
    // Invalid UTF-8 in the output is replaced rather than aborting the whole run.
    std::cout << answer.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
              << "\n";
    std::cout.flush();
  }
  return 0;
}
