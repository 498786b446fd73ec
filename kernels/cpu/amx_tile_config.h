#pragma once

// The operand of AMX's LDTILECFG (palette 1): rows and bytes per row of each of the eight
// tile registers, and LoadTileConfig to load it (no intrinsics, so any file may include this):
// the AMX GEMMs (matmul_int8act_gemm_amx.cc, matmul_bf16act_amx.cc) and the bench's AMX peak
// loops (bench/machine_limits.cc) fill and load it.

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

/// Every tile at its largest, 16 rows of 64 bytes: the BF16 GEMM's and the peak loops'.
inline AmxTileConfig FullTileConfig() {
  AmxTileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  return config;
}

/// LDTILECFG of `config`, as inline assembly with the whole struct as a memory input. GCC 12's
/// _tile_loadconfig declares only the operand's first 8 bytes as read (an "m" of a pointer):
/// in the bench's peak loop, once its setup moved into a function of its own, -O2 dropped the
/// stores of the rows and column widths as dead, and LDTILECFG faulted on the uninitialized
/// rest. The kernels' configurations happened to survive; this keeps every store.
inline void LoadTileConfig(const AmxTileConfig& config) {
  asm volatile("ldtilecfg %0" : : "m"(config));
}

}  // namespace loom::kernels::cpu
