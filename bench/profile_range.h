#pragma once

// Nsight Compute ranges for the GPU benchmarks' --profile form (tests/gpu/profile.sh runs them
// under `ncu --profile-from-start off`): each measured shape launches once more between
// cudaProfilerStart and cudaProfilerStop, so the profiler sees exactly the kernels of the
// figures in the report, named by the shape (tests/gpu/profile_report.py).

#include <cuda_runtime_api.h>

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace loom::bench {

/// Turns the ranges on for this process (the benchmarks' --profile).
void EnableProfileRanges();

/// Whether --profile turned the ranges on.
bool ProfileRangesEnabled();

/// With the ranges on: prints "loom-profile-range N LABEL" on stdout, then runs `launch()` once
/// between cudaProfilerStart and cudaProfilerStop (the device synchronized on both sides),
/// closing the range on `stream` (null: the default stream) with a
/// one-thread marker kernel (`loom_profile_marker`) of N blocks, so that a report lists the
/// range's kernels and then the marker that names them (N counts from 1 per process). Does
/// nothing with the ranges off. Exits 1 when a launch fails.
void ProfileRange(cudaStream_t stream, const std::string& label,
                  const std::function<absl::Status()>& launch);

}  // namespace loom::bench
