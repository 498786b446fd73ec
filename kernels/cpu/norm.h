#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

/// out[t] = x[t] / sqrt(mean(x[t]²) + eps) * weight, for t in [0, num_tokens).
/// x, out: [num_tokens, hidden] (may alias); weight: [hidden].
void RmsNorm(const float* x, const float* weight, float eps, int64_t num_tokens,
             int64_t hidden, float* out);

/// Fused residual add + RMSNorm: residual += x, then out = RmsNorm(residual).
/// residual, x, out: [num_tokens, hidden].
void AddRmsNorm(float* residual, const float* x, const float* weight, float eps,
                int64_t num_tokens, int64_t hidden, float* out);

/// Scalar references (double accumulation).
void RmsNormReference(const float* x, const float* weight, float eps, int64_t num_tokens,
                      int64_t hidden, float* out);

}  // namespace loom::kernels::cpu
