#pragma once

// Internal to kernels/cuda: the sampler's counter-based random draw, compiled for the host
// (sampling.cc: SamplingRandomBits) and the device (sampling.cu) from this one definition.

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOOM_HOST_DEVICE inline
#endif

namespace loom::kernels::cuda::internal {

/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
/// Random123 reference): four 32-bit words of `counter` encrypted under `key`.
LOOM_HOST_DEVICE void Philox4x32x10(const uint32_t (&counter)[4], const uint32_t (&key)[2],
                                    uint32_t (&out)[4]) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * c0;
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32),
                   lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32),
                   lo1 = static_cast<uint32_t>(product1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/// The 64 random bits of sampling draw (seed, step): see SamplingRandomBits.
LOOM_HOST_DEVICE uint64_t SamplingBits(uint64_t seed, uint64_t step) {
  const uint32_t counter[4] = {static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32), 0,
                               0};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t out[4];
  Philox4x32x10(counter, key, out);
  return static_cast<uint64_t>(out[1]) << 32 | out[0];
}

}  // namespace loom::kernels::cuda::internal

#undef LOOM_HOST_DEVICE
