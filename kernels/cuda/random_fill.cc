#include "kernels/cuda/random_fill.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckRandomFillParams(const RandomFillParams& p) {
  if (p.count < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RandomFill: count %d must be >= 0", p.count));
  }
  if (!std::isfinite(p.offset) || !std::isfinite(p.scale) || p.scale < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RandomFill: offset %g and scale %g must be finite, scale >= 0", p.offset, p.scale));
  }
  if (p.count > 0 && p.out == nullptr) return absl::InvalidArgumentError("RandomFill: null out");
  return absl::OkStatus();
}

// Keep in step with the device copy in random_fill.cu (the GPU test compares them bit for
// bit): splitmix64's finalizer over the index mixed with the seed.
float RandomFillValue(uint64_t seed, int64_t index, float offset, float scale) {
  uint64_t z = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  // 24 bits: exact in float, so u in [-1, 1) is the same on host and device.
  const float u = static_cast<float>(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
  return std::fma(scale, u, offset);
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchRandomFill(const RandomFillParams& params, cudaStream_t) {
  if (absl::Status status = CheckRandomFillParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("RandomFill: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
