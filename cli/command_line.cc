#include "cli/command_line.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli/yaml_config.h"

namespace loom::cli {
namespace {

constexpr const char* kBoolWords[] = {"on", "off", "true", "false", "yes", "no", "1", "0"};

bool IsBoolWord(const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (const char* word : kBoolWords) {
    if (lower == word) return true;
  }
  return false;
}

// A flag that takes no value (a boolean): CLI11 expects no items after it.
bool IsBoolFlag(const CLI::Option* option) {
  return option->get_items_expected_max() == 0 && option->get_lnames().size() > 0 &&
         option->get_lnames()[0] != "help";
}

}  // namespace

std::string EnvironmentName(const std::string& long_name) {
  std::string name = long_name;
  while (!name.empty() && name[0] == '-') name.erase(0, 1);
  return "LOOM_" + absl::AsciiStrToUpper(absl::StrReplaceAll(name, {{"-", "_"}}));
}

CommandLine::CommandLine(std::string name, const std::string& description)
    : name_(std::move(name)), app_(description, name_) {
  app_.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app_.set_config("--config", "", "a YAML file of `flag-name: value` lines (precedence: "
                                  "command line > LOOM_* environment > file > default)");
  app_.config_formatter(std::make_shared<YamlConfig>(&app_));
  app_.allow_config_extras(CLI::config_extras_mode::error);
  app_.get_formatter()->column_width(34);
}

void CommandLine::AssignEnvironmentNames() {
  for (CLI::Option* option : app_.get_options()) {
    if (option->get_lnames().empty() || !option->get_envname().empty()) continue;
    const std::string& long_name = option->get_lnames()[0];
    if (long_name == "help") continue;
    option->envname(EnvironmentName(long_name));
  }
}

std::optional<int> CommandLine::Parse(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return Parse(std::move(args));
}

std::optional<int> CommandLine::Parse(std::vector<std::string> args) {
  absl::StatusOr<bool> help = TryParse(std::move(args));
  if (!help.ok()) return Fail(std::string(help.status().message()));
  if (*help) {
    std::fputs(app_.help().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

absl::StatusOr<bool> CommandLine::TryParse(std::vector<std::string> args) {
  AssignEnvironmentNames();
  // The old `--flag on|off` form of booleans: join it into `--flag=on|off`.
  std::vector<std::string> joined;
  for (std::string& arg : args) {
    for (const auto& [alias, name] : aliases_) {
      if (arg == alias) arg = name;
      if (arg.rfind(alias + "=", 0) == 0) arg = name + arg.substr(alias.size());
    }
  }
  // LOOM_CONFIG names the file when the command line does not (CLI11 reads the file
  // before it looks at the environment).
  const bool config_given = std::any_of(args.begin(), args.end(), [](const std::string& arg) {
    return arg == "--config" || arg.rfind("--config=", 0) == 0;
  });
  if (const char* config = std::getenv("LOOM_CONFIG");
      !config_given && config != nullptr && *config != '\0') {
    args.push_back(std::string("--config=") + config);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) == 0 && arg.find('=') == std::string::npos && i + 1 < args.size() &&
        IsBoolWord(args[i + 1])) {
      const CLI::Option* option = app_.get_option_no_throw(arg);
      if (option != nullptr && IsBoolFlag(option)) {
        joined.push_back(arg + "=" + args[++i]);
        continue;
      }
    }
    joined.push_back(arg);
  }
  // CLI11 takes the arguments in reverse order.
  std::vector<std::string> reversed(joined.rbegin(), joined.rend());
  try {
    app_.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return true;
  } catch (const CLI::CallForAllHelp&) {
    return true;
  } catch (const CLI::ExtrasError& error) {
    // Most often a boolean given a value it does not know (`--cuda-graphs maybe`): name it.
    for (size_t i = 0; i + 1 < joined.size(); ++i) {
      const CLI::Option* option = joined[i].rfind("--", 0) == 0
                                      ? app_.get_option_no_throw(joined[i])
                                      : nullptr;
      if (option != nullptr && IsBoolFlag(option) && joined[i + 1].rfind("-", 0) != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: unexpected value '%s' (a boolean: %s, --no-%s, or %s=on|off)", joined[i],
            joined[i + 1], joined[i], joined[i].substr(2), joined[i]));
      }
    }
    return absl::InvalidArgumentError(absl::StrReplaceAll(error.what(), {{"\n", " "}}));
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(absl::StrReplaceAll(error.what(), {{"\n", " "}}));
  }
  return false;
}

bool AnyDeclared(const CLI::App& app, const std::string& names) {
  for (absl::string_view name : absl::StrSplit(names, ',')) {
    if (app.get_option_no_throw(std::string(name)) != nullptr) return true;
  }
  return false;
}

int CommandLine::Fail(const std::string& message) const {
  std::string line = absl::StrReplaceAll(message, {{"\n", " "}});
  std::fprintf(stderr, "%s: error: %s (usage: %s --help)\n", name_.c_str(), line.c_str(),
               name_.c_str());
  return 2;
}

CLI::Validator IntegerIn(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        int64_t number = 0;
        if (!absl::SimpleAtoi(text, &number)) {
          return absl::StrFormat("'%s' is not an integer (expected an integer in [%d, %d])", text,
                                 min, max);
        }
        if (number < min || number > max) {
          return absl::StrFormat("%d is out of range (expected an integer in [%d, %d])", number,
                                 min, max);
        }
        return "";
      },
      absl::StrFormat("INT in [%d, %d]", min, max));
}

CLI::Validator NumberIn(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double number = 0;
        if (!absl::SimpleAtod(text, &number) || !std::isfinite(number)) {
          return absl::StrFormat("'%s' is not a number (expected a number in [%g, %g])", text, min,
                                 max);
        }
        if (number < min || number > max) {
          return absl::StrFormat("%s is out of range (expected a number in [%g, %g])", text, min,
                                 max);
        }
        return "";
      },
      absl::StrFormat("NUMBER in [%g, %g]", min, max));
}

CLI::Validator OneOf(const std::vector<std::string>& choices) {
  return CLI::Validator(
      [choices](std::string& text) -> std::string {
        for (const std::string& choice : choices) {
          if (text == choice) return "";
        }
        std::string list;
        for (size_t i = 0; i < choices.size(); ++i) {
          list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") +
                  (choices[i].empty() ? std::string("\"\"") : choices[i]);
        }
        return absl::StrFormat("'%s' is not one of %s", text, list);
      },
      absl::StrJoin(choices, "|"));
}

namespace {

std::string CheckHostPort(const std::string& text) {
  const size_t colon = text.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::StrFormat("'%s' is not HOST:PORT (port in [0, 65535])", text);
  }
  return "";
}

}  // namespace

CLI::Validator HostPort() {
  return CLI::Validator([](std::string& text) { return CheckHostPort(text); }, "HOST:PORT");
}

CLI::Validator HostPortList() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        for (absl::string_view one : absl::StrSplit(text, ',')) {
          if (std::string error = CheckHostPort(std::string(one)); !error.empty()) return error;
        }
        return "";
      },
      "HOST:PORT[,HOST:PORT...]");
}

CLI::Option* AddBool(CLI::App& app, const std::string& name, bool& value,
                     const std::string& help) {
  const std::string bare = name.substr(2);
  return app.add_flag(name + ",!--no-" + bare, value,
                      help + absl::StrFormat(" (default: %s)", value ? "on" : "off"));
}

namespace {

template <typename T>
CLI::Option* AddIntImpl(CLI::App& app, const std::string& names, T& value, int64_t min,
                        int64_t max, const std::string& help) {
  return app.add_option(names, value, help)->check(IntegerIn(min, max));
}

template <typename T>
CLI::Option* AddNumberImpl(CLI::App& app, const std::string& names, T& value, double min,
                           double max, const std::string& help) {
  return app.add_option(names, value, help)->check(NumberIn(min, max));
}

CLI::Validator Unsigned64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t number = 0;
        if (text.empty() || text[0] == '-' || text[0] == '+' || !absl::SimpleAtoi(text, &number)) {
          return absl::StrFormat("'%s' is not an integer in [0, 2^64)", text);
        }
        return "";
      },
      "UINT64");
}

}  // namespace

CLI::Option* AddInt(CLI::App& app, const std::string& names, int64_t& value, int64_t min,
                    int64_t max, const std::string& help) {
  return AddIntImpl(app, names, value, min, max, help);
}
CLI::Option* AddInt(CLI::App& app, const std::string& names, int32_t& value, int64_t min,
                    int64_t max, const std::string& help) {
  return AddIntImpl(app, names, value, min, max, help);
}
CLI::Option* AddInt(CLI::App& app, const std::string& names, std::optional<int64_t>& value,
                    int64_t min, int64_t max, const std::string& help) {
  return AddIntImpl(app, names, value, min, max, help)->default_str("none");
}
CLI::Option* AddInt(CLI::App& app, const std::string& names, std::optional<int32_t>& value,
                    int64_t min, int64_t max, const std::string& help) {
  return AddIntImpl(app, names, value, min, max, help)->default_str("none");
}
CLI::Option* AddUint64(CLI::App& app, const std::string& names, uint64_t& value,
                       const std::string& help) {
  return app.add_option(names, value, help)->check(Unsigned64());
}
CLI::Option* AddUint64(CLI::App& app, const std::string& names, std::optional<uint64_t>& value,
                       const std::string& help) {
  return app.add_option(names, value, help)->check(Unsigned64())->default_str("none");
}
CLI::Option* AddNumber(CLI::App& app, const std::string& names, double& value, double min,
                       double max, const std::string& help) {
  return AddNumberImpl(app, names, value, min, max, help);
}
CLI::Option* AddNumber(CLI::App& app, const std::string& names, float& value, double min,
                       double max, const std::string& help) {
  return AddNumberImpl(app, names, value, min, max, help);
}
CLI::Option* AddNumber(CLI::App& app, const std::string& names, std::optional<double>& value,
                       double min, double max, const std::string& help) {
  return AddNumberImpl(app, names, value, min, max, help)->default_str("none");
}
CLI::Option* AddNumber(CLI::App& app, const std::string& names, std::optional<float>& value,
                       double min, double max, const std::string& help) {
  return AddNumberImpl(app, names, value, min, max, help)->default_str("none");
}

CLI::Option* AddString(CLI::App& app, const std::string& names, std::string& value,
                       const std::string& help, const std::vector<std::string>& choices) {
  CLI::Option* option = app.add_option(names, value, help);
  if (!choices.empty()) option->check(OneOf(choices));
  if (value.empty()) option->default_str("\"\"");
  return option;
}

}  // namespace loom::cli
