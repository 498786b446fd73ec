#pragma once

// Internal to kernels/cuda (prefill_attention.cu, prefill_attention_candidates.cu): the paged
// prefill kernel as a template over its tiling, and its launch.
//
// Paged prefill attention, FlashAttention-2 style on mma.sync tensor cores.
//
// Block (q tile, kv_head, seq), 128 threads = 4 warps in the dispatched tiling (Tiling below;
// the tuning space of prefill_attention_candidates.h varies the warps, the M-tiles per warp
// and the KV tile). A sequence's query rows for one KV head are the packed pairs (token, head
// of the group): row r is token r / group, query head kv_head * group + r % group. A block
// owns Tile::kRows rows: 128 at head dims 64 and 128,
// where each warp computes two M-tiles of 16 rows (warp w: rows 16w .. 16w + 15 and
// 64 + 16w .. 64 + 16w + 15), so every K and V fragment it loads from shared memory feeds
// two MMAs; 64 at head dim 256 (one M-tile per warp). The block walks the KV positions
// [0, last row's position] (with a sliding window from the first row's window start) in
// tiles of kBlockN tokens (64 at head dim 64, 32 from 128 on). Each tile's rows are
// resolved through the block table once (one thread per row, the entry loaded two tiles
// ahead and turned into a slot while the tile before computes) and gathered with cp.async
// into shared memory, double-buffered (tile j + 1 loads while tile j computes). Per tile a
// warp computes S = Q K^T with mma.sync m16n8k16 (Q's fragments from shared memory at
// each k-step), soft-caps it when asked, applies the causal (and window) mask, updates the
// online softmax in registers and adds P V (head_dim columns) with P taken straight from
// the S accumulators. An attention sink joins each row's denominator in the epilogue only.
//
// Fragment layouts relied on (PTX ISA, "Warp Level Matrix Multiply-Accumulate
// Instructions" > mma.m16n8k16 > "Matrix Fragments for mma.m16n8k16 with floating point
// type", and "ldmatrix"), with g = lane / 4 (groupID) and t = lane % 4
// (threadID_in_group):
//   A (16 x 16, .row), 4 x b32: a0 = (row g, cols 2t, 2t+1), a1 = (row g+8, cols 2t, 2t+1),
//                               a2 = (row g, cols 2t+8, 2t+9), a3 = (row g+8, cols 2t+8, 2t+9)
//   B (16 x 8, .col), 2 x b32:  b0 = (rows k = 2t, 2t+1; col n = g), b1 = (k = 2t+8, 2t+9; n = g)
//   C/D (16 x 8, f32), 4 x f32: c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, same cols)
//   In a b32 pair the lower-indexed element sits in the low 16 bits.
//   ldmatrix .x4: lanes 8i .. 8i+7 give the addresses of matrix i's eight 16-byte rows;
//   register i of lane l receives matrix i's (row l / 4, cols 2(l%4), 2(l%4)+1), or with
//   .trans its (rows 2(l%4), 2(l%4)+1; col l / 4).
// Hence: Q (row-major [row][dim]) loads as A with ldmatrix; K (row-major [token][dim]) is
// B = K^T in .col form and loads with plain ldmatrix; V (row-major [token][dim]) is B in
// .row form and loads with ldmatrix.trans; the S accumulators of n-tiles 2k and 2k+1,
// packed in pairs, are exactly the A fragment of the P V product's k-step k.
//
// Shared rows are padded by 8 elements (16 bytes), so the eight rows one ldmatrix matrix
// reads fall into eight different 16-byte bank groups (no bank conflicts).
//
// An 8-bit cache (Code int8_t or uint8_t) is read with plain loads instead of cp.async:
// each thread decodes 8 codes times the row's scale into T and stores them, so the tile
// in shared memory is what an F16/BF16 cache would hold (the next tile's loads do not
// overlap this tile's math then). The caller rotates query and output (kv_cache.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/status_macros.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/mma_internal.cuh"
#include "kernels/cuda/prefill_attention.h"

namespace loom::kernels::cuda::internal::prefill {

using internal::CopyAsync16;
using internal::CopyAsyncCommit;
using internal::CopyAsyncWait;
using internal::FromFloat;
using internal::LoadMatrixX4;
using internal::LoadMatrixX4Trans;
using internal::Mma;
using internal::PackPair;
using internal::RoundThrough;

// The most blocks per (KV head, sequence) along the query tiles; more tiles loop.
inline constexpr int64_t kMaxTileBlocks = 1 << 20;

/// A block's tiling: kWarpsT warps, each computing kMTilesT M-tiles of 16 query rows (every K
/// and V fragment a warp loads from shared memory feeds kMTilesT MMAs), over KV tiles of
/// kKvTileT tokens staged in shared memory, double-buffered; kMinBlocksT blocks a
/// multiprocessor asked of the register allocator (__launch_bounds__).
template <int kWarpsT, int kMTilesT, int kKvTileT, int kMinBlocksT = 0>
struct Tiling {
  static constexpr int kWarps = kWarpsT;
  static constexpr int kMinBlocks = kMinBlocksT;
  static constexpr int kThreads = 32 * kWarpsT;
  static constexpr int kMTiles = kMTilesT;
  static constexpr int kKvTile = kKvTileT;
  static constexpr int kRows = kWarpsT * 16 * kMTilesT;  // query rows per block
};

/// The dispatched tiling: 4 warps; two M-tiles at head dims 64 and 128, one at 256, where two
/// tiles' output accumulators would not fit in registers; KV tiles of 64 tokens, half from head
/// dim 128 on, so that the score registers make room for the output accumulators (two M-tiles
/// at 128: 64 tokens spilled 152 bytes on sm_90a; one at 256) and the tiles fit in shared
/// memory (at 256: 99 KiB instead of 165).
template <int kHeadDim>
using DispatchedTiling = Tiling<4, (kHeadDim > 128 ? 1 : 2),
                                (kHeadDim >= 128 ? kPagedPrefillKvTile / 2 : kPagedPrefillKvTile)>;
static_assert(kPagedPrefillRowsPerBlock == DispatchedTiling<128>::kRows,
              "the header's rows per block");

/// Shared memory per block: Q tile + two K and two V tiles, rows of kHeadDim + 8 elements.
/// Dispatched: head dim 128: 68 KiB; 64: 54 KiB; 256: 99 KiB (the most sm_86 and sm_89 allow a
/// block). At 255 registers (head dim 128) two blocks fit a multiprocessor.
template <int kHeadDim, typename Tile>
constexpr size_t SharedBytes() {
  return static_cast<size_t>(Tile::kRows + 4 * Tile::kKvTile) * (kHeadDim + 8) * 2;
}

struct PrefillArgs {
  const void* q;
  void* out;
  const void* k_cache;
  const void* v_cache;
  const int32_t* query_start;
  const int32_t* context_len;
  const int32_t* block_indptr;
  const int32_t* block_indices;
  const uint16_t* k_scale;  // 8-bit caches: [slots, num_kv_heads] BF16 bits
  const uint16_t* v_scale;
  int64_t q_stride;  // elements between tokens' q rows
  int num_heads;
  int num_kv_heads;
  int group;  // num_heads / num_kv_heads
  int block_size;
  int num_blocks;
  int window;        // > 0: a query attends to its last `window` positions only
  float scale_log2;  // scale * log2(e): the softmax runs in base 2
  // > 0: soft-capped scores, softcap * tanh(scale * s / softcap), in base 2 as
  // softcap_log2 * tanh(s * scale_over_softcap).
  float softcap_log2;
  float scale_over_softcap;
};

// Eight codes of one row times its scale (and the codes' decode factor), as 8 T in 16 bytes.
template <typename T, typename Code>
__device__ __forceinline__ uint4 DequantizeChunk(const Code* codes, float scale) {
  float values[8];
  internal::LoadCodes8(codes, values);
  const float factor = scale * internal::kKvDecodeFactor<Code>;
  return make_uint4(PackPair<T>(values[0] * factor, values[1] * factor),
                    PackPair<T>(values[2] * factor, values[3] * factor),
                    PackPair<T>(values[4] * factor, values[5] * factor),
                    PackPair<T>(values[6] * factor, values[7] * factor));
}

// The kernel's arguments from checked params.
inline PrefillArgs MakePrefillArgs(const PagedPrefillParams& p) {
  PrefillArgs args{};
  args.q = p.q;
  args.out = p.out;
  args.k_cache = p.cache.k;
  args.v_cache = p.cache.v;
  args.query_start = p.query_start;
  args.context_len = p.context_len;
  args.block_indptr = p.block_indptr;
  args.block_indices = p.block_indices;
  args.k_scale = p.cache.k_scale;
  args.v_scale = p.cache.v_scale;
  args.q_stride = p.q_stride != 0 ? p.q_stride : p.num_heads * p.cache.head_dim;
  args.num_heads = static_cast<int>(p.num_heads);
  args.num_kv_heads = static_cast<int>(p.cache.num_kv_heads);
  args.group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  args.block_size = static_cast<int>(std::min<int64_t>(p.cache.block_size, 0x7fffffff));
  args.num_blocks = static_cast<int>(std::min<int64_t>(p.cache.num_blocks, 0x7fffffff));
  args.window = static_cast<int>(p.window);
  args.scale_log2 = p.scale * kLog2E;
  if (p.softcap > 0.0f) {
    args.softcap_log2 = p.softcap * kLog2E;
    args.scale_over_softcap = p.scale / p.softcap;
  }
  return args;
}

// `sinks`: [num_heads] attention sinks (natural log) or null. A parameter of its own: a
// field in PrefillArgs changed ptxas's register allocation of the KV loop at head dim 128
// (more spills on sm_90a, sinks or not).
template <typename T, typename Out, int kHeadDim, typename Code, typename Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    PagedPrefillKernel(PrefillArgs args, const float* __restrict__ sinks) {
  constexpr int kThreads = Tile::kThreads;
  constexpr int kWarps = Tile::kWarps;
  constexpr int kStride = kHeadDim + 8;   // elements per shared row (16 bytes of padding)
  constexpr int kChunks = kHeadDim / 8;   // 16-byte chunks per row
  constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T over the head dim
  constexpr int kDTiles = kHeadDim / 8;   // n-tiles of the output
  constexpr int kM = Tile::kMTiles;
  constexpr int kRows = Tile::kRows;
  constexpr int kBlockN = Tile::kKvTile;
  static_assert(kBlockN % 16 == 0, "KV tiles are whole mma k-steps");
  static_assert(kBlockN <= kThreads, "one thread resolves each KV row's slot");
  static_assert(kBlockN * kChunks % kThreads == 0, "whole chunks per thread");
  constexpr int kNTiles = kBlockN / 8;  // n-tiles of the scores
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* q_shared = reinterpret_cast<T*>(shared_raw);  // [kRows][kStride]
  T* k_shared = q_shared + kRows * kStride;        // [2][kBlockN][kStride]
  T* v_shared = k_shared + 2 * kBlockN * kStride;  // [2][kBlockN][kStride]
  // Each KV tile's rows as cache rows (slot x num_kv_heads + kv_head), resolved through the
  // block table once per row: kNoCacheRow for a row past the tile's positions or one the table
  // cannot resolve (zero-filled). A row's
  // entry sits in its K row's padding (columns kHeadDim .., which no copy or ldmatrix
  // touches), so the entries take no shared memory of their own (head dim 256 fills the
  // 99 KiB that sm_86 and sm_89 allow a block).
  auto row_of = [&](int buffer, int row) -> uint32_t& {
    return *reinterpret_cast<uint32_t*>(k_shared + (buffer * kBlockN + row) * kStride + kHeadDim);
  };

  const int seq = blockIdx.z;
  const int kv_head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // the PTX fragments' groupID, threadID_in_group

  const int q_begin = args.query_start[seq];
  const int q_len = args.query_start[seq + 1] - q_begin;
  if (q_len <= 0) return;                          // uniform over the block
  const int past = args.context_len[seq] - q_len;  // position of the sequence's first query
  const int64_t rows = static_cast<int64_t>(q_len) * args.group;
  const int64_t num_tiles = (rows + kRows - 1) / kRows;
  const int table_begin = args.block_indptr[seq];
  const int table_len = args.block_indptr[seq + 1] - table_begin;
  const T* q = static_cast<const T*>(args.q);
  const Code* k_cache = static_cast<const Code*>(args.k_cache);
  const Code* v_cache = static_cast<const Code*>(args.v_cache);

  // Every shared read of one tile ends before the next tile's writes: the KV loop ends
  // with __syncthreads and the epilogue starts with __syncthreads_or.
  for (int64_t step = blockIdx.x; step < num_tiles; step += gridDim.x) {
    const int64_t tile = num_tiles - 1 - step;  // the longest (latest) tiles first
    const int64_t row0 = tile * kRows;
    const int64_t last_row = min(row0 + kRows, rows) - 1;
    const int first_pos = past + static_cast<int>(row0 / args.group);
    const int kv_end = past + static_cast<int>(last_row / args.group) + 1;
    // KV read: [kv_begin, kv_end); with a window nothing before the first row's window
    // (freed blocks may sit there). Tile j covers [kv_begin + j kBlockN, + kBlockN).
    const int kv_begin = args.window > 0 ? max(0, first_pos - args.window + 1) : 0;
    bool bad = past < 0;  // context shorter than the query: no valid position
    const int num_kv_tiles = bad ? 0 : (kv_end - kv_begin + kBlockN - 1) / kBlockN;

    for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
      const int r = c / kChunks, chunk = c % kChunks;
      const int64_t row = row0 + r;
      const T* src = q;
      int bytes = 0;
      if (row < rows) {
        const int64_t token = q_begin + row / args.group;
        const int64_t head = static_cast<int64_t>(kv_head) * args.group + row % args.group;
        src = q + token * args.q_stride + head * kHeadDim + chunk * 8;
        bytes = 16;
      }
      CopyAsync16(q_shared + r * kStride + chunk * 8, src, bytes);
    }
    CopyAsyncCommit();

    // Row threadIdx.x of KV tile `kv_tile`: is it one to read, and its block-table entry
    // (-1 past the table), loaded early; resolve_slot turns it into the slot once arrived.
    auto in_tile = [&](int kv_tile) {
      const int position = kv_begin + kv_tile * kBlockN + static_cast<int>(threadIdx.x);
      return threadIdx.x < kBlockN && kv_tile < num_kv_tiles && position < kv_end;
    };
    auto table_entry = [&](int kv_tile) {
      if (!in_tile(kv_tile)) return -1;
      const int position = kv_begin + kv_tile * kBlockN + static_cast<int>(threadIdx.x);
      const int index = position / args.block_size;
      return index < table_len ? args.block_indices[table_begin + index] : -1;
    };
    auto resolve_slot = [&](int kv_tile, int entry) {
      if (threadIdx.x >= kBlockN) return;
      uint32_t row = internal::kNoCacheRow;
      if (in_tile(kv_tile)) {
        if (entry >= 0 && entry < args.num_blocks) {
          const int position = kv_begin + kv_tile * kBlockN + static_cast<int>(threadIdx.x);
          const uint32_t slot =
              static_cast<uint32_t>(entry) * args.block_size + position % args.block_size;
          row = slot * args.num_kv_heads + kv_head;
        } else {
          bad = true;  // a table the host failed to validate (any entry outside the pool)
        }
      }
      row_of(kv_tile & 1, threadIdx.x) = row;
    };
    // One KV tile's K and V rows into buffer kv_tile & 1 from its resolved rows. Thread
    // threadIdx.x copies chunk threadIdx.x % kChunks of rows threadIdx.x / kChunks + i
    // kThreads / kChunks: a copy is a shared load, a product and the two copies.
    auto load_kv = [&](int kv_tile) {
      static_assert(kThreads % kChunks == 0, "a thread copies one chunk column");
      const int buffer = kv_tile & 1;
      const int chunk = static_cast<int>(threadIdx.x) % kChunks;
      T* k_dst = k_shared + buffer * kBlockN * kStride + chunk * 8;
      T* v_dst = v_shared + buffer * kBlockN * kStride + chunk * 8;
      const Code* k_src = k_cache + chunk * 8;
      const Code* v_src = v_cache + chunk * 8;
#pragma unroll
      for (int i = 0; i < kBlockN * kChunks / kThreads; ++i) {
        const int r = i * (kThreads / kChunks) + static_cast<int>(threadIdx.x) / kChunks;
        const uint32_t row = row_of(buffer, r);
        const bool found = row != internal::kNoCacheRow;
        const uint64_t offset = static_cast<uint64_t>(found ? row : 0u) * kHeadDim;
        if constexpr (internal::kIsKvCode<Code>) {
          uint4 k_chunk = make_uint4(0, 0, 0, 0), v_chunk = make_uint4(0, 0, 0, 0);
          if (found) {
            k_chunk =
                DequantizeChunk<T>(k_src + offset, internal::Bf16BitsToFloat(args.k_scale[row]));
            v_chunk =
                DequantizeChunk<T>(v_src + offset, internal::Bf16BitsToFloat(args.v_scale[row]));
          }
          *reinterpret_cast<uint4*>(k_dst + r * kStride) = k_chunk;
          *reinterpret_cast<uint4*>(v_dst + r * kStride) = v_chunk;
        } else {
          CopyAsync16(k_dst + r * kStride, k_src + offset, found ? 16 : 0);
          CopyAsync16(v_dst + r * kStride, v_src + offset, found ? 16 : 0);
        }
      }
    };
    // Slots of tiles 0 and 1, then tile 0's rows; tile j + 2's slots are resolved while
    // tile j computes (its table entry loaded before the MMAs, stored after them).
    resolve_slot(0, table_entry(0));
    resolve_slot(1, table_entry(1));
    __syncthreads();
    if (num_kv_tiles > 0) load_kv(0);
    CopyAsyncCommit();

    // This thread's rows: of M-tile m, rows g and g + 8 of the 16 at 64 m + 16 warp, and
    // their query positions; a row past the sequence gets -1 (fully masked, never stored).
    int row_pos[kM][2];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = row0 + m * kWarps * 16 + warp * 16 + g + 8 * h;
        row_pos[m][h] = row < rows ? past + static_cast<int>(row / args.group) : -1;
      }
    }
    float o[kM][kDTiles][4];
    float row_max[kM][2], row_sum[kM][2];  // row_sum: this thread's share (4 lanes per row)
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[m][d][e] = 0.0f;
      }
      row_max[m][0] = row_max[m][1] = -INFINITY;
      row_sum[m][0] = row_sum[m][1] = 0.0f;
    }

    for (int j = 0; j < num_kv_tiles; ++j) {
      if (j + 1 < num_kv_tiles) {
        load_kv(j + 1);
        CopyAsyncCommit();
        CopyAsyncWait<1>();  // the Q tile and KV tile j have landed (this thread's copies)
      } else {
        CopyAsyncWait<0>();
      }
      __syncthreads();  // ... and everyone's
      const int next_entry = table_entry(j + 2);
      const T* k_tile = k_shared + (j & 1) * kBlockN * kStride;
      const T* v_tile = v_shared + (j & 1) * kBlockN * kStride;

      // S = Q K^T. The A fragments of the warp's M-tiles come from shared memory at each
      // k-step: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15). One ldmatrix.x4 of K covers
      // tokens n0 .. n0+15 x dims k0 .. k0+15: matrix i = tokens n0 + 8 (i / 2), dims
      // k0 + 8 (i % 2), i.e. (b0, b1) of n-tile n0 then of n-tile n0 + 8; each feeds the
      // MMAs of every M-tile.
      float s[kM][kNTiles][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[m][n][e] = 0.0f;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t a[kM][4];
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          LoadMatrixX4(a[m], q_shared + (m * kWarps * 16 + warp * 16 + lane % 16) * kStride +
                                 kk * 16 + (lane / 16) * 8);
        }
#pragma unroll
        for (int nn = 0; nn < kBlockN / 16; ++nn) {
          uint32_t b[4];
          LoadMatrixX4(b, k_tile + (nn * 16 + lane % 8 + (lane / 16) * 8) * kStride + kk * 16 +
                              ((lane / 8) % 2) * 8);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            Mma<T>(s[m][2 * nn], a[m], b[0], b[1]);
            Mma<T>(s[m][2 * nn + 1], a[m], b[2], b[3]);
          }
        }
      }

      // Scale into base 2 (soft-capped first when asked), then the causal mask (after
      // scaling, so a negative scale cannot turn -inf into +inf). Only tiles reaching past
      // the block's first row's position need it (that includes every tile with
      // zero-filled positions), and with a window every tile (rows' windows differ).
      const int kv0 = kv_begin + j * kBlockN;
      const bool needs_mask = args.window > 0 || kv0 + kBlockN - 1 > first_pos;
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[m][n][e] = args.softcap_log2 > 0.0f
                             ? args.softcap_log2 * tanhf(s[m][n][e] * args.scale_over_softcap)
                             : s[m][n][e] * args.scale_log2;
            const int position = kv0 + n * 8 + 2 * t + (e & 1);
            const int row = row_pos[m][e / 2];
            if (needs_mask &&
                (position > row || (args.window > 0 && position <= row - args.window))) {
              s[m][n][e] = -INFINITY;
            }
          }
        }
      }

      // Online softmax per row; a row's kBlockN scores sit in the 4 lanes sharing g. The
      // accumulators are rescaled only when some row of the warp has a new maximum: otherwise
      // every factor is exp2(0) = 1 (or a row with nothing unmasked yet: its sums are 0), so
      // skipping the multiplications changes no bit, and after the first tiles a new maximum
      // is rare.
      float new_max[kM][2];
      bool grew = false;
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float tile_max = -INFINITY;
#pragma unroll
          for (int n = 0; n < kNTiles; ++n) {
            tile_max = fmaxf(tile_max, fmaxf(s[m][n][2 * h], s[m][n][2 * h + 1]));
          }
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
          new_max[m][h] = fmaxf(row_max[m][h], tile_max);
          grew = grew || new_max[m][h] > row_max[m][h];
        }
      }
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // A row with nothing unmasked yet keeps max -inf: subtract 0 (exp2(-inf) = 0).
            const float base = new_max[m][h] == -INFINITY ? 0.0f : new_max[m][h];
            const float alpha = exp2f(row_max[m][h] - base);  // 0 while row_max is -inf
            row_max[m][h] = new_max[m][h];
            row_sum[m][h] *= alpha;
#pragma unroll
            for (int d = 0; d < kDTiles; ++d) {
              o[m][d][2 * h] *= alpha;
              o[m][d][2 * h + 1] *= alpha;
            }
          }
        }
      }
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // A row with nothing unmasked yet keeps max -inf: subtract 0 (exp2(-inf) = 0).
          const float base = row_max[m][h] == -INFINITY ? 0.0f : row_max[m][h];
#pragma unroll
          for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e) {
              // Rounded to T here, so the denominator sums exactly the weights P V uses.
              s[m][n][e] = RoundThrough<T>(exp2f(s[m][n][e] - base));
              row_sum[m][h] += s[m][n][e];
            }
          }
        }
      }

      // O += P V. The S accumulators of n-tiles 2k and 2k + 1, packed in pairs, are the A
      // fragment of k-step k. One ldmatrix.x4.trans covers tokens k0 .. k0+15 x dims
      // n0 .. n0+15: matrix i = tokens k0 + 8 (i % 2), dims n0 + 8 (i / 2), i.e. (b0, b1) of
      // d-tile n0 then of d-tile n0 + 8; each feeds the MMAs of every M-tile.
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[kM][4];
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          a[m][0] = PackPair<T>(s[m][2 * kk][0], s[m][2 * kk][1]);
          a[m][1] = PackPair<T>(s[m][2 * kk][2], s[m][2 * kk][3]);
          a[m][2] = PackPair<T>(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
          a[m][3] = PackPair<T>(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dn = 0; dn < kHeadDim / 16; ++dn) {
          uint32_t b[4];
          LoadMatrixX4Trans(b, v_tile + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride +
                                   dn * 16 + (lane / 16) * 8);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            Mma<T>(o[m][2 * dn], a[m], b[0], b[1]);
            Mma<T>(o[m][2 * dn + 1], a[m], b[2], b[3]);
          }
        }
      }
      // Tile j + 2's slots go where tile j's were (load_kv(j) ran last iteration).
      resolve_slot(j + 2, next_entry);
      __syncthreads();  // buffer j & 1 is refilled by the next iteration (tile j + 2)
    }
    CopyAsyncWait<0>();  // without KV tiles the Q group may still be in flight
    bad = __syncthreads_or(bad) != 0;

#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = row_sum[m][h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int64_t row = row0 + m * kWarps * 16 + warp * 16 + g + 8 * h;
        if (row >= rows) continue;
        const int64_t token = q_begin + row / args.group;
        const int64_t head = static_cast<int64_t>(kv_head) * args.group + row % args.group;
        Out* dst = static_cast<Out*>(args.out) + (token * args.num_heads + head) * kHeadDim;
        // An attention sink joins the denominator only, relative to the row's max (base 2,
        // as the softmax runs). No rescaling to max(row max, sink) is needed: a sink so
        // dominant that exp2 overflows (or a row with nothing attended, max -inf) makes the
        // sum inf and the output 0, the limit.
        if (sinks != nullptr) sum += exp2f(sinks[head] * kLog2E - row_max[m][h]);
        const float inverse = bad ? NAN : (sum > 0.0f ? 1.0f / sum : 0.0f);
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
          dst[d * 8 + 2 * t] = FromFloat<Out>(o[m][d][2 * h] * inverse);
          dst[d * 8 + 2 * t + 1] = FromFloat<Out>(o[m][d][2 * h + 1] * inverse);
        }
      }
    }
  }
}

template <typename T, typename Out, int kHeadDim, typename Code, typename Tile>
absl::Status LaunchKernel(const PagedPrefillParams& p, const PrefillArgs& args,
                          cudaStream_t stream) {
  constexpr size_t kShared = SharedBytes<kHeadDim, Tile>();
  constexpr auto kernel = &PagedPrefillKernel<T, Out, kHeadDim, Code, Tile>;
  LOOM_RETURN_IF_ERROR(
      internal::OptInSharedMemory<kernel>(static_cast<int>(kShared), "PagedPrefill"));
  const int64_t tiles = (p.max_query_len * args.group + Tile::kRows - 1) / Tile::kRows;
  const dim3 grid(static_cast<unsigned>(std::min(tiles, kMaxTileBlocks)),
                  static_cast<unsigned>(p.cache.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  kernel<<<grid, Tile::kThreads, kShared, stream>>>(args, p.sinks);
  return internal::CheckLaunch("PagedPrefill");
}

}  // namespace loom::kernels::cuda::internal::prefill
