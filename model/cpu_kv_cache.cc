#include "model/cpu_kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "model/kv_layout.h"

namespace loom::model {

namespace {

// Each part starts on a cache line (the kernels' vector loads).
constexpr int64_t kPartAlignment = 64;

int64_t AlignUp(int64_t bytes) {
  return (bytes + kPartAlignment - 1) / kPartAlignment * kPartAlignment;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuKvCache>> CpuKvCache::Create(const common::ModelConfig& config,
                                                               int64_t num_blocks,
                                                               int64_t block_size,
                                                               kernels::cpu::KvDtype dtype,
                                                               bool shared) {
  if (num_blocks <= 0 || block_size <= 0 || block_size > 1024) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV cache needs num_blocks > 0 and 0 < block_size <= 1024, got %d blocks of %d",
        num_blocks, block_size));
  }
  std::unique_ptr<CpuKvCache> cache(new CpuKvCache());
  cache->num_blocks_ = num_blocks;
  cache->block_size_ = block_size;
  cache->num_kv_heads_ = config.num_kv_heads;
  cache->head_dim_ = config.head_dim;
  cache->dtype_ = dtype;
  cache->values_are_keys_ = KvPoolsPerLayer(config) == 1;
  const int64_t heads = num_blocks * block_size * config.num_kv_heads;
  const int64_t value_bytes =
      heads * config.head_dim * static_cast<int64_t>(kernels::cpu::KvElementBytes(dtype));
  const int64_t scale_bytes =
      kernels::cpu::IsQuantizedKv(dtype) ? heads * static_cast<int64_t>(sizeof(uint16_t)) : 0;
  const int64_t layer_bytes = AlignUp(value_bytes);
  const int64_t layer_scales = AlignUp(scale_bytes);
  const int64_t pools = KvPoolsPerLayer(config);
  const int64_t bytes = config.num_layers * pools * (layer_bytes + layer_scales);
  cache->pool_bytes_ = config.num_layers * pools * (value_bytes + scale_bytes);
  void* mapped = MAP_FAILED;
  if (shared) {
    // Zero pages on demand, as anonymous memory; the file goes with its last mapping.
    cache->fd_ = memfd_create("loom-kv-pool", MFD_CLOEXEC);
    if (cache->fd_ < 0 || ftruncate(cache->fd_, bytes) != 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "a memory file of %d bytes for the shared KV pool: %s", bytes, std::strerror(errno)));
    }
    mapped = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                  cache->fd_, 0);
  } else {
    mapped = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (mapped == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("mapping %d bytes for the KV pool: %s", bytes, std::strerror(errno)));
  }
  cache->base_ = static_cast<uint8_t*>(mapped);
  cache->mapped_bytes_ = bytes;
  uint8_t* next = cache->base_;
  auto take = [&next](int64_t size) {
    uint8_t* part = next;
    next += size;
    return part;
  };
  for (int64_t l = 0; l < config.num_layers; ++l) {
    cache->k_.push_back(take(layer_bytes));
    if (pools == 2) cache->v_.push_back(take(layer_bytes));
    if (layer_scales == 0) continue;
    cache->k_scale_.push_back(reinterpret_cast<uint16_t*>(take(layer_scales)));
    if (pools == 2) cache->v_scale_.push_back(reinterpret_cast<uint16_t*>(take(layer_scales)));
  }
  return cache;
}

CpuKvCache::~CpuKvCache() {
  if (base_ != nullptr) munmap(base_, static_cast<size_t>(mapped_bytes_));
  if (fd_ >= 0) close(fd_);
}

kernels::cpu::KvLayerView CpuKvCache::layer(int64_t index) const {
  kernels::cpu::KvLayerView view;
  view.k = k_[index];
  view.v = values_are_keys_ ? view.k : v_[index];
  view.dtype = dtype_;
  view.num_blocks = num_blocks_;
  view.block_size = block_size_;
  view.num_kv_heads = num_kv_heads_;
  view.head_dim = head_dim_;
  if (kernels::cpu::IsQuantizedKv(dtype_)) {
    view.k_scale = k_scale_[index];
    view.v_scale = values_are_keys_ ? view.k_scale : v_scale_[index];
  }
  return view;
}

int64_t CpuKvCache::bytes() const { return pool_bytes_; }

int64_t CpuKvCache::block_value_bytes() const {
  return block_size_ * num_kv_heads_ * head_dim_ *
         static_cast<int64_t>(kernels::cpu::KvElementBytes(dtype_));
}

int64_t CpuKvCache::block_scale_bytes() const {
  return kernels::cpu::IsQuantizedKv(dtype_)
             ? block_size_ * num_kv_heads_ * static_cast<int64_t>(sizeof(uint16_t))
             : 0;
}

int64_t CpuKvCache::block_bytes() const {
  return num_layers() * (values_are_keys_ ? 1 : 2) * (block_value_bytes() + block_scale_bytes());
}

template <typename Copy>
void CpuKvCache::ForEachPiece(int32_t block, Copy&& copy) const {
  const int64_t values = block_value_bytes();
  const int64_t scales = block_scale_bytes();
  int64_t offset = 0;
  for (int64_t l = 0; l < num_layers(); ++l) {
    copy(k_[l] + block * values, offset, values);
    offset += values;
    if (!values_are_keys_) {
      copy(v_[l] + block * values, offset, values);
      offset += values;
    }
    if (scales > 0) {
      copy(reinterpret_cast<uint8_t*>(k_scale_[l]) + block * scales, offset, scales);
      offset += scales;
      if (!values_are_keys_) {
        copy(reinterpret_cast<uint8_t*>(v_scale_[l]) + block * scales, offset, scales);
        offset += scales;
      }
    }
  }
}

absl::Status CpuKvCache::SaveBlocks(absl::Span<const int32_t> blocks,
                                    absl::Span<uint8_t* const> host) const {
  if (blocks.size() != host.size()) {
    return absl::InvalidArgumentError("SaveBlocks: one host slot per block");
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    ForEachPiece(blocks[i], [&](const uint8_t* pool, int64_t offset, int64_t size) {
      std::memcpy(host[i] + offset, pool, static_cast<size_t>(size));
    });
  }
  return absl::OkStatus();
}

absl::Status CpuKvCache::SaveBlockLayer(int32_t block, int64_t layer, uint8_t* host) const {
  if (block < 0 || block >= num_blocks_ || layer < 0 || layer >= num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SaveBlockLayer: block %d or layer %d outside the pool", block, layer));
  }
  const int64_t layer_bytes = block_bytes() / num_layers();
  const int64_t begin = layer * layer_bytes, end = begin + layer_bytes;
  ForEachPiece(block, [&](const uint8_t* pool, int64_t offset, int64_t size) {
    if (offset >= begin && offset < end) {
      std::memcpy(host + (offset - begin), pool, static_cast<size_t>(size));
    }
  });
  return absl::OkStatus();
}

absl::Status CpuKvCache::LoadBlocks(absl::Span<const uint8_t* const> host,
                                    absl::Span<const int32_t> blocks) const {
  if (blocks.size() != host.size()) {
    return absl::InvalidArgumentError("LoadBlocks: one host slot per block");
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    ForEachPiece(blocks[i], [&](uint8_t* pool, int64_t offset, int64_t size) {
      std::memcpy(pool, host[i] + offset, static_cast<size_t>(size));
    });
  }
  return absl::OkStatus();
}

std::vector<int64_t> CpuKvCache::PartBlockBytes() const {
  std::vector<int64_t> sizes;
  ForEachPiece(0, [&](const uint8_t*, int64_t, int64_t size) { sizes.push_back(size); });
  return sizes;
}

absl::StatusOr<KvPoolShare> CpuKvCache::Share() const {
  if (fd_ < 0) {
    return absl::UnimplementedError(
        "this CPU KV pool is not in shared memory (the worker's --kv-pool-shared-memory)");
  }
  KvPoolShare share;
  share.kind = KvPoolShare::Kind::kHostFile;
  share.fd = fd_;
  share.file_bytes = mapped_bytes_;
  share.num_blocks = num_blocks_;
  ForEachPiece(0, [&](const uint8_t* part, int64_t, int64_t size) {
    share.parts.push_back({0, part - base_, size});
  });
  return share;
}

absl::Status CpuKvCache::CopyBlocksFromPeer(const PeerKvPool& peer,
                                            absl::Span<const int32_t> src_blocks,
                                            absl::Span<const int32_t> dest_blocks,
                                            const PeerHeads& heads) const {
  const std::vector<int64_t> sizes = PartBlockBytes();
  if (absl::Status checked =
          CheckPeerCopy(peer, sizes, num_blocks_, block_size_, src_blocks, dest_blocks, heads);
      !checked.ok()) {
    return checked;
  }
  for (size_t i = 0; i < src_blocks.size(); ++i) {
    size_t part = 0;
    ForEachPiece(dest_blocks[i], [&](uint8_t* pool, int64_t, int64_t size) {
      const uint8_t* src = peer.bases[part] + src_blocks[i] * peer.block_bytes[part];
      ++part;
      if (heads.whole()) {
        std::memcpy(pool, src, static_cast<size_t>(size));
        return;
      }
      // The heads of each token row: as many bytes a head in both pools.
      const int64_t head = size / (block_size_ * heads.dest_heads);
      for (int64_t row = 0; row < block_size_; ++row) {
        std::memcpy(pool + (row * heads.dest_heads + heads.dest_first) * head,
                    src + (row * heads.src_heads + heads.src_first) * head,
                    static_cast<size_t>(heads.count * head));
      }
    });
  }
  return absl::OkStatus();
}

}  // namespace loom::model
