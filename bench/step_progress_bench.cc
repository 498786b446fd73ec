// What the worker's progress reporting costs the step path: single-sequence decode
// (the smallest step, where a fixed cost shows most) on two CPU runners of the same model,
// one without a StepProgress and one counting two units per layer into it while a reader
// thread snapshots it every millisecond (500x the heartbeat's rate). Rounds alternate
// between the two; the figure is the median tokens/s with progress over the median
// without, held against 0.98. Writes bench/results/step_progress.json.
//
// usage: step_progress_bench [--model PATH] [--threads N] [--rounds R]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/machine_limits.h"
#include "common/gguf_file.h"
#include "kernels/cpu/matmul.h"
#include "worker/local_generator.h"
#include "worker/model_runner.h"
#include "worker/step_progress.h"

namespace {

constexpr double kLimit = 0.98;  // with progress, at least this share of the speed without

// Decode tokens/s of one sequence generating `tokens` after a 16-token prompt.
double DecodeRate(loom::worker::ModelRunner& runner, int tokens) {
  loom::worker::GenerationRequest request;
  for (int i = 0; i < 16; ++i) request.prompt_ids.push_back(1000 + 37 * i);
  request.sampling.temperature = 0.0f;
  request.max_tokens = tokens;
  request.ignore_eos = true;
  loom::worker::LocalGenerator generator(runner, {});
  auto results = generator.Generate({request});
  if (!results.ok()) {
    std::fprintf(stderr, "generate failed: %s\n", results.status().ToString().c_str());
    std::exit(1);
  }
  const auto& result = (*results)[0];
  return (static_cast<double>(result.tokens.size()) - 1) / result.decode_seconds;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (const char* env = std::getenv("LOOM_MODEL_PATH")) model_path = env;
  int threads = 2;
  int rounds = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model_path = argv[i + 1];
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    if (flag == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  auto gguf = loom::common::GgufFile::Open(model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  loom::worker::StepProgress progress;
  loom::worker::ModelRunnerOptions options;
  options.num_threads = threads;
  options.num_kv_blocks = 64;
  auto plain = loom::worker::ModelRunner::Create(**gguf, options);
  options.progress = &progress;
  auto counted = loom::worker::ModelRunner::Create(**gguf, options);
  if (!plain.ok() || !counted.ok()) {
    std::fprintf(stderr, "cannot load %s\n", model_path.c_str());
    return 1;
  }
  std::printf("CPU: %s, %d threads, matmul ISA %s\n", loom::bench::CpuModel().c_str(), threads,
              loom::kernels::cpu::MatmulIsa());

  std::atomic<bool> stop{false};
  std::atomic<int64_t> snapshots{0};
  std::thread reader([&] {
    while (!stop.load()) {
      const loom::v1::StepProgress snapshot = progress.Snapshot();
      if (snapshot.units_done() > 0) snapshots.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  DecodeRate(**plain, 16);  // warm-up
  DecodeRate(**counted, 16);
  std::vector<double> without, with;
  for (int r = 0; r < rounds; ++r) {
    without.push_back(DecodeRate(**plain, 64));
    with.push_back(DecodeRate(**counted, 64));
    std::printf("round %d: %.1f tokens/s without progress, %.1f with\n", r + 1, without.back(),
                with.back());
  }
  stop.store(true);
  reader.join();
  const double base = loom::bench::Median(without);
  const double counted_rate = loom::bench::Median(with);
  const double ratio = counted_rate / base;
  std::printf("decode with progress counted and read every 1 ms: %.1f tokens/s vs %.1f without "
              "= %.3f (limit >= %.2f) %s; %lld units counted, %lld snapshots\n",
              counted_rate, base, ratio, kLimit, ratio >= kLimit ? "OK" : "OVER",
              static_cast<long long>(progress.units_done()),
              static_cast<long long>(snapshots.load()));
  loom::bench::WriteResult(
      "step_progress",
      absl::StrFormat(
          "{\"date\": \"%s\", \"cpu\": \"%s\", \"threads\": %d, \"rounds\": %d,\n"
          " \"decode_tokens_per_s_without_progress\": %.2f,\n"
          " \"decode_tokens_per_s_with_progress\": %.2f,\n"
          " \"ratio\": %.4f, \"limit\": %.2f, \"reader_interval_ms\": 1}\n",
          loom::bench::UtcNow(), loom::bench::CpuModel(), threads, rounds, base, counted_rate,
          ratio, kLimit));
  return ratio >= kLimit ? 0 : 1;
}
