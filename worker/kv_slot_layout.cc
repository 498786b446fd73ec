#include "worker/kv_slot_layout.h"

#include <cstring>

namespace loom::worker {

void CopyKvHeads(const KvSlotLayout& source, absl::Span<const uint8_t> from,
                 const KvSlotLayout& dest, absl::Span<uint8_t> to,
                 absl::Span<const int64_t> heads) {
  const int64_t head_bytes = dest.head_dim * dest.element_bytes;
  const int64_t tokens = dest.block_size;
  // One layer's sections in each slot: K values, V values, K scales, V scales (no V ones
  // where the values are the keys).
  const int64_t pools = dest.pools;
  const int64_t source_values = tokens * source.num_kv_heads * head_bytes;
  const int64_t dest_values = tokens * dest.num_kv_heads * head_bytes;
  const int64_t source_scales = tokens * source.num_kv_heads * source.scale_bytes;
  const int64_t dest_scales = tokens * dest.num_kv_heads * dest.scale_bytes;
  const int64_t source_layer = pools * (source_values + source_scales);
  const int64_t dest_layer = pools * (dest_values + dest_scales);
  for (int64_t layer = 0; layer < dest.num_layers; ++layer) {
    const uint8_t* in = from.data() + layer * source_layer;
    uint8_t* out = to.data() + layer * dest_layer;
    for (int64_t kv = 0; kv < pools; ++kv) {
      const uint8_t* in_values = in + kv * source_values;
      uint8_t* out_values = out + kv * dest_values;
      const uint8_t* in_scales = in + pools * source_values + kv * source_scales;
      uint8_t* out_scales = out + pools * dest_values + kv * dest_scales;
      for (int64_t t = 0; t < tokens; ++t) {
        for (const int64_t head : heads) {
          const int64_t s = t * source.num_kv_heads + (head - source.kv_head_begin);
          const int64_t d = t * dest.num_kv_heads + (head - dest.kv_head_begin);
          std::memcpy(out_values + d * head_bytes, in_values + s * head_bytes,
                      static_cast<size_t>(head_bytes));
          if (dest.scale_bytes > 0) {
            std::memcpy(out_scales + d * dest.scale_bytes, in_scales + s * source.scale_bytes,
                        static_cast<size_t>(dest.scale_bytes));
          }
        }
      }
    }
  }
}

uint64_t KvSlotChecksum(absl::Span<const uint8_t> bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (const uint8_t byte : bytes) hash = (hash ^ byte) * 1099511628211ull;
  return hash;
}

}  // namespace loom::worker
