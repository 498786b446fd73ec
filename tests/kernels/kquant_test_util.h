#pragma once

// Random GGUF K-quant blocks for the kernel tests: random payload bytes (every q, scale and
// min pattern) with finite F16 super-block scales of both signs, in (-max_scale, max_scale)
// (a random model's layers want values near 1 / sqrt(columns): a smaller one).

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/formats/ggml_type.h"
#include "kernels/cpu/half.h"

namespace loom::kernels::cpu::testing_util {

inline std::vector<uint8_t> RandomKQuantBlocks(common::GgmlType type, int64_t num_elements,
                                               uint32_t seed, float max_scale = 0.02f) {
  using common::GgmlType;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(-max_scale, max_scale);
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t block_bytes = common::GetGgmlTypeTraits(static_cast<uint32_t>(type))->type_size;
  // Byte offsets of the F16 super-block scales (d, and dmin where the type has mins).
  std::vector<int> halves;
  switch (type) {
    case GgmlType::kQ2_K:
      halves = {80, 82};
      break;
    case GgmlType::kQ3_K:
      halves = {108};
      break;
    case GgmlType::kQ6_K:
      halves = {208};
      break;
    default:  // Q4_K, Q5_K
      halves = {0, 2};
      break;
  }
  std::vector<uint8_t> out(num_elements / 256 * block_bytes);
  for (size_t b = 0; b < out.size(); b += block_bytes) {
    for (int64_t i = 0; i < block_bytes; ++i) out[b + i] = static_cast<uint8_t>(byte(rng));
    for (int offset : halves) {
      const uint16_t half = FloatToHalf(scale(rng));
      std::memcpy(&out[b + offset], &half, 2);
    }
  }
  return out;
}

}  // namespace loom::kernels::cpu::testing_util
