#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace loom::kernels::cpu {
namespace {

// Rotates every head of one token: pairs (first[i], second[i]) for i < rope_dim / 2.
template <typename Real>
void RotateHeads(float* heads, int64_t num_heads, int64_t head_dim, int64_t half, bool neox,
                 const Real* cosines, const Real* sines) {
  for (int64_t h = 0; h < num_heads; ++h) {
    float* v = heads + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = neox ? i : 2 * i;
      const int64_t b = neox ? i + half : 2 * i + 1;
      const Real x0 = v[a], x1 = v[b];
      v[a] = static_cast<float>(x0 * cosines[i] - x1 * sines[i]);
      v[b] = static_cast<float>(x0 * sines[i] + x1 * cosines[i]);
    }
  }
}

template <typename Real>
void RopeImpl(const RopeParams& p) {
  const int64_t half = p.rope_dim / 2;
  std::vector<Real> cosines(half), sines(half);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    // The angle is the float product pos * inv_freq (as HF and llama.cpp compute it);
    // only its cosine and sine differ in precision between the kernel and the reference.
    const float position = static_cast<float>(p.positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = position * p.inv_freq[i];
      cosines[i] = std::cos(static_cast<Real>(angle)) * static_cast<Real>(p.attention_factor);
      sines[i] = std::sin(static_cast<Real>(angle)) * static_cast<Real>(p.attention_factor);
    }
    RotateHeads(p.q + t * p.num_heads * p.head_dim, p.num_heads, p.head_dim, half, p.neox,
                cosines.data(), sines.data());
    if (p.k == nullptr) continue;
    RotateHeads(p.k + t * p.num_kv_heads * p.head_dim, p.num_kv_heads, p.head_dim, half, p.neox,
                cosines.data(), sines.data());
  }
}

}  // namespace

void Rope(const RopeParams& params) { RopeImpl<float>(params); }

void RopeReference(const RopeParams& params) { RopeImpl<double>(params); }

}  // namespace loom::kernels::cpu
