#include "kernels/cpu/activation.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/cpu/activation_internal.h"
#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu {
namespace {

std::atomic<bool> activation_simd{true};

// Below this many outputs SiluMul(..., pool) stays on the calling thread: the vector loop
// takes about a nanosecond per 8 outputs, so waking the pool would cost more than it saves.
constexpr int64_t kMinParallelElements = 64 * 1024;

using SpanFn = void (*)(const float*, const float*, int64_t, float*);

SpanFn ActiveSpan() {
  static const bool avx512 = internal::IsaSupported(internal::MatmulIsaChoice::kAvx512);
  static const bool avx2 = internal::IsaSupported(internal::MatmulIsaChoice::kAvx2);
  if (!activation_simd.load(std::memory_order_relaxed)) return internal::SiluMulSpanScalar;
  return avx512 ? internal::SiluMulSpanAvx512
         : avx2 ? internal::SiluMulSpanAvx2
                : internal::SiluMulSpanScalar;
}

// Outputs [begin, end) of the flattened [num_tokens, ffn] result, row segment by row segment.
void SiluMulRange(SpanFn span, const float* gate_up, int64_t ffn, int64_t begin, int64_t end,
                  float* out) {
  while (begin < end) {
    const int64_t t = begin / ffn, i = begin % ffn;
    const int64_t count = std::min(ffn - i, end - begin);
    const float* gate = gate_up + t * 2 * ffn + i;
    span(gate, gate + ffn, count, out + t * ffn + i);
    begin += count;
  }
}

}  // namespace

namespace internal {

void SetActivationSimdForTesting(bool enabled) { activation_simd.store(enabled); }

void SiluMulSpanScalar(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace internal

void SiluMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out) {
  if (num_tokens <= 0 || ffn <= 0) return;
  SiluMulRange(ActiveSpan(), gate_up, ffn, 0, num_tokens * ffn, out);
}

void SiluMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out, ThreadPool& pool) {
  if (num_tokens <= 0 || ffn <= 0) return;
  const int64_t total = num_tokens * ffn;
  const SpanFn span = ActiveSpan();
  if (total < kMinParallelElements || pool.num_threads() == 1) {
    SiluMulRange(span, gate_up, ffn, 0, total, out);
    return;
  }
  pool.ParallelFor(total, kMinParallelElements / 2, [&](int64_t begin, int64_t end) {
    SiluMulRange(span, gate_up, ffn, begin, end, out);
  });
}

void SiluMulReference(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < ffn; ++i) {
      const double g = gate_up[t * 2 * ffn + i];
      const double up = gate_up[t * 2 * ffn + ffn + i];
      out[t * ffn + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up);
    }
  }
}

namespace {

// out[t, i] = gated(gate, up) of gate_up's row t, scalar, split over `pool` when large.
template <typename Gated>
void MapGated(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out, ThreadPool& pool,
              Gated gated) {
  if (num_tokens <= 0 || ffn <= 0) return;
  // Element e of the [num_tokens, ffn] output: row e / ffn, channel e % ffn.
  auto range = [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      const int64_t t = e / ffn, i = e % ffn;
      out[e] = gated(gate_up[t * 2 * ffn + i], gate_up[t * 2 * ffn + ffn + i]);
    }
  };
  const int64_t total = num_tokens * ffn;
  if (total < kMinParallelElements || pool.num_threads() == 1) {
    range(0, total);
    return;
  }
  pool.ParallelFor(total, kMinParallelElements / 2, range);
}

}  // namespace

void GeluTanhMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out,
                 ThreadPool& pool) {
  MapGated(gate_up, num_tokens, ffn, out, pool, [](float g, float up) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up;
  });
}

void SwigluOaiMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float limit, float* out,
                  ThreadPool& pool) {
  MapGated(gate_up, num_tokens, ffn, out, pool, [limit](float gate, float up) {
    const float g = std::min(gate, limit);
    const float u = std::clamp(up, -limit, limit);
    return g / (1.0f + std::exp(-kSwigluOaiAlpha * g)) * (u + 1.0f);
  });
}

void SoftCap(float* x, int64_t n, float cap) {
  if (!(cap > 0.0f)) return;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void Scale(float* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void AddSigmoidGatedRows(const float* x, const float* gate_logits, int64_t rows, int64_t cols,
                         float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float s = gate_logits == nullptr ? 1.0f : 1.0f / (1.0f + std::exp(-gate_logits[t]));
    const float* row = x + t * cols;
    float* dst = out + t * cols;
    for (int64_t i = 0; i < cols; ++i) dst[i] += s * row[i];
  }
}

}  // namespace loom::kernels::cpu
