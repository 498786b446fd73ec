#pragma once

// Internal to kernels/cuda: the quantized GEMM's tile configurations, shared by the host side
// (dispatch, split-K heuristic, workspace size) and the kernels (quantized_gemm.cuh).

#include <cstddef>
#include <cstdint>
#include <iterator>

#include "absl/status/statusor.h"
#include "kernels/cuda/quantized_gemm.h"

namespace loom::kernels::cuda::internal {

/// One member of the kernel family. Warps form a (warps_k, warps_m, warps_n) grid: each computes
/// frags_n 16-row weight tiles x tiles_m 8-token tiles over its 64-column slice of every pipeline
/// step; warps_k > 1 splits each step along K inside the block (GEMV-like, summed through shared
/// memory at the end).
///
/// A `direct` member stages nothing: each lane loads its A fragments straight from global memory
/// into registers (the device layout is already in fragment order, 16 bytes per lane per 64-column
/// chunk), `stages` chunks per warp in flight, and the activations (the B operand) from L1; the
/// block's warps_k warps take interleaved chunks of one step_k-wide step and meet in shared memory
/// at the end, as the staged members' do. No __syncthreads in the main loop; for small m, where
/// the weights are the traffic. warps_m and warps_n are 1.
struct QuantGemmConfig {
  int tiles_m;  // 8-token mma tiles per warp
  int warps_m;
  int warps_n;
  int frags_n;  // 16-row weight tiles per warp
  int warps_k;
  int target_blocks_per_sm;  // split-K aims for this many blocks per multiprocessor
  const char* name;
  int stages = 0;       // the cp.async ring's depth; 0: kQuantGemmStages (3 where 4 do not fit);
                        // direct: the chunks each warp has in flight
  bool direct = false;  // weights straight to registers (above)

  constexpr int threads() const { return 32 * warps_m * warps_n * warps_k; }
  constexpr int block_m() const { return 8 * tiles_m * warps_m; }
  constexpr int row_tiles() const { return frags_n * warps_n; }  // 16-row tiles per block
  constexpr int block_n() const { return 16 * row_tiles(); }
  constexpr int step_k() const { return 64 * warps_k; }
};

/// The dispatch table's members. Small m is weight-bandwidth bound: wide blocks along N, K split
/// across warps and across blocks. From m = 17 the members are the winners of
/// `quantized_gemm_bench --sweep` on an H200 (bench/results/gpu/2026-12-04-h200-s28-sweep: the
/// geometric mean over Llama-3-8B's three shapes in W4A16 and W8A16, against the table before
/// it): 17-32 tokens 2.1x, 33-64 1.26x, 65-128 1.09x, 129-256 1.40x; and, for INT4 at 9-16
/// tokens, gemv_m16_n256 (1.23x over the three shapes: 11.9 + 26.8 + 23.2 us against
/// 11.1 + 31.2 + 33.2). Every member but gemv_m16_n256 fits the 99 KiB of sm_86 in every
/// format (the K-quants' F32 scales and mins in groups of 16 included); it fits INT4's.
inline constexpr QuantGemmConfig kQuantGemmConfigs[] = {
    // tiles_m warps_m warps_n frags_n warps_k target name
    {1, 1, 4, 2, 2, 2, "gemv_m8"},       {2, 1, 4, 2, 2, 2, "gemv_m16"},
    {4, 1, 4, 2, 2, 2, "tile_m32"},       // 32 tokens x 128 features, K 128 in two warps
    {4, 2, 2, 2, 2, 1, "tile_m64"},       // 64 x 64, K 128 in two warps
    {8, 1, 4, 2, 1, 1, "tile_m64_n128"},  // 64 x 128, one warp per 32 features
    {2, 1, 4, 4, 2, 2, "gemv_m16_n256"},  // 16 x 256, K 128 in two warps: INT4 only
};
inline constexpr int kNumQuantGemmConfigs = 6;
/// The member only INT4 takes (its INT8 stages pass 99 KiB).
inline constexpr int kQuantGemmInt4OnlyConfig = 5;

/// The member each range of m takes: the first whose max_m >= m.
struct QuantGemmRange {
  int max_m;
  int config;
};
inline constexpr QuantGemmRange kQuantGemmRanges[] = {
    {8, 0}, {16, 1}, {32, 2}, {64, 3}, {128, 4}, {256, 3},
};
/// INT4's: 9-16 tokens on the 256-wide gemv.
inline constexpr QuantGemmRange kQuantGemmInt4Ranges[] = {
    {8, 0}, {16, 5}, {32, 2}, {64, 3}, {128, 4}, {256, 3},
};

/// Pipeline stages (cp.async ring) of every config: one fewer for a member whose four would
/// not fit sm_86's shared memory (qgemm::Shape::kStages).
inline constexpr int kQuantGemmStages = 4;
/// Split-K never makes a split shorter than this many pipeline steps.
inline constexpr int kQuantGemmMinStepsPerSplit = 4;
/// The workspace is sized for GPUs of up to this many multiprocessors.
inline constexpr int kQuantGemmMaxSmsForWorkspace = 256;

/// cuBLASLt scratch inside the FP8 GEMM's workspace (after the F32 results).
inline constexpr size_t kFp8LtWorkspaceBytes = size_t{8} << 20;

/// The tuning space beyond the dispatch table (the table's members left out: tile_m32 was
/// c_m32_n128_k128, tile_m64 c_m64_n64_k128, tile_m64_n128 c_m64_n128_w4, gemv_m16_n256
/// c_m16_n256_k128): members that
/// `quantized_gemm_bench --sweep` times against the table's at every m (LaunchQuantGemmCandidate;
/// INT4 in groups of 128 and INT8 per channel, F16 activations only, to keep the build small). A
/// candidate that wins a range of m on a lent GPU moves into kQuantGemmConfigs (if it fits every
/// format there).
inline constexpr QuantGemmConfig kQuantGemmCandidates[] = {
    // tiles_m warps_m warps_n frags_n warps_k target name
    {1, 1, 2, 2, 4, 2, "c_m8_n64_k256"},
    {1, 1, 4, 1, 4, 2, "c_m8_n64_k256_w16"},
    {1, 1, 4, 4, 2, 2, "c_m8_n256_k128"},
    {2, 1, 2, 2, 4, 2, "c_m16_n64_k256"},
    {4, 1, 4, 4, 2, 1, "c_m32_n256_k128"},
    {4, 2, 4, 2, 1, 1, "c_m64_n128_w8"},
    {4, 2, 2, 4, 1, 1, "c_m64_n128_f4"},
    {8, 1, 4, 2, 2, 1, "c_m64_n128_k128"},
    {4, 2, 4, 4, 1, 1, "c_m64_n256"},
    {8, 2, 4, 2, 1, 1, "c_m128_n128_w8"},
    {8, 2, 2, 4, 1, 1, "c_m128_n128_f4"},
    {4, 4, 2, 2, 1, 1, "c_m128_n64_w8"},
    {8, 2, 4, 4, 1, 1, "c_m128_n256"},
    // Deeper rings for the weight-bandwidth-bound small m: the table's gemv members and
    // tile_m32 with 6 or 8 stages (INT4 only where INT8's would pass 99 KiB).
    {1, 1, 4, 2, 2, 2, "gemv_m8_s6", 6},
    {1, 1, 4, 2, 2, 2, "gemv_m8_s8", 8},
    {1, 1, 4, 2, 2, 4, "gemv_m8_s6_t4", 6},
    {2, 1, 4, 2, 2, 2, "gemv_m16_s6", 6},
    {1, 1, 4, 4, 2, 2, "c_m8_n256_k128_s5", 5},
    {4, 1, 4, 2, 2, 2, "tile_m32_s6", 6},
    // Direct members (no shared-memory staging of the weights): one 16-row tile per warp (two
    // with _f2, sharing the activation loads), warps_k warps per block on one tile, `stages`
    // chunks in flight per warp. Their shape at m = 1: 4096 x 4096 in W4A16 is 256 row tiles x 64
    // chunks, so 8 warps x 2 splits give each warp 4 chunks.
    {1, 1, 1, 1, 8, 4, "d_m8_w8_u4", 4, true},
    {1, 1, 1, 1, 8, 4, "d_m8_w8_u8", 8, true},
    {1, 1, 1, 1, 4, 8, "d_m8_w4_u8", 8, true},
    {1, 1, 1, 2, 4, 4, "d_m8_f2_w4_u4", 4, true},
    {2, 1, 1, 1, 8, 4, "d_m16_w8_u4", 4, true},
    {2, 1, 1, 2, 4, 4, "d_m16_f2_w4_u4", 4, true},
};
inline constexpr int kNumQuantGemmCandidates =
    sizeof(kQuantGemmCandidates) / sizeof(kQuantGemmCandidates[0]);
/// A kernel's config index: below kQuantGemmCandidateBase the dispatch table's, from it the
/// candidates'.
inline constexpr int kQuantGemmCandidateBase = 100;

constexpr const QuantGemmConfig& QuantGemmConfigAt(int index) {
  return index < kQuantGemmCandidateBase ? kQuantGemmConfigs[index]
                                         : kQuantGemmCandidates[index - kQuantGemmCandidateBase];
}

/// Split-K partitions for config `c` (ChooseQuantGemmSplits for the dispatch table's member).
int QuantGemmSplitsFor(const QuantGemmConfig& c, int64_t m, int64_t n, int64_t k, int num_sms);

/// Output tiles (blocks of one split) config `c` covers m x n with.
int64_t QuantGemmTiles(const QuantGemmConfig& c, int64_t m, int64_t n);

/// The splits a launch of checked params with config `c` runs (params.num_splits, else
/// QuantGemmSplitsFor on the current device), checked against the workspace and, when given,
/// the counters: InvalidArgument naming what is short.
absl::StatusOr<int> PlanQuantGemmSplits(const QuantGemmParams& params, const QuantGemmConfig& c);

/// Index into kQuantGemmConfigs for m in [1, 256] (INT4's ranges with int4).
constexpr int QuantGemmConfigIndex(int64_t m, bool int4) {
  const auto& ranges = int4 ? kQuantGemmInt4Ranges : kQuantGemmRanges;
  for (const QuantGemmRange& range : ranges) {
    if (m <= range.max_m) return range.config;
  }
  return ranges[std::size(ranges) - 1].config;
}

}  // namespace loom::kernels::cuda::internal
