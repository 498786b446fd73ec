#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

/// Rotary position embedding applied in place to Q and K.
struct RopeParams {
  float* q = nullptr;              // [num_tokens, num_heads, head_dim]
  float* k = nullptr;              // [num_tokens, num_kv_heads, head_dim] or nullptr (Q only)
  const int32_t* positions = nullptr;  // [num_tokens]
  const float* inv_freq = nullptr; // [rope_dim / 2], scaling (linear, llama3) already applied
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;            // rotated dims (<= head_dim), the rest pass through
  bool neox = false;               // false: pairs (2i, 2i+1) (GGUF llama); true: (i, i + rope_dim/2) (qwen2)
  float attention_factor = 1.0f;   // multiplies cos and sin (YaRN's attention scaling); > 0
};

void Rope(const RopeParams& params);
void RopeReference(const RopeParams& params);

}  // namespace loom::kernels::cpu
