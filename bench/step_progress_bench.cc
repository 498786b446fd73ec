// What the worker's progress reporting costs the step path. Two figures, both with a reader
// thread snapshotting the StepProgress every millisecond (500x the heartbeat's rate):
// * direct: nanoseconds per StepProgress::Advance() over 10^7 calls, times the units a
//   SmolLM2 step counts (2 per layer + 2), as a share of the median single-sequence decode
//   step measured in the same run (the smallest step, where a fixed cost shows most); held
//   against 1%;
// * end to end: median decode tokens/s of a forward pass counting progress over one that does
//   not, rounds alternating (informational: on a shared machine the round-to-round noise is
//   far larger than the effect).
// Writes bench/results/step_progress.json.
//
// usage: step_progress_bench [--model PATH] [--threads N] [--rounds R]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/machine_limits.h"
#include "cli/local_engine.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cpu/matmul.h"
#include "worker/step_backend_factory.h"
#include "worker/step_progress.h"

namespace {

constexpr double kLimit = 0.01;  // progress counting may cost at most this share of a step

// Decode tokens/s of one sequence generating `tokens` after a 16-token prompt.
double DecodeRate(loom::cli::LocalEngine& engine, int tokens) {
  loom::cli::EngineRequest request;
  for (int i = 0; i < 16; ++i) request.prompt_ids.push_back(1000 + 37 * i);
  request.sampling.temperature = 0.0f;
  request.max_tokens = tokens;
  request.ignore_eos = true;
  auto results = engine.Generate({request});
  if (!results.ok()) {
    std::fprintf(stderr, "generate failed: %s\n", results.status().ToString().c_str());
    std::exit(1);
  }
  const auto& result = (*results)[0];
  return (static_cast<double>(result.outputs.size()) - 1) / result.decode_seconds;
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
  loom::worker::StepBackendOptions options;
  options.num_threads = threads;
  options.num_kv_blocks = 64;
  auto config = loom::common::ModelConfigFromGguf(**gguf);
  auto tokenizer = loom::common::Tokenizer::FromGguf(**gguf);
  if (!config.ok() || !tokenizer.ok()) {
    std::fprintf(stderr, "cannot read %s\n", model_path.c_str());
    return 1;
  }
  auto plain_backend = loom::worker::CreateStepBackend(options, **gguf, *config);
  options.progress = &progress;
  auto counted_backend = loom::worker::CreateStepBackend(options, **gguf, *config);
  if (!plain_backend.ok() || !counted_backend.ok()) {
    std::fprintf(stderr, "cannot load %s\n", model_path.c_str());
    return 1;
  }
  // Each forward pass behind the serving engine; the executor counts the step's start and end
  // into `progress` too, as in the worker.
  loom::worker::StepExecutorOptions counted_executor;
  counted_executor.progress = &progress;
  auto plain = std::make_unique<loom::cli::LocalEngine>(**plain_backend, **tokenizer);
  auto counted = std::make_unique<loom::cli::LocalEngine>(**counted_backend, **tokenizer,
                                                          loom::cli::LocalEngineOptions{},
                                                          counted_executor);
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
  DecodeRate(*plain, 16);  // warm-up
  DecodeRate(*counted, 16);
  std::vector<double> without, with;
  for (int r = 0; r < rounds; ++r) {
    without.push_back(DecodeRate(*plain, 64));
    with.push_back(DecodeRate(*counted, 64));
    std::printf("round %d: %.1f tokens/s without progress, %.1f with\n", r + 1, without.back(),
                with.back());
  }
  // Direct: Advance() while the reader polls.
  constexpr int64_t kCalls = 10000000;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kCalls; ++i) progress.Advance();
  const double ns_per_advance =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
      kCalls;
  stop.store(true);
  reader.join();
  const double base = loom::bench::Median(without);
  const double counted_rate = loom::bench::Median(with);
  const double units_per_step = 2.0 + 2.0 * static_cast<double>(plain->config().num_layers);
  const double step_ns = 1e9 / base;
  const double share = ns_per_advance * units_per_step / step_ns;
  std::printf("Advance(): %.2f ns with a reader polling every 1 ms; %.0f units per step = "
              "%.3g%% of a %.2f ms decode step (limit %.0f%%) %s\n",
              ns_per_advance, units_per_step, 100 * share, step_ns / 1e6, 100 * kLimit,
              share <= kLimit ? "OK" : "OVER");
  std::printf("end to end (informational, noisy on a shared machine): %.1f tokens/s counting "
              "progress vs %.1f without = %.3f; %lld snapshots taken\n",
              counted_rate, base, counted_rate / base, static_cast<long long>(snapshots.load()));
  loom::bench::WriteResult(
      "step_progress",
      absl::StrFormat(
          "{\"date\": \"%s\", \"cpu\": \"%s\", \"threads\": %d, \"rounds\": %d,\n"
          " \"ns_per_advance\": %.3f, \"units_per_step\": %.0f, \"decode_step_ms\": %.3f,\n"
          " \"share_of_step\": %.3e, \"limit\": %.2f,\n"
          " \"decode_tokens_per_s_without_progress\": %.2f,\n"
          " \"decode_tokens_per_s_with_progress\": %.2f, \"reader_interval_ms\": 1}\n",
          loom::bench::UtcNow(), loom::bench::CpuModel(), threads, rounds, ns_per_advance,
          units_per_step, step_ns / 1e6, share, kLimit, base, counted_rate));
  return share <= kLimit ? 0 : 1;
}
