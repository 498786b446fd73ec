#pragma once

// Helpers shared by the CUDA kernel tests (tests/kernels/cuda_*_test.cc): random inputs,
// device upload/download in any DataType, NaN poisoning and tolerance checks.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

/// Skips the test (with the reason) where no CUDA device can run it.
#define LOOM_SKIP_WITHOUT_CUDA_DEVICE()                                                \
  do {                                                                                 \
    if (::loom::kernels::CudaDeviceCount() == 0) {                                     \
      GTEST_SKIP() << "no CUDA device: " << ::loom::kernels::CudaDeviceDescription(0); \
    }                                                                                  \
  } while (0)

namespace loom::kernels::cuda::testing_util {

/// True under LOOM_GPU_TEST_SIZE=small (tests/gpu/quick.sh, and its compute-sanitizer
/// runs): sweeps keep every kernel instantiation but drop their longest contexts and
/// largest matrices, whose CPU references dominate the time.
inline bool SmallGpuTestSize() {
  const char* size = std::getenv("LOOM_GPU_TEST_SIZE");
  return size != nullptr && std::string(size) == "small";
}

inline std::vector<float> RandomFloats(int64_t count, uint32_t seed, float low = -1.0f,
                                       float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> out(count);
  for (float& x : out) x = dist(rng);
  return out;
}

/// The values a tensor of `type` holds for `values` (rounded to nearest even).
inline std::vector<float> RoundTo(DataType type, const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * ElementBytes(type));
  ConvertFromFloat(type, values.data(), static_cast<int64_t>(values.size()), bytes.data());
  std::vector<float> out(values.size());
  ConvertToFloat(type, bytes.data(), static_cast<int64_t>(values.size()), out.data());
  return out;
}

/// A device buffer holding `values` converted to `type`.
inline absl::StatusOr<DeviceBuffer> Upload(DataType type, const std::vector<float>& values) {
  std::vector<uint8_t> bytes(std::max<size_t>(values.size(), 1) * ElementBytes(type));
  ConvertFromFloat(type, values.data(), static_cast<int64_t>(values.size()), bytes.data());
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(bytes.size());
  if (!buffer.ok()) return buffer.status();
  if (absl::Status status = buffer->CopyFromHost(bytes.data(), bytes.size()); !status.ok())
    return status;
  return buffer;
}

/// A device buffer holding `values` verbatim.
template <typename T>
absl::StatusOr<DeviceBuffer> UploadRaw(const std::vector<T>& values) {
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(std::max<size_t>(values.size(), 1) * sizeof(T));
  if (!buffer.ok()) return buffer.status();
  if (absl::Status status = buffer->CopyFromHost(values.data(), values.size() * sizeof(T));
      !status.ok()) {
    return status;
  }
  return buffer;
}

/// A device buffer of `count` elements of `type`, every byte 0xff (NaN in F32/F16/BF16).
inline absl::StatusOr<DeviceBuffer> Poisoned(DataType type, int64_t count) {
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(std::max<int64_t>(count, 1) * ElementBytes(type));
  if (!buffer.ok()) return buffer.status();
  if (absl::Status status = buffer->Fill(0xff); !status.ok()) return status;
  return buffer;
}

/// `count` elements of `type` from the device, as floats.
inline absl::StatusOr<std::vector<float>> Download(const DeviceBuffer& buffer, DataType type,
                                                   int64_t count) {
  std::vector<uint8_t> bytes(count * ElementBytes(type));
  if (absl::Status status = buffer.CopyToHost(bytes.data(), bytes.size()); !status.ok())
    return status;
  std::vector<float> out(count);
  ConvertToFloat(type, bytes.data(), count, out.data());
  return out;
}

/// Checks |actual - expected| <= atol + rtol * |expected| everywhere and that actual has no
/// NaN; reports the first failure and the largest error.
inline ::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                           const std::vector<double>& expected, double atol,
                                           double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "sizes " << actual.size() << " vs " << expected.size();
  }
  double worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(actual[i])) return ::testing::AssertionFailure() << "NaN at " << i;
    const double error = std::abs(actual[i] - expected[i]);
    worst = std::max(worst, error);
    if (!(error <= atol + rtol * std::abs(expected[i]))) {
      return ::testing::AssertionFailure()
             << "at " << i << ": " << actual[i] << " vs expected " << expected[i] << " (atol "
             << atol << ", rtol " << rtol << ")";
    }
  }
  return ::testing::AssertionSuccess() << "max error " << worst;
}

inline std::vector<double> ToDouble(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

/// Relative tolerance of one rounding to `type` (plus float arithmetic for F32).
inline double RoundingTolerance(DataType type) {
  switch (type) {
    case DataType::kF32:
      return 1e-5;
    case DataType::kF16:
      return 1e-3;  // 2^-11 per rounding, twice over
    case DataType::kBF16:
      return 8e-3;  // 2^-8 per rounding, twice over
  }
  return 0.0;
}

/// A host KV pool in the cache dtype plus its exact float values.
struct HostCache {
  std::vector<uint8_t> k_bytes, v_bytes;
  std::vector<float> k, v;  // the same values as floats
};

inline HostCache RandomCache(DataType dtype, int64_t elements, uint32_t seed) {
  HostCache c;
  c.k = testing_util::RoundTo(dtype, testing_util::RandomFloats(elements, seed, -1, 1));
  c.v = testing_util::RoundTo(dtype, testing_util::RandomFloats(elements, seed + 1, -1, 1));
  c.k_bytes.resize(elements * 2);
  c.v_bytes.resize(elements * 2);
  ConvertFromFloat(dtype, c.k.data(), elements, c.k_bytes.data());
  ConvertFromFloat(dtype, c.v.data(), elements, c.v_bytes.data());
  return c;
}

/// Which token slots of a pool of `num_blocks` x `block_size` some sequence attends: the
/// positions below its context length in the blocks its table names (entries outside the pool
/// skipped).
inline std::vector<bool> AttendedSlots(int64_t num_blocks, int64_t block_size,
                                       const std::vector<int32_t>& context_lens,
                                       const std::vector<int32_t>& indptr,
                                       const std::vector<int32_t>& indices) {
  std::vector<bool> attended(static_cast<size_t>(num_blocks * block_size), false);
  for (size_t s = 0; s < context_lens.size(); ++s) {
    for (int32_t b = indptr[s]; b < indptr[s + 1]; ++b) {
      const int32_t block = indices[static_cast<size_t>(b)];
      if (block < 0 || block >= num_blocks) continue;
      const int64_t first = int64_t{b - indptr[s]} * block_size;
      for (int64_t i = 0; i < block_size && first + i < context_lens[s]; ++i) {
        attended[static_cast<size_t>(block * block_size + i)] = true;
      }
    }
  }
  return attended;
}

/// Sets K and V of every slot no sequence attends (block tails past a context, spare blocks,
/// blocks no table names) to NaN, as a reused pool may hold there: a kernel that lets such a
/// row into a result (a masked probability 0 times NaN is NaN) fails, where over finite values
/// it would pass. `row`: values per slot (KV heads x head dim).
inline void PoisonUnattended(DataType dtype, int64_t row, const std::vector<bool>& attended,
                             HostCache& cache) {
  const uint16_t nan_bits = dtype == DataType::kBF16 ? 0x7fc0 : 0x7e00;
  for (size_t slot = 0; slot < attended.size(); ++slot) {
    if (attended[slot]) continue;
    for (int64_t i = 0; i < row; ++i) {
      const size_t e = slot * static_cast<size_t>(row) + static_cast<size_t>(i);
      cache.k[e] = cache.v[e] = std::nanf("");
      std::memcpy(&cache.k_bytes[2 * e], &nan_bits, 2);
      std::memcpy(&cache.v_bytes[2 * e], &nan_bits, 2);
    }
  }
}

/// An 8-bit cache of `slots` token slots x `row` values, K and V random in [-1, 1] written
/// by cpu::WriteKv (rotated, one BF16 scale per row and KV head), on the host (`cpu`, for
/// cpu::PagedAttentionReference) and as the same bytes on the device (`View`).
struct EightBitCache {
  std::vector<uint8_t> k, v;
  std::vector<uint16_t> k_scale, v_scale;
  cpu::KvLayerView cpu;
  DeviceBuffer d_k, d_v, d_k_scale, d_v_scale;
  KvQuant quant = KvQuant::kNone;

  KvCacheView View(DataType compute) const {
    KvCacheView view{d_k.data(),     d_v.data(),       compute,     cpu.num_blocks,
                     cpu.block_size, cpu.num_kv_heads, cpu.head_dim};
    view.quant = quant;
    view.k_scale = static_cast<uint16_t*>(d_k_scale.data());
    view.v_scale = static_cast<uint16_t*>(d_v_scale.data());
    return view;
  }
};

/// Copies `c`'s host codes and scales to its device buffers (allocated on the first call).
inline absl::Status UploadEightBitCache(EightBitCache& c) {
  for (auto [buffer, bytes, size] :
       {std::tuple{&c.d_k, static_cast<const void*>(c.k.data()), c.k.size()},
        std::tuple{&c.d_v, static_cast<const void*>(c.v.data()), c.v.size()},
        std::tuple{&c.d_k_scale, static_cast<const void*>(c.k_scale.data()), 2 * c.k_scale.size()},
        std::tuple{&c.d_v_scale, static_cast<const void*>(c.v_scale.data()),
                   2 * c.v_scale.size()}}) {
    if (buffer->bytes() != size) {
      absl::StatusOr<DeviceBuffer> allocated = DeviceBuffer::Allocate(size);
      if (!allocated.ok()) return allocated.status();
      *buffer = std::move(*allocated);
    }
    if (absl::Status status = buffer->CopyFromHost(bytes, size); !status.ok()) return status;
  }
  return absl::OkStatus();
}

inline absl::Status MakeEightBitCache(cpu::KvDtype dtype, int64_t num_blocks, int64_t block_size,
                                      int64_t num_kv_heads, int64_t head_dim, uint32_t seed,
                                      EightBitCache& c, int64_t v_nan_at = -1) {
  const int64_t slots = num_blocks * block_size, row = num_kv_heads * head_dim;
  c.quant = dtype == cpu::KvDtype::kInt8 ? KvQuant::kInt8 : KvQuant::kFp8E4m3;
  c.k.assign(slots * row, 0);
  c.v.assign(slots * row, 0);
  c.k_scale.assign(slots * num_kv_heads, 0);
  c.v_scale.assign(slots * num_kv_heads, 0);
  c.cpu = {c.k.data(), c.v.data(),       dtype,           num_blocks, block_size, num_kv_heads,
           head_dim,   c.k_scale.data(), c.v_scale.data()};
  const std::vector<float> k = RandomFloats(slots * row, seed, -1, 1);
  std::vector<float> v = RandomFloats(slots * row, seed + 1, -1, 1);
  if (v_nan_at >= 0) v[static_cast<size_t>(v_nan_at)] = std::nanf("");
  std::vector<int32_t> all(slots);
  for (int64_t s = 0; s < slots; ++s) all[s] = static_cast<int32_t>(s);
  if (absl::Status status = cpu::WriteKv(c.cpu, k.data(), v.data(), all.data(), slots);
      !status.ok()) {
    return status;
  }
  return UploadEightBitCache(c);
}

/// PoisonUnattended for an 8-bit cache: codes 0x7f (E4M3's NaN) and NaN scales in every slot no
/// sequence attends, uploaded again.
inline absl::Status PoisonUnattended(const std::vector<bool>& attended, EightBitCache& c) {
  const int64_t heads = c.cpu.num_kv_heads, row = heads * c.cpu.head_dim;
  for (size_t slot = 0; slot < attended.size(); ++slot) {
    if (attended[slot]) continue;
    std::fill_n(c.k.begin() + static_cast<int64_t>(slot) * row, row, uint8_t{0x7f});
    std::fill_n(c.v.begin() + static_cast<int64_t>(slot) * row, row, uint8_t{0x7f});
    std::fill_n(c.k_scale.begin() + static_cast<int64_t>(slot) * heads, heads, uint16_t{0x7fc0});
    std::fill_n(c.v_scale.begin() + static_cast<int64_t>(slot) * heads, heads, uint16_t{0x7fc0});
  }
  return UploadEightBitCache(c);
}

/// cpu::PagedAttentionReference of `q` (rows of num_heads x head_dim) over `cache`'s codes
/// (it rotates query and output as the CUDA path does), at scale 1 / sqrt(head_dim).
/// `extras`: a sliding window, soft-capping and attention sinks, as cpu::PagedAttentionParams.
struct AttentionExtras {
  int64_t window = 0;
  float softcap = 0.0f;
  std::vector<float> sinks;  // [num_heads]; empty: none
};

inline absl::StatusOr<std::vector<float>> EightBitReference(
    const EightBitCache& cache, const std::vector<float>& q,
    const std::vector<int32_t>& query_start, const std::vector<int32_t>& context_lens,
    const std::vector<int32_t>& indptr, const std::vector<int32_t>& indices, int64_t num_heads,
    const AttentionExtras& extras = {}) {
  std::vector<float> expected(q.size());
  cpu::PagedAttentionParams ref;
  ref.q = q.data();
  ref.out = expected.data();
  ref.cache = cache.cpu;
  ref.query_start = query_start.data();
  ref.context_len = context_lens.data();
  ref.block_indptr = indptr.data();
  ref.block_indices = indices.data();
  ref.num_seqs = static_cast<int64_t>(context_lens.size());
  ref.num_heads = num_heads;
  ref.scale = 1.0f / std::sqrt(static_cast<float>(cache.cpu.head_dim));
  ref.window = extras.window;
  ref.softcap = extras.softcap;
  ref.sinks = extras.sinks.empty() ? nullptr : extras.sinks.data();
  if (absl::Status status = cpu::PagedAttentionReference(ref); !status.ok()) return status;
  return expected;
}

/// LaunchRotateHeads of `rows` head_dim-long F32 rows at `src` into `dst` (of dst_dtype).
inline absl::Status RotateRows(const void* src, void* dst, DataType dst_dtype, int64_t rows,
                               int64_t head_dim) {
  RotateHeadsParams p;
  p.src = static_cast<const float*>(src);
  p.dst = dst;
  p.dst_dtype = dst_dtype;
  p.rows = rows;
  p.head_dim = head_dim;
  return LaunchRotateHeads(p, nullptr);
}

}  // namespace loom::kernels::cuda::testing_util

#define LOOM_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  LOOM_ASSERT_OK_AND_ASSIGN_IMPL_(LOOM_TEST_CONCAT_(statusor_, __LINE__), lhs, expr)
#define LOOM_TEST_CONCAT_INNER_(a, b) a##b
#define LOOM_TEST_CONCAT_(a, b) LOOM_TEST_CONCAT_INNER_(a, b)
#define LOOM_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  ASSERT_TRUE(statusor.ok()) << statusor.status();           \
  lhs = std::move(statusor).value()
