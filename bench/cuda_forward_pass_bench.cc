// The CUDA forward pass end to end on a Llama-3-8B-shaped model (hidden 4096, 32 layers,
// 32 query / 8 KV heads, head dim 128, FFN 14336, vocab 128256, rope theta 500000), F16
// weights generated on the device (CudaForwardPass::CreateRandom: no 16 GB file, never
// zeros), against limits measured in the same run:
//  1. a decode step at batch 1: weight bytes read per second (every layer matrix and the
//     LM head, once per step) as a ratio of the device-to-device copy bandwidth (bytes
//     read + written per second of a 1 GiB cudaMemcpy); target >= 0.75; CUDA graphs on
//     and off;
//  2. output tokens/s of greedy decode steps (StepAndSample, the sampled token fed back)
//     at batch 1, 16, 64, 256 after a 512-token prompt per sequence, each next to its
//     bound: batch / ((weight bytes + KV bytes read per step) / copy bandwidth);
//  3. (full only) 8-bit KV at the F16 pool's memory budget (KvDtypeRow);
//  4. the host KV tier (issue 35): the pool's SaveBlocks / LoadBlocks of an 8,192-token
//     prompt's 512 blocks into pinned host slots, GB/s against one pinned cudaMemcpy of the
//     same bytes each way (this machine's PCIe / C2C limit), and the TTFT of that prompt
//     recomputed (one prefill step) against a host-tier hit (its blocks loaded back, the
//     last token computed over them).
//
// Timing: wall clock over kDecodeSteps steps after kWarmupSteps (which capture the decode
// graphs); StepAndSample waits for its tokens, so each step is complete when it returns.
// Writes cuda_forward_pass_bench.json into $OUT when set, else bench/results/gpu/ under
// LOOM_SOURCE_DIR (or the current directory). Exits 0 with a message where no GPU is.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_bench_support.h"
#include "bench/machine_limits.h"
#include "bench/model_shapes.h"
#include "bench/profile_range.h"
#include "common/formats/model_config.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda_device.h"
#include "worker/cuda_forward_pass.h"
#include "worker/forward_pass.h"
#include "worker/step_batch.h"

namespace loom::bench {
namespace {

using kernels::cuda::DataType;
using kernels::cuda::DeviceBuffer;

constexpr int64_t kPromptTokens = 512;
constexpr int64_t kWarmupSteps = 3;  // the first decode step of a bucket runs eagerly, the second captures
constexpr int64_t kDecodeSteps = 32;
constexpr int64_t kBlockSize = 16;
constexpr int64_t kBatches[] = {1, 16, 64, 256};
constexpr int64_t kMaxBatch = 256;
constexpr int64_t kPrefillSeqsPerStep = 8;  // 4,096 prompt tokens per prefill step
constexpr uint64_t kWeightSeed = 20240501;
constexpr double kTargetDecodeRatio = 0.75;

// Tokens each sequence holds at most: the prompt, the warm-up and the timed steps.
constexpr int64_t kTokensPerSeq = kPromptTokens + kWarmupSteps + kDecodeSteps;
constexpr int64_t kBlocksPerSeq = (kTokensPerSeq + kBlockSize - 1) / kBlockSize;

// --quick keeps this many of the 32 layers: 7 layers (3.1 GB) plus the embedding and LM
// head (2.1 GB) are a 5.2 GB model, past the 4 GB where batch-1 decode reads from DRAM on
// any current GPU, built and warmed in seconds.
constexpr int64_t kQuickLayers = 7;
// --profile keeps two: every kernel of a layer is in the profiled step twice (the profiler
// replays each kernel launch many times), with the embedding, LM head and sampling.
constexpr int64_t kProfileLayers = 2;

// Bytes of weights a decode step reads: every layer matrix and the LM head (one embedding
// row per token is negligible), 2 bytes per element (F16).
double WeightBytesPerStep(const common::ModelConfig& c) {
  const double q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  const double per_layer = (q_dim + 2 * kv_dim) * c.hidden_size + c.hidden_size * q_dim +
                           2.0 * c.intermediate_size * c.hidden_size +
                           c.hidden_size * static_cast<double>(c.intermediate_size);
  return 2.0 * (c.num_layers * per_layer + static_cast<double>(c.vocab_size) * c.hidden_size);
}

// K and V of every layer for one token in the pool (F16).
double KvBytesPerToken(const common::ModelConfig& c) {
  return 2.0 * c.num_layers * c.num_kv_heads * c.head_dim * 2;
}

// Sequence s owns blocks [s * kBlocksPerSeq, (s + 1) * kBlocksPerSeq); its table for
// `tokens` tokens is the first ceil(tokens / kBlockSize) of them.
std::vector<int32_t> BlockTable(int64_t seq, int64_t tokens) {
  std::vector<int32_t> table((tokens + kBlockSize - 1) / kBlockSize);
  for (size_t i = 0; i < table.size(); ++i) {
    table[i] = static_cast<int32_t>(seq * kBlocksPerSeq + static_cast<int64_t>(i));
  }
  return table;
}

// Fills the KV of sequences [0, num_seqs) with kPromptTokens random prompt tokens each.
void Prefill(worker::CudaForwardPass& forward_pass, int64_t num_seqs, int64_t vocab) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<float> logits;
  for (int64_t first = 0; first < num_seqs; first += kPrefillSeqsPerStep) {
    worker::StepBatch batch;
    for (int64_t s = first; s < std::min(num_seqs, first + kPrefillSeqsPerStep); ++s) {
      std::vector<int32_t> prompt(kPromptTokens);
      for (int32_t& id : prompt) id = token(rng);
      CheckOk(worker::AppendSequence(batch, prompt, 0, BlockTable(s, kPromptTokens),
                                     kBlockSize, true),
              "prefill batch");
    }
    CheckOk(forward_pass.Step(batch, logits), "prefill step");
  }
}

// Seconds per greedy decode step of sequences [0, batch) over kDecodeSteps steps at
// positions kPromptTokens + kWarmupSteps onwards (after kWarmupSteps warm-up steps). Under
// --profile with a `profile_label`, the last step runs inside a profiler range of that name.
double DecodeStepSeconds(worker::CudaForwardPass& forward_pass, int64_t batch,
                         const char* profile_label = nullptr) {
  std::vector<int32_t> tokens(batch);
  for (int64_t s = 0; s < batch; ++s) tokens[s] = static_cast<int32_t>((s * 7919) % 128000);
  std::vector<int32_t> next;
  std::vector<float> logprobs, host_logits;
  std::chrono::steady_clock::time_point start;
  for (int64_t step = 0; step < kWarmupSteps + kDecodeSteps; ++step) {
    if (step == kWarmupSteps) start = std::chrono::steady_clock::now();
    const int32_t position = static_cast<int32_t>(kPromptTokens + step);
    worker::StepBatch step_batch;
    worker::DeviceSampleRows rows;
    rows.penalty_indptr.push_back(0);
    for (int64_t s = 0; s < batch; ++s) {
      CheckOk(worker::AppendSequence(step_batch, {tokens[s]}, position,
                                     BlockTable(s, position + 1), kBlockSize, true),
              "decode batch");
      worker::SamplingParams greedy;
      greedy.temperature = 0.0f;
      rows.params.push_back(greedy);
      rows.positions.push_back(position);
      rows.penalty_indptr.push_back(0);
    }
    const auto step_and_sample = [&] {
      return forward_pass.StepAndSample(step_batch, rows, next, logprobs, host_logits);
    };
    if (profile_label != nullptr && ProfileRangesEnabled() &&
        step + 1 == kWarmupSteps + kDecodeSteps) {
      ProfileRange(nullptr, profile_label, step_and_sample);
    } else {
      CheckOk(step_and_sample(), "decode step");
    }
    tokens = next;
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / kDecodeSteps;
}

std::unique_ptr<worker::CudaForwardPass> MakeForwardPass(
    const common::ModelConfig& config, bool cuda_graphs, int64_t num_seqs,
    kernels::cuda::KvQuant kv_quant = kernels::cuda::KvQuant::kNone) {
  worker::CudaForwardPassOptions options;
  options.dtype = DataType::kF16;
  options.kv_dtype = DataType::kF16;
  options.kv_quant = kv_quant;
  options.block_size = kBlockSize;
  options.num_kv_blocks = num_seqs * kBlocksPerSeq;
  options.max_num_tokens = kPrefillSeqsPerStep * kPromptTokens;
  options.cuda_graphs = cuda_graphs;
  absl::StatusOr<std::unique_ptr<worker::CudaForwardPass>> forward_pass =
      worker::CudaForwardPass::CreateRandom(config, options, kWeightSeed);
  CheckOk(forward_pass.status(), "CudaForwardPass::CreateRandom");
  std::printf("runner (graphs %s):\n%s", cuda_graphs ? "on" : "off",
              (*forward_pass)->load_log().c_str());
  return std::move(forward_pass).value();
}

// Section 3: the sequences the F16 pool of kKvBudgetSeqs sequences holds in 8-bit KV, and
// greedy decode of all of them against F16 KV at the same budget.
constexpr int64_t kKvBudgetSeqs = 128;

struct KvDtypeRow {
  const char* name = "";
  int64_t seqs = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;
};

KvDtypeRow EightBitKvRow(const common::ModelConfig& config, const char* name,
                         kernels::cuda::KvQuant quant) {
  const int64_t f16_block =
      worker::CudaForwardPass::KvBytesPerBlock(config, kBlockSize, DataType::kF16);
  const int64_t block =
      worker::CudaForwardPass::KvBytesPerBlock(config, kBlockSize, DataType::kF16, quant);
  KvDtypeRow row;
  row.name = name;
  row.seqs = kKvBudgetSeqs * kBlocksPerSeq * f16_block / block / kBlocksPerSeq;
  std::unique_ptr<worker::CudaForwardPass> forward_pass =
      MakeForwardPass(config, true, row.seqs, quant);
  Prefill(*forward_pass, row.seqs, config.vocab_size);
  row.step_seconds = DecodeStepSeconds(*forward_pass, row.seqs);
  row.tokens_per_second = row.seqs / row.step_seconds;
  return row;
}

// Section 3's table (F16 first), and its member of the result JSON.
void PrintKvRows(const std::vector<KvDtypeRow>& kv_rows) {
  if (kv_rows.empty()) return;
  std::printf(
      "\n3. KV dtype at the memory of %ld F16 sequences: all of them decoding, output "
      "tokens/s against F16 KV (target >= 1.3x for 8-bit)\n",
      static_cast<long>(kKvBudgetSeqs));
  std::printf("%10s %6s %10s %12s %8s\n", "kv dtype", "seqs", "step us", "tokens/s", "/f16");
  for (const KvDtypeRow& r : kv_rows) {
    std::printf("%10s %6ld %10.1f %12.0f %8.3f\n", r.name, static_cast<long>(r.seqs),
                r.step_seconds * 1e6, r.tokens_per_second,
                r.tokens_per_second / kv_rows.front().tokens_per_second);
  }
}

std::string KvRowsJson(const std::vector<KvDtypeRow>& kv_rows) {
  std::string json = "  \"kv_dtypes_at_one_budget\": [\n";
  for (size_t i = 0; i < kv_rows.size(); ++i) {
    const KvDtypeRow& r = kv_rows[i];
    json += absl::StrFormat(
        "    {\"kv_dtype\": \"%s\", \"seqs\": %d, \"step_us\": %.2f, \"tokens_per_s\": %.1f, "
        "\"over_f16\": %.3f}%s\n",
        r.name, r.seqs, r.step_seconds * 1e6, r.tokens_per_second,
        r.tokens_per_second / kv_rows.front().tokens_per_second, i + 1 < kv_rows.size() ? "," : "");
  }
  return json + "  ]\n";
}

// Section 4's figures.
struct HostTierRow {
  int64_t blocks = 0;
  double bytes = 0;
  double save_gbs = 0, load_gbs = 0;  // the pool's block copies
  double d2h_gbs = 0, h2d_gbs = 0;    // one pinned cudaMemcpy of the same bytes
  double recompute_seconds = 0, reload_seconds = 0;
};

constexpr int64_t kTierPromptTokens = 8192;

HostTierRow MeasureHostTier(const common::ModelConfig& model) {
  common::ModelConfig config = model;
  config.context_length = std::max<int64_t>(config.context_length, kTierPromptTokens);
  const int64_t blocks = kTierPromptTokens / kBlockSize;
  worker::CudaForwardPassOptions options;
  options.dtype = DataType::kF16;
  options.kv_dtype = DataType::kF16;
  options.block_size = kBlockSize;
  options.num_kv_blocks = 2 * blocks;  // the prompt, and where its reload lands
  options.max_num_tokens = kTierPromptTokens;
  options.cuda_graphs = false;
  absl::StatusOr<std::unique_ptr<worker::CudaForwardPass>> created =
      worker::CudaForwardPass::CreateRandom(config, options, kWeightSeed);
  CheckOk(created.status(), "CudaForwardPass::CreateRandom (host tier)");
  worker::CudaForwardPass& forward_pass = **created;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<int32_t> prompt(kTierPromptTokens);
  for (int32_t& id : prompt) id = token(rng);
  auto table = [&](int64_t first) {
    std::vector<int32_t> ids(blocks);
    for (int64_t b = 0; b < blocks; ++b) ids[b] = static_cast<int32_t>(first + b);
    return ids;
  };
  std::vector<float> logits;
  auto prefill = [&] {
    worker::StepBatch batch;
    CheckOk(worker::AppendSequence(batch, prompt, 0, table(0), kBlockSize, true), "tier prefill");
    const auto start = std::chrono::steady_clock::now();
    CheckOk(forward_pass.Step(batch, logits), "tier prefill step");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  prefill();  // warm-up
  HostTierRow row;
  row.blocks = blocks;
  row.recompute_seconds = prefill();
  const model::KvCache& pool = *forward_pass.kv_pool();
  const int64_t block_bytes = pool.block_bytes();
  row.bytes = static_cast<double>(blocks * block_bytes);
  uint8_t* host = nullptr;
  BENCH_CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&host), blocks * block_bytes));
  std::vector<uint8_t*> slots(blocks);
  std::vector<const uint8_t*> const_slots(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    slots[b] = host + b * block_bytes;
    const_slots[b] = slots[b];
  }
  const std::vector<int32_t> source = table(0), dest = table(blocks);
  auto seconds = [](auto&& work) {
    const auto start = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  CheckOk(pool.SaveBlocks(source, slots), "SaveBlocks warm-up");
  row.save_gbs =
      row.bytes / seconds([&] { CheckOk(pool.SaveBlocks(source, slots), "SaveBlocks"); }) / 1e9;
  row.load_gbs =
      row.bytes / seconds([&] { CheckOk(pool.LoadBlocks(const_slots, dest), "LoadBlocks"); }) / 1e9;
  {
    DeviceBuffer device = AllocateOrExit(blocks * block_bytes);
    const size_t bytes = static_cast<size_t>(blocks * block_bytes);
    BENCH_CHECK_CUDA(cudaMemcpy(host, device.data(), bytes, cudaMemcpyDeviceToHost));
    row.d2h_gbs =
        row.bytes / seconds([&] {
          BENCH_CHECK_CUDA(cudaMemcpy(host, device.data(), bytes, cudaMemcpyDeviceToHost));
        }) /
        1e9;
    row.h2d_gbs =
        row.bytes / seconds([&] {
          BENCH_CHECK_CUDA(cudaMemcpy(device.data(), host, bytes, cudaMemcpyHostToDevice));
        }) /
        1e9;
  }
  // The hit: the prompt's blocks back from the host tier, then its last token over them.
  row.reload_seconds = seconds([&] {
    CheckOk(pool.LoadBlocks(const_slots, dest), "LoadBlocks (hit)");
    worker::StepBatch batch;
    CheckOk(worker::AppendSequence(batch, {prompt.back()}, kTierPromptTokens - 1, table(blocks),
                                   kBlockSize, true),
            "tier hit batch");
    CheckOk(forward_pass.Step(batch, logits), "tier hit step");
  });
  BENCH_CHECK_CUDA(cudaFreeHost(host));
  return row;
}

void PrintHostTier(const HostTierRow& tier) {
  std::printf(
      "\n4. host KV tier, %ld blocks (%.2f GB): SaveBlocks %.1f GB/s (%.3f of pinned D2H %.1f), "
      "LoadBlocks %.1f GB/s (%.3f of pinned H2D %.1f); %ld-token prompt: recompute %.1f ms, "
      "host-tier hit %.1f ms (%.2fx faster)\n",
      static_cast<long>(tier.blocks), tier.bytes / 1e9, tier.save_gbs, tier.save_gbs / tier.d2h_gbs,
      tier.d2h_gbs, tier.load_gbs, tier.load_gbs / tier.h2d_gbs, tier.h2d_gbs,
      static_cast<long>(kTierPromptTokens), tier.recompute_seconds * 1e3, tier.reload_seconds * 1e3,
      tier.recompute_seconds / tier.reload_seconds);
}

// Section 4's member of the result JSON (after the others), and the JSON's end.
std::string HostTierJson(const HostTierRow& tier) {
  return absl::StrFormat(
      "  ,\"host_tier\": {\"blocks\": %d, \"bytes\": %.0f, \"save_gbs\": %.2f, "
      "\"pinned_d2h_gbs\": %.2f, \"save_ratio\": %.3f, \"load_gbs\": %.2f, "
      "\"pinned_h2d_gbs\": %.2f, \"load_ratio\": %.3f, \"prompt_tokens\": %d, "
      "\"recompute_ms\": %.2f, \"host_hit_ms\": %.2f, \"hit_speedup\": %.2f}\n}\n",
      tier.blocks, tier.bytes, tier.save_gbs, tier.d2h_gbs, tier.save_gbs / tier.d2h_gbs,
      tier.load_gbs, tier.h2d_gbs, tier.load_gbs / tier.h2d_gbs, kTierPromptTokens,
      tier.recompute_seconds * 1e3, tier.reload_seconds * 1e3,
      tier.recompute_seconds / tier.reload_seconds);
}

struct ThroughputRow {
  int64_t batch = 0;
  double step_seconds = 0;
  double kv_bytes = 0;  // K/V read per step (mean context over the timed steps)
  double tokens_per_second = 0;
  double bound_tokens_per_second = 0;
};

int Run(bool quick) {
  if (kernels::CudaDeviceCount() == 0) {
    std::printf("cuda_forward_pass_bench: no CUDA device (%s): nothing measured\n",
                kernels::CudaDeviceDescription(0).c_str());
    return 0;
  }
  const std::string device = kernels::CudaDeviceDescription(0);
  std::printf("cuda_forward_pass_bench on %s\n", device.c_str());
  common::ModelConfig config = Llama3_8BShape();
  if (quick) config.num_layers = ProfileRangesEnabled() ? kProfileLayers : kQuickLayers;
  double copy = 0;
  {
    cudaStream_t stream;
    BENCH_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    copy = MeasureDeviceCopyBandwidth(stream);
    BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
  }
  const double weight_bytes = WeightBytesPerStep(config);
  std::printf("limits: copy %.0f GB/s (read + write); weights read per step %.2f GB\n",
              copy / 1e9, weight_bytes / 1e9);

  // Graphs off first (one sequence), then graphs on with the full pool: one forward pass at a
  // time, so the device holds one copy of the weights.
  double eager_b1 = 0;
  {
    std::unique_ptr<worker::CudaForwardPass> forward_pass = MakeForwardPass(config, false, 1);
    Prefill(*forward_pass, 1, config.vocab_size);
    eager_b1 = DecodeStepSeconds(*forward_pass, 1);
  }
  std::vector<ThroughputRow> rows;
  std::vector<KvDtypeRow> kv_rows;  // F16 first; not in --quick
  {
    // --quick: batch 1 only (the graphs on/off comparison).
    const int64_t max_batch = quick ? 1 : kMaxBatch;
    std::unique_ptr<worker::CudaForwardPass> forward_pass =
        MakeForwardPass(config, true, max_batch);
    const auto prefill_start = std::chrono::steady_clock::now();
    Prefill(*forward_pass, max_batch, config.vocab_size);
    const std::chrono::duration<double> prefill = std::chrono::steady_clock::now() - prefill_start;
    std::printf("prefill: %ld sequences x %ld tokens in %.2f s (%.0f tokens/s)\n",
                static_cast<long>(max_batch), static_cast<long>(kPromptTokens), prefill.count(),
                max_batch * kPromptTokens / prefill.count());
    // Mean context attended over the timed steps (position + 1).
    const double mean_context =
        kPromptTokens + kWarmupSteps + (kDecodeSteps - 1) / 2.0 + 1.0;
    for (int64_t batch : kBatches) {
      if (batch > max_batch) break;
      ThroughputRow row;
      row.batch = batch;
      const std::string label =
          absl::StrFormat("decode step batch %d, graphs on, %d layers", batch, config.num_layers);
      row.step_seconds =
          DecodeStepSeconds(*forward_pass, batch, batch == 1 ? label.c_str() : nullptr);
      row.kv_bytes = batch * mean_context * KvBytesPerToken(config);
      row.tokens_per_second = batch / row.step_seconds;
      row.bound_tokens_per_second = batch * copy / (weight_bytes + row.kv_bytes);
      rows.push_back(row);
    }
    if (!quick) {
      KvDtypeRow& f16 = kv_rows.emplace_back();
      f16.name = "f16";
      f16.seqs = kKvBudgetSeqs;
      f16.step_seconds = DecodeStepSeconds(*forward_pass, kKvBudgetSeqs);
      f16.tokens_per_second = kKvBudgetSeqs / f16.step_seconds;
    }
    const worker::CudaForwardPass::Stats stats = forward_pass->stats();
    std::printf("graph captures %ld, replays %ld, eager steps %ld\n",
                static_cast<long>(stats.graph_captures), static_cast<long>(stats.graph_replays),
                static_cast<long>(stats.eager_steps));
  }
  const double graph_b1 = rows.front().step_seconds;
  if (!quick) {
    kv_rows.push_back(EightBitKvRow(config, "int8", kernels::cuda::KvQuant::kInt8));
    kv_rows.push_back(EightBitKvRow(config, "fp8_e4m3", kernels::cuda::KvQuant::kFp8E4m3));
  }

  std::printf("\n1. decode step at batch 1 (context %ld): weight bytes/s against copy\n",
              static_cast<long>(kPromptTokens + kWarmupSteps + kDecodeSteps / 2));
  std::printf("%8s %10s %10s %8s\n", "graphs", "us", "GB/s", "/copy");
  for (auto [name, seconds] : {std::pair<const char*, double>{"on", graph_b1}, {"off", eager_b1}}) {
    std::printf("%8s %10.1f %10.0f %8.3f\n", name, seconds * 1e6, weight_bytes / seconds / 1e9,
                weight_bytes / seconds / copy);
  }
  std::printf("\n2. greedy decode, output tokens/s against (weights + KV read) / copy\n");
  std::printf("%6s %10s %10s %12s %12s %8s\n", "batch", "step us", "KV GB", "tokens/s", "bound",
              "ratio");
  for (const ThroughputRow& r : rows) {
    std::printf("%6ld %10.1f %10.2f %12.0f %12.0f %8.3f\n", static_cast<long>(r.batch),
                r.step_seconds * 1e6, r.kv_bytes / 1e9, r.tokens_per_second,
                r.bound_tokens_per_second, r.tokens_per_second / r.bound_tokens_per_second);
  }
  std::printf("target: batch-1 decode weight bytes/s >= %.2f of copy (graphs on)\n",
              kTargetDecodeRatio);
  PrintKvRows(kv_rows);

  std::string json = "{\n";
  json +=
      absl::StrFormat("  \"bench\": \"cuda_forward_pass_bench\",\n  \"date\": \"%s\",\n", UtcNow());
  json += absl::StrFormat("  \"device\": \"%s\",\n", device);
  json += absl::StrFormat(
      "  \"quick\": %s,\n"
      "  \"model\": {\"shape\": \"Llama-3-8B\", \"dtype\": \"F16\", \"hidden\": %d, "
      "\"layers\": %d, \"num_heads\": %d, \"num_kv_heads\": %d, \"head_dim\": %d, \"ffn\": %d, "
      "\"vocab\": %d, \"rope_theta\": %.0f, \"weights\": \"random on the device\"},\n",
      quick ? "true" : "false", config.hidden_size, config.num_layers, config.num_heads,
      config.num_kv_heads,
      config.head_dim, config.intermediate_size, config.vocab_size, config.rope_theta);
  json += absl::StrFormat(
      "  \"prompt_tokens\": %d,\n  \"warmup_steps\": %d,\n  \"decode_steps\": %d,\n"
      "  \"block_size\": %d,\n",
      kPromptTokens, kWarmupSteps, kDecodeSteps, kBlockSize);
  json += absl::StrFormat(
      "  \"copy_bandwidth_gbs\": %.1f,\n  \"weight_bytes_per_step\": %.0f,\n", copy / 1e9,
      weight_bytes);
  json += absl::StrFormat("  \"targets\": {\"decode_b1_weight_copy_ratio\": %.2f},\n",
                          kTargetDecodeRatio);
  json += absl::StrFormat(
      "  \"decode_b1\": {\"graphs_on_us\": %.2f, \"graphs_on_copy_ratio\": %.3f, "
      "\"graphs_off_us\": %.2f, \"graphs_off_copy_ratio\": %.3f},\n",
      graph_b1 * 1e6, weight_bytes / graph_b1 / copy, eager_b1 * 1e6,
      weight_bytes / eager_b1 / copy);
  json += "  \"throughput\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const ThroughputRow& r = rows[i];
    json += absl::StrFormat(
        "    {\"batch\": %d, \"step_us\": %.2f, \"kv_bytes_per_step\": %.0f, "
        "\"tokens_per_s\": %.1f, \"bound_tokens_per_s\": %.1f, \"ratio\": %.3f}%s\n",
        r.batch, r.step_seconds * 1e6, r.kv_bytes, r.tokens_per_second,
        r.bound_tokens_per_second, r.tokens_per_second / r.bound_tokens_per_second,
        i + 1 < rows.size() ? "," : "");
  }
  json += "  ],\n" + KvRowsJson(kv_rows);
  // Written now and again with section 4: a window that runs out of time mid-section keeps
  // sections 1-3.
  if (!loom::bench::WriteGpuResult("cuda_forward_pass_bench", json + "}\n")) return 1;

  const HostTierRow tier = MeasureHostTier(config);
  PrintHostTier(tier);
  json += HostTierJson(tier);

  const bool written = loom::bench::WriteGpuResult("cuda_forward_pass_bench", json);
  return written ? 0 : 1;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  return loom::bench::Run(loom::bench::QuickMode(argc, argv));
}
