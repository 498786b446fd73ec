#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace loom::kernels::cpu {

/// SwiGLU: out[t, i] = silu(gate_up[t, i]) * gate_up[t, ffn + i], i < ffn.
/// gate_up: [num_tokens, 2 * ffn] (gate and up projections side by side); out: [num_tokens, ffn].
/// Runs on the calling thread (AVX-512, else AVX2, where the CPU and LOOM_CPU_ISA allow).
void SiluMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out);
/// The same, split over `pool`'s threads when num_tokens * ffn is large enough to pay for
/// the hand-off (small batches run on the calling thread). Not re-entrant on one pool.
void SiluMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out, ThreadPool& pool);
void SiluMulReference(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out);

/// GeGLU (Gemma): out[t, i] = gelu(gate_up[t, i]) * gate_up[t, ffn + i] with GELU's tanh
/// approximation, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). Scalar, split over
/// `pool` like SiluMul; a row's result does not depend on the split.
void GeluTanhMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out,
                 ThreadPool& pool);

/// OpenAI's clamped SwiGLU (gpt-oss's experts): with g = min(gate, limit) and
/// u = clamp(up, -limit, limit), out[t, i] = g * sigmoid(kSwigluOaiAlpha * g) * (u + 1), in
/// float with std::exp (llama.cpp's swiglu_oai). Scalar, split over `pool` like SiluMul.
inline constexpr float kSwigluOaiAlpha = 1.702f;
void SwigluOaiMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float limit, float* out,
                  ThreadPool& pool);

/// Soft-capping (Gemma 2's final logits): x[i] = cap * tanh(x[i] / cap), in place, for
/// cap > 0 (cap <= 0 leaves x as it is). Scalar, on the calling thread.
void SoftCap(float* x, int64_t n, float cap);

/// x[i] = factor * x[i], in place (Granite's residual and logit multipliers). Scalar, on the
/// calling thread (the compiler vectorizes it).
void Scale(float* x, int64_t n, float factor);

/// out[t, i] += s_t * x[t, i] for t < rows, i < cols, s_t = 1 / (1 + exp(-gate_logits[t]))
/// in float (Qwen2-MoE's gated shared expert joining the routed experts' sum), or s_t = 1
/// without gate logits (nullptr). Scalar, on the calling thread.
void AddSigmoidGatedRows(const float* x, const float* gate_logits, int64_t rows, int64_t cols,
                         float* out);

}  // namespace loom::kernels::cpu
