#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"

namespace loom::cli {

/// One command's parser: a CLI11 app with Loom's conventions. Every option declared on
/// `app()` gets, when Parse runs:
/// * `--flag value` and `--flag=value`; a repeated single-valued flag keeps its last value;
/// * the environment variable `LOOM_<FLAG>` (its first long name, upper case, dashes as
///   underscores), used when the flag is not on the command line;
/// * `--config FILE.yaml`: flat `flag-name: value` lines (sequences for repeatable flags),
///   used when neither the command line nor the environment sets the flag;
/// * booleans as `--x`/`--no-x`, `--x=on|off|true|false`, and the old `--x on|off` form;
/// * one line `loom <command>: error: ...` on stderr and exit code 2 for anything bad.
/// Not thread-safe; one per process invocation.
class CommandLine {
 public:
  /// `name`: "loom serve", "loom-worker"...; `description`: the first line of --help.
  CommandLine(std::string name, const std::string& description);

  CLI::App& app() { return app_; }
  const std::string& name() const { return name_; }

  /// Parses argv[1..argc). Returns nullopt to go on, or the exit code: 0 after printing
  /// --help (stdout), 2 after printing one error line (stderr).
  std::optional<int> Parse(int argc, const char* const* argv);
  /// The same over a vector of arguments (argv[1..] order).
  std::optional<int> Parse(std::vector<std::string> args);
  /// Parses without printing: true when --help was asked for, InvalidArgument with the
  /// one-line message for a bad command line.
  absl::StatusOr<bool> TryParse(std::vector<std::string> args);

  /// Reads the argument `alias` (and `alias=value`) as `name`: CLI11's short names are one
  /// letter, vLLM's -tp is two.
  void AddArgumentAlias(const std::string& alias, const std::string& name) {
    aliases_.emplace_back(alias, name);
  }

  /// Prints `name: error: message` on stderr and returns 2 (for checks after parsing).
  int Fail(const std::string& message) const;

  /// The generated help text.
  std::string Help() const { return app_.help(); }

 private:
  void AssignEnvironmentNames();

  std::string name_;
  CLI::App app_;
  std::vector<std::pair<std::string, std::string>> aliases_;
};

/// The environment variable of a flag: "--max-model-len" -> "LOOM_MAX_MODEL_LEN".
std::string EnvironmentName(const std::string& long_name);

/// A boolean flag `--name`/`--no-name` (also `--name=on|off` and `--name on|off`), its
/// default shown in the help.
CLI::Option* AddBool(CLI::App& app, const std::string& name, bool& value, const std::string& help);

/// An integer flag (`names`: "--a,--b" as CLI11) in [min, max]: "1.7", "1e3", "0x10" and
/// values out of range are refused, naming the range.
CLI::Option* AddInt(CLI::App& app, const std::string& names, int64_t& value, int64_t min,
                    int64_t max, const std::string& help);
CLI::Option* AddInt(CLI::App& app, const std::string& names, int32_t& value, int64_t min,
                    int64_t max, const std::string& help);
CLI::Option* AddInt(CLI::App& app, const std::string& names, std::optional<int64_t>& value,
                    int64_t min, int64_t max, const std::string& help);
CLI::Option* AddInt(CLI::App& app, const std::string& names, std::optional<int32_t>& value,
                    int64_t min, int64_t max, const std::string& help);
/// An unsigned 64-bit integer flag (seeds): digits only.
CLI::Option* AddUint64(CLI::App& app, const std::string& names, uint64_t& value,
                       const std::string& help);
CLI::Option* AddUint64(CLI::App& app, const std::string& names, std::optional<uint64_t>& value,
                       const std::string& help);
/// A finite real number in [min, max].
CLI::Option* AddNumber(CLI::App& app, const std::string& names, double& value, double min,
                       double max, const std::string& help);
CLI::Option* AddNumber(CLI::App& app, const std::string& names, float& value, double min,
                       double max, const std::string& help);
CLI::Option* AddNumber(CLI::App& app, const std::string& names, std::optional<double>& value,
                       double min, double max, const std::string& help);
CLI::Option* AddNumber(CLI::App& app, const std::string& names, std::optional<float>& value,
                       double min, double max, const std::string& help);
/// A string flag; `choices` non-empty: one of them.
CLI::Option* AddString(CLI::App& app, const std::string& names, std::string& value,
                       const std::string& help, const std::vector<std::string>& choices = {});

/// Whether any of `names` ("--a,--b,positional") is already an option of `app`.
bool AnyDeclared(const CLI::App& app, const std::string& names);

/// CLI11 validators with Loom's messages.
CLI::Validator IntegerIn(int64_t min, int64_t max);
CLI::Validator NumberIn(double min, double max);
CLI::Validator OneOf(const std::vector<std::string>& choices);
/// HOST:PORT ("[v6]:port" too), port in [0, 65535].
CLI::Validator HostPort();
/// One HOST:PORT or several, comma-separated.
CLI::Validator HostPortList();

}  // namespace loom::cli
