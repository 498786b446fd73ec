// LoadModelWeights' layer sink: the layers one at a time, as a device that copies them
// uploads them (LlamaGraph::CreateFromFile), and the refusal of a graph loaded that way on
// the CPU device, which computes on the host weights.
#include "model/model_weights.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/gguf_writer.h"
#include "common/formats/hf_quantization.h"
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

// An FP8 checkpoint's row scales (the Hugging Face view's ".fp8_scale" companions) reach the
// packed layers: fused Q/K/V and gate/up in row order, a tensor-parallel rank's own rows of
// them, every row of a row-parallel layer's column slice; the LM head has none. A companion of
// the wrong size is refused by name.
TEST(ModelWeightsTest, Fp8RowScalesFollowTheirRowsIntoFusedAndShardedLayers) {
  worker::testing::TinyModelSpec spec;
  spec.kv_heads = 2;  // two ranks each hold one
  std::unique_ptr<common::GgufFile> tiny = worker::testing::TinyModel(spec);
  ASSERT_NE(tiny, nullptr);
  const std::vector<std::string> linears = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                            "ffn_gate", "ffn_up", "ffn_down"};
  // Row r of linear j of layer l scales by 100 l + 10 j + r / 1000: every row its own.
  std::map<std::string, std::vector<float>> scales;
  auto with_scales = [&](int64_t wrong_rows) {
    common::GgufWriter writer;
    writer.CopyMetadata(*tiny);
    for (const common::GgufTensorInfo& tensor : tiny->tensors()) {
      const absl::Span<const uint8_t> bytes = tiny->TensorData(tensor);
      EXPECT_TRUE(writer
                      .AddTensor(tensor.name, tensor.shape, tensor.type,
                                 std::vector<uint8_t>(bytes.begin(), bytes.end()))
                      .ok());
    }
    for (int64_t l = 0; l < spec.layers; ++l) {
      for (size_t j = 0; j < linears.size(); ++j) {
        const std::string name = absl::StrCat("blk.", l, ".", linears[j], ".weight");
        const int64_t rows = static_cast<int64_t>(tiny->FindTensor(name)->shape[1]) + wrong_rows;
        std::vector<float>& values = scales[name];
        values.resize(rows);
        for (int64_t r = 0; r < rows; ++r) values[r] = 100.0f * l + 10.0f * j + r / 1000.0f;
        std::vector<uint8_t> bytes(rows * sizeof(float));
        std::memcpy(bytes.data(), values.data(), bytes.size());
        EXPECT_TRUE(writer
                        .AddTensor(name + std::string(common::kFp8RowScaleSuffix),
                                   {static_cast<uint64_t>(rows)}, common::GgmlType::kF32,
                                   std::move(bytes))
                        .ok());
      }
    }
    absl::StatusOr<std::string> image = writer.Serialize();
    EXPECT_TRUE(image.ok()) << image.status();
    return *common::GgufFile::FromBytes(*std::move(image));
  };
  std::unique_ptr<common::GgufFile> gguf = with_scales(0);
  EXPECT_TRUE(common::HasFp8RowScales(*gguf));
  EXPECT_FALSE(common::HasFp8RowScales(*tiny));
  auto rows_of = [&](const std::string& linear, int64_t first, int64_t count) {
    const std::vector<float>& all = scales["blk.1." + linear + ".weight"];
    return std::vector<float>(all.begin() + first, all.begin() + first + count);
  };
  auto concat = [](std::vector<std::vector<float>> parts) {
    std::vector<float> out;
    for (const std::vector<float>& part : parts) out.insert(out.end(), part.begin(), part.end());
    return out;
  };
  const int64_t q = spec.heads * spec.head_dim, kv = spec.kv_heads * spec.head_dim;
  absl::StatusOr<std::unique_ptr<ModelWeights>> whole = LoadModelWeights(*gguf);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const LayerWeights& layer = (*whole)->layers[1];
  EXPECT_EQ(layer.qkv.fp8_row_scales,
            concat({rows_of("attn_q", 0, q), rows_of("attn_k", 0, kv), rows_of("attn_v", 0, kv)}));
  EXPECT_EQ(layer.gate_up.fp8_row_scales,
            concat({rows_of("ffn_gate", 0, spec.ffn), rows_of("ffn_up", 0, spec.ffn)}));
  EXPECT_EQ(layer.attn_output.fp8_row_scales, rows_of("attn_output", 0, spec.hidden));
  EXPECT_EQ(layer.down.fp8_row_scales, rows_of("ffn_down", 0, spec.hidden));
  ASSERT_NE((*whole)->output, nullptr);
  EXPECT_TRUE((*whole)->output->fp8_row_scales.empty());

  Parallelism second;
  second.tp_rank = 1;
  second.tp_size = 2;
  absl::StatusOr<std::unique_ptr<ModelWeights>> rank = LoadModelWeights(*gguf, second);
  ASSERT_TRUE(rank.ok()) << rank.status();
  const LayerWeights& shard = (*rank)->layers[1];
  EXPECT_EQ(shard.qkv.fp8_row_scales,
            concat({rows_of("attn_q", q / 2, q / 2), rows_of("attn_k", kv / 2, kv / 2),
                    rows_of("attn_v", kv / 2, kv / 2)}));
  EXPECT_EQ(shard.gate_up.fp8_row_scales, concat({rows_of("ffn_gate", spec.ffn / 2, spec.ffn / 2),
                                                  rows_of("ffn_up", spec.ffn / 2, spec.ffn / 2)}));
  EXPECT_EQ(shard.attn_output.fp8_row_scales, rows_of("attn_output", 0, spec.hidden));
  EXPECT_EQ(shard.down.fp8_row_scales, rows_of("ffn_down", 0, spec.hidden));

  std::unique_ptr<common::GgufFile> wrong = with_scales(1);
  absl::StatusOr<std::unique_ptr<ModelWeights>> refused = LoadModelWeights(*wrong);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(".fp8_scale"), std::string::npos) << refused.status();
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
