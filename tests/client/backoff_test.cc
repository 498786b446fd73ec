#include "client/backoff.h"

#include "gtest/gtest.h"

namespace loom::client {
namespace {

TEST(BackoffTest, GrowsByTheMultiplierUpToTheCap) {
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.backoff_multiplier = 2.0;
  policy.max_backoff = absl::Milliseconds(500);
  EXPECT_EQ(BackoffBefore(policy, 1), absl::Milliseconds(100));
  EXPECT_EQ(BackoffBefore(policy, 2), absl::Milliseconds(200));
  EXPECT_EQ(BackoffBefore(policy, 3), absl::Milliseconds(400));
  EXPECT_EQ(BackoffBefore(policy, 4), absl::Milliseconds(500));
  // Far past the cap the power overflows to infinity; the wait stays capped.
  EXPECT_EQ(BackoffBefore(policy, 5000), absl::Milliseconds(500));
}

TEST(BackoffTest, OnlyUnavailableIsRetried) {
  EXPECT_TRUE(IsRetryable(absl::UnavailableError("no replica")));
  EXPECT_FALSE(IsRetryable(absl::ResourceExhaustedError("queue full")));
  EXPECT_FALSE(IsRetryable(absl::InvalidArgumentError("bad temperature")));
  EXPECT_FALSE(IsRetryable(absl::DeadlineExceededError("late")));
  EXPECT_FALSE(IsRetryable(absl::CancelledError("cancelled")));
}

}  // namespace
}  // namespace loom::client
