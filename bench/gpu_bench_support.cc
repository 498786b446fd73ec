#include "bench/gpu_bench_support.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/machine_limits.h"
#include "bench/profile_range.h"
#include "kernels/cuda/random_fill.h"

namespace loom::bench {

bool QuickMode(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--quick") {
      quick = true;
    } else if (std::string_view(argv[i]) == "--profile") {
      quick = true;
      EnableProfileRanges();
    } else {
      std::fprintf(stderr, "%s: unknown argument %s (--quick or --profile)\n", argv[0], argv[i]);
      std::exit(2);
    }
  }
  return quick;
}

void CheckOk(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

kernels::cuda::DeviceBuffer AllocateOrExit(size_t bytes) {
  absl::StatusOr<kernels::cuda::DeviceBuffer> buffer = kernels::cuda::DeviceBuffer::Allocate(bytes);
  CheckOk(buffer.status(), "cudaMalloc");
  return *std::move(buffer);
}

double MedianLaunchSeconds(cudaStream_t stream, const std::function<absl::Status()>& launch,
                           int repeats, int iterations) {
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) CheckOk(launch(), "warm-up launch");
  BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < iterations; ++i) CheckOk(launch(), "launch");
    BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms * 1e-3 / iterations);
  }
  BENCH_CHECK_CUDA(cudaEventDestroy(start));
  BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  return Median(std::move(samples));
}

double MedianGraphLaunchUs(cudaStream_t stream, const std::function<absl::Status(int)>& launch,
                           int repeats) {
  constexpr double kGraphTargetUs = 2000.0;  // each timed graph runs about this long
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  // Warm-up (lazy module loading, cuBLAS heuristics, shared-memory opt-in), then one timed eager
  // call to size the graph.
  CheckOk(launch(0), "warm-up launch");
  BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < 3; ++i) CheckOk(launch(i), "launch");
  BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
  BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
  float eager_ms = 0.0f;
  BENCH_CHECK_CUDA(cudaEventElapsedTime(&eager_ms, start, stop));
  const int inner = std::clamp(static_cast<int>(kGraphTargetUs / (eager_ms * 1000.0 / 3)), 4, 200);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BENCH_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < inner; ++i) CheckOk(launch(i), "captured launch");
  BENCH_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm the graph
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    BENCH_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms * 1000.0 / inner);
  }
  BENCH_CHECK_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CHECK_CUDA(cudaGraphDestroy(graph));
  BENCH_CHECK_CUDA(cudaEventDestroy(start));
  BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  return Median(std::move(samples));
}

int RotationCopies(size_t bytes) {
  constexpr size_t kRotationBytes = size_t{384} << 20;
  return static_cast<int>(
      std::clamp<size_t>((kRotationBytes + bytes - 1) / std::max<size_t>(bytes, 1), 1, 64));
}

double MeasureDeviceCopyBandwidth(cudaStream_t stream) {
  constexpr size_t kBytes = size_t{1} << 30;
  kernels::cuda::DeviceBuffer src = AllocateOrExit(kBytes), dst = AllocateOrExit(kBytes);
  kernels::cuda::RandomFillParams fill;
  fill.out = src.data();
  fill.dtype = kernels::cuda::DataType::kF16;
  fill.count = kBytes / 2;
  fill.seed = 1;
  CheckOk(kernels::cuda::LaunchRandomFill(fill, stream), "random fill");
  const double seconds = MedianLaunchSeconds(
      stream,
      [&] {
        const cudaError_t error =
            cudaMemcpyAsync(dst.data(), src.data(), kBytes, cudaMemcpyDeviceToDevice, stream);
        return error == cudaSuccess ? absl::OkStatus()
                                    : absl::InternalError(cudaGetErrorString(error));
      },
      /*repeats=*/9, /*iterations=*/10);
  return 2.0 * kBytes / seconds;
}

}  // namespace loom::bench
