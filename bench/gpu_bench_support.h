#pragma once

// What the GPU benchmarks share (built only with CUDA): exiting on a failed CUDA call or
// Status, device allocation, launch timing, and the device's copy bandwidth (the limit
// their figures are read against).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "absl/status/status.h"
#include "kernels/cuda/device_memory.h"

/// Exits 1 naming the call, file and line when a CUDA runtime call fails.
#define BENCH_CHECK_CUDA(expr)                                           \
  do {                                                                   \
    const cudaError_t error_ = (expr);                                   \
    if (error_ != cudaSuccess) {                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(error_));                          \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

namespace loom::bench {

/// Whether the command line asks for the short form (`--quick`: the figures the GPU
/// verification window needs, under 90 s for the three GPU benchmarks together; see
/// tests/gpu/quick.sh). `--profile` is the short form with each measured shape launched once
/// more inside a profiler range (bench/profile_range.h; tests/gpu/profile.sh). Exits 2 naming
/// any other argument.
bool QuickMode(int argc, char** argv);

/// Exits 1 with "`what`: status" unless `status` is OK.
void CheckOk(const absl::Status& status, const char* what);

/// `bytes` of device memory (uninitialized); exits 1 when the allocation fails.
kernels::cuda::DeviceBuffer AllocateOrExit(size_t bytes);

/// Seconds one `launch()` takes on `stream`: CUDA events around `iterations` back-to-back
/// launches, the median of `repeats` such timings, after 2 warm-up launches. Exits 1 when
/// a launch fails.
double MedianLaunchSeconds(cudaStream_t stream, const std::function<absl::Status()>& launch,
                           int repeats, int iterations);

/// Microseconds one `launch(i)` takes as the device runs it (i: the launch's index, for operands
/// rotated past L2): after one eager warm-up launch, a CUDA graph of enough captured launches to
/// run about 2 ms, replayed `repeats` times; the median per launch. Host launch costs do not
/// count: back-to-back eager launches of a kernel shorter than its launch time the host. Exits 1
/// when a launch or the capture fails.
double MedianGraphLaunchUs(cudaStream_t stream, const std::function<absl::Status(int)>& launch,
                           int repeats = 11);

/// Copies of a `bytes` operand that a rotation reads to miss L2 on every launch: enough for 384
/// MiB (over twice the L2 of any current GPU), 1 to 64.
int RotationCopies(size_t bytes);

/// Bytes read + bytes written per second of a 1 GiB device-to-device copy on `stream`:
/// MedianLaunchSeconds of the copy over 9 repeats of 10 copies.
double MeasureDeviceCopyBandwidth(cudaStream_t stream);

}  // namespace loom::bench
