#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

/// SwiGLU: out[t, i] = silu(gate_up[t, i]) * gate_up[t, ffn + i], i < ffn.
/// gate_up: [num_tokens, 2 * ffn] (gate and up projections side by side); out: [num_tokens, ffn].
void SiluMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out);
void SiluMulReference(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out);

}  // namespace loom::kernels::cpu
