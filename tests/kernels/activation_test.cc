#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace loom::kernels::cpu {
namespace {

// Tolerance: |out - ref| <= 2e-6 * |ref| + 1e-7 (float exp and two roundings).
TEST(ActivationTest, SiluMulMatchesReferenceOverShapes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int64_t ffn : {1, 5, 64, 1536, 8193}) {
    for (int64_t tokens : {1, 3, 17}) {
      std::vector<float> gate_up(tokens * 2 * ffn);
      for (float& v : gate_up) v = normal(rng);
      gate_up[0] = -90.0f;  // exp overflow side: silu -> -0
      std::vector<float> got(tokens * ffn), want(tokens * ffn);
      SiluMul(gate_up.data(), tokens, ffn, got.data());
      SiluMulReference(gate_up.data(), tokens, ffn, want.data());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << i;
        ASSERT_NEAR(got[i], want[i], 2e-6 * std::fabs(want[i]) + 1e-7) << "ffn " << ffn << " i " << i;
      }
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
