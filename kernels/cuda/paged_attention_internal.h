#pragma once

// Internal to kernels/cuda: how paged decode maps query heads onto blocks, shared by the
// host-side checks (paged_attention.cc) and the launch (paged_attention.cu).

#include <cstdint>

namespace loom::kernels::cuda::internal {

/// Query heads one decode block computes (the compiled group tiles 1, 2, 4, 8).
inline int DecodeHeadsPerBlock(int64_t group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
}

/// Blocks per KV head: a group larger than the tile is split across blocks.
inline int64_t DecodeHeadChunks(int64_t group) {
  const int tile = DecodeHeadsPerBlock(group);
  return (group + tile - 1) / tile;
}

/// Bytes of workspace `num_splits` partitions need.
inline int64_t DecodeWorkspaceBytes(int64_t num_seqs, int64_t num_heads, int64_t head_dim,
                                    int64_t num_splits) {
  if (num_splits <= 1) return 0;
  // Per (sequence, head, split): head_dim partial sums, the running max and the sum.
  return num_seqs * num_heads * num_splits * (head_dim + 2) * static_cast<int64_t>(sizeof(float));
}

/// One tiling of the decode kernel: threads per block, tokens per subgroup per tile (passes)
/// and the depth of the cp.async ring. kDecodeTilings[0] is the one LaunchPagedDecode runs;
/// the others are its tuning space (LaunchPagedDecodeCandidate, `cuda_attention_bench
/// --sweep`). Passes stay even: an 8-bit tile row is half a 16-byte chunk per pass.
struct DecodeTiling {
  int threads;
  int passes;
  int stages;  // >= 3: a tile's slots are read one tile ahead (the 8-bit scales)
  const char* name;
};
inline constexpr DecodeTiling kDecodeTilings[] = {
    {128, 4, 4, "t128_p4_s4"}, {256, 2, 4, "t256_p2_s4"}, {256, 2, 6, "t256_p2_s6"},
    {128, 2, 6, "t128_p2_s6"}, {256, 4, 3, "t256_p4_s3"}, {128, 8, 3, "t128_p8_s3"},
    {512, 2, 3, "t512_p2_s3"}, {64, 4, 6, "t64_p4_s6"},
};
inline constexpr int kNumDecodeTilings = sizeof(kDecodeTilings) / sizeof(kDecodeTilings[0]);

/// The most multiprocessors PagedDecodeWorkspaceBytes provisions for (H100: 132, B200: 148).
inline constexpr int kMaxSmsForWorkspace = 256;
/// The most decode blocks the split heuristic counts resident on one multiprocessor (the
/// kernels' shared memory and registers allow 2-3 on Hopper); the workspace provisions
/// for it.
inline constexpr int kMaxResidentDecodeBlocks = 4;

}  // namespace loom::kernels::cuda::internal
