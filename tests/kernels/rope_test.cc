#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace loom::kernels::cpu {
namespace {

// Tolerance: float cos/sin of the same float angle and one rotation in float:
// |out - ref| <= 1e-5 * (|x0| + |x1|) bounded by 1e-5 * 4 for unit-normal inputs.
constexpr double kTol = 4e-5;

TEST(RopeTest, MatchesReferenceForBothPairingsAndPartialRotation) {
  uint32_t seed = 1;
  for (bool neox : {false, true}) {
    for (auto [head_dim, rope_dim] : std::vector<std::pair<int64_t, int64_t>>{
             {64, 64}, {128, 128}, {64, 32}, {80, 80}}) {
      const int64_t tokens = 5, heads = 9, kv_heads = 3;
      std::mt19937 rng(++seed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> q(tokens * heads * head_dim), k(tokens * kv_heads * head_dim);
      for (float& v : q) v = normal(rng);
      for (float& v : k) v = normal(rng);
      std::vector<float> inv_freq(rope_dim / 2);
      for (int64_t i = 0; i < rope_dim / 2; ++i) {
        inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / rope_dim));
      }
      const std::vector<int32_t> positions = {0, 1, 17, 511, 8191};
      std::vector<float> q_ref = q, k_ref = k;
      RopeParams p;
      p.positions = positions.data();
      p.inv_freq = inv_freq.data();
      p.num_tokens = tokens;
      p.num_heads = heads;
      p.num_kv_heads = kv_heads;
      p.head_dim = head_dim;
      p.rope_dim = rope_dim;
      p.neox = neox;
      RopeParams ref = p;
      p.q = q.data();
      p.k = k.data();
      ref.q = q_ref.data();
      ref.k = k_ref.data();
      const std::vector<float> q_in = q;
      Rope(p);
      RopeReference(ref);
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_TRUE(std::isfinite(q[i]));
        ASSERT_NEAR(q[i], q_ref[i], kTol) << "neox " << neox << " q " << i;
      }
      for (size_t i = 0; i < k.size(); ++i) ASSERT_NEAR(k[i], k_ref[i], kTol) << "k " << i;
      // Position 0 is the identity; dims past rope_dim pass through untouched.
      for (int64_t i = 0; i < heads * head_dim; ++i) EXPECT_FLOAT_EQ(q[i], q_in[i]);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t d = rope_dim; d < head_dim; ++d) {
            const int64_t i = (t * heads + h) * head_dim + d;
            EXPECT_EQ(q[i], q_in[i]);
          }
        }
      }
      // A rotation preserves each pair's norm; the pairing decides which pairs.
      const int64_t t = 3, h = 2, half = rope_dim / 2;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = (t * heads + h) * head_dim + (neox ? i : 2 * i);
        const int64_t b = (t * heads + h) * head_dim + (neox ? i + half : 2 * i + 1);
        EXPECT_NEAR(std::hypot(q[a], q[b]), std::hypot(q_in[a], q_in[b]), 1e-5);
      }
    }
  }
}

// YaRN's attention factor scales every rotated value (cos and sin alike) and leaves the
// pass-through dims alone.
TEST(RopeTest, AttentionFactorScalesRotatedDimsOnly) {
  const int64_t heads = 3, head_dim = 64, rope_dim = 32;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(heads * head_dim);
  for (float& v : q) v = normal(rng);
  std::vector<float> inv_freq(rope_dim / 2);
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / rope_dim));
  }
  const int32_t position = 1234;
  std::vector<float> plain = q, scaled = q;
  RopeParams p;
  p.positions = &position;
  p.inv_freq = inv_freq.data();
  p.num_tokens = 1;
  p.num_heads = heads;
  p.head_dim = head_dim;
  p.rope_dim = rope_dim;
  p.neox = true;
  p.q = plain.data();
  Rope(p);
  p.q = scaled.data();
  p.attention_factor = 1.25f;
  Rope(p);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t d = 0; d < head_dim; ++d) {
      const int64_t i = h * head_dim + d;
      if (d < rope_dim) {
        ASSERT_NEAR(scaled[i], 1.25f * plain[i], 1e-5f) << i;
      } else {
        ASSERT_EQ(scaled[i], q[i]) << i;
      }
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
