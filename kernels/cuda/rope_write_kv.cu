// QK-norm, RoPE and the KV write fused: one block per token. The token's cosines and sines go
// into shared memory once, and with QK-norm each query and key head's inverse RMS (a warp per
// head); then each thread takes elements of the row: a query element normalized and rotated
// with its partner into q_out, a key element likewise into the token's slot, a value element as
// it is.
#include "common/status_macros.h"
#include "kernels/cuda/launch_internal.cuh"
#include "kernels/cuda/rope_internal.cuh"
#include "kernels/cuda/rope_write_kv.h"

namespace loom::kernels::cuda {
namespace {

using internal::FromFloat;

struct Args {
  const float* qkv;
  int64_t qkv_stride;
  float* q_out;
  void* k_cache;
  void* v_cache;
  const int32_t* slots;
  const int32_t* positions;
  const float* inv_freq;  // null: no rotation
  const float* q_norm;    // null: no QK-norm
  const float* k_norm;
  float norm_eps;
  int64_t num_slots;
  int num_heads, num_kv_heads, head_dim, half;
  bool neox;
  float attention_factor;
};

// A run of heads (head_dim apart) of one token's row, with the QK-norm of each: its weights
// (null: none) and the heads' inverse RMS.
struct Heads {
  const float* x;
  const float* norm;
  const float* inverse_rms;
};

// Element d of head `head`, normalized: LaunchRmsNorm's value * inverse_rms * weight.
__device__ __forceinline__ float NormedAt(const Heads& h, int head, int d, int head_dim) {
  const float x = h.x[head * head_dim + d];
  return h.norm == nullptr ? x : x * h.inverse_rms[head] * h.norm[d];
}

// Element i of `h` normalized, then rotated with its partner where it lies in the rotated part
// of its head: the value LaunchRmsNorm then LaunchRope leave there.
__device__ __forceinline__ float RotatedElement(const Heads& h, int i, const Args& a,
                                                const float* table) {
  const int head = i / a.head_dim, d = i - head * a.head_dim;
  if (a.inv_freq == nullptr || d >= 2 * a.half) return NormedAt(h, head, d, a.head_dim);
  const internal::RopePairOf pair(d, a.half, a.neox);
  const float2 r = internal::RotatePair(NormedAt(h, head, pair.first, a.head_dim),
                                        NormedAt(h, head, pair.second, a.head_dim),
                                        table[pair.pair], table[a.half + pair.pair]);
  return d == pair.first ? r.x : r.y;
}

template <typename Kv>
__global__ void RopeWriteKvKernel(Args a) {
  // [2 * half]: cosines, then sines; then with QK-norm [num_heads + num_kv_heads] inverse RMS.
  extern __shared__ float table[];
  float* inverse_rms = table + 2 * a.half;
  const float* row = a.qkv + blockIdx.x * a.qkv_stride;
  if (a.inv_freq != nullptr) {
    internal::FillRopeTable(static_cast<float>(a.positions[blockIdx.x]), a.inv_freq, a.half,
                            a.attention_factor, table);
  }
  if (a.q_norm != nullptr) {
    // Query and key heads lie side by side: head h at h * head_dim.
    const int lane = threadIdx.x % 32;
    for (int h = threadIdx.x / 32; h < a.num_heads + a.num_kv_heads; h += blockDim.x / 32) {
      float sum_squares = 0.0f;
      for (int d = lane; d < a.head_dim; d += 32) {
        const float x = row[h * a.head_dim + d];
        sum_squares += x * x;
      }
      sum_squares = internal::WarpSum(sum_squares);
      if (lane == 0) inverse_rms[h] = rsqrtf(sum_squares / a.head_dim + a.norm_eps);
    }
  }
  if (a.inv_freq != nullptr || a.q_norm != nullptr) __syncthreads();
  const int q_elements = a.num_heads * a.head_dim;
  const Heads q{row, a.q_norm, inverse_rms};
  float* q_dst = a.q_out + static_cast<int64_t>(blockIdx.x) * q_elements;
  for (int i = threadIdx.x; i < q_elements; i += blockDim.x) {
    q_dst[i] = RotatedElement(q, i, a, table);
  }
  const int64_t slot = a.slots[blockIdx.x];
  if (slot < 0 || slot >= a.num_slots) return;  // padding (or a slot the host failed to reject)
  const int kv_elements = a.num_kv_heads * a.head_dim;
  const Heads k{row + q_elements, a.k_norm, inverse_rms + a.num_heads};
  const float* v_row = row + q_elements + kv_elements;
  Kv* k_dst = static_cast<Kv*>(a.k_cache) + slot * kv_elements;
  Kv* v_dst = static_cast<Kv*>(a.v_cache) + slot * kv_elements;
  for (int i = threadIdx.x; i < kv_elements; i += blockDim.x) {
    k_dst[i] = FromFloat<Kv>(RotatedElement(k, i, a, table));
    v_dst[i] = FromFloat<Kv>(v_row[i]);
  }
}

}  // namespace

absl::Status LaunchRopeWriteKv(const RopeWriteKvParams& p, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckRopeWriteKvParams(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  Args a{};
  a.qkv = p.qkv;
  a.num_heads = static_cast<int>(p.num_heads);
  a.num_kv_heads = static_cast<int>(p.cache.num_kv_heads);
  a.head_dim = static_cast<int>(p.cache.head_dim);
  a.qkv_stride = p.qkv_stride != 0
                     ? p.qkv_stride
                     : static_cast<int64_t>(a.num_heads + 2 * a.num_kv_heads) * a.head_dim;
  a.q_out = p.q_out;
  a.k_cache = p.cache.k;
  a.v_cache = p.cache.v;
  a.slots = p.slots;
  a.positions = p.positions;
  a.inv_freq = p.inv_freq;
  a.num_slots = p.cache.num_blocks * p.cache.block_size;
  a.half = p.inv_freq != nullptr ? static_cast<int>(p.rope_dim / 2) : 0;
  a.neox = p.neox;
  a.attention_factor = p.attention_factor;
  a.q_norm = p.q_norm;
  a.k_norm = p.k_norm;
  a.norm_eps = p.norm_eps;
  const int64_t q_elements = p.num_heads * p.cache.head_dim;
  const int threads = q_elements >= 256 ? 256 : static_cast<int>((q_elements + 31) / 32) * 32;
  const size_t shared =
      (2 * static_cast<size_t>(a.half) +
       (p.q_norm != nullptr ? static_cast<size_t>(a.num_heads + a.num_kv_heads) : 0)) *
      sizeof(float);
  const auto blocks = static_cast<unsigned>(p.num_tokens);
  if (p.cache.dtype == DataType::kF16) {
    RopeWriteKvKernel<__half><<<blocks, threads, shared, stream>>>(a);
  } else {
    RopeWriteKvKernel<__nv_bfloat16><<<blocks, threads, shared, stream>>>(a);
  }
  return internal::CheckLaunch("RopeWriteKv");
}

}  // namespace loom::kernels::cuda
