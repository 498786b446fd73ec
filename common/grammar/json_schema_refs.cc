#include "common/grammar/json_schema_refs.h"

#include <cctype>
#include <string>

namespace loom::common {
namespace {

using Json = nlohmann::ordered_json;

// %XX escapes of a URI fragment decoded; the text as it is when one is malformed.
std::string PercentDecoded(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() &&
        std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

const Json* FindAnchor(const Json& schema, std::string_view name) {
  if (schema.is_object()) {
    if (auto it = schema.find("$anchor"); it != schema.end() && it->is_string() && *it == name) {
      return &schema;
    }
  }
  if (schema.is_object() || schema.is_array()) {
    for (const Json& child : schema) {
      if (const Json* found = FindAnchor(child, name); found != nullptr) return found;
    }
  }
  return nullptr;
}

}  // namespace

const Json* ResolveLocalRef(const Json& root, std::string_view ref) {
  if (ref.empty() || ref[0] != '#') return nullptr;
  if (ref == "#") return &root;
  if (ref.size() > 1 && ref[1] != '/') return FindAnchor(root, ref.substr(1));
  try {
    return &root.at(Json::json_pointer(PercentDecoded(ref.substr(1))));
  } catch (const Json::exception&) {
    return nullptr;
  }
}

}  // namespace loom::common
