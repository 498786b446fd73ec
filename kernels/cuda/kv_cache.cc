#include "kernels/cuda/kv_cache.h"

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

namespace {

bool PowerOfTwoHeadDim(int64_t head_dim) {
  return head_dim >= 32 && head_dim <= 256 && (head_dim & (head_dim - 1)) == 0;
}

}  // namespace

int64_t KvCodeBytes(const KvCacheView& cache) {
  return cache.quant == KvQuant::kNone ? ElementBytes(cache.dtype) : 1;
}

absl::Status CheckKvCacheView(const KvCacheView& c) {
  if (c.dtype != DataType::kF16 && c.dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV cache: dtype %s unsupported (F16, BF16)", DataTypeName(c.dtype)));
  }
  if (c.num_blocks < 1 || c.block_size < 1 || c.num_kv_heads < 1 || c.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV cache: num_blocks %d, block_size %d, num_kv_heads %d, head_dim %d must be positive",
        c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim));
  }
  // The attention kernels count the pool's rows (slot x KV head) in 32 bits (kNoCacheRow).
  if (c.num_blocks * c.block_size * c.num_kv_heads >= int64_t{internal::kNoCacheRow}) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV cache: %d blocks x %d slots x %d KV heads is 2^32 cache rows or more",
                        c.num_blocks, c.block_size, c.num_kv_heads));
  }
  if (c.k == nullptr || c.v == nullptr) return absl::InvalidArgumentError("KV cache: null k or v");
  if (c.quant != KvQuant::kNone) {
    if (!PowerOfTwoHeadDim(c.head_dim)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "KV cache: 8-bit KV needs a power-of-two head_dim in [32, 256], got %d", c.head_dim));
    }
    if (c.k_scale == nullptr || c.v_scale == nullptr) {
      return absl::InvalidArgumentError("KV cache: 8-bit KV without k_scale or v_scale");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRotateHeadsParams(const RotateHeadsParams& p) {
  if (!PowerOfTwoHeadDim(p.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RotateHeads: head_dim %d is not a power of two in [32, 256]", p.head_dim));
  }
  if (p.rows < 0 || p.rows > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrFormat("RotateHeads: rows %d out of range", p.rows));
  }
  if (p.rows > 0 && (p.src == nullptr || p.dst == nullptr)) {
    return absl::InvalidArgumentError("RotateHeads: null src or dst");
  }
  if (p.dst == p.src && p.dst_dtype != DataType::kF32) {
    return absl::InvalidArgumentError("RotateHeads: in place only with an F32 destination");
  }
  return absl::OkStatus();
}

absl::Status CheckWriteKvParams(const WriteKvParams& p) {
  if (absl::Status status = CheckKvCacheView(p.cache); !status.ok()) return status;
  const int64_t row = p.cache.num_kv_heads * p.cache.head_dim;
  if (p.num_tokens < 0 || p.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("WriteKv: num_tokens %d out of range", p.num_tokens));
  }
  if ((p.k_stride != 0 && p.k_stride < row) || (p.v_stride != 0 && p.v_stride < row)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("WriteKv: k_stride %d / v_stride %d shorter than a row of %d", p.k_stride,
                        p.v_stride, row));
  }
  if (p.num_tokens > 0 && (p.k == nullptr || p.v == nullptr || p.slots == nullptr)) {
    return absl::InvalidArgumentError("WriteKv: null k, v or slots");
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchWriteKv(const WriteKvParams& params, cudaStream_t) {
  if (absl::Status status = CheckWriteKvParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("WriteKv: Loom was built without CUDA");
}

absl::Status LaunchRotateHeads(const RotateHeadsParams& params, cudaStream_t) {
  if (absl::Status status = CheckRotateHeadsParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("RotateHeads: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
