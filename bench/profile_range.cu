#include "bench/profile_range.h"

#include <cuda_profiler_api.h>

#include <cstdio>

#include "bench/gpu_bench_support.h"

namespace loom::bench {
namespace {

bool profile_ranges = false;
int ranges_opened = 0;

// The range's last kernel: its grid (N blocks of one thread) says which range the kernels
// listed before it belong to.
__global__ void loom_profile_marker() {}

}  // namespace

void EnableProfileRanges() { profile_ranges = true; }

bool ProfileRangesEnabled() { return profile_ranges; }

void ProfileRange(cudaStream_t stream, const std::string& label,
                  const std::function<absl::Status()>& launch) {
  if (!profile_ranges) return;
  const int range = ++ranges_opened;
  std::printf("loom-profile-range %d %s\n", range, label.c_str());
  std::fflush(stdout);
  // The whole device, not only `stream`: nothing launched before may run inside the range.
  BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  BENCH_CHECK_CUDA(cudaProfilerStart());
  CheckOk(launch(), "profiled launch");
  loom_profile_marker<<<range, 1, 0, stream>>>();
  BENCH_CHECK_CUDA(cudaGetLastError());
  BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  BENCH_CHECK_CUDA(cudaProfilerStop());
}

}  // namespace loom::bench
