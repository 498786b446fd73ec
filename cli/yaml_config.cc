#include "cli/yaml_config.h"

#include <cstdlib>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "yaml-cpp/yaml.h"

namespace loom::cli {
namespace {

bool EnvironmentSets(const CLI::App* app, const std::string& name) {
  const CLI::Option* option = app->get_option_no_throw("--" + name);
  if (option == nullptr) option = app->get_option_no_throw(name);
  if (option == nullptr || option->get_envname().empty()) return false;
  const char* value = std::getenv(option->get_envname().c_str());
  return value != nullptr && *value != '\0';
}

}  // namespace

std::vector<CLI::ConfigItem> YamlConfig::from_config(std::istream& input) const {
  std::stringstream text;
  text << input.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& error) {
    throw CLI::ConfigError(absl::StrFormat("--config: not YAML: %s", error.what()));
  }
  std::vector<CLI::ConfigItem> items;
  if (root.IsNull()) return items;
  if (!root.IsMap()) {
    throw CLI::ConfigError("--config: the file must be a mapping of `flag-name: value` lines");
  }
  for (const auto& entry : root) {
    std::string name = entry.first.as<std::string>();
    while (!name.empty() && name[0] == '-') name.erase(0, 1);
    name = absl::StrReplaceAll(name, {{"_", "-"}});
    if (name == "config") throw CLI::ConfigError("--config: a config file cannot name another");
    CLI::ConfigItem item;
    item.name = name;
    const YAML::Node& value = entry.second;
    if (value.IsScalar()) {
      item.inputs.push_back(value.Scalar());
    } else if (value.IsSequence()) {
      for (const auto& element : value) {
        if (!element.IsScalar()) {
          throw CLI::ConfigError(absl::StrFormat("--config: '%s' must list plain values", name));
        }
        item.inputs.push_back(element.Scalar());
      }
    } else {
      throw CLI::ConfigError(
          absl::StrFormat("--config: '%s' needs a value (a scalar or a list)", name));
    }
    if (EnvironmentSets(app_, name)) continue;
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace loom::cli
