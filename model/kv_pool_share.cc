#include "model/kv_pool_share.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"

namespace loom::model {

namespace {

// Bytes of one block of the source's part whose block here is `own` bytes: the same, or with
// heads mapped as much per head for the source's heads; -1 where `own` is not rows of heads.
int64_t SourceBlockBytes(int64_t own, int64_t block_size, const PeerHeads& heads) {
  if (heads.whole()) return own;
  if (block_size < 1 || own % (block_size * heads.dest_heads) != 0) return -1;
  return own / heads.dest_heads * heads.src_heads;
}

}  // namespace

absl::Status CheckPeerCopy(const PeerKvPool& peer, absl::Span<const int64_t> own_block_bytes,
                           int64_t own_num_blocks, int64_t block_size,
                           absl::Span<const int32_t> src_blocks,
                           absl::Span<const int32_t> dest_blocks, const PeerHeads& heads) {
  if (!heads.whole() &&
      (heads.src_heads < 1 || heads.dest_heads < 1 || heads.count < 1 || heads.src_first < 0 ||
       heads.dest_first < 0 || heads.src_first + heads.count > heads.src_heads ||
       heads.dest_first + heads.count > heads.dest_heads)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV heads [%d, +%d) of the source's %d to [%d, +%d) of this pool's %d: outside a pool",
        heads.src_first, heads.count, heads.src_heads, heads.dest_first, heads.count,
        heads.dest_heads));
  }
  if (src_blocks.size() != dest_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("%d source blocks for %d destination blocks",
                                                      src_blocks.size(), dest_blocks.size()));
  }
  if (peer.block_bytes.size() != own_block_bytes.size() ||
      peer.bases.size() != own_block_bytes.size()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the source pool has %d parts, this one %d (another model or KV dtype)",
                        peer.block_bytes.size(), own_block_bytes.size()));
  }
  for (size_t p = 0; p < own_block_bytes.size(); ++p) {
    const int64_t expected = SourceBlockBytes(own_block_bytes[p], block_size, heads);
    if (peer.block_bytes[p] != expected) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "part %d of a block is %d bytes in the source pool, %d here for %d of its %d KV heads "
          "(another model, tensor-parallel slice, block size or KV dtype)",
          p, peer.block_bytes[p], own_block_bytes[p], heads.whole() ? 1 : heads.dest_heads,
          heads.whole() ? 1 : heads.src_heads));
    }
  }
  absl::flat_hash_set<int32_t> written;
  for (size_t i = 0; i < src_blocks.size(); ++i) {
    if (src_blocks[i] < 0 || src_blocks[i] >= peer.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrFormat("source block %d is outside the source pool (%d blocks)", src_blocks[i],
                          peer.num_blocks));
    }
    if (dest_blocks[i] < 0 || dest_blocks[i] >= own_num_blocks) {
      return absl::InvalidArgumentError(absl::StrFormat("block %d is outside this pool (%d blocks)",
                                                        dest_blocks[i], own_num_blocks));
    }
    if (!written.insert(dest_blocks[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("block %d is written twice", dest_blocks[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::model
