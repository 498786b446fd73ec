#include "kernels/cuda/prefill_attention.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckPagedPrefillParams(const PagedPrefillParams& p) {
  if (absl::Status status = CheckKvCacheView(p.cache); !status.ok()) return status;
  if (p.cache.head_dim != 64 && p.cache.head_dim != 128 && p.cache.head_dim != 256) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: head_dim %d unsupported (64, 128, 256)", p.cache.head_dim));
  }
  if (p.q_dtype != p.cache.dtype) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: q dtype %s must be the cache's %s", DataTypeName(p.q_dtype),
                        DataTypeName(p.cache.dtype)));
  }
  if (p.out_dtype != DataType::kF32 && p.out_dtype != p.cache.dtype) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: out dtype %s must be F32 or the cache's %s",
                        DataTypeName(p.out_dtype), DataTypeName(p.cache.dtype)));
  }
  if (reinterpret_cast<uintptr_t>(p.cache.k) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.cache.v) % 16 != 0) {
    return absl::InvalidArgumentError("PagedPrefill: K/V pools must be 16-byte aligned");
  }
  if (p.num_seqs < 0 || p.num_seqs > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: num_seqs %d must be in [0, 65535]", p.num_seqs));
  }
  if (p.num_heads <= 0 || p.num_heads % p.cache.num_kv_heads != 0 || p.num_heads > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedPrefill: num_heads %d must be a positive multiple of num_kv_heads %d (<= 65535)",
        p.num_heads, p.cache.num_kv_heads));
  }
  if (p.cache.num_kv_heads > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: num_kv_heads %d exceeds 65535", p.cache.num_kv_heads));
  }
  if (p.q_stride != 0 && (p.q_stride < p.num_heads * p.cache.head_dim || p.q_stride % 8 != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedPrefill: q_stride %d must be a multiple of 8 and at least a row of %d", p.q_stride,
        p.num_heads * p.cache.head_dim));
  }
  if (!std::isfinite(p.scale)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: scale %g not finite", p.scale));
  }
  if (p.max_query_len < 1 || p.max_query_len > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: max_query_len %d must be in [1, 2^31)", p.max_query_len));
  }
  if (p.window < 0 || p.window > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: window %d must be in [0, 2^31) (0: none)", p.window));
  }
  if (!std::isfinite(p.softcap) || p.softcap < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedPrefill: softcap %g must be finite and >= 0 (0: none)", p.softcap));
  }
  if (reinterpret_cast<uintptr_t>(p.sinks) % alignof(float) != 0) {
    return absl::InvalidArgumentError("PagedPrefill: sinks must be 4-byte aligned");
  }
  if (p.num_seqs > 0 &&
      (p.q == nullptr || p.out == nullptr || p.query_start == nullptr || p.context_len == nullptr ||
       p.block_indptr == nullptr || p.block_indices == nullptr)) {
    return absl::InvalidArgumentError("PagedPrefill: null q, out, query_start or block table");
  }
  if (reinterpret_cast<uintptr_t>(p.q) % 16 != 0) {
    return absl::InvalidArgumentError("PagedPrefill: q must be 16-byte aligned");
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchPagedPrefill(const PagedPrefillParams& params, cudaStream_t) {
  if (absl::Status status = CheckPagedPrefillParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("PagedPrefill: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
