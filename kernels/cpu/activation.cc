#include "kernels/cpu/activation.h"

#include <cmath>

namespace loom::kernels::cpu {

void SiluMul(const float* gate_up, int64_t num_tokens, int64_t ffn, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* gate = gate_up + t * 2 * ffn;
    const float* up = gate + ffn;
    float* dst = out + t * ffn;
    for (int64_t i = 0; i < ffn; ++i) {
      const float g = gate[i];
      dst[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
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

}  // namespace loom::kernels::cpu
