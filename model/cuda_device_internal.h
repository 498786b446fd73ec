#pragma once

// CudaDevice's own types and limits, shared by its source files (model/cuda_device*.cc,
// model/cuda_kv_pool_share.cc) and their tests, and included by nothing else.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/quantized_gemm.h"
#include "model/communicator.h"
#include "model/device.h"
#include "model/kv_pool_share.h"

namespace loom::model::cuda_detail {

namespace kc = kernels::cuda;

class CudaBuffer : public Buffer {
 public:
  explicit CudaBuffer(kc::DeviceBuffer buffer, int64_t bytes)
      : buffer_(std::move(buffer)), bytes_(bytes) {}
  void* data() const override { return buffer_.data(); }
  int64_t bytes() const override { return bytes_; }

 private:
  kc::DeviceBuffer buffer_;
  int64_t bytes_;
};

// A linear layer's weight on the device: dense [rows, cols] of the device dtype (cuBLAS),
// INT4/INT8 in the W4A16/W8A16 GEMM's layout with its scales (scale_type), or FP8 with a
// scale per row; the bias in F32.
class CudaLinear : public DeviceLinear {
 public:
  int64_t rows() const override { return n; }
  int64_t cols() const override { return k; }
  bool quantized() const { return q.data() != nullptr; }
  bool fp8() const { return fp8_weight.data() != nullptr; }

  kc::DeviceBuffer dense, q, scale_min, bias;
  kc::QuantWeightFormat format = kc::QuantWeightFormat::kInt4;  // of q (quantized())
  kc::QuantScaleType scale_type = kc::QuantScaleType::kF16;     // of scale_min
  kc::DeviceBuffer fp8_weight, fp8_scale;  // E4M3 [n, k] and F32 [n] (fp8_weights)
  int64_t n = 0, k = 0, group_size = 0;
};

// Waits for the work enqueued on `stream`: with stream-ordered collectives on it
// (`communicator` has device collectives) under the communicator's timeout, so a dead or
// stalled peer fails the wait instead of hanging it; else cudaStreamSynchronize.
absl::Status WaitForStream(cudaStream_t stream, Communicator* communicator);

class CudaKvCache : public KvCache {
 public:
  ~CudaKvCache() override;  // model/cuda_kv_pool_share.cc (its peer copies' stream)
  int64_t num_blocks() const override { return view_.num_blocks; }
  int64_t block_size() const override { return view_.block_size; }
  int64_t num_layers() const override { return static_cast<int64_t>(k_.size()); }
  int64_t bytes() const override {
    int64_t total = 0;
    for (size_t l = 0; l < k_.size(); ++l) total += k_[l].bytes() + v_[l].bytes();
    for (size_t l = 0; l < k_scale_.size(); ++l) total += k_scale_[l].bytes() + v_scale_[l].bytes();
    return total;
  }
  kc::KvCacheView layer(int64_t index) const {
    kc::KvCacheView view = view_;
    view.k = k_[index].data();
    view.v = v_[index].data();
    if (!k_scale_.empty()) {
      view.k_scale = static_cast<uint16_t*>(k_scale_[index].data());
      view.v_scale = static_cast<uint16_t*>(v_scale_[index].data());
    }
    return view;
  }

  // One block's K (or V) values, and its K (or V) scales (8-bit KV), in one layer.
  int64_t block_value_bytes() const {
    return view_.block_size * view_.num_kv_heads * view_.head_dim * kc::KvCodeBytes(view_);
  }
  int64_t block_scale_bytes() const {
    return view_.quant == kc::KvQuant::kNone
               ? 0
               : view_.block_size * view_.num_kv_heads * static_cast<int64_t>(sizeof(uint16_t));
  }
  // Per layer K, V, then (8-bit KV) K scales and V scales of the block, contiguous: the
  // CPU pool's host layout (model/cuda_device.cc; stubs without CUDA).
  int64_t block_bytes() const override {
    return num_layers() * 2 * (block_value_bytes() + block_scale_bytes());
  }
  absl::Status SaveBlocks(absl::Span<const int32_t> blocks,
                          absl::Span<uint8_t* const> host) const override;
  absl::Status LoadBlocks(absl::Span<const uint8_t* const> host,
                          absl::Span<const int32_t> blocks) const override;
  absl::Status RegisterHostMemory(void* host, int64_t bytes) const override;
  void UnregisterHostMemory(void* host) const override;
  // Calls copy(pool, byte offset in it, byte offset in the host slot, bytes) for each
  // contiguous piece of `block` in host-layout order; stops at the first error (below).
  template <typename Copy>
  absl::Status ForEachPiece(int32_t block, Copy&& copy) const;

  // Copies every block between the pool and the host slots (to_host: the pool's pieces into
  // host[i] + offset, else back), staged (CopyStaged) or else piece by piece (CopyPieces), then
  // waits for them (WaitForStream: behind a step's collectives, a dead peer fails it), on
  // this pool's device (the calling thread, a gRPC stream's, may have none set). On an error
  // the copies already queued are still waited for: none outlives the call.
  absl::Status CopyBlocks(absl::Span<const int32_t> blocks, absl::Span<uint8_t* const> host,
                          bool to_host) const;
  // Through staging_: batches of whole slots gathered from (scattered into) the pool on the
  // device (kernels/cuda/kv_block_copy), each run of slots adjacent in host memory one copy
  // over the link.
  absl::Status CopyStaged(absl::Span<const int32_t> blocks, absl::Span<uint8_t* const> host,
                          bool to_host) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);
  // Every layer's K or V of every block one copy, as one batch (SubmitCopies).
  absl::Status CopyPieces(absl::Span<const int32_t> blocks, absl::Span<uint8_t* const> host,
                          bool to_host) const;
  // Makes staging_ and pool_table_ at the first copy; false (the copies go piece by piece)
  // where the device has no memory for them.
  bool PrepareStaging() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);

  // One part of the pool, in host slot order (ForEachPiece's: per layer K, V, then K scales,
  // V scales): its allocation (a cudaMalloc of its own) and the bytes of one block in it.
  struct Part {
    uint8_t* base = nullptr;
    int64_t block_bytes = 0;
  };
  std::vector<Part> Parts() const;

  // ---- pool-to-pool copies (model/cuda_kv_pool_share.cc; stubs without CUDA) ----
  // Share: one CUDA IPC handle per part's allocation, made once (the pool never reallocates).
  absl::StatusOr<KvPoolShare> Share() const override;
  // OpenPeer: another process's handles opened on this pool's device (the share's device must be
  // this one or a peer it can access); the PeerKvPool's keep closes them on this device.
  absl::StatusOr<PeerKvPool> OpenPeer(const KvPoolShare& share) const override;
  // CopyBlocksFromPeer: kernels/cuda/kv_block_copy's pool-to-pool kernel, kKvBlockCopyMaxBlocks
  // blocks a launch, on peer_stream_ under copy_mu_, then waits for them. Not on stream_: a
  // transfer runs on a gRPC thread while the step thread may be capturing a CUDA graph on
  // stream_ (work enqueued there would join the graph); no step touches the blocks it writes
  // (the worker waits for the plans that might have, worker/kv_pool_transfer).
  absl::Status CopyBlocksFromPeer(const PeerKvPool& peer, absl::Span<const int32_t> src_blocks,
                                  absl::Span<const int32_t> dest_blocks,
                                  const PeerHeads& heads) const override;
  // The launches of one CopyBlocksFromPeer: `bases` (the peer's part bases, then this pool's,
  // [2 * parts]) uploaded to peer_table_ on peer_stream_ (made at the first call).
  absl::Status LaunchPeerCopies(const std::vector<const uint8_t*>& bases,
                                absl::Span<const int32_t> src_blocks,
                                absl::Span<const int32_t> dest_blocks, int64_t peer_blocks,
                                const PeerHeads& heads) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_);

  // The most bytes of slots staged at once (at least one slot; at most kKvBlockCopyMaxBlocks).
  static constexpr int64_t kStagingBytes = int64_t{16} << 20;
  mutable absl::Mutex copy_mu_;  // one CopyBlocks at a time: they share staging_
  mutable kc::DeviceBuffer staging_ ABSL_GUARDED_BY(copy_mu_);     // whole slots
  mutable kc::DeviceBuffer pool_table_ ABSL_GUARDED_BY(copy_mu_);  // the pools' bases, slot order
  mutable int64_t staging_slots_ ABSL_GUARDED_BY(copy_mu_) = 0;
  mutable bool staging_tried_ ABSL_GUARDED_BY(copy_mu_) = false;
  // A peer copy's part bases on the device: the source pool's, then this pool's.
  mutable kc::DeviceBuffer peer_table_ ABSL_GUARDED_BY(copy_mu_);
  mutable cudaStream_t peer_stream_ ABSL_GUARDED_BY(copy_mu_) = nullptr;
  mutable absl::Mutex share_mu_;  // Share's first call makes share_
  mutable std::optional<KvPoolShare> share_ ABSL_GUARDED_BY(share_mu_);

  kc::KvCacheView view_;  // shape and dtype; k and v (and scales) per layer below
  std::vector<kc::DeviceBuffer> k_, v_;
  std::vector<kc::DeviceBuffer> k_scale_, v_scale_;  // 8-bit KV only
  cudaStream_t stream_ = nullptr;  // the device's: copies are ordered with its steps
  Communicator* communicator_ = nullptr;  // the device's (WaitForStream)
  int device_index_ = 0;           // the device the pool is on
};

// Block b of a layer is one contiguous range of each of its K and V (and their scales')
// pools; a host slot holds them in the CPU pool's host layout (CudaKvCache::block_bytes).
template <typename Copy>
absl::Status CudaKvCache::ForEachPiece(int32_t block, Copy&& copy) const {
  const int64_t values = block_value_bytes();
  const int64_t scales = block_scale_bytes();
  int64_t offset = 0;
  for (size_t l = 0; l < k_.size(); ++l) {
    LOOM_RETURN_IF_ERROR(copy(k_[l].data(), block * values, offset, values));
    LOOM_RETURN_IF_ERROR(copy(v_[l].data(), block * values, offset + values, values));
    offset += 2 * values;
    if (scales > 0) {
      LOOM_RETURN_IF_ERROR(copy(k_scale_[l].data(), block * scales, offset, scales));
      LOOM_RETURN_IF_ERROR(copy(v_scale_[l].data(), block * scales, offset + scales, scales));
      offset += 2 * scales;
    }
  }
  return absl::OkStatus();
}

inline std::vector<CudaKvCache::Part> CudaKvCache::Parts() const {
  std::vector<Part> parts;
  (void)ForEachPiece(0, [&](void* pool, int64_t, int64_t, int64_t size) {
    parts.push_back({static_cast<uint8_t*>(pool), size});
    return absl::OkStatus();
  });
  return parts;
}

inline const CudaLinear& AsCuda(const DeviceLinear& w) { return static_cast<const CudaLinear&>(w); }
inline const CudaKvCache& AsCuda(const KvCache& c) { return static_cast<const CudaKvCache&>(c); }

// The FP8 GEMM's largest m (CheckFp8GemmParams): larger steps go in chunks.
inline constexpr int64_t kFp8ChunkRows = 65536;

// The attention kernels' grids hold at most this many sequences per launch.
inline constexpr int64_t kMaxAttentionSeqsPerLaunch = 65535;

inline absl::Status GrowingWhileCapturing(size_t bytes) {
  return absl::InternalError(absl::StrFormat(
      "CUDA device: a buffer would grow to %d bytes during CUDA graph capture (the shape "
      "was not run eagerly first)",
      bytes));
}

}  // namespace loom::model::cuda_detail
