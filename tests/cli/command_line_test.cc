#include "cli/command_line.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "cli/client_flags.h"
#include "cli/serve_flags.h"
#include "cli/worker_options.h"

namespace loom::cli {
namespace {

// A command with one flag of each kind.
struct Flags {
  int64_t max_tokens = 16;
  uint64_t seed = 0;
  double fraction = 0.5;
  std::string name = "x";
  bool caching = true;
  std::vector<std::string> stop;
};

struct TestCommand {
  Flags flags;
  CommandLine command_line{"loom test", "a test command"};

  TestCommand() {
    CLI::App& app = command_line.app();
    AddInt(app, "--max-tokens", flags.max_tokens, 1, 4096, "tokens");
    AddUint64(app, "--seed", flags.seed, "seed");
    AddNumber(app, "--fraction", flags.fraction, 0, 1, "fraction");
    AddString(app, "--served-name", flags.name, "name");
    AddBool(app, "--prefix-caching", flags.caching, "caching");
    app.add_option("--stop", flags.stop, "stops");
  }
  absl::StatusOr<bool> Parse(std::vector<std::string> args) {
    return command_line.TryParse(std::move(args));
  }
};

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

std::string WriteConfig(const std::string& text) {
  const std::string path =
      testing::TempDir() + "/" + testing::UnitTest::GetInstance()->current_test_info()->name() +
      ".yaml";
  std::ofstream(path) << text;
  return path;
}

TEST(CommandLineTest, TakesEqualsAndSpaceForms) {
  for (bool equals : {false, true}) {
    TestCommand command;
    auto arg = [&](const std::string& flag, const std::string& value) {
      return equals ? std::vector<std::string>{flag + "=" + value}
                    : std::vector<std::string>{flag, value};
    };
    std::vector<std::string> args;
    for (const auto& pair : {arg("--max-tokens", "7"), arg("--seed", "18446744073709551615"),
                             arg("--fraction", "0.25"), arg("--served-name", "m"),
                             arg("--prefix-caching", "off"), arg("--stop", "a"),
                             arg("--stop", "b")}) {
      args.insert(args.end(), pair.begin(), pair.end());
    }
    ASSERT_TRUE(command.Parse(args).ok()) << equals;
    EXPECT_EQ(command.flags.max_tokens, 7);
    EXPECT_EQ(command.flags.seed, 18446744073709551615u);
    EXPECT_EQ(command.flags.fraction, 0.25);
    EXPECT_EQ(command.flags.name, "m");
    EXPECT_FALSE(command.flags.caching);
    EXPECT_EQ(command.flags.stop, (std::vector<std::string>{"a", "b"}));
  }
}

TEST(CommandLineTest, BooleansAreRealFlagsAndStillReadOnOff) {
  const std::vector<std::pair<std::vector<std::string>, bool>> cases = {
      {{"--no-prefix-caching"}, false}, {{"--prefix-caching"}, true},
      {{"--prefix-caching", "off"}, false}, {{"--prefix-caching=on"}, true},
      {{"--prefix-caching=false"}, false}, {{"--no-prefix-caching", "--prefix-caching"}, true}};
  for (const auto& [args, expected] : cases) {
    TestCommand command;
    command.flags.caching = !expected;
    ASSERT_TRUE(command.Parse(args).ok()) << args[0];
    EXPECT_EQ(command.flags.caching, expected) << args[0];
  }
}

TEST(CommandLineTest, RefusesBadValuesWithOneLineNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--max-tokens", "1.7"}, "not an integer"},
      {{"--max-tokens", "abc"}, "not an integer"},
      {{"--max-tokens", "0x10"}, "not an integer"},
      {{"--max-tokens", "5000"}, "out of range"},
      {{"--seed", "1e3"}, "not an integer"},
      {{"--seed", "-1"}, "not an integer"},
      {{"--fraction", "half"}, "not a number"},
      {{"--fraction", "1.5"}, "out of range"},
      {{"--fraction", "nan"}, "not a number"},
      {{"--prefix-caching=maybe"}, "prefix-caching"},
      {{"--max-tokens"}, "max-tokens"},
      {{"--frobnicate", "1"}, "frobnicate"}};
  for (const auto& [args, expected] : cases) {
    TestCommand command;
    absl::StatusOr<bool> parsed = command.Parse(args);
    ASSERT_FALSE(parsed.ok()) << args[0];
    const std::string message(parsed.status().message());
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    if (args[0] != "--frobnicate") {
      EXPECT_NE(message.find(args[0].substr(0, args[0].find('='))), std::string::npos) << message;
    }
  }
}

TEST(CommandLineTest, EnvironmentSetsEveryFlagUnderItsLoomName) {
  EXPECT_EQ(EnvironmentName("--max-model-len"), "LOOM_MAX_MODEL_LEN");
  ScopedEnv tokens("LOOM_MAX_TOKENS", "9");
  ScopedEnv caching("LOOM_PREFIX_CACHING", "off");
  ScopedEnv name("LOOM_SERVED_NAME", "env");
  TestCommand command;
  ASSERT_TRUE(command.Parse({"--served-name", "cli"}).ok());
  EXPECT_EQ(command.flags.max_tokens, 9);
  EXPECT_FALSE(command.flags.caching);
  EXPECT_EQ(command.flags.name, "cli");  // the command line wins
  ScopedEnv bad("LOOM_SEED", "1.5");
  TestCommand refused;
  EXPECT_FALSE(refused.Parse({}).ok());
}

TEST(CommandLineTest, ConfigFileIsBelowEnvironmentAndCommandLine) {
  const std::string path = WriteConfig(
      "# flags\nmax-tokens: 11\nseed: 5\nfraction: 0.125\nserved_name: file\n"
      "prefix-caching: off\nstop: [x, y]\n");
  ScopedEnv seed("LOOM_SEED", "6");
  TestCommand command;
  ASSERT_TRUE(command.Parse({"--config", path, "--max-tokens=12"}).ok());
  EXPECT_EQ(command.flags.max_tokens, 12);  // command line > file
  EXPECT_EQ(command.flags.seed, 6u);        // environment > file
  EXPECT_EQ(command.flags.fraction, 0.125);
  EXPECT_EQ(command.flags.name, "file");
  EXPECT_FALSE(command.flags.caching);
  EXPECT_EQ(command.flags.stop, (std::vector<std::string>{"x", "y"}));
  ScopedEnv config("LOOM_CONFIG", path.c_str());  // the file itself from the environment
  TestCommand from_env;
  ASSERT_TRUE(from_env.Parse({}).ok());
  EXPECT_EQ(from_env.flags.max_tokens, 11);
}

TEST(CommandLineTest, ConfigFileErrorsAreOneLine) {
  for (const std::string& text :
       {std::string("max-tokens: 1.5\n"), std::string("unknown-flag: 1\n"),
        std::string("max-tokens: {a: 1}\n"), std::string("- a\n- b\n"),
        std::string("max-tokens: [1\n")}) {
    TestCommand command;
    absl::StatusOr<bool> parsed = command.Parse({"--config", WriteConfig(text)});
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().message().find('\n'), std::string::npos) << parsed.status();
  }
  TestCommand missing;
  EXPECT_FALSE(missing.Parse({"--config", "/nonexistent/loom.yaml"}).ok());
}

// Every flag of the real commands is in --help with its default and its environment name.
void ExpectHelpListsEveryFlagWithItsDefault(CommandLine& command_line) {
  const std::string help = command_line.Help();
  int checked = 0;
  for (const CLI::Option* option : command_line.app().get_options()) {
    if (option->get_lnames().empty()) continue;
    const std::string name = option->get_lnames()[0];
    if (name == "help" || name == "config") continue;
    EXPECT_NE(help.find("--" + name), std::string::npos) << name;
    const bool shown = (!option->get_default_str().empty() &&
                        help.find("=" + option->get_default_str()) != std::string::npos) ||
                       option->get_description().find("(default") != std::string::npos;
    EXPECT_TRUE(shown) << "--" << name << " has no default in --help";
    EXPECT_NE(help.find(EnvironmentName(name)), std::string::npos) << name;
    ++checked;
  }
  EXPECT_GT(checked, 3);
}

TEST(CommandLineTest, HelpListsEveryFlagWithItsDefault) {
  {
    api::ServeOptions options;
    CommandLine command_line("loom serve", "serve");
    AddServeFlags(command_line.app(), options);
    ASSERT_TRUE(command_line.TryParse({"m.gguf"}).ok());
    ExpectHelpListsEveryFlagWithItsDefault(command_line);
  }
  {
    WorkerOptions options;
    CommandLine command_line("loom-worker", "worker");
    AddWorkerFlags(command_line.app(), options);
    ASSERT_TRUE(command_line.TryParse({}).ok());
    ExpectHelpListsEveryFlagWithItsDefault(command_line);
  }
  {
    client::ClientOptions options;
    client::GenerateRequest request;
    CommandLine command_line("loom complete", "complete");
    cli::AddClientFlags(command_line.app(), options);
    cli::AddGenerationFlags(command_line.app(), request);
    ASSERT_TRUE(command_line.TryParse({}).ok());
    ExpectHelpListsEveryFlagWithItsDefault(command_line);
  }
}

TEST(CommandLineTest, ServeTakesTheModelPositionallyAndTheVllmNames) {
  api::ServeOptions options;
  CommandLine command_line("loom serve", "serve");
  AddServeFlags(command_line.app(), options);
  ASSERT_TRUE(command_line
                  .TryParse({"m.gguf", "--port", "9001", "--max-num-seqs=3",
                             "--max-num-batched-tokens", "64", "--served-model-name", "mine",
                             "--max-model-len", "256", "--disable-log-requests",
                             "--no-enable-prefix-caching", "--step-timeout-ms=250"})
                  .ok());
  EXPECT_EQ(options.model_path, "m.gguf");
  EXPECT_EQ(options.http.port, 9001);
  EXPECT_EQ(options.cluster.replica.max_num_seqs, 3);
  EXPECT_EQ(options.cluster.replica.max_num_batched_tokens, 64);
  EXPECT_EQ(options.served_model_name, "mine");
  EXPECT_EQ(options.max_model_len, 256);
  EXPECT_FALSE(options.cluster.replica.enable_prefix_caching);
  EXPECT_EQ(options.cluster.replica.liveness.no_progress_timeout, absl::Milliseconds(250));
}

}  // namespace
}  // namespace loom::cli
