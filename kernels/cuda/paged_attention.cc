#include "kernels/cuda/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "kernels/cuda/paged_attention_internal.h"

namespace loom::kernels::cuda {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A split's fixed cost in tokens of streaming: filling the cp.async ring before the first
// tile lands, and the epilogue's merge and partial writes.
constexpr int64_t kSplitOverheadTokens = 64;

// The splits the heuristic may consider: no partition under kPagedDecodeMinPartition
// tokens, at most kPagedDecodeMaxSplits, and at most two waves of blocks (more splits
// only add partial sums once the (sequence, KV head) blocks fill the GPU). Monotone in
// `wanted_blocks`, so the largest GPU's bound bounds every GPU's choice (the workspace).
int64_t SplitCap(int64_t blocks_per_split, int64_t attended, int64_t wanted_blocks) {
  const int64_t by_length = std::min<int64_t>(
      CeilDiv(std::max<int64_t>(attended, 1), kPagedDecodeMinPartition), kPagedDecodeMaxSplits);
  if (blocks_per_split <= 0) return 1;
  return std::max<int64_t>(1, std::min(by_length, CeilDiv(2 * wanted_blocks, blocks_per_split)));
}

// The most splits a launch with these params can use: num_splits when set, else the
// heuristic's cap on a GPU of up to kMaxSmsForWorkspace multiprocessors.
int64_t MaxSplits(const PagedDecodeParams& p) {
  if (p.num_splits > 0) return p.num_splits;
  if (p.num_seqs <= 0 || p.num_heads <= 0 || p.cache.num_kv_heads <= 0) return 1;
  const int64_t blocks_per_split =
      p.num_seqs * p.cache.num_kv_heads *
      internal::DecodeHeadChunks(p.num_heads / p.cache.num_kv_heads);
  return SplitCap(blocks_per_split, PagedDecodeAttendedLength(p),
                  static_cast<int64_t>(internal::kMaxSmsForWorkspace) *
                      internal::kMaxResidentDecodeBlocks);
}

}  // namespace

int64_t PagedDecodeAttendedLength(const PagedDecodeParams& p) {
  return p.window > 0 ? std::min(p.max_context_len, p.window) : p.max_context_len;
}

int ChoosePagedDecodeSplits(int64_t blocks_per_split, int64_t max_context_len, int num_sms,
                            int resident_blocks_per_sm) {
  const int64_t wanted_blocks =
      static_cast<int64_t>(std::max(num_sms, 1)) *
      std::clamp(resident_blocks_per_sm, 1, internal::kMaxResidentDecodeBlocks);
  const int64_t cap = SplitCap(blocks_per_split, max_context_len, wanted_blocks);
  // Equal partitions run in waves of wanted_blocks: the time is the waves times one
  // partition's tokens (plus its fixed cost). The cheapest, fewer splits on a tie.
  int64_t best = 1, best_cost = 0;
  for (int64_t splits = 1; splits <= cap; ++splits) {
    const int64_t cost = CeilDiv(blocks_per_split * splits, wanted_blocks) *
                         (CeilDiv(std::max<int64_t>(max_context_len, 1), splits) + kSplitOverheadTokens);
    if (splits == 1 || cost < best_cost) {
      best = splits;
      best_cost = cost;
    }
  }
  return static_cast<int>(best);
}

size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p) {
  if (p.num_seqs <= 0 || p.num_heads <= 0 || p.cache.head_dim <= 0) return 0;
  return static_cast<size_t>(
      internal::DecodeWorkspaceBytes(p.num_seqs, p.num_heads, p.cache.head_dim, MaxSplits(p)));
}

absl::Status CheckPagedDecodeParams(const PagedDecodeParams& p) {
  if (absl::Status status = CheckKvCacheView(p.cache); !status.ok()) return status;
  if (p.cache.head_dim != 64 && p.cache.head_dim != 128 && p.cache.head_dim != 256) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedDecode: head_dim %d unsupported (64, 128, 256)", p.cache.head_dim));
  }
  if (p.q_dtype != DataType::kF32 && p.q_dtype != p.cache.dtype) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedDecode: q dtype %s must be F32 or the cache's %s",
                        DataTypeName(p.q_dtype), DataTypeName(p.cache.dtype)));
  }
  if (p.cache.quant != KvQuant::kNone && p.q_dtype != DataType::kF32) {
    return absl::InvalidArgumentError("PagedDecode: an 8-bit cache takes an F32 query");
  }
  if (p.out_low != nullptr && p.out_low_dtype != DataType::kF16 &&
      p.out_low_dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedDecode: out_low dtype %s must be F16 or BF16", DataTypeName(p.out_low_dtype)));
  }
  if (reinterpret_cast<uintptr_t>(p.cache.k) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.cache.v) % 16 != 0) {
    return absl::InvalidArgumentError("PagedDecode: K/V pools must be 16-byte aligned");
  }
  if (p.num_seqs < 0 || p.num_seqs > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedDecode: num_seqs %d must be in [0, 65535]", p.num_seqs));
  }
  if (p.num_heads <= 0 || p.num_heads % p.cache.num_kv_heads != 0 || p.num_heads > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedDecode: num_heads %d must be a positive multiple of num_kv_heads %d (<= 65535)",
        p.num_heads, p.cache.num_kv_heads));
  }
  if (p.q_stride != 0 && p.q_stride < p.num_heads * p.cache.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedDecode: q_stride %d shorter than a row of %d", p.q_stride,
                        p.num_heads * p.cache.head_dim));
  }
  if (!std::isfinite(p.scale)) {
    return absl::InvalidArgumentError(absl::StrFormat("PagedDecode: scale %g not finite", p.scale));
  }
  if (p.max_context_len < 1 || p.max_context_len > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedDecode: max_context_len %d must be in [1, 2^31)", p.max_context_len));
  }
  if (p.window < 0 || p.window > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedDecode: window %d must be in [0, 2^31) (0: none)", p.window));
  }
  if (!std::isfinite(p.softcap) || p.softcap < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedDecode: softcap %g must be finite and >= 0 (0: none)", p.softcap));
  }
  if (reinterpret_cast<uintptr_t>(p.sinks) % alignof(float) != 0) {
    return absl::InvalidArgumentError("PagedDecode: sinks must be 4-byte aligned");
  }
  if (p.num_splits < 0 || p.num_splits > kPagedDecodeMaxSplits) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedDecode: num_splits %d must be 0 (heuristic) or in [1, %d]",
                        p.num_splits, kPagedDecodeMaxSplits));
  }
  if (p.num_seqs > 0 && (p.q == nullptr || p.out == nullptr || p.context_len == nullptr ||
                         p.block_indptr == nullptr || p.block_indices == nullptr)) {
    return absl::InvalidArgumentError("PagedDecode: null q, out or block table");
  }
  const size_t needed = PagedDecodeWorkspaceBytes(p);
  if (p.num_seqs > 0 && needed > 0 && (p.workspace == nullptr || p.workspace_bytes < needed)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedDecode: workspace of %d bytes, %d needed", p.workspace_bytes, needed));
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchPagedDecode(const PagedDecodeParams& params, cudaStream_t) {
  if (absl::Status status = CheckPagedDecodeParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("PagedDecode: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
