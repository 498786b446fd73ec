#pragma once

// Internal to kernels/cuda: the quantized GEMM's tile configurations, shared by the host side
// (dispatch, split-K heuristic, workspace size) and the kernels (quantized_gemm.cuh).

#include <cstddef>
#include <cstdint>

namespace loom::kernels::cuda::internal {

/// One member of the kernel family. Warps form a (warps_k, warps_m, warps_n) grid: each computes
/// frags_n 16-row weight tiles x tiles_m 8-token tiles over its 64-column slice of every pipeline
/// step; warps_k > 1 splits each step along K inside the block (GEMV-like, summed through shared
/// memory at the end).
struct QuantGemmConfig {
  int max_m;    // the dispatcher takes the first config whose max_m >= m
  int tiles_m;  // 8-token mma tiles per warp
  int warps_m;
  int warps_n;
  int frags_n;  // 16-row weight tiles per warp
  int warps_k;
  int target_blocks_per_sm;  // split-K aims for this many blocks per multiprocessor
  const char* name;

  constexpr int threads() const { return 32 * warps_m * warps_n * warps_k; }
  constexpr int block_m() const { return 8 * tiles_m * warps_m; }
  constexpr int row_tiles() const { return frags_n * warps_n; }  // 16-row tiles per block
  constexpr int block_n() const { return 16 * row_tiles(); }
  constexpr int step_k() const { return 64 * warps_k; }
};

/// The dispatch table, by m. Small m is weight-bandwidth bound: wide blocks along N, K split across
/// warps and across blocks. Large m tiles 64 weight rows x 128 tokens.
inline constexpr QuantGemmConfig kQuantGemmConfigs[] = {
    // max_m tiles_m warps_m warps_n frags_n warps_k target name
    {8, 1, 1, 4, 2, 2, 2, "gemv_m8"},
    {16, 2, 1, 4, 2, 2, 2, "gemv_m16"},
    {64, 4, 2, 2, 2, 1, 1, "tile_m64"},
    {256, 8, 2, 2, 2, 1, 1, "tile_m128"},
};
inline constexpr int kNumQuantGemmConfigs = 4;

/// Pipeline stages (cp.async ring) of every config: one fewer for a member whose four would
/// not fit sm_86's shared memory (qgemm::Shape::kStages).
inline constexpr int kQuantGemmStages = 4;
/// Split-K never makes a split shorter than this many pipeline steps.
inline constexpr int kQuantGemmMinStepsPerSplit = 4;
/// The workspace is sized for GPUs of up to this many multiprocessors.
inline constexpr int kQuantGemmMaxSmsForWorkspace = 256;

/// cuBLASLt scratch inside the FP8 GEMM's workspace (after the F32 results).
inline constexpr size_t kFp8LtWorkspaceBytes = size_t{8} << 20;

/// Index into kQuantGemmConfigs for m in [1, 256].
constexpr int QuantGemmConfigIndex(int64_t m) {
  for (int i = 0; i < kNumQuantGemmConfigs; ++i) {
    if (m <= kQuantGemmConfigs[i].max_m) return i;
  }
  return kNumQuantGemmConfigs - 1;
}

}  // namespace loom::kernels::cuda::internal
