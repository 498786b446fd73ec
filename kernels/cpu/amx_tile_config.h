#pragma once

// The operand of AMX's LDTILECFG (palette 1): rows and bytes per row of each of the eight
// tile registers. Plain data, no intrinsics: the AMX GEMM (matmul_int8act_gemm_amx.cc) and
// the bench's AMX peak loop (bench/machine_limits.cc) fill it.

#include <cstdint>

namespace loom::kernels::cpu {

struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64);

}  // namespace loom::kernels::cpu
