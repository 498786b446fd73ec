#pragma once

#include <istream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace loom::cli {

/// `--config FILE.yaml` for CLI11: a flat YAML mapping of flag names (without the dashes;
/// underscores read as dashes) to scalars, or to sequences of scalars for repeatable flags.
/// A key whose flag's LOOM_* environment variable is set is dropped, so the environment
/// overrides the file (CLI11 would read the file first). Anything else (nested mappings,
/// a document that is not a mapping, YAML syntax errors) is a CLI::ConfigError naming it.
class YamlConfig : public CLI::Config {
 public:
  explicit YamlConfig(const CLI::App* app) : app_(app) {}

  std::string to_config(const CLI::App*, bool, bool, std::string) const override { return ""; }
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;

 private:
  const CLI::App* app_;
};

}  // namespace loom::cli
