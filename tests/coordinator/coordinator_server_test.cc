#include "coordinator/coordinator_server.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

TEST(ParseServeFlagTest, StreamIntervalDefaultsToTenMillisecondsAndAcceptsZero) {
  ServeOptions options;
  EXPECT_EQ(options.stream_interval, absl::Milliseconds(10));
  std::string error;
  ASSERT_TRUE(ParseServeFlag("--stream-interval-ms", "0", options, error));
  EXPECT_EQ(error, "");
  EXPECT_EQ(options.stream_interval, absl::ZeroDuration());
  ASSERT_TRUE(ParseServeFlag("--stream-interval-ms", "25", options, error));
  EXPECT_EQ(error, "");
  EXPECT_EQ(options.stream_interval, absl::Milliseconds(25));
}

TEST(ParseServeFlagTest, StreamIntervalRejectsNegativeHugeAndNonNumbersByName) {
  for (const char* bad : {"-1", "10001", "ten", "", "1.5"}) {
    ServeOptions options;
    std::string error;
    ASSERT_TRUE(ParseServeFlag("--stream-interval-ms", bad, options, error)) << bad;
    EXPECT_NE(error.find("--stream-interval-ms"), std::string::npos) << error;
    EXPECT_NE(error.find("[0, 10000]"), std::string::npos) << error;
    EXPECT_EQ(options.stream_interval, absl::Milliseconds(10)) << bad;
  }
}

TEST(ParseServeFlagTest, UnknownFlagsAreNotServeFlags) {
  ServeOptions options;
  std::string error;
  EXPECT_FALSE(ParseServeFlag("--stream-interval", "5", options, error));
  EXPECT_EQ(error, "");
}

}  // namespace
}  // namespace loom::coordinator
