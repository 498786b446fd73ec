// Paged decode attention, FlashDecoding style, with the K/V stream pipelined.
//
// Block (split, kv_head * head_chunks + chunk, seq), 128 threads. A block computes up to
// kGroup query heads that share one KV head, so each K/V row is read once for the group.
// The split's tokens go in tiles of kPasses tokens per subgroup; the tiles stream into
// shared memory through a kStages-deep cp.async ring (each thread copies 16-byte chunks of
// K and V rows; rows past the split or the table are zero-filled), so several stages of
// loads are in flight per block while it computes another. Each row of a tile is resolved
// once, by one thread, a tile ahead of its copies: its block-table index advances by a tile's
// worth per tile (no division per chunk), and its cache row (slot x KV heads + head, 32-bit)
// is staged in shared memory for the copies (one product each), the compute (validity) and
// the 8-bit scales.
//
// Compute: threads form subgroups of kHeadDim / 8 lanes; a subgroup owns kPasses tokens
// of a tile and each lane 8 consecutive dims of them. A subgroup keeps its own online
// softmax (max, sum and the V accumulators in registers): one rescale per tile and no
// block-wide barrier but the ring's one per tile. Subgroups are merged at the end
// (shuffles within a warp, shared memory across warps); with several splits each block
// leaves (unnormalized sums, max, denominator) in the workspace and
// PagedDecodeReduceKernel merges them. An attention sink joins the final denominator once:
// in the block's own epilogue with one split, in the reduction with several. An 8-bit
// cache (int8_t or uint8_t codes as Kv) is copied as codes; a token's K scale multiplies
// its score, its V scale its probability (the caller rotates query and output,
// kv_cache.h), both loaded one tile ahead.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <string_view>
#include <utility>

#include "common/status_macros.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_candidates.h"
#include "kernels/cuda/paged_attention_internal.h"
#include "kernels/cuda/paged_decode_internal.cuh"
#include "kernels/cuda/paged_decode_mma.h"

namespace loom::kernels::cuda {
namespace {

using internal::CopyAsync16;
using internal::CopyAsyncCommit;
using internal::CopyAsyncWait;
using internal::DecodeArgs;
using internal::ExpFrom;
using internal::FromFloat;
using internal::StoreLow;
using internal::ToFloat;

// The tiling of one instantiation (internal::kDecodeTilings[kTiling]): each thread reads
// kPasses rows' 8 values of a tile, so a tile's K rows take kPasses * kThreads * 8 elements
// (the dispatched tiling: 8 KiB for F16/BF16, 4 KiB for 8-bit codes, whatever the head dim;
// K and V of its 4 stages take 64 (32) KiB).
template <typename Kv, int kHeadDim, int kGroup, int kTiling>
struct DecodeShape {
  static constexpr internal::DecodeTiling kT = internal::kDecodeTilings[kTiling];
  static constexpr int kThreads = kT.threads;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kStages = kT.stages;
  static constexpr int kPasses = kT.passes;  // tokens per subgroup per tile
  static constexpr int kLanes = kHeadDim / 8;           // lanes per token
  static constexpr int kSubgroups = kThreads / kLanes;  // tokens per pass
  static constexpr int kTile = kPasses * kSubgroups;    // tokens per tile
  static constexpr int kRowBytes = kHeadDim * static_cast<int>(sizeof(Kv));
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kChunksPerThread = kTile * kChunksPerRow / kThreads;  // of K (and V)
  static constexpr int kTileBytes = kTile * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K, then V
  static constexpr int kRingBytes = kStages * kStageBytes;
  // After the ring drains its memory holds the warps' accumulators for the final merge.
  static constexpr int kMergeBytes = kWarps * kGroup * kHeadDim * 4;
  static constexpr int kSharedBytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
  static_assert(kTile * kChunksPerRow % kThreads == 0, "whole chunks per thread");
  static_assert(kThreads % kChunksPerRow == 0, "a thread copies one chunk column");
  static_assert(kTile <= kThreads, "one thread resolves each row of a tile");
  static_assert(kStages >= 3, "a tile's rows are read one tile ahead");
  // Each tile's rows, from their resolution kStages tiles ahead of the compute to the compute:
  // kStages + 1 live entries, rounded up to a power of two.
  static constexpr int kRowRing = std::bit_ceil(static_cast<unsigned>(kStages) + 1);
};

// Eight consecutive F16/BF16 values (16 bytes) or 8-bit codes (8 bytes) from shared
// memory, as floats (codes decoded, not yet scaled).
template <typename Kv>
__device__ __forceinline__ void LoadShared8(const Kv* address, float (&values)[8]) {
  if constexpr (internal::kIsKvCode<Kv>) {
    internal::DecodeCodes8<Kv>(*reinterpret_cast<const uint2*>(address), values);
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(address);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<Kv, __half>) {
        values[2 * i] =
            __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] & 0xffffu)));
        values[2 * i + 1] =
            __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] >> 16)));
      } else {
        values[2 * i] = __uint_as_float(words[i] << 16);
        values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
    }
  }
}



template <typename Q, typename Kv, int kHeadDim, int kGroup, int kTiling>
__global__ void __launch_bounds__(internal::kDecodeTilings[kTiling].threads)
    PagedDecodeKernel(DecodeArgs args) {
  using S = DecodeShape<Kv, kHeadDim, kGroup, kTiling>;
  constexpr int kThreads = S::kThreads, kWarps = S::kWarps, kStages = S::kStages;
  constexpr int kPasses = S::kPasses;
  constexpr bool kQuantized = internal::kIsKvCode<Kv>;
  extern __shared__ __align__(16) uint8_t ring[];  // S::kSharedBytes
  // Each tile's rows as cache rows (internal::TileRowResolver; kNoCacheRow when none).
  __shared__ uint32_t row_ring[S::kRowRing][S::kTile];
  __shared__ float warp_max[kWarps][kGroup], warp_sum[kWarps][kGroup];

  const int seq = blockIdx.z;
  const int split = blockIdx.x;
  const int num_splits = gridDim.x;
  const int kv_head = blockIdx.y / args.head_chunks;
  const int chunk = blockIdx.y % args.head_chunks;
  const int head0 = kv_head * args.group + chunk * kGroup;
  const int heads_here = min(kGroup, args.group - chunk * kGroup);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int subgroup = threadIdx.x / S::kLanes, sub_lane = threadIdx.x % S::kLanes;

  const internal::DecodeSpan span = internal::DecodeSpanOf(args, seq, split, num_splits, S::kTile);
  const int begin = span.begin, num_tiles = span.num_tiles;

  // This lane's 8 dims of every query head, pre-scaled, in registers for the whole split.
  const Q* q =
      static_cast<const Q*>(args.q) + seq * args.q_stride + static_cast<int64_t>(head0) * kHeadDim;
  float q_lane[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q_lane[g][i] = g < heads_here ? ToFloat(q[g * kHeadDim + sub_lane * 8 + i]) * args.scale
                                    : 0.0f;
    }
  }

  // ---- the rows: thread `row` < kTile resolves row `row` of each tile in turn, kStages
  // tiles ahead of its compute.
  bool bad = false;  // a table the host failed to validate
  const int length = span.end - begin;
  internal::TileRowResolver resolver(begin + static_cast<int>(threadIdx.x), args.block_size,
                                     S::kTile);
  auto resolve = [&](int tile) {
    if (tile >= num_tiles || threadIdx.x >= S::kTile) return;
    const bool in_span = tile * S::kTile + static_cast<int>(threadIdx.x) < length;
    row_ring[tile % S::kRowRing][threadIdx.x] = resolver.Next(args, span, in_span, kv_head, bad);
  };
  // ---- the ring: thread i copies column i % kChunksPerRow of rows i / kChunksPerRow + j
  // kThreads / kChunksPerRow of each tile, from the rows resolved a tile earlier.
  const int column = static_cast<int>(threadIdx.x) % S::kChunksPerRow;
  const int copy_row = static_cast<int>(threadIdx.x) / S::kChunksPerRow;
  const uint8_t* k_source = static_cast<const uint8_t*>(args.k_cache) + column * 16;
  const uint8_t* v_source = static_cast<const uint8_t*>(args.v_cache) + column * 16;
  auto issue = [&](int tile) {
    if (tile < num_tiles) {
      uint8_t* k_stage = ring + (tile % kStages) * S::kStageBytes + threadIdx.x * 16;
      const uint32_t* rows = row_ring[tile % S::kRowRing] + copy_row;
#pragma unroll
      for (int i = 0; i < S::kChunksPerThread; ++i) {
        constexpr int kRowsApart = kThreads / S::kChunksPerRow;
        const uint32_t row = rows[i * kRowsApart];
        const bool found = row != internal::kNoCacheRow;
        const uint64_t at = static_cast<uint64_t>(found ? row : 0u) * S::kRowBytes;
        CopyAsync16(k_stage + i * kThreads * 16, k_source + at, found ? 16 : 0);
        CopyAsync16(k_stage + S::kTileBytes + i * kThreads * 16, v_source + at, found ? 16 : 0);
      }
    }
    CopyAsyncCommit();  // an empty group past the last tile keeps the wait counts uniform
  };

  // ---- 8-bit scales of this subgroup's tokens: the current tile's and the next's.
  float k_scale[kPasses] = {}, v_scale[kPasses] = {};
  float next_k_scale[kPasses] = {}, next_v_scale[kPasses] = {};
  auto load_scales = [&](int tile, float (&ks)[kPasses], float (&vs)[kPasses]) {
    if constexpr (kQuantized) {
      if (tile >= num_tiles) return;
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const uint32_t row = row_ring[tile % S::kRowRing][p * S::kSubgroups + subgroup];
        constexpr float kFactor = internal::kKvDecodeFactor<Kv>;
        ks[p] = row != internal::kNoCacheRow
                    ? internal::Bf16BitsToFloat(args.k_scale[row]) * kFactor
                    : 0.0f;
        vs[p] = row != internal::kNoCacheRow
                    ? internal::Bf16BitsToFloat(args.v_scale[row]) * kFactor
                    : 0.0f;
      }
    } else {
      (void)tile, (void)ks, (void)vs;
    }
  };

  // ---- this subgroup's online softmax.
  float row_max[kGroup], row_sum[kGroup], acc[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    row_max[g] = -INFINITY;
    row_sum[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }
  auto compute = [&](int tile) {
    const int stage = tile % kStages;
    const Kv* k_tile = reinterpret_cast<const Kv*>(ring + stage * S::kStageBytes);
    const Kv* v_tile = reinterpret_cast<const Kv*>(ring + stage * S::kStageBytes + S::kTileBytes);
    float score[kPasses][kGroup];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int t = p * S::kSubgroups + subgroup;
      const bool valid = row_ring[tile % S::kRowRing][t] != internal::kNoCacheRow;
      float k[8];
      LoadShared8(k_tile + t * kHeadDim + sub_lane * 8, k);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot += q_lane[g][i] * k[i];
#pragma unroll
        for (int offset = S::kLanes / 2; offset > 0; offset >>= 1) {
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        }
        if constexpr (kQuantized) dot *= k_scale[p];
        if (args.softcap > 0.0f) dot = args.softcap * tanhf(dot / args.softcap);
        score[p][g] = valid ? dot : -INFINITY;
      }
    }
    // At most one rescale per tile, skipped when no head of the warp has a new maximum: its
    // factor would be exp(0) = 1 (or 0 times sums that are 0), so no bit changes, and after the
    // first tiles a new maximum is rare. Scores become probabilities relative to the max.
    float new_max[kGroup];
    bool grew = false;
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      new_max[g] = row_max[g];
#pragma unroll
      for (int p = 0; p < kPasses; ++p) new_max[g] = fmaxf(new_max[g], score[p][g]);
      grew = grew || new_max[g] > row_max[g];
    }
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float alpha = ExpFrom(row_max[g], new_max[g]);
        row_max[g] = new_max[g];
        row_sum[g] *= alpha;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        score[p][g] = ExpFrom(score[p][g], row_max[g]);
        row_sum[g] += score[p][g];
      }
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int t = p * S::kSubgroups + subgroup;
      float v[8];
      LoadShared8(v_tile + t * kHeadDim + sub_lane * 8, v);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float probability = kQuantized ? score[p][g] * v_scale[p] : score[p][g];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] += probability * v[i];
      }
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
    if (tile == 0) load_scales(0, k_scale, v_scale);
    load_scales(tile + 1, next_k_scale, next_v_scale);
    compute(tile);
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      k_scale[p] = next_k_scale[p];
      v_scale[p] = next_v_scale[p];
    }
  }
  CopyAsyncWait<0>();

  // ---- merge: the subgroups of a warp by shuffles, then the warps through shared memory.
#pragma unroll
  for (int offset = S::kLanes; offset < 32; offset <<= 1) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float other_max = __shfl_xor_sync(0xffffffffu, row_max[g], offset);
      const float other_sum = __shfl_xor_sync(0xffffffffu, row_sum[g], offset);
      const float new_max = fmaxf(row_max[g], other_max);
      const float mine = ExpFrom(row_max[g], new_max), theirs = ExpFrom(other_max, new_max);
      row_sum[g] = row_sum[g] * mine + other_sum * theirs;
      row_max[g] = new_max;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        acc[g][i] = acc[g][i] * mine + __shfl_xor_sync(0xffffffffu, acc[g][i], offset) * theirs;
      }
    }
  }
  const bool bad_table = __syncthreads_or(bad) != 0;  // also: the ring is free for the merge
  float* merge = reinterpret_cast<float*>(ring);    // [kWarps][kGroup][kHeadDim]
  if (lane < S::kLanes) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        merge[(warp * kGroup + g) * kHeadDim + lane * 8 + i] = acc[g][i];
      }
      if (lane == 0) {
        warp_max[warp][g] = row_max[g];
        warp_sum[warp][g] = row_sum[g];
      }
    }
  }
  __syncthreads();
  const internal::DecodeOutput output{
      args.out, args.partial_acc, args.partial_max, args.partial_sum, args.sinks, kHeadDim,
      split,    num_splits,       args.out_low,     args.out_low_bf16};
  for (int i = threadIdx.x; i < heads_here * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim, d = i % kHeadDim;
    internal::StoreDecodeElement<Q, kWarps>(
        &warp_max[0][g], &warp_sum[0][g], kGroup, merge + g * kHeadDim + d, kGroup * kHeadDim,
        bad_table, output, static_cast<int64_t>(seq) * args.num_heads + head0 + g, head0 + g, d);
  }
}

// Merges the splits of one (sequence, head): block (head, sequence), thread d owns output
// dim d. With sinks the head's sink joins the denominator here, once.
template <typename Q>
__global__ void PagedDecodeReduceKernel(const float* __restrict__ partial_acc,
                                        const float* __restrict__ partial_max,
                                        const float* __restrict__ partial_sum,
                                        const float* __restrict__ sinks, Q* __restrict__ out,
                                        void* __restrict__ out_low, bool out_low_bf16,
                                        int num_splits, int head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const float* maxes = partial_max + row * num_splits;
  const float* sums = partial_sum + row * num_splits;
  float global_max = -INFINITY;
  for (int s = 0; s < num_splits; ++s) global_max = fmaxf(global_max, maxes[s]);
  // The sink as the reference max too, so that a dominant sink cannot overflow exp.
  const float sink = sinks != nullptr ? sinks[blockIdx.x] : -INFINITY;
  global_max = fmaxf(global_max, sink);
  const int d = threadIdx.x;
  float numerator = 0.0f, denominator = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    if (sums[s] == 0.0f) continue;  // an empty split (NaN, a bad table, is kept)
    const float weight = expf(maxes[s] - global_max);
    denominator += weight * sums[s];
    numerator += weight * partial_acc[(row * num_splits + s) * head_dim + d];
  }
  if (sinks != nullptr) denominator += ExpFrom(sink, global_max);
  const float value = denominator != 0.0f ? numerator / denominator : 0.0f;
  out[row * head_dim + d] = FromFloat<Q>(value);
  if (out_low != nullptr) StoreLow(out_low, out_low_bf16, row * head_dim + d, value);
}

// Blocks of `kernel` (with kShared bytes of dynamic shared memory) one multiprocessor of
// the current device holds at once; asked once per instantiation.
template <auto kKernel, int kShared, int kThreads>
absl::StatusOr<int> ResidentBlocksPerSm() {
  static std::atomic<int> resident{0};
  if (const int known = resident.load(); known > 0) return known;
  int blocks = 0;
  const cudaError_t error =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, kThreads, kShared);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrFormat("PagedDecode: occupancy query failed: %s", cudaGetErrorString(error)));
  }
  blocks = std::clamp(blocks, 1, internal::kMaxResidentDecodeBlocks);
  resident.store(blocks);
  return blocks;
}

// Splits (the heuristic's when p.num_splits is 0: one wave of resident blocks), their
// workspace and partition, then the kernels.
template <typename Q, typename Kv, int kHeadDim, int kGroup, int kTiling = 0>
absl::Status LaunchKernels(const PagedDecodeParams& p, DecodeArgs args, cudaStream_t stream) {
  using S = DecodeShape<Kv, kHeadDim, kGroup, kTiling>;
  constexpr int kShared = S::kSharedBytes;
  constexpr auto kernel = &PagedDecodeKernel<Q, Kv, kHeadDim, kGroup, kTiling>;
  LOOM_RETURN_IF_ERROR(internal::OptInSharedMemory<kernel>(kShared, "PagedDecode"));
  LOOM_ASSIGN_OR_RETURN(const int resident, (ResidentBlocksPerSm<kernel, kShared, S::kThreads>()));
  LOOM_ASSIGN_OR_RETURN(
      const int num_splits,
      internal::PlanDecodeSplits(p, p.num_seqs * p.cache.num_kv_heads * args.head_chunks,
                                 resident, args));
  const dim3 grid(num_splits, static_cast<unsigned>(p.cache.num_kv_heads * args.head_chunks),
                  static_cast<unsigned>(p.num_seqs));
  kernel<<<grid, S::kThreads, kShared, stream>>>(args);
  LOOM_RETURN_IF_ERROR(internal::CheckLaunch("PagedDecode"));
  return num_splits > 1 ? internal::LaunchPagedDecodeReduce(p, num_splits, stream)
                        : absl::OkStatus();
}

// The one place runtime shapes become template arguments: q dtype x KV dtype x head dim x
// heads per block.
template <typename Q, typename Kv>
absl::Status DispatchShape(const PagedDecodeParams& p, const DecodeArgs& args, int group_tile,
                           cudaStream_t stream) {
  auto by_group = [&]<int kHeadDim>() {
    switch (group_tile) {
      case 1:
        return LaunchKernels<Q, Kv, kHeadDim, 1>(p, args, stream);
      case 2:
        return LaunchKernels<Q, Kv, kHeadDim, 2>(p, args, stream);
      case 4:
        return LaunchKernels<Q, Kv, kHeadDim, 4>(p, args, stream);
      default:
        return LaunchKernels<Q, Kv, kHeadDim, 8>(p, args, stream);
    }
  };
  if (p.cache.head_dim == 64) return by_group.template operator()<64>();
  if (p.cache.head_dim == 128) return by_group.template operator()<128>();
  return by_group.template operator()<256>();
}

}  // namespace

absl::StatusOr<int> internal::PlanDecodeSplits(const PagedDecodeParams& p,
                                               int64_t blocks_per_split, int resident,
                                               DecodeArgs& args) {
  int num_splits = p.num_splits;
  if (num_splits == 0) {
    LOOM_ASSIGN_OR_RETURN(const int num_sms, CurrentDeviceSmCount());
    num_splits = ChoosePagedDecodeSplits(blocks_per_split, PagedDecodeAttendedLength(p),
                                         num_sms, resident);
  }
  const int64_t needed =
      internal::DecodeWorkspaceBytes(p.num_seqs, p.num_heads, p.cache.head_dim, num_splits);
  if (needed > 0 && (p.workspace == nullptr || static_cast<int64_t>(p.workspace_bytes) < needed)) {
    // Only on a GPU of more than kMaxSmsForWorkspace multiprocessors.
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedDecode: %d splits need a workspace of %d bytes, got %d", num_splits, needed,
        p.workspace_bytes));
  }
  if (num_splits > 1) {
    const int64_t partials = p.num_seqs * p.num_heads * num_splits;
    args.partial_acc = static_cast<float*>(p.workspace);
    args.partial_max = args.partial_acc + partials * p.cache.head_dim;
    args.partial_sum = args.partial_max + partials;
  }
  args.partition =
      static_cast<int>((PagedDecodeAttendedLength(p) + num_splits - 1) / num_splits);
  return num_splits;
}

absl::StatusOr<internal::DecodeArgs> internal::MakeDecodeArgs(const PagedDecodeParams& p) {
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  const int head_chunks = static_cast<int>(internal::DecodeHeadChunks(group));
  if (p.cache.num_kv_heads * head_chunks > 65535) {
    return absl::InvalidArgumentError("PagedDecode: too many KV heads for one grid dimension");
  }
  DecodeArgs args{};
  args.q = p.q;
  args.out = p.out;
  args.out_low = p.out_low;
  args.out_low_bf16 = p.out_low_dtype == DataType::kBF16;
  args.k_cache = p.cache.k;
  args.v_cache = p.cache.v;
  args.context_len = p.context_len;
  args.block_indptr = p.block_indptr;
  args.block_indices = p.block_indices;
  args.k_scale = p.cache.k_scale;
  args.v_scale = p.cache.v_scale;
  args.q_stride = p.q_stride != 0 ? p.q_stride : p.num_heads * p.cache.head_dim;
  args.num_heads = static_cast<int>(p.num_heads);
  args.num_kv_heads = static_cast<int>(p.cache.num_kv_heads);
  args.group = group;
  args.head_chunks = head_chunks;
  args.block_size = static_cast<int>(p.cache.block_size);
  args.num_blocks = static_cast<int>(std::min<int64_t>(p.cache.num_blocks, 0x7fffffff));
  args.window = static_cast<int>(p.window);
  args.scale = p.scale;
  args.softcap = p.softcap;
  args.sinks = p.sinks;
  return args;
}

namespace {

// Candidate tiling kTiling at head dim 128 and `group_tile` 4 or 8 (the tuning space's
// shapes): F16 K/V with an F16 query, or an INT8 cache with its F32 query.
template <int kTiling>
absl::Status LaunchCandidate(const PagedDecodeParams& p, const DecodeArgs& args, int group_tile,
                             cudaStream_t stream) {
  if (p.cache.quant == KvQuant::kInt8) {
    return group_tile == 4 ? LaunchKernels<float, int8_t, 128, 4, kTiling>(p, args, stream)
                           : LaunchKernels<float, int8_t, 128, 8, kTiling>(p, args, stream);
  }
  return group_tile == 4 ? LaunchKernels<__half, __half, 128, 4, kTiling>(p, args, stream)
                         : LaunchKernels<__half, __half, 128, 8, kTiling>(p, args, stream);
}

using CandidateLaunch = absl::Status (*)(const PagedDecodeParams&, const DecodeArgs&, int,
                                         cudaStream_t);
template <int... kIndex>
constexpr std::array<CandidateLaunch, sizeof...(kIndex)> CandidateLaunches(
    std::integer_sequence<int, kIndex...>) {
  return {&LaunchCandidate<kIndex>...};
}

}  // namespace

absl::Status internal::LaunchPagedDecodeReduce(const PagedDecodeParams& p, int num_splits,
                                               cudaStream_t stream) {
  const int64_t partials = p.num_seqs * p.num_heads * num_splits;
  const float* acc = static_cast<const float*>(p.workspace);
  const float* max = acc + partials * p.cache.head_dim;
  const float* sum = max + partials;
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_seqs));
  const int threads = static_cast<int>(p.cache.head_dim);
  const bool low_bf16 = p.out_low_dtype == DataType::kBF16;
  if (p.q_dtype == DataType::kF32) {
    PagedDecodeReduceKernel<float>
        <<<grid, threads, 0, stream>>>(acc, max, sum, p.sinks, static_cast<float*>(p.out),
                                       p.out_low, low_bf16, num_splits, threads);
  } else if (p.q_dtype == DataType::kF16) {
    PagedDecodeReduceKernel<__half>
        <<<grid, threads, 0, stream>>>(acc, max, sum, p.sinks, static_cast<__half*>(p.out),
                                       p.out_low, low_bf16, num_splits, threads);
  } else {
    PagedDecodeReduceKernel<__nv_bfloat16>
        <<<grid, threads, 0, stream>>>(acc, max, sum, p.sinks, static_cast<__nv_bfloat16*>(p.out),
                                       p.out_low, low_bf16, num_splits, threads);
  }
  return internal::CheckLaunch("PagedDecode split reduction");
}

// The tilings of kDecodeTilings, then the tensor-core kernel (paged_decode_mma.cu).
int PagedDecodeCandidateCount() { return internal::kNumDecodeTilings + 1; }

std::string_view PagedDecodeCandidateName(int index) {
  return index < internal::kNumDecodeTilings ? internal::kDecodeTilings[index].name
                                             : "mma_t64_s3";
}

absl::Status LaunchPagedDecodeCandidate(const PagedDecodeParams& p, int index,
                                        cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckPagedDecodeParams(p));
  if (index < 0 || index >= PagedDecodeCandidateCount()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedDecode candidate %d: not in [0, %d)", index, PagedDecodeCandidateCount()));
  }
  if (index == internal::kNumDecodeTilings) {
    if (!internal::PagedDecodeMmaSupports(p)) {
      return absl::UnimplementedError(
          "PagedDecode candidate mma_t64_s3: head dim 128, F16 or BF16 K/V with a query of the "
          "same type or F32, at most 16 query heads per KV head, query rows aligned to two "
          "elements");
    }
    return p.num_seqs == 0 ? absl::OkStatus() : internal::LaunchPagedDecodeMma(p, stream);
  }
  // The dispatched kernel takes every cache LaunchPagedDecode takes (BF16 too).
  if (index == 0) return LaunchPagedDecode(p, stream);
  const int group_tile = internal::DecodeHeadsPerBlock(p.num_heads / p.cache.num_kv_heads);
  const bool f16 = p.cache.quant == KvQuant::kNone && p.cache.dtype == DataType::kF16 &&
                   p.q_dtype == DataType::kF16;
  const bool int8 = p.cache.quant == KvQuant::kInt8 && p.q_dtype == DataType::kF32;
  if (p.cache.head_dim != 128 || group_tile < 4 || !(f16 || int8)) {
    return absl::InvalidArgumentError(
        "PagedDecode candidate: head dim 128, 3 or more query heads per KV head, F16 K/V with "
        "an F16 query or INT8 K/V with an F32 one");
  }
  if (p.num_seqs == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(const DecodeArgs args, internal::MakeDecodeArgs(p));
  return CandidateLaunches(std::make_integer_sequence<int, internal::kNumDecodeTilings>{})[index](
      p, args, group_tile, stream);
}

absl::Status LaunchPagedDecode(const PagedDecodeParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckPagedDecodeParams(p));
  if (p.num_seqs == 0) return absl::OkStatus();
  const int group_tile = internal::DecodeHeadsPerBlock(p.num_heads / p.cache.num_kv_heads);
  LOOM_ASSIGN_OR_RETURN(const DecodeArgs args, internal::MakeDecodeArgs(p));
  auto by_kv = [&]<typename Kv>() {
    return p.q_dtype == DataType::kF32
               ? DispatchShape<float, Kv>(p, args, group_tile, stream)
               : DispatchShape<Kv, Kv>(p, args, group_tile, stream);
  };
  // 8-bit caches take an F32 query (the rotated one, kv_cache.h).
  if (p.cache.quant == KvQuant::kInt8) {
    return DispatchShape<float, int8_t>(p, args, group_tile, stream);
  }
  if (p.cache.quant == KvQuant::kFp8E4m3) {
    return DispatchShape<float, uint8_t>(p, args, group_tile, stream);
  }
  if (p.cache.dtype == DataType::kF16) return by_kv.template operator()<__half>();
  return by_kv.template operator()<__nv_bfloat16>();
}

}  // namespace loom::kernels::cuda
