// Tensor parallelism on the CPU: gloo all-reduce latency on loopback for 8 KB - 1 MB
// messages (2 ranks, in-process threads: the same TCP transport as separate processes), as
// achieved bus bandwidth against this machine's memcpy bandwidth measured in the same run;
// and the decode step time of the default model with TP = 2 (2 ranks x 1 thread) against
// TP = 1 (1 rank x 2 threads), the baseline. Writes bench/results/tensor_parallel_cpu.json.
//
//   build/bench/tensor_parallel_bench [--model PATH]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/machine_limits.h"
#include "common/formats/gguf_file.h"
#include "gloo/rendezvous/hash_store.h"
#include "worker/cpu_forward_pass.h"
#include "worker/gloo_communicator.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs body(rank, communicator) on `ranks` threads joined through one store.
template <typename Body>
void WithRanks(int ranks, Body&& body) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      auto communicator = loom::worker::GlooCommunicator::Connect(store, rank, ranks, {});
      if (!communicator.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, communicator.status().ToString().c_str());
        std::exit(1);
      }
      body(rank, **communicator);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Decode step time: `sequences` sequences of 64 tokens of context each, 32 steps.
double DecodeStepSeconds(loom::worker::CpuForwardPass& forward_pass, int sequences) {
  std::vector<std::vector<int32_t>> blocks(sequences);
  for (int s = 0; s < sequences; ++s) {
    for (int b = 0; b < 8; ++b) blocks[s].push_back(s * 8 + b);
  }
  std::vector<float> logits;
  // Prefill 64 tokens each, then time decodes.
  loom::worker::StepBatch prefill;
  for (int s = 0; s < sequences; ++s) {
    std::vector<int32_t> prompt(64);
    for (int i = 0; i < 64; ++i) prompt[i] = 300 + (s * 64 + i) % 20000;
    (void)loom::worker::AppendSequence(prefill, prompt, 0, blocks[s], 16, true);
  }
  (void)forward_pass.Step(prefill, logits);
  std::vector<double> times;
  for (int step = 0; step < 32; ++step) {
    loom::worker::StepBatch batch;
    for (int s = 0; s < sequences; ++s) {
      const int32_t token = 500 + step;
      (void)loom::worker::AppendSequence(batch, {&token, 1}, 64 + step, blocks[s], 16, true);
    }
    const auto start = Clock::now();
    if (!forward_pass.Step(batch, logits).ok()) std::exit(1);
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return Median(times);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (const char* env = std::getenv("LOOM_MODEL_PATH")) model_path = env;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--model") model_path = argv[i + 1];
  }
  const double copy_gbs = loom::bench::MeasureCopyBandwidthGBs(1);
  std::printf("CPU: %s; limit: memcpy %.1f GB/s (1 thread, read+write)\n",
              loom::bench::CpuModel().c_str(), copy_gbs);

  // All-reduce latency, 2 ranks.
  std::string json = absl::StrFormat(
      "{\"benchmark\": \"tensor_parallel_cpu\", \"date\": \"%s\", \"cpu\": \"%s\", "
      "\"limits\": {\"memcpy_gbs_1thread\": %.2f},\n \"allreduce_gloo_2ranks\": [",
      loom::bench::UtcNow(), loom::bench::CpuModel(), copy_gbs);
  std::printf("gloo all-reduce, 2 ranks on loopback (median of 50):\n");
  bool first = true;
  for (int64_t bytes : {int64_t{8} << 10, int64_t{64} << 10, int64_t{256} << 10, int64_t{1} << 20}) {
    std::vector<double> latencies;
    WithRanks(2, [&](int rank, loom::worker::GlooCommunicator& comm) {
      std::vector<float> data(bytes / sizeof(float), 1.0f);
      for (int i = 0; i < 60; ++i) {
        (void)comm.Barrier();
        const auto start = Clock::now();
        (void)comm.AllReduceSum(absl::MakeSpan(data));
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (rank == 0 && i >= 10) latencies.push_back(seconds);
      }
    });
    const double latency = Median(latencies);
    // A ring all-reduce moves 2 (n - 1) / n of the buffer per rank: the bus bandwidth.
    const double bus_gbs = bytes * 2.0 * (2 - 1) / 2 / latency / 1e9;
    std::printf("  %7lld bytes: %8.1f us, bus %6.2f GB/s = %.3f of memcpy\n",
                static_cast<long long>(bytes), latency * 1e6, bus_gbs, bus_gbs / copy_gbs);
    absl::StrAppendFormat(&json,
                          "%s{\"bytes\": %d, \"latency_us\": %.1f, \"bus_gbs\": %.3f, "
                          "\"vs_memcpy\": %.4f}",
                          first ? "" : ", ", bytes, latency * 1e6, bus_gbs, bus_gbs / copy_gbs);
    first = false;
  }
  json += "],\n \"decode_step\": [";

  auto gguf = loom::common::GgufFile::Open(model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  std::printf("decode step of %s, median of 32 steps (TP = 1 with 2 threads is the baseline):\n",
              model_path.c_str());
  first = true;
  for (int sequences : {1, 16}) {
    loom::worker::CpuForwardPassOptions options;
    options.num_threads = 2;
    options.num_kv_blocks = 16 * 8;
    options.kv_dtype = loom::kernels::cpu::KvDtype::kF16;
    auto whole = loom::worker::CpuForwardPass::Create(**gguf, options);
    if (!whole.ok()) return 1;
    const double tp1 = DecodeStepSeconds(**whole, sequences);
    std::vector<double> tp2(2);
    WithRanks(2, [&](int rank, loom::worker::GlooCommunicator& comm) {
      loom::worker::CpuForwardPassOptions shard = options;
      shard.num_threads = 1;
      shard.tp_rank = rank;
      shard.tp_size = 2;
      shard.communicator = &comm;
      auto forward_pass = loom::worker::CpuForwardPass::Create(**gguf, shard);
      if (!forward_pass.ok()) std::exit(1);
      tp2[rank] = DecodeStepSeconds(**forward_pass, sequences);
    });
    std::printf("  %2d sequences: TP=1 %.2f ms, TP=2 %.2f ms = %.2fx the TP=1 step time\n",
                sequences, tp1 * 1e3, tp2[0] * 1e3, tp2[0] / tp1);
    absl::StrAppendFormat(&json,
                          "%s{\"sequences\": %d, \"tp1_ms\": %.3f, \"tp2_ms\": %.3f, "
                          "\"tp2_vs_tp1\": %.3f}",
                          first ? "" : ", ", sequences, tp1 * 1e3, tp2[0] * 1e3, tp2[0] / tp1);
    first = false;
  }
  json += "]}\n";
  loom::bench::WriteResult("tensor_parallel_cpu", json);
  return 0;
}
