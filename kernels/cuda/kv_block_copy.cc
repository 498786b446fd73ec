#include "kernels/cuda/kv_block_copy.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {
namespace {

// The part layout both copies share: per layer K and V of value_bytes a block, then (8-bit KV,
// 4 pools per layer) their scales of scale_bytes.
absl::Status CheckPartShape(const char* kernel, int num_layers, int pools_per_layer,
                            int64_t value_bytes, int64_t scale_bytes) {
  if (num_layers < 1 || (pools_per_layer != 2 && pools_per_layer != 4)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: num_layers %d must be positive, pools_per_layer %d 2 or 4", kernel,
                        num_layers, pools_per_layer));
  }
  if (value_bytes < 1 || (pools_per_layer == 4) != (scale_bytes > 0) || scale_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: value_bytes %d must be positive, scale_bytes %d positive exactly with "
                        "4 pools per layer (%d)",
                        kernel, value_bytes, scale_bytes, pools_per_layer));
  }
  if (int64_t{num_layers} * pools_per_layer > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: more than 2^31 pools", kernel));
  }
  return absl::OkStatus();
}

absl::Status CheckNumBlocks(const char* kernel, int num_blocks) {
  if (num_blocks < 0 || num_blocks > kKvBlockCopyMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: num_blocks %d not in [0, %d]", kernel,
                                                      num_blocks, kKvBlockCopyMaxBlocks));
  }
  return absl::OkStatus();
}

// Two thread blocks writing one block would race: at most 64 entries, so pairwise.
absl::Status CheckWrittenOnce(const char* kernel, const char* name, const int32_t* blocks,
                              int num_blocks) {
  for (int i = 0; i < num_blocks; ++i) {
    for (int j = 0; j < i; ++j) {
      if (blocks[j] == blocks[i]) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: %s[%d] %d repeats %s[%d]", kernel, name, i, blocks[i], name, j));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t KvBlockCopySlotBytes(const KvBlockCopyParams& p) {
  return int64_t{p.num_layers} * 2 * (p.value_bytes + p.scale_bytes);
}

absl::Status CheckKvBlockCopyParams(const KvBlockCopyParams& p) {
  if (absl::Status shape = CheckPartShape("KvBlockCopy", p.num_layers, p.pools_per_layer,
                                          p.value_bytes, p.scale_bytes);
      !shape.ok()) {
    return shape;
  }
  if (absl::Status count = CheckNumBlocks("KvBlockCopy", p.num_blocks); !count.ok()) return count;
  if (p.num_blocks > 0 && (p.pools == nullptr || p.staging == nullptr)) {
    return absl::InvalidArgumentError("KvBlockCopy: null pools or staging");
  }
  for (int i = 0; i < p.num_blocks; ++i) {
    if (p.blocks[i] < 0 || p.blocks[i] >= p.pool_blocks) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "KvBlockCopy: block %d (entry %d) outside the pools' %d", p.blocks[i], i, p.pool_blocks));
    }
  }
  // Gathering a block twice is harmless; scattering two slots into one is a race.
  return p.to_staging ? absl::OkStatus()
                      : CheckWrittenOnce("KvBlockCopy", "blocks", p.blocks, p.num_blocks);
}

namespace {

// A head mapping's shape: rows of whole heads in both pools, the heads inside both rows.
absl::Status CheckHeadCopy(const KvPoolCopyParams& p) {
  const KvHeadCopy& h = p.heads;
  if (h.whole()) return absl::OkStatus();
  if (h.block_size < 1 || h.src_heads < 1 || h.dest_heads < 1 || h.count < 1 || h.src_first < 0 ||
      h.dest_first < 0 || h.src_first + h.count > h.src_heads ||
      h.dest_first + h.count > h.dest_heads) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KvPoolCopy: heads [%d, +%d) of %d-head source rows to [%d, +%d) of %d-head destination "
        "rows, %d rows a block: outside a row",
        h.src_first, h.count, h.src_heads, h.dest_first, h.count, h.dest_heads, h.block_size));
  }
  const int64_t rows = int64_t{h.block_size} * h.dest_heads;
  if (p.value_bytes % rows != 0 || p.scale_bytes % rows != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KvPoolCopy: value_bytes %d or scale_bytes %d is not %d rows of %d heads",
                        p.value_bytes, p.scale_bytes, h.block_size, h.dest_heads));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t KvPoolCopySourceBytes(const KvPoolCopyParams& p, int part) {
  const int64_t bytes = part % p.pools_per_layer < 2 ? p.value_bytes : p.scale_bytes;
  return p.heads.whole() ? bytes : bytes / p.heads.dest_heads * p.heads.src_heads;
}

absl::Status CheckKvPoolCopyParams(const KvPoolCopyParams& p) {
  if (absl::Status shape = CheckPartShape("KvPoolCopy", p.num_layers, p.pools_per_layer,
                                          p.value_bytes, p.scale_bytes);
      !shape.ok()) {
    return shape;
  }
  if (absl::Status heads = CheckHeadCopy(p); !heads.ok()) return heads;
  if (absl::Status count = CheckNumBlocks("KvPoolCopy", p.num_blocks); !count.ok()) return count;
  if (p.num_blocks > 0 && (p.src_parts == nullptr || p.dest_parts == nullptr)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KvPoolCopy: null src_parts (%p) or dest_parts (%p)", static_cast<const void*>(p.src_parts),
        static_cast<const void*>(p.dest_parts)));
  }
  for (int i = 0; i < p.num_blocks; ++i) {
    if (p.src_blocks[i] < 0 || p.src_blocks[i] >= p.src_pool_blocks) {
      return absl::InvalidArgumentError(
          absl::StrFormat("KvPoolCopy: src_blocks[%d] %d outside the source pool's %d blocks", i,
                          p.src_blocks[i], p.src_pool_blocks));
    }
    if (p.dest_blocks[i] < 0 || p.dest_blocks[i] >= p.dest_pool_blocks) {
      return absl::InvalidArgumentError(
          absl::StrFormat("KvPoolCopy: dest_blocks[%d] %d outside the destination pool's %d blocks",
                          i, p.dest_blocks[i], p.dest_pool_blocks));
    }
  }
  return CheckWrittenOnce("KvPoolCopy", "dest_blocks", p.dest_blocks, p.num_blocks);
}

absl::Status KvPoolCopyOnHost(const KvPoolCopyParams& p) {
  if (absl::Status status = CheckKvPoolCopyParams(p); !status.ok()) return status;
  const int parts = p.num_layers * p.pools_per_layer;
  const KvHeadCopy& h = p.heads;
  for (int i = 0; i < p.num_blocks; ++i) {
    for (int part = 0; part < parts; ++part) {
      const int64_t size = part % p.pools_per_layer < 2 ? p.value_bytes : p.scale_bytes;
      const int64_t src_size = KvPoolCopySourceBytes(p, part);
      const uint8_t* src = p.src_parts[part] + p.src_blocks[i] * src_size;
      uint8_t* dest = p.dest_parts[part] + p.dest_blocks[i] * size;
      if (h.whole()) {
        std::memcpy(dest, src, static_cast<size_t>(size));
        continue;
      }
      const int64_t head = size / (int64_t{h.block_size} * h.dest_heads);
      for (int row = 0; row < h.block_size; ++row) {
        std::memcpy(dest + (int64_t{row} * h.dest_heads + h.dest_first) * head,
                    src + (int64_t{row} * h.src_heads + h.src_first) * head,
                    static_cast<size_t>(h.count * head));
      }
    }
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchKvBlockCopy(const KvBlockCopyParams& params, cudaStream_t) {
  if (absl::Status status = CheckKvBlockCopyParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("KvBlockCopy: Loom was built without CUDA");
}
absl::Status LaunchKvPoolCopy(const KvPoolCopyParams& params, cudaStream_t) {
  if (absl::Status status = CheckKvPoolCopyParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("KvPoolCopy: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
