#include "kernels/cuda/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "kernels/cuda/paged_attention_internal.h"

namespace loom::kernels::cuda {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The most splits a launch with these params can use: num_splits when set, else what the
// heuristic picks on a GPU of up to kMaxSmsForWorkspace multiprocessors.
int64_t MaxSplits(const PagedDecodeParams& p) {
  if (p.num_splits > 0) return p.num_splits;
  if (p.num_seqs <= 0 || p.num_heads <= 0 || p.cache.num_kv_heads <= 0) return 1;
  const int64_t blocks_per_split =
      p.num_seqs * p.cache.num_kv_heads *
      internal::DecodeHeadChunks(p.num_heads / p.cache.num_kv_heads);
  return ChoosePagedDecodeSplits(blocks_per_split, PagedDecodeAttendedLength(p),
                                 internal::kMaxSmsForWorkspace, internal::kMaxResidentDecodeBlocks);
}

}  // namespace

int64_t PagedDecodeAttendedLength(const PagedDecodeParams& p) {
  return p.window > 0 ? std::min(p.max_context_len, p.window) : p.max_context_len;
}

int ChoosePagedDecodeSplits(int64_t blocks_per_split, int64_t max_context_len, int num_sms,
                            int resident_blocks_per_sm) {
  const int64_t by_length =
      std::min<int64_t>(CeilDiv(std::max<int64_t>(max_context_len, 1), kPagedDecodeMinPartition),
                        kPagedDecodeMaxSplits);
  if (by_length <= 1 || blocks_per_split <= 0) return 1;
  const int64_t wanted_blocks =
      static_cast<int64_t>(std::max(num_sms, 1)) *
      std::clamp(resident_blocks_per_sm, 1, internal::kMaxResidentDecodeBlocks);
  return static_cast<int>(
      std::clamp<int64_t>(CeilDiv(wanted_blocks, blocks_per_split), 1, by_length));
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
