#pragma once

#include <cstdint>

#include "absl/types/span.h"

namespace loom::worker {

/// How a host-tier slot lays one KV block out (model::CpuKvCache's SaveBlocks order): for
/// each layer the worker holds, K values [block_size, kv heads, head_dim], V values (same;
/// none where the values are the keys: `pools` 1), then for 8-bit dtypes K scales
/// [block_size, kv heads] and V scales of scale_bytes each.
/// The heads are the model's [kv_head_begin, + num_kv_heads) (a tensor-parallel slice).
/// What a transfer between replicas of different tensor-parallel sizes maps head by head.
struct KvSlotLayout {
  int64_t num_layers = 0;
  int64_t block_size = 0;
  int64_t head_dim = 0;
  int64_t element_bytes = 0;  // of one K or V value
  int64_t scale_bytes = 0;    // per token and head; 0: no scales
  int64_t kv_head_begin = 0;
  int64_t num_kv_heads = 0;
  int64_t pools = 2;  // K and V, or K alone (model::KvPoolsPerLayer)

  /// Set (num_kv_heads > 0): transfers may map heads; unset: whole slots only.
  bool known() const { return num_kv_heads > 0; }
  int64_t slot_bytes() const {
    return num_layers * pools * block_size * num_kv_heads *
           (head_dim * element_bytes + scale_bytes);
  }
  bool holds(int64_t head) const {
    return head >= kv_head_begin && head < kv_head_begin + num_kv_heads;
  }
  /// The same layout over the heads [begin, + count).
  KvSlotLayout WithHeads(int64_t begin, int64_t count) const {
    KvSlotLayout other = *this;
    other.kv_head_begin = begin;
    other.num_kv_heads = count;
    return other;
  }
};

/// Copies the K/V values (and scales) of the model's heads `heads` (each held by both
/// layouts) from a slot laid out as `source` into one laid out as `dest`, every layer and
/// token. The layouts must agree on everything but their heads; the spans hold one slot
/// each.
void CopyKvHeads(const KvSlotLayout& source, absl::Span<const uint8_t> from,
                 const KvSlotLayout& dest, absl::Span<uint8_t> to, absl::Span<const int64_t> heads);

/// FNV-1a 64 of `bytes`: a host slot's transfer checksum (the same in every process).
uint64_t KvSlotChecksum(absl::Span<const uint8_t> bytes);

}  // namespace loom::worker
