#include "cli/serve_flags.h"

#include <string>
#include <vector>

#include "cli/command_line.h"
#include "gtest/gtest.h"

namespace loom::cli {
namespace {

absl::StatusOr<bool> ParseServe(std::vector<std::string> args, api::ServeOptions& options) {
  CommandLine command_line("loom serve", "serve");
  AddServeFlags(command_line.app(), options);
  return command_line.TryParse(std::move(args));
}

TEST(ServeFlagsTest, StreamIntervalDefaultsToTenMillisecondsAndAcceptsZero) {
  api::ServeOptions options;
  EXPECT_EQ(options.stream_interval, absl::Milliseconds(10));
  ASSERT_TRUE(ParseServe({"m.gguf", "--stream-interval-ms", "0"}, options).ok());
  EXPECT_EQ(options.stream_interval, absl::ZeroDuration());
  ASSERT_TRUE(ParseServe({"m.gguf", "--stream-interval-ms=25"}, options).ok());
  EXPECT_EQ(options.stream_interval, absl::Milliseconds(25));
}

TEST(ServeFlagsTest, StreamIntervalRejectsNegativeHugeAndNonNumbersByName) {
  for (const char* bad : {"-1", "10001", "ten", "", "1.5"}) {
    api::ServeOptions options;
    absl::StatusOr<bool> parsed = ParseServe({"m.gguf", "--stream-interval-ms", bad}, options);
    ASSERT_FALSE(parsed.ok()) << bad;
    const std::string error(parsed.status().message());
    EXPECT_NE(error.find("--stream-interval-ms"), std::string::npos) << error;
    EXPECT_NE(error.find("[0, 10000]"), std::string::npos) << error;
    EXPECT_EQ(options.stream_interval, absl::Milliseconds(10)) << bad;
  }
}

TEST(ServeFlagsTest, UnknownFlagsAreRefusedByName) {
  api::ServeOptions options;
  absl::StatusOr<bool> parsed = ParseServe({"m.gguf", "--stream-interval", "5"}, options);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("--stream-interval"), std::string::npos);
}

TEST(ServeFlagsTest, OldNamesStillWork) {
  api::ServeOptions options;
  ASSERT_TRUE(ParseServe({"--model", "m.gguf", "--http-port", "-1", "--prefix-caching", "off",
                          "--speculative-tokens", "3", "--speculative-adaptive", "off",
                          "--routing", "least-loaded"},
                         options)
                  .ok());
  EXPECT_EQ(options.model_path, "m.gguf");
  EXPECT_EQ(options.http.port, -1);
  EXPECT_FALSE(options.cluster.replica.enable_prefix_caching);
  EXPECT_EQ(options.cluster.replica.speculation.num_speculative_tokens, 3);
  EXPECT_FALSE(options.cluster.replica.speculation.adaptive);
  EXPECT_EQ(options.cluster.router.policy, coordinator::RoutingPolicy::kLeastLoaded);
}

}  // namespace
}  // namespace loom::cli
