// LlamaGraph's lifecycle on the CPU device: a KV pool created after the weights (how the
// CUDA forward pass sizes it from the memory left), activations reserved up front (how it keeps
// CUDA graph captures free of allocations), and random weights, which only a device that
// generates them can make.
#include "model/llama_graph.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "model/cpu_device.h"
#include "model/model_weights.h"
#include "tests/worker/tiny_model.h"

namespace loom::model {
namespace {

// A graph with a pool of `num_kv_blocks` blocks, or none yet (0: defer_kv_cache).
std::unique_ptr<LlamaGraph> MakeGraph(const common::GgufFile& gguf, int64_t num_kv_blocks) {
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadModelWeights(gguf);
  EXPECT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create({});
  EXPECT_TRUE(device.ok()) << device.status();
  if (!weights.ok() || !device.ok()) return nullptr;
  LlamaGraphOptions options;
  options.num_kv_blocks = num_kv_blocks;
  options.defer_kv_cache = num_kv_blocks == 0;
  options.block_size = 16;
  absl::StatusOr<std::unique_ptr<LlamaGraph>> graph =
      LlamaGraph::Create(std::move(*weights), std::move(*device), options);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return graph.ok() ? std::move(*graph) : nullptr;
}

// A 5-token prefill of one sequence in block 1, then a decode step; the last token's logits.
absl::Status RunTwoSteps(LlamaGraph& graph, std::vector<std::vector<float>>& out) {
  const int64_t vocab = graph.config().vocab_size;
  std::vector<int32_t> ids = {3, 17, 5, 9, 1}, positions = {0, 1, 2, 3, 4};
  for (int step = 0; step < 2; ++step) {
    std::vector<int32_t> slots;
    for (int32_t p : positions) slots.push_back(16 + p);
    const std::vector<int32_t> query_start = {0, static_cast<int32_t>(ids.size())};
    const std::vector<int32_t> context_len = {positions.back() + 1}, indptr = {0, 1};
    const std::vector<int32_t> indices = {1};
    const std::vector<int32_t> sample = {static_cast<int32_t>(ids.size()) - 1};
    absl::StatusOr<StepTensors> step_tensors = graph.device().UploadStep(
        ids, positions, slots, query_start, context_len, indptr, indices, sample);
    if (!step_tensors.ok()) return step_tensors.status();
    std::vector<float>& logits = out.emplace_back(vocab);
    absl::Status status = graph.Forward(
        *step_tensors, Tensor::Of(logits.data(), DType::kF32, DeviceType::kCpu, {1, vocab}));
    if (!status.ok()) return status;
    ids = {7};
    positions = {positions.back() + 1};
  }
  return absl::OkStatus();
}

TEST(LlamaGraphTest, DeferredKvPoolAndReservedActivationsGiveTheSameLogits) {
  std::unique_ptr<common::GgufFile> gguf = worker::testing::TinyModel({});
  ASSERT_NE(gguf, nullptr);
  std::unique_ptr<LlamaGraph> eager = MakeGraph(*gguf, 4);
  std::unique_ptr<LlamaGraph> deferred = MakeGraph(*gguf, 0);
  ASSERT_NE(eager, nullptr);
  ASSERT_NE(deferred, nullptr);
  std::vector<std::vector<float>> expected, got;
  // No pool yet: refused before anything runs.
  EXPECT_EQ(RunTwoSteps(*deferred, got).code(), absl::StatusCode::kFailedPrecondition);
  got.clear();
  ASSERT_TRUE(deferred->CreateKvCache(4).ok());
  EXPECT_EQ(deferred->CreateKvCache(4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(deferred->kv_cache().num_blocks(), 4);
  ASSERT_TRUE(deferred->Reserve(/*max_tokens=*/64, /*max_rows=*/8).ok());
  ASSERT_TRUE(RunTwoSteps(*eager, expected).ok());
  ASSERT_TRUE(RunTwoSteps(*deferred, got).ok());
  ASSERT_EQ(expected.size(), 2u);
  ASSERT_EQ(got.size(), 2u);
  for (size_t step = 0; step < 2; ++step) {
    EXPECT_EQ(
        std::memcmp(expected[step].data(), got[step].data(), expected[step].size() * sizeof(float)),
        0)
        << "step " << step;
  }
}

TEST(LlamaGraphTest, RandomWeightsNeedADeviceThatGeneratesThem) {
  std::unique_ptr<common::GgufFile> gguf = worker::testing::TinyModel({});
  ASSERT_NE(gguf, nullptr);
  absl::StatusOr<common::ModelConfig> config = common::ModelConfigFromGguf(*gguf);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create({});
  ASSERT_TRUE(device.ok()) << device.status();
  LlamaGraphOptions options;
  options.num_kv_blocks = 4;
  absl::StatusOr<std::unique_ptr<LlamaGraph>> graph =
      LlamaGraph::CreateRandom(*config, std::move(*device), options, /*seed=*/1);
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kUnimplemented) << graph.status();
}

}  // namespace
}  // namespace loom::model
