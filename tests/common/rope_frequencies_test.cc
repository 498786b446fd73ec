#include "common/rope_frequencies.h"

#include <cmath>

#include "gtest/gtest.h"

namespace loom::common {
namespace {

ModelConfig YarnConfig() {
  ModelConfig config;
  config.rope_dim = 16;
  config.rope_theta = 10000.0;
  config.rope_scaling = RopeScalingType::kYarn;
  config.rope_scaling_factor = 4.0;
  config.rope_original_context_length = 32;
  return config;
}

double Plain(int i) { return std::pow(10000.0, -2.0 * i / 16.0); }

// rope_dim 16, theta 1e4, original context 32, betas 32/1: the correction dims are
// 16 ln(32 / (32 * 2 pi)) / (2 ln 1e4) = -1.60 (floor: -2, clamped to 0) and
// 16 ln(32 / (1 * 2 pi)) / (2 ln 1e4) = 1.41 (ceil: 2), so pair 0 keeps its frequency,
// pair 1 is halfway, and pairs 2.. are divided by the factor 4.
TEST(RopeFrequenciesTest, YarnRampsFromExtrapolationToInterpolation) {
  const std::vector<float> inv_freq = RopeInverseFrequencies(YarnConfig(), {});
  ASSERT_EQ(inv_freq.size(), 8u);
  EXPECT_FLOAT_EQ(inv_freq[0], static_cast<float>(Plain(0)));
  EXPECT_FLOAT_EQ(inv_freq[1], static_cast<float>(Plain(1) * (0.5 / 4.0 + 0.5)));
  for (int i = 2; i < 8; ++i) {
    EXPECT_FLOAT_EQ(inv_freq[i], static_cast<float>(Plain(i) / 4.0)) << i;
  }
}

// Without truncation the ramp runs over the fractional range [0, 1.41].
TEST(RopeFrequenciesTest, YarnWithoutTruncationUsesTheExactCorrectionRange) {
  ModelConfig config = YarnConfig();
  config.rope_yarn_truncate = false;
  const double high = 16.0 * std::log(32.0 / (2.0 * M_PI)) / (2.0 * std::log(10000.0));
  const std::vector<float> inv_freq = RopeInverseFrequencies(config, {});
  const double ramp = 1.0 / high;  // pair 1
  EXPECT_FLOAT_EQ(inv_freq[0], static_cast<float>(Plain(0)));
  EXPECT_FLOAT_EQ(inv_freq[1], static_cast<float>(Plain(1) / 4.0 * ramp + Plain(1) * (1 - ramp)));
  EXPECT_FLOAT_EQ(inv_freq[2], static_cast<float>(Plain(2) / 4.0));
}

TEST(RopeFrequenciesTest, LinearDividesEveryFrequency) {
  ModelConfig config = YarnConfig();
  config.rope_scaling = RopeScalingType::kLinear;
  const std::vector<float> inv_freq = RopeInverseFrequencies(config, {});
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(inv_freq[i], static_cast<float>(Plain(i) / 4.0));
}

}  // namespace
}  // namespace loom::common
