#include "kernels/cuda/kv_block_copy.h"

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

int64_t KvBlockCopySlotBytes(const KvBlockCopyParams& p) {
  return int64_t{p.num_layers} * 2 * (p.value_bytes + p.scale_bytes);
}

absl::Status CheckKvBlockCopyParams(const KvBlockCopyParams& p) {
  if (p.num_layers < 1 || (p.pools_per_layer != 2 && p.pools_per_layer != 4)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KvBlockCopy: num_layers %d must be positive, pools_per_layer %d 2 or 4",
                        p.num_layers, p.pools_per_layer));
  }
  if (p.value_bytes < 1 || (p.pools_per_layer == 4) != (p.scale_bytes > 0) || p.scale_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KvBlockCopy: value_bytes %d must be positive, scale_bytes %d positive exactly with "
        "4 pools per layer (%d)",
        p.value_bytes, p.scale_bytes, p.pools_per_layer));
  }
  if (p.num_blocks < 0 || p.num_blocks > kKvBlockCopyMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrFormat("KvBlockCopy: num_blocks %d not in [0, %d]",
                                                      p.num_blocks, kKvBlockCopyMaxBlocks));
  }
  if (int64_t{p.num_layers} * p.pools_per_layer > 0x7fffffff) {
    return absl::InvalidArgumentError("KvBlockCopy: more than 2^31 pools");
  }
  if (p.num_blocks > 0 && (p.pools == nullptr || p.staging == nullptr)) {
    return absl::InvalidArgumentError("KvBlockCopy: null pools or staging");
  }
  for (int i = 0; i < p.num_blocks; ++i) {
    if (p.blocks[i] < 0 || p.blocks[i] >= p.pool_blocks) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "KvBlockCopy: block %d (entry %d) outside the pools' %d", p.blocks[i], i, p.pool_blocks));
    }
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchKvBlockCopy(const KvBlockCopyParams& params, cudaStream_t) {
  if (absl::Status status = CheckKvBlockCopyParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("KvBlockCopy: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
