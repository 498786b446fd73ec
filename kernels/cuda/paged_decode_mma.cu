// Paged decode attention on tensor cores for grouped-query heads: a member of decode
// attention's tuning space (paged_attention_candidates.h), timed against paged_attention.cu's
// kernel by `cuda_attention_bench --sweep` and held against the CPU reference by the candidate
// test; serving runs paged_attention.cu's kernel until a GPU sweep says otherwise.
//
// Block (split, KV head, sequence), 128 threads = 4 warps, head dim 128, F16 or BF16 K/V and a
// query of the same type or F32 (the model path's, rounded to the K/V type once).
// The KV head's query heads (at most 16) are the rows of one m16 tile, so S = Q K^T and
// O += P V run as mma.sync m16n8k16 instead of one FMA per element per head (FlashInfer's
// tensor-core decode for GQA): a tile of 64 tokens gives each warp 16 of them, two n8 tiles of
// scores (8 k-steps of 16 dims against the query's fragments, kept in registers for the whole
// split) and one k16 step of P V over the 16 n8 tiles of the head dim. Each warp keeps its
// own online softmax (the rows' running max, this lane's share of their sums, the output
// accumulators), merged across warps at the end as paged_attention.cu's kernel merges its
// subgroups; with several splits each block leaves its partial result for
// internal::LaunchPagedDecodeReduce.
//
// Tiles stream through a kStages-deep cp.async ring (K then V, 16 KiB each); a row's 16
// chunks of 16 bytes are stored at chunk ^ (token & 7), so the 8 rows one ldmatrix phase
// reads fall into 8 different bank groups. K loads as the B operand with plain ldmatrix, V
// with ldmatrix.trans, and P, rounded to the K/V type as FlashAttention rounds it, is the A
// operand taken straight from the score accumulators (fragment layouts: prefill_attention.cu's
// header). The P rounding puts outputs about 1e-3 (F16; BF16 about 4e-3) from the float
// reference rather than 5e-5.
//
// Instructions per tile are what bounded the FMA kernel (about 14.6 per KV element and lane at
// GQA 4: the issue rate, not DRAM), so this one spends few outside the MMAs: a tile row's cache
// row (a 32-bit slot * KV heads) is resolved once, by one thread, whose block-table index
// advances by a tile's worth per tile instead of dividing; a copy is a shared load, one address
// product and the two cp.async of K and V; the softmax runs in base 2 (log2 e folded into the
// scale, one ex2 per probability); the accumulators are rescaled only when some row's maximum
// grew (exact: the factor is 1 otherwise), and only a tile that runs past the span's end masks.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/mma_internal.cuh"
#include "kernels/cuda/paged_attention_internal.h"
#include "kernels/cuda/paged_decode_internal.cuh"
#include "kernels/cuda/paged_decode_mma.h"

namespace loom::kernels::cuda {
namespace {

using internal::CopyAsync16;
using internal::CopyAsyncCommit;
using internal::CopyAsyncWait;
using internal::LoadMatrixX4;
using internal::LoadMatrixX4Trans;
using internal::Mma;
using internal::PackPair;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kHeadDim = 128;
constexpr int kMaxGroup = 16;                          // query heads: the rows of one m16 tile
constexpr int kTile = 16 * kWarps;                     // tokens per tile, 16 per warp
constexpr int kStages = 3;                             // >= 3: tile t + 2 loads while t computes
constexpr int kRowRing = std::bit_ceil(unsigned{kStages} + 1);  // tile rows' ring: see below
constexpr int kChunks = kHeadDim * 2 / 16;             // 16-byte chunks per K or V row
constexpr int kTileBytes = kTile * kHeadDim * 2;       // 16 KiB
constexpr int kStageBytes = 2 * kTileBytes;            // K, then V
constexpr int kSharedBytes = kStages * kStageBytes;    // 96 KiB: two blocks per Hopper SM
constexpr int kMergeBytes = kWarps * kMaxGroup * kHeadDim * 4;
static_assert(kMergeBytes <= kSharedBytes, "the ring holds the warps' outputs for the merge");
static_assert(kTile * kChunks % kThreads == 0, "whole chunks per thread");


// Byte offset of 16-byte chunk `chunk` of row `row` in a K or V tile (swizzled).
__device__ __forceinline__ int Swizzled(int row, int chunk) {
  return (row * kChunks + (chunk ^ (row & 7))) * 16;
}

// 2^x (PTX ex2.approx: 2 ulp, 2^-inf = 0): the softmax runs in base 2 with log2(e) folded into
// the score's scale, one MUFU per probability.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    PagedDecodeMmaKernel(internal::DecodeArgs args, bool q_f32) {
  extern __shared__ __align__(16) uint8_t ring[];
  // Each tile's rows as cache rows (internal::TileRowResolver; kNoCacheRow when none), resolved
  // a tile ahead of their copies: kRowRing >= kStages + 1 entries, so that a tile's entry is
  // written while the tile before it is issued.
  __shared__ uint32_t row_ring[kRowRing][kTile];
  __shared__ float warp_max[kWarps][kMaxGroup], warp_sum[kWarps][kMaxGroup];

  const int seq = blockIdx.z, split = blockIdx.x, num_splits = gridDim.x;
  const int kv_head = blockIdx.y, head0 = kv_head * args.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  const internal::DecodeSpan span = internal::DecodeSpanOf(args, seq, split, num_splits, kTile);
  const int begin = span.begin, num_tiles = span.num_tiles, length = span.end - span.begin;

  // The query's A fragments for the 8 k-steps: a0 (head g, dims 2t, 2t+1), a1 (head g + 8),
  // a2 (head g, dims 2t + 8, 2t + 9), a3 (head g + 8, same); heads past the group are 0. An F32
  // query (the model path's) is rounded to T here, once.
  const int64_t q_at = seq * args.q_stride + static_cast<int64_t>(head0) * kHeadDim;
  uint32_t qa[kHeadDim / 16][4];
#pragma unroll
  for (int s = 0; s < kHeadDim / 16; ++s) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int head = g + (r & 1) * 8, dim = 16 * s + 2 * t + (r >> 1) * 8;
      const int64_t at = q_at + head * kHeadDim + dim;
      if (head >= args.group) {
        qa[s][r] = 0u;
      } else if (q_f32) {
        const float2 pair =
            *reinterpret_cast<const float2*>(static_cast<const float*>(args.q) + at);
        qa[s][r] = PackPair<T>(pair.x, pair.y);
      } else {
        qa[s][r] = *reinterpret_cast<const uint32_t*>(static_cast<const T*>(args.q) + at);
      }
    }
  }

  // ---- the rows: thread `row` < kTile resolves row `row` of each tile in turn.
  bool bad = false;  // a table the host failed to validate
  internal::TileRowResolver resolver(begin + static_cast<int>(threadIdx.x), args.block_size, kTile);
  auto resolve = [&](int tile) {
    if (tile >= num_tiles || threadIdx.x >= kTile) return;
    const bool in_span = tile * kTile + static_cast<int>(threadIdx.x) < length;
    row_ring[tile % kRowRing][threadIdx.x] = resolver.Next(args, span, in_span, kv_head, bad);
  };
  // ---- the ring: thread i copies column i % 16 of rows i / 16 + 8 j of each tile (the same
  // swizzle for every j: row + 8 j keeps row & 7), from the rows resolved a tile earlier.
  const uint32_t ring_at = internal::SharedAddress(ring);
  const int copy_row = threadIdx.x / kChunks, column = threadIdx.x % kChunks;
  const uint32_t copy_at = ring_at + Swizzled(copy_row, column);
  const uint8_t* k_source = static_cast<const uint8_t*>(args.k_cache) + column * 16;
  const uint8_t* v_source = static_cast<const uint8_t*>(args.v_cache) + column * 16;
  auto issue = [&](int tile) {
    if (tile < num_tiles) {
      const uint32_t k_stage = copy_at + (tile % kStages) * kStageBytes;
      const uint32_t* rows = row_ring[tile % kRowRing] + copy_row;
#pragma unroll
      for (int i = 0; i < kTile * kChunks / kThreads; ++i) {
        constexpr int kRowsApart = kThreads / kChunks;  // a thread's rows, 8 apart
        const uint32_t row = rows[i * kRowsApart];
        const bool read = row != internal::kNoCacheRow;
        const uint64_t at = static_cast<uint64_t>(read ? row : 0u) * (kHeadDim * 2);
        const uint32_t to = k_stage + i * kRowsApart * kChunks * 16;
        CopyAsync16(to, k_source + at, read ? 16 : 0);
        CopyAsync16(to + kTileBytes, v_source + at, read ? 16 : 0);
      }
    }
    CopyAsyncCommit();  // an empty group past the last tile keeps the wait counts uniform
  };

  // ---- this warp's online softmax in base 2: rows g (h = 0) and g + 8 (h = 1).
  const float scale_log2 = args.scale * internal::kLog2E;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this lane's tokens only, until the end
  float o[kHeadDim / 8][4];          // o[d]: (row g, dims 8d + 2t, +1), then row g + 8
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[d][e] = 0.0f;
  }
  // The ldmatrix rows this lane addresses: matrix m = lane / 8, row r = lane % 8. Chunk c ^ r of
  // a row is at Swizzled(row, c & 1) ^ ((c & ~1) * 16), for K (k-step ks: c = 2 ks + (m & 1)) and
  // V (dims 8 d..: c = d + (m >> 1), d even).
  const int m = lane / 8, r = lane % 8;
  const int k_at = Swizzled(warp * 16 + (m >> 1) * 8 + r, m & 1);
  const int v_at = kTileBytes + Swizzled(warp * 16 + (m & 1) * 8 + r, m >> 1);
  auto compute = [&](int tile) {
    const uint32_t stage = ring_at + (tile % kStages) * kStageBytes;
    // S = Q K^T: n-tile j holds this warp's tokens 8 j .. 8 j + 7. Matrices: 0 (tokens 0.., dims
    // 16 ks..), 1 (tokens 0.., dims 16 ks + 8..), 2 and 3 the same for tokens 8..
    float s[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      uint32_t b[4];
      LoadMatrixX4(b, stage + (k_at ^ (ks * 32)));
      Mma<T>(s[0], qa[ks], b[0], b[1]);
      Mma<T>(s[1], qa[ks], b[2], b[3]);
    }
    // Scale (base 2), soft-cap, mask: s[j][e] is (row g + (e >> 1) * 8, token 8 j + 2 t + (e & 1)
    // of this warp's 16). Only a tile running past the span's end masks.
    if (args.softcap > 0.0f) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] = args.softcap * internal::kLog2E * tanhf(s[j][e] * args.scale / args.softcap);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= scale_log2;
      }
    }
    const int valid = length - tile * kTile - warp * 16;  // this warp's tokens in the span
    if (valid < 16) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (8 * j + 2 * t + (e & 1) >= valid) s[j][e] = -INFINITY;
        }
      }
    }
    // The rows' maxima over the 4 lanes that hold their 16 tokens. The accumulators are
    // rescaled only when a row's maximum grew (exact: otherwise the factor is 1), which after
    // the first tiles is rare.
    float new_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      new_max[h] = fmaxf(row_max[h], tile_max);
    }
    if (__any_sync(0xffffffffu, new_max[0] > row_max[0] || new_max[1] > row_max[1])) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // 0 while nothing was attended (row_max -inf); new_max -inf too subtracts 0.
        const float alpha = Exp2(row_max[h] - (new_max[h] == -INFINITY ? 0.0f : new_max[h]));
        row_max[h] = new_max[h];
        row_sum[h] *= alpha;
#pragma unroll
        for (int d = 0; d < kHeadDim / 8; ++d) {
          o[d][2 * h] *= alpha;
          o[d][2 * h + 1] *= alpha;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float base = row_max[h] == -INFINITY ? 0.0f : row_max[h];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[j][e] = Exp2(s[j][e] - base);
          row_sum[h] += s[j][e];
        }
      }
    }
    // O += P V: P's A fragment is the score accumulators (n-tile 0: tokens 2t, 2t+1; n-tile
    // 1: 2t + 8, 2t + 9). V's matrices (.trans): 0 (tokens 0.., dims 8 d..), 1 (tokens 8..,
    // dims 8 d..), 2 and 3 the same for dims 8 (d + 1)..
    const uint32_t pa[4] = {PackPair<T>(s[0][0], s[0][1]), PackPair<T>(s[0][2], s[0][3]),
                            PackPair<T>(s[1][0], s[1][1]), PackPair<T>(s[1][2], s[1][3])};
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; d += 2) {
      uint32_t b[4];
      LoadMatrixX4Trans(b, stage + (v_at ^ (d * 16)));
      Mma<T>(o[d], pa, b[0], b[1]);
      Mma<T>(o[d + 1], pa, b[2], b[3]);
    }
  };

  // ---- the pipeline: kStages - 1 tiles in flight ahead of the one computed, their rows
  // resolved one tile further ahead (published by each iteration's barrier).
#pragma unroll
  for (int tile = 0; tile < kStages; ++tile) resolve(tile);
  __syncthreads();
#pragma unroll
  for (int tile = 0; tile < kStages - 1; ++tile) issue(tile);
  for (int tile = 0; tile < num_tiles; ++tile) {
    CopyAsyncWait<kStages - 2>();  // this thread's copies of `tile` landed
    // Everyone's have; everyone finished tile - 1 (its stage and its rows' entry are free), and
    // the rows of tile + kStages - 1 are visible.
    __syncthreads();
    issue(tile + kStages - 1);
    resolve(tile + kStages);
    compute(tile);
  }
  CopyAsyncWait<0>();

  // ---- merge: the row sums over their 4 lanes, then the warps through shared memory (the
  // maxima back in base e, which StoreDecodeElement and the split reduction take).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }
  const bool bad_table = __syncthreads_or(bad) != 0;  // also: the ring is free for the merge
  float* merge = reinterpret_cast<float*>(ring);     // [kWarps][kMaxGroup][kHeadDim]
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e >> 1) * 8, dim = 8 * d + 2 * t + (e & 1);
      merge[(warp * kMaxGroup + row) * kHeadDim + dim] = o[d][e];
    }
  }
  if (t == 0) {
    warp_max[warp][g] = row_max[0] / internal::kLog2E;
    warp_sum[warp][g] = row_sum[0];
    warp_max[warp][g + 8] = row_max[1] / internal::kLog2E;
    warp_sum[warp][g + 8] = row_sum[1];
  }
  __syncthreads();
  const internal::DecodeOutput output{
      args.out, args.partial_acc, args.partial_max, args.partial_sum, args.sinks, kHeadDim,
      split,    num_splits,       args.out_low,     args.out_low_bf16};
  // The output is of the query's type.
  auto store = [&]<typename Out>() {
    for (int i = threadIdx.x; i < args.group * kHeadDim; i += kThreads) {
      const int h = i / kHeadDim, d = i % kHeadDim;
      internal::StoreDecodeElement<Out, kWarps>(
          &warp_max[0][h], &warp_sum[0][h], kMaxGroup, merge + h * kHeadDim + d,
          kMaxGroup * kHeadDim, bad_table, output,
          static_cast<int64_t>(seq) * args.num_heads + head0 + h, head0 + h, d);
    }
  };
  if (q_f32) {
    store.template operator()<float>();
  } else {
    store.template operator()<T>();
  }
}

// Blocks of the kernel one multiprocessor of the current device holds, asked once.
template <typename T>
absl::StatusOr<int> ResidentBlocksPerSm() {
  static std::atomic<int> resident{0};
  if (const int known = resident.load(); known > 0) return known;
  int blocks = 0;
  const cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, PagedDecodeMmaKernel<T>, kThreads, kSharedBytes);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrFormat("PagedDecodeMma: occupancy query failed: %s",
                                               cudaGetErrorString(error)));
  }
  blocks = std::clamp(blocks, 1, internal::kMaxResidentDecodeBlocks);
  resident.store(blocks);
  return blocks;
}

}  // namespace

bool internal::PagedDecodeMmaSupports(const PagedDecodeParams& p) {
  // The query is read two elements at a time (float2 / 32 bits): its rows must keep that
  // alignment, which CheckPagedDecodeParams does not ask of the FMA kernel.
  const uintptr_t pair_bytes = p.q_dtype == DataType::kF32 ? 8 : 4;
  return p.cache.head_dim == kHeadDim && p.cache.quant == KvQuant::kNone &&
         (p.cache.dtype == DataType::kF16 || p.cache.dtype == DataType::kBF16) &&
         (p.q_dtype == p.cache.dtype || p.q_dtype == DataType::kF32) &&
         p.num_heads / p.cache.num_kv_heads <= kMaxGroup && p.q_stride % 2 == 0 &&
         reinterpret_cast<uintptr_t>(p.q) % pair_bytes == 0;
}

namespace {

template <typename T>
absl::Status LaunchKernel(const PagedDecodeParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(
      internal::OptInSharedMemory<PagedDecodeMmaKernel<T>>(kSharedBytes, "PagedDecodeMma"));
  LOOM_ASSIGN_OR_RETURN(internal::DecodeArgs args, internal::MakeDecodeArgs(p));
  args.head_chunks = 1;  // the whole group in one m16 tile
  LOOM_ASSIGN_OR_RETURN(const int resident, ResidentBlocksPerSm<T>());
  LOOM_ASSIGN_OR_RETURN(
      const int num_splits,
      internal::PlanDecodeSplits(p, p.num_seqs * p.cache.num_kv_heads, resident, args));
  const dim3 grid(num_splits, static_cast<unsigned>(p.cache.num_kv_heads),
                  static_cast<unsigned>(p.num_seqs));
  PagedDecodeMmaKernel<T>
      <<<grid, kThreads, kSharedBytes, stream>>>(args, p.q_dtype == DataType::kF32);
  LOOM_RETURN_IF_ERROR(internal::CheckLaunch("PagedDecodeMma"));
  return num_splits > 1 ? internal::LaunchPagedDecodeReduce(p, num_splits, stream)
                        : absl::OkStatus();
}

}  // namespace

absl::Status internal::LaunchPagedDecodeMma(const PagedDecodeParams& p, cudaStream_t stream) {
  return p.cache.dtype == DataType::kBF16 ? LaunchKernel<__nv_bfloat16>(p, stream)
                                          : LaunchKernel<__half>(p, stream);
}

}  // namespace loom::kernels::cuda
