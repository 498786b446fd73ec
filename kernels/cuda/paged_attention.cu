// Paged decode attention, FlashDecoding style.
//
// Block (split, kv_head * head_chunks + chunk, seq), 128 threads. A block computes up to
// kGroup query heads that share one KV head, so each K/V row is read once for the group.
// Threads form subgroups of kHeadDim / 8 lanes; a subgroup owns one token at a time and
// each lane 8 consecutive dims (one 16-byte load of K or V). The split's tokens go in
// tiles of kTile: scores into shared memory, an online-softmax update per head, then the
// V accumulation in registers. Subgroups are merged at the end; with several splits each
// block leaves (unnormalized sums, max, denominator) in the workspace and
// PagedDecodeReduceKernel merges them. An 8-bit cache (int8_t or uint8_t codes as Kv) is
// read 8 codes (8 bytes) per lane; a token's K scale multiplies its score, its V scale its
// probability (the caller rotates query and output, kv_cache.h).
#include <cmath>

#include "common/status_macros.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_internal.h"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 128;

// Eight consecutive F16/BF16 values from a 16-byte aligned address (8-bit codes: 8-byte
// aligned), as floats.
template <typename Kv>
__device__ __forceinline__ void Load8(const Kv* address, float (&values)[8]) {
  if constexpr (internal::kIsKvCode<Kv>) {
    internal::LoadCodes8(address, values);
    return;
  }
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(address));
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

struct DecodeArgs {
  const void* q;
  void* out;
  const void* k_cache;
  const void* v_cache;
  const int32_t* context_len;
  const int32_t* block_indptr;
  const int32_t* block_indices;
  const uint16_t* k_scale;  // 8-bit caches: [slots, num_kv_heads] BF16 bits
  const uint16_t* v_scale;
  float* partial_acc;  // [num_seqs, num_heads, num_splits, head_dim]
  float* partial_max;  // [num_seqs, num_heads, num_splits]
  float* partial_sum;  // [num_seqs, num_heads, num_splits]
  int64_t q_stride;
  int num_heads;
  int num_kv_heads;
  int group;        // num_heads / num_kv_heads
  int head_chunks;  // ceil(group / kGroup)
  int block_size;
  int num_blocks;
  int partition;  // tokens per split (the last split runs to context_len)
  int window;     // > 0: attend to the last `window` positions only
  float scale;
  float softcap;  // > 0: scores become softcap * tanh(score / softcap)
};

template <typename Q, typename Kv, int kHeadDim, int kGroup>
__global__ void __launch_bounds__(kThreads) PagedDecodeKernel(DecodeArgs args) {
  constexpr int kLanes = kHeadDim / 8;           // lanes per token
  constexpr int kSubgroups = kThreads / kLanes;  // tokens in flight per block
  __shared__ float q_shared[kGroup][kHeadDim];   // pre-scaled queries
  __shared__ float p_shared[kGroup][kTile];      // scores, then probabilities
  __shared__ int64_t slot_shared[kTile];         // the tile's slots, -1 when invalid
  __shared__ float max_shared[kGroup], sum_shared[kGroup], alpha_shared[kGroup];
  __shared__ float merge_shared[kWarps][kGroup][kHeadDim];
  __shared__ int bad_table;

  const int seq = blockIdx.z;
  const int split = blockIdx.x;
  const int num_splits = gridDim.x;
  const int kv_head = blockIdx.y / args.head_chunks;
  const int chunk = blockIdx.y % args.head_chunks;
  const int head0 = kv_head * args.group + chunk * kGroup;
  const int heads_here = min(kGroup, args.group - chunk * kGroup);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int subgroup = threadIdx.x / kLanes, sub_lane = threadIdx.x % kLanes;

  const int context = args.context_len[seq];
  // The splits cut the attended positions [first, context): with a window the positions
  // before it are never read (their blocks may be freed).
  const int first = args.window > 0 ? max(0, context - args.window) : 0;
  const int begin = first + split * args.partition;
  const int end = split == num_splits - 1 ? context : min(context, begin + args.partition);
  const int table_begin = args.block_indptr[seq];
  const int table_len = args.block_indptr[seq + 1] - table_begin;

  const Q* q =
      static_cast<const Q*>(args.q) + seq * args.q_stride + static_cast<int64_t>(head0) * kHeadDim;
  for (int i = threadIdx.x; i < kGroup * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim;
    q_shared[g][i % kHeadDim] = g < heads_here ? ToFloat(q[i]) * args.scale : 0.0f;
  }
  if (threadIdx.x < kGroup) {
    max_shared[threadIdx.x] = -INFINITY;
    sum_shared[threadIdx.x] = 0.0f;
  }
  if (threadIdx.x == 0) bad_table = 0;
  __syncthreads();

  constexpr bool kQuantized = internal::kIsKvCode<Kv>;
  // A token's scale, times the codes' decode factor (1 without quantization).
  auto row_scale = [&](const uint16_t* scales, int64_t slot) {
    if constexpr (kQuantized) {
      return internal::Bf16BitsToFloat(scales[slot * args.num_kv_heads + kv_head]) *
             internal::kKvDecodeFactor<Kv>;
    } else {
      return 1.0f;
    }
  };
  const Kv* k_cache = static_cast<const Kv*>(args.k_cache);
  const Kv* v_cache = static_cast<const Kv*>(args.v_cache);
  const int64_t head_offset = static_cast<int64_t>(kv_head) * kHeadDim + sub_lane * 8;
  // This lane's 8 dims of every query head stay in registers for the whole split.
  float q_lane[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) q_lane[g][i] = q_shared[g][sub_lane * 8 + i];
  }
  float acc[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }

  for (int tile = begin; tile < end; tile += kTile) {
    const int count = min(kTile, end - tile);
    // Scores. The loop bound is uniform across the block, so whole warps shuffle together.
    for (int base = 0; base < count; base += kSubgroups) {
      const int t = base + subgroup;
      const bool active = t < count;
      int64_t slot = -1;
      if (active) {
        const int position = tile + t;
        const int index = position / args.block_size;
        const int block = index < table_len ? args.block_indices[table_begin + index] : -1;
        if (block >= 0 && block < args.num_blocks) {
          slot = static_cast<int64_t>(block) * args.block_size + position % args.block_size;
        } else {
          atomicOr(&bad_table, 1);  // a table the host failed to validate
        }
      }
      float k_values[8] = {};
      float k_scale = 0.0f;
      if (slot >= 0) {
        Load8(k_cache + slot * args.num_kv_heads * kHeadDim + head_offset, k_values);
        k_scale = row_scale(args.k_scale, slot);
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot += q_lane[g][i] * k_values[i];
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        }
        if constexpr (kQuantized) dot *= k_scale;
        if (args.softcap > 0.0f) dot = args.softcap * tanhf(dot / args.softcap);
        if (active && sub_lane == 0) p_shared[g][t] = slot >= 0 ? dot : -INFINITY;
      }
      if (active && sub_lane == 0) slot_shared[t] = slot;
    }
    __syncthreads();
    // Online softmax: one warp per head.
    for (int g = warp; g < kGroup; g += kWarps) {
      float tile_max = -INFINITY;
      for (int t = lane; t < count; t += 32) tile_max = fmaxf(tile_max, p_shared[g][t]);
      tile_max = internal::WarpMax(tile_max);
      const float old_max = max_shared[g];
      const float new_max = fmaxf(old_max, tile_max);
      float tile_sum = 0.0f;
      for (int t = lane; t < count; t += 32) {
        const float p = new_max == -INFINITY ? 0.0f : expf(p_shared[g][t] - new_max);
        p_shared[g][t] = p;
        tile_sum += p;
      }
      tile_sum = internal::WarpSum(tile_sum);
      __syncwarp();
      if (lane == 0) {
        const float alpha = old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
        alpha_shared[g] = alpha;
        sum_shared[g] = sum_shared[g] * alpha + tile_sum;
        max_shared[g] = new_max;
      }
    }
    __syncthreads();
    // V accumulation in registers.
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float alpha = alpha_shared[g];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
    }
    for (int t = subgroup; t < count; t += kSubgroups) {
      const int64_t slot = slot_shared[t];
      if (slot < 0) continue;
      float v_values[8];
      Load8(v_cache + slot * args.num_kv_heads * kHeadDim + head_offset, v_values);
      const float v_scale = row_scale(args.v_scale, slot);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float p = kQuantized ? p_shared[g][t] * v_scale : p_shared[g][t];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] += p * v_values[i];
      }
    }
    __syncthreads();  // the next tile overwrites p_shared and slot_shared
  }

  // Merge the subgroups: first those sharing a warp (shuffles), then the warps.
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int offset = kLanes; offset < 32; offset <<= 1) {
        acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], offset);
      }
    }
  }
  if (lane < kLanes) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
#pragma unroll
      for (int i = 0; i < 8; ++i) merge_shared[warp][g][lane * 8 + i] = acc[g][i];
    }
  }
  __syncthreads();
  const bool bad = bad_table != 0;
  for (int i = threadIdx.x; i < heads_here * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim, d = i % kHeadDim;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += merge_shared[w][g][d];
    if (bad) total = NAN;
    const int64_t row = static_cast<int64_t>(seq) * args.num_heads + head0 + g;
    if (num_splits == 1) {
      const float sum = sum_shared[g];
      static_cast<Q*>(args.out)[row * kHeadDim + d] =
          FromFloat<Q>(sum != 0.0f ? total / sum : 0.0f);
    } else {
      const int64_t partial = row * num_splits + split;
      args.partial_acc[partial * kHeadDim + d] = total;
      if (d == 0) {
        args.partial_max[partial] = max_shared[g];
        args.partial_sum[partial] = bad ? NAN : sum_shared[g];
      }
    }
  }
}

// Merges the splits of one (sequence, head): thread d owns output dim d.
template <typename Q>
__global__ void PagedDecodeReduceKernel(const float* __restrict__ partial_acc,
                                        const float* __restrict__ partial_max,
                                        const float* __restrict__ partial_sum, Q* __restrict__ out,
                                        int num_splits, int head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const float* maxes = partial_max + row * num_splits;
  const float* sums = partial_sum + row * num_splits;
  float global_max = -INFINITY;
  for (int s = 0; s < num_splits; ++s) global_max = fmaxf(global_max, maxes[s]);
  const int d = threadIdx.x;
  float numerator = 0.0f, denominator = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    if (sums[s] == 0.0f) continue;  // an empty split (NaN, a bad table, is kept)
    const float weight = expf(maxes[s] - global_max);
    denominator += weight * sums[s];
    numerator += weight * partial_acc[(row * num_splits + s) * head_dim + d];
  }
  out[row * head_dim + d] = FromFloat<Q>(denominator != 0.0f ? numerator / denominator : 0.0f);
}

template <typename Q, typename Kv, int kHeadDim, int kGroup>
void LaunchKernels(const PagedDecodeParams& p, DecodeArgs args, int num_splits,
                   cudaStream_t stream) {
  const dim3 grid(num_splits, static_cast<unsigned>(p.cache.num_kv_heads * args.head_chunks),
                  static_cast<unsigned>(p.num_seqs));
  PagedDecodeKernel<Q, Kv, kHeadDim, kGroup><<<grid, kThreads, 0, stream>>>(args);
  if (num_splits > 1) {
    PagedDecodeReduceKernel<Q>
        <<<dim3(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_seqs)), kHeadDim, 0,
           stream>>>(args.partial_acc, args.partial_max, args.partial_sum, static_cast<Q*>(p.out),
                     num_splits, kHeadDim);
  }
}

// The one place runtime shapes become template arguments: q dtype x KV dtype x head dim x
// heads per block.
template <typename Q, typename Kv>
void DispatchShape(const PagedDecodeParams& p, const DecodeArgs& args, int group_tile,
                   int num_splits, cudaStream_t stream) {
  auto by_group = [&]<int kHeadDim>() {
    switch (group_tile) {
      case 1:
        LaunchKernels<Q, Kv, kHeadDim, 1>(p, args, num_splits, stream);
        break;
      case 2:
        LaunchKernels<Q, Kv, kHeadDim, 2>(p, args, num_splits, stream);
        break;
      case 4:
        LaunchKernels<Q, Kv, kHeadDim, 4>(p, args, num_splits, stream);
        break;
      default:
        LaunchKernels<Q, Kv, kHeadDim, 8>(p, args, num_splits, stream);
        break;
    }
  };
  if (p.cache.head_dim == 64) {
    by_group.template operator()<64>();
  } else if (p.cache.head_dim == 128) {
    by_group.template operator()<128>();
  } else {
    by_group.template operator()<256>();
  }
}

}  // namespace

absl::Status LaunchPagedDecode(const PagedDecodeParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckPagedDecodeParams(p));
  if (p.num_seqs == 0) return absl::OkStatus();
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  const int group_tile = internal::DecodeHeadsPerBlock(group);
  const int head_chunks = static_cast<int>(internal::DecodeHeadChunks(group));
  if (p.cache.num_kv_heads * head_chunks > 65535) {
    return absl::InvalidArgumentError("PagedDecode: too many KV heads for one grid dimension");
  }
  int num_splits = p.num_splits;
  if (num_splits == 0) {
    LOOM_ASSIGN_OR_RETURN(const int num_sms, CurrentDeviceSmCount());
    num_splits = ChoosePagedDecodeSplits(p.num_seqs * p.cache.num_kv_heads * head_chunks,
                                         PagedDecodeAttendedLength(p), num_sms);
  }
  const int64_t needed =
      internal::DecodeWorkspaceBytes(p.num_seqs, p.num_heads, p.cache.head_dim, num_splits);
  if (needed > 0 && (p.workspace == nullptr || static_cast<int64_t>(p.workspace_bytes) < needed)) {
    // Only on a GPU of more than kMaxSmsForWorkspace multiprocessors.
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedDecode: %d splits need a workspace of %d bytes, got %d", num_splits, needed,
        p.workspace_bytes));
  }
  DecodeArgs args{};
  args.q = p.q;
  args.out = p.out;
  args.k_cache = p.cache.k;
  args.v_cache = p.cache.v;
  args.context_len = p.context_len;
  args.block_indptr = p.block_indptr;
  args.block_indices = p.block_indices;
  args.k_scale = p.cache.k_scale;
  args.v_scale = p.cache.v_scale;
  if (num_splits > 1) {
    const int64_t partials = p.num_seqs * p.num_heads * num_splits;
    args.partial_acc = static_cast<float*>(p.workspace);
    args.partial_max = args.partial_acc + partials * p.cache.head_dim;
    args.partial_sum = args.partial_max + partials;
  }
  args.q_stride = p.q_stride != 0 ? p.q_stride : p.num_heads * p.cache.head_dim;
  args.num_heads = static_cast<int>(p.num_heads);
  args.num_kv_heads = static_cast<int>(p.cache.num_kv_heads);
  args.group = group;
  args.head_chunks = head_chunks;
  args.block_size = static_cast<int>(p.cache.block_size);
  args.num_blocks = static_cast<int>(std::min<int64_t>(p.cache.num_blocks, 0x7fffffff));
  args.partition =
      static_cast<int>((PagedDecodeAttendedLength(p) + num_splits - 1) / num_splits);
  args.window = static_cast<int>(p.window);
  args.scale = p.scale;
  args.softcap = p.softcap;
  auto by_kv = [&]<typename Kv>() {
    if (p.q_dtype == DataType::kF32) {
      DispatchShape<float, Kv>(p, args, group_tile, num_splits, stream);
    } else {
      DispatchShape<Kv, Kv>(p, args, group_tile, num_splits, stream);
    }
  };
  // 8-bit caches take an F32 query (the rotated one, kv_cache.h).
  if (p.cache.quant == KvQuant::kInt8) {
    DispatchShape<float, int8_t>(p, args, group_tile, num_splits, stream);
  } else if (p.cache.quant == KvQuant::kFp8E4m3) {
    DispatchShape<float, uint8_t>(p, args, group_tile, num_splits, stream);
  } else if (p.cache.dtype == DataType::kF16) {
    by_kv.template operator()<__half>();
  } else {
    by_kv.template operator()<__nv_bfloat16>();
  }
  return internal::CheckLaunch("PagedDecode");
}

}  // namespace loom::kernels::cuda
