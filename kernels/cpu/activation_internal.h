#pragma once

// Internal to kernels/cpu: the per-ISA inner loops of SiluMul.

#include <cstdint>

namespace loom::kernels::cpu::internal {

/// out[i] = silu(gate[i]) * up[i] for i < count, silu(g) = g / (1 + e^-g).
void SiluMulSpanScalar(const float* gate, const float* up, int64_t count, float* out);
/// The same on AVX-512F; call only where IsaSupported(MatmulIsaChoice::kAvx512).
void SiluMulSpanAvx512(const float* gate, const float* up, int64_t count, float* out);

/// The same on AVX2 + FMA (e^x as accurate as the AVX-512 one); call only where
/// IsaSupported(MatmulIsaChoice::kAvx2).
void SiluMulSpanAvx2(const float* gate, const float* up, int64_t count, float* out);

/// Test hook: false forces the scalar span even where AVX2/AVX-512 is available.
void SetActivationSimdForTesting(bool enabled);

}  // namespace loom::kernels::cpu::internal
