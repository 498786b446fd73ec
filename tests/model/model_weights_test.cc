// LoadModelWeights' layer sink: the layers one at a time, as a device that copies them
// uploads them (LlamaGraph::CreateFromFile), and the refusal of a graph loaded that way on
// the CPU device, which computes on the host weights.
#include "model/model_weights.h"

#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/cpu_device.h"
#include "model/llama_graph.h"
#include "tests/worker/tiny_model.h"

namespace loom::model {
namespace {

bool SameWeight(const kernels::cpu::PackedWeight& a, const kernels::cpu::PackedWeight& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols &&
         a.group_size == b.group_size && a.data == b.data && a.scales == b.scales &&
         a.mins == b.mins && a.scales_f32 == b.scales_f32 && a.mins_f32 == b.mins_f32;
}

TEST(ModelWeightsTest, ASinkReceivesEveryLayerInOrderInsteadOfTheList) {
  worker::testing::TinyModelSpec spec;
  spec.layers = 3;
  std::unique_ptr<common::GgufFile> gguf = worker::testing::TinyModel(spec);
  ASSERT_NE(gguf, nullptr);
  absl::StatusOr<std::unique_ptr<ModelWeights>> whole = LoadModelWeights(*gguf);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<LayerWeights> received;
  absl::StatusOr<std::unique_ptr<ModelWeights>> streamed =
      LoadModelWeights(*gguf, {}, {}, [&](LayerWeights layer) {
        received.push_back(std::move(layer));
        return absl::OkStatus();
      });
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE((*streamed)->layers.empty());
  ASSERT_EQ(received.size(), (*whole)->layers.size());
  ASSERT_EQ(received.size(), 3u);
  for (size_t l = 0; l < received.size(); ++l) {
    const LayerWeights& a = received[l];
    const LayerWeights& b = (*whole)->layers[l];
    EXPECT_EQ(a.attn_norm, b.attn_norm) << l;
    EXPECT_EQ(a.ffn_norm, b.ffn_norm) << l;
    EXPECT_EQ(a.qkv_bias, b.qkv_bias) << l;
    EXPECT_TRUE(SameWeight(a.qkv, b.qkv)) << l;
    EXPECT_TRUE(SameWeight(a.attn_output, b.attn_output)) << l;
    EXPECT_TRUE(SameWeight(a.gate_up, b.gate_up)) << l;
    EXPECT_TRUE(SameWeight(a.down, b.down)) << l;
  }
  // Everything else is loaded as without a sink.
  EXPECT_TRUE(SameWeight((*streamed)->token_embedding, (*whole)->token_embedding));
  EXPECT_EQ((*streamed)->output_norm, (*whole)->output_norm);
  EXPECT_EQ((*streamed)->load_log, (*whole)->load_log);
  // A sink's error stops the load at that layer.
  int calls = 0;
  absl::StatusOr<std::unique_ptr<ModelWeights>> stopped =
      LoadModelWeights(*gguf, {}, {}, [&](LayerWeights) {
        return ++calls == 2 ? absl::ResourceExhaustedError("device full") : absl::OkStatus();
      });
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 2);
}

TEST(ModelWeightsTest, ALayerByLayerGraphNeedsADeviceThatCopies) {
  std::unique_ptr<common::GgufFile> gguf = worker::testing::TinyModel({});
  ASSERT_NE(gguf, nullptr);
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create({});
  ASSERT_TRUE(device.ok()) << device.status();
  absl::StatusOr<std::unique_ptr<LlamaGraph>> graph =
      LlamaGraph::CreateFromFile(*gguf, {}, std::move(*device), LlamaGraphOptions{});
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition) << graph.status();
}

}  // namespace
}  // namespace loom::model
