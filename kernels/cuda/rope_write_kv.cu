// RoPE and the KV write fused: one block per token. The token's cosines and sines go into
// shared memory once; then each thread takes elements of the row: a query element rotated
// with its partner into q_out, a key element likewise into the token's slot, a value element
// as it is.
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
  int64_t num_slots;
  int num_heads, num_kv_heads, head_dim, half;
  bool neox;
  float attention_factor;
};

// Element i of `heads` (a run of heads, head_dim apart) rotated with its partner where it lies
// in the rotated part of its head: the value LaunchRope leaves there.
__device__ __forceinline__ float RotatedElement(const float* heads, int i, const Args& a,
                                                const float* table) {
  const int d = i % a.head_dim;
  if (a.inv_freq == nullptr || d >= 2 * a.half) return heads[i];
  const internal::RopePairOf pair(d, a.half, a.neox);
  const float* head = heads + (i - d);
  const float2 r = internal::RotatePair(head[pair.first], head[pair.second], table[pair.pair],
                                        table[a.half + pair.pair]);
  return d == pair.first ? r.x : r.y;
}

template <typename Kv>
__global__ void RopeWriteKvKernel(Args a) {
  extern __shared__ float table[];  // [2 * half]: cosines, then sines
  if (a.inv_freq != nullptr) {
    internal::FillRopeTable(static_cast<float>(a.positions[blockIdx.x]), a.inv_freq, a.half,
                            a.attention_factor, table);
    __syncthreads();
  }
  const float* row = a.qkv + blockIdx.x * a.qkv_stride;
  const int q_elements = a.num_heads * a.head_dim;
  float* q_dst = a.q_out + static_cast<int64_t>(blockIdx.x) * q_elements;
  for (int i = threadIdx.x; i < q_elements; i += blockDim.x) {
    q_dst[i] = RotatedElement(row, i, a, table);
  }
  const int64_t slot = a.slots[blockIdx.x];
  if (slot < 0 || slot >= a.num_slots) return;  // padding (or a slot the host failed to reject)
  const int kv_elements = a.num_kv_heads * a.head_dim;
  const float* k_row = row + q_elements;
  const float* v_row = k_row + kv_elements;
  Kv* k_dst = static_cast<Kv*>(a.k_cache) + slot * kv_elements;
  Kv* v_dst = static_cast<Kv*>(a.v_cache) + slot * kv_elements;
  for (int i = threadIdx.x; i < kv_elements; i += blockDim.x) {
    k_dst[i] = FromFloat<Kv>(RotatedElement(k_row, i, a, table));
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
  a.qkv_stride = p.qkv_stride != 0 ? p.qkv_stride
                                   : static_cast<int64_t>(a.num_heads + 2 * a.num_kv_heads) *
                                         a.head_dim;
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
  const int64_t q_elements = p.num_heads * p.cache.head_dim;
  const int threads = q_elements >= 256 ? 256 : static_cast<int>((q_elements + 31) / 32) * 32;
  const size_t shared = 2 * static_cast<size_t>(a.half) * sizeof(float);
  const auto blocks = static_cast<unsigned>(p.num_tokens);
  if (p.cache.dtype == DataType::kF16) {
    RopeWriteKvKernel<__half><<<blocks, threads, shared, stream>>>(a);
  } else {
    RopeWriteKvKernel<__nv_bfloat16><<<blocks, threads, shared, stream>>>(a);
  }
  return internal::CheckLaunch("RopeWriteKv");
}

}  // namespace loom::kernels::cuda
