#include "quant/model_quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cli/quantize_command.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_writer.h"
#include "common/tokenizer/tokenizer.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/quantize.h"
#include "model/model_weights.h"
#include "model/quantized_gguf.h"
#include "tests/common/tokenizer_test_util.h"
#include "tests/worker/forward_pass_test_util.h"
#include "worker/cpu_forward_pass.h"
#include "worker/gloo_communicator.h"

namespace loom::quant {

using cli::CalibrationSequences;
using worker::CpuForwardPass;
using worker::CpuForwardPassOptions;
using worker::GlooCommunicator;
namespace test_util = worker::test_util;
namespace {

using kernels::cpu::WeightFormat;
using model::AddQuantizedTensor;
using model::IsLoomQuantized;
using model::ReadQuantizedRows;
using model::LayerWeights;
using model::LoadModelWeights;
using model::ModelWeights;
using ::testing::HasSubstr;

// Same type and the same stored value, recursively (GgufValue has no operator==).
bool SameValue(const common::GgufValue& a, const common::GgufValue& b) {
  if (a.type() != b.type()) return false;
  if (a.type() == common::GgufValueType::kArray) {
    const common::GgufValue::Array& x = *a.AsArray().value();
    const common::GgufValue::Array& y = *b.AsArray().value();
    if (a.element_type() != b.element_type() || x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!SameValue(x[i], y[i])) return false;
    }
    return true;
  }
  const auto& s = a.storage();
  const auto& t = b.storage();
  if (s.index() != t.index()) return false;
  if (const auto* u = std::get_if<uint64_t>(&s)) return *u == std::get<uint64_t>(t);
  if (const auto* i = std::get_if<int64_t>(&s)) return *i == std::get<int64_t>(t);
  if (const auto* d = std::get_if<double>(&s)) return std::memcmp(d, &std::get<double>(t), 8) == 0;
  if (const auto* flag = std::get_if<bool>(&s)) return *flag == std::get<bool>(t);
  return std::get<std::string>(s) == std::get<std::string>(t);
}

std::vector<float> Unpack(const kernels::cpu::PackedWeight& w, int64_t row_begin, int64_t row_end) {
  std::vector<float> out((row_end - row_begin) * w.cols);
  kernels::cpu::DequantizeRows(w, row_begin, row_end, out.data());
  return out;
}

TEST(GroupSizeForTest, FallsBackToThePowerOfTwoThatDividesTheWidth) {
  EXPECT_EQ(GroupSizeFor(QuantizeFormat::kInt8, 0, 576).value(), 576);  // per channel
  EXPECT_EQ(GroupSizeFor(QuantizeFormat::kInt4, 0, 1536).value(), 128);
  EXPECT_EQ(GroupSizeFor(QuantizeFormat::kInt4, 128, 576).value(), 64);  // 576 = 9 x 64
  EXPECT_EQ(GroupSizeFor(QuantizeFormat::kInt4, 64, 576).value(), 64);
  EXPECT_EQ(GroupSizeFor(QuantizeFormat::kInt4, 128, 96).value(), 32);
  EXPECT_EQ(GroupSizeFor(QuantizeFormat::kInt8, 32, 576).value(), 32);
  EXPECT_THAT(GroupSizeFor(QuantizeFormat::kInt4, 48, 576).status().message(),
              HasSubstr("group size 48"));
  EXPECT_THAT(GroupSizeFor(QuantizeFormat::kInt4, 128, 100).status().message(),
              HasSubstr("100 columns"));
}

TEST(QuantizedGgufTest, RoundTripsRowRangesOfBothFormats) {
  for (WeightFormat format : {WeightFormat::kInt8, WeightFormat::kInt4}) {
    const int64_t rows = 40, cols = 128;
    std::vector<float> w(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) w[i] = std::sin(0.37f * static_cast<float>(i));
    const kernels::cpu::QuantizedMatrix q =
        kernels::cpu::QuantizeRtn(w.data(), rows, cols, format, 64).value();
    common::GgufWriter writer;
    ASSERT_TRUE(AddQuantizedTensor(writer, "blk.0.ffn_up.weight", q).ok());
    auto file = common::GgufFile::FromBytes(writer.Serialize().value());
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_TRUE(IsLoomQuantized(**file, "blk.0.ffn_up.weight"));
    EXPECT_EQ((*file)->FindTensor("blk.0.ffn_up.weight"), nullptr);
    EXPECT_EQ((*file)
                  ->FindTensor(format == WeightFormat::kInt8 ? "blk.0.ffn_up.weight.q8"
                                                             : "blk.0.ffn_up.weight.q4")
                  ->type,
              common::GgmlType::kI8);
    absl::StatusOr<kernels::cpu::QuantizedMatrix> part =
        ReadQuantizedRows(**file, "blk.0.ffn_up.weight", rows, cols, 16, 9);
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_EQ(part->group_size, 64);
    EXPECT_TRUE(std::equal(part->q.begin(), part->q.end(), q.q.begin() + 16 * cols));
    EXPECT_TRUE(std::equal(part->scales.begin(), part->scales.end(), q.scales.begin() + 16 * 2));
    // The wrong expected shape names the tensor.
    EXPECT_THAT(
        ReadQuantizedRows(**file, "blk.0.ffn_up.weight", rows, 256, 0, rows).status().message(),
        HasSubstr("blk.0.ffn_up.weight"));
  }
}

class ModelQuantizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = common::GgufFile::Open(common::testing::ModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    gguf_ = gguf->release();
  }
  static void TearDownTestSuite() {
    delete gguf_;
    gguf_ = nullptr;
  }

  static std::unique_ptr<common::GgufFile> Quantize(
      const QuantizerOptions& options, const std::vector<std::vector<int32_t>>& calibration = {},
      QuantizerReport* report = nullptr) {
    common::GgufWriter writer;
    absl::StatusOr<QuantizerReport> result = QuantizeModel(*gguf_, options, calibration, writer);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return nullptr;
    if (report != nullptr) *report = *result;
    absl::StatusOr<std::string> image = writer.Serialize();
    EXPECT_TRUE(image.ok()) << image.status();
    auto file = common::GgufFile::FromBytes(*std::move(image));
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? *std::move(file) : nullptr;
  }

  static common::GgufFile* gguf_;
};

common::GgufFile* ModelQuantizerTest::gguf_ = nullptr;

TEST_F(ModelQuantizerTest, F32CopyHoldsTheSourceValuesExactly) {
  QuantizerOptions options;
  options.format = QuantizeFormat::kF32;
  std::unique_ptr<common::GgufFile> f32 = Quantize(options);
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->tensors().size(), gguf_->tensors().size());
  const common::GgufTensorInfo* down = f32->FindTensor("blk.3.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, common::GgmlType::kF32);
  EXPECT_EQ(f32->FindTensor("token_embd.weight")->type, common::GgmlType::kF32);
  EXPECT_EQ(f32->GetInt("general.file_type").value(), 0);
  EXPECT_EQ(f32->DequantizeTensor(*down).value(),
            gguf_->DequantizeTensor(*gguf_->FindTensor("blk.3.ffn_down.weight")).value());
}

// --format bf16: every matrix rounded to nearest even, loaded as BF16 without another change.
TEST_F(ModelQuantizerTest, Bf16CopyHoldsTheSourceValuesRoundedAndLoadsAsBf16) {
  QuantizerOptions options;
  options.format = QuantizeFormat::kBf16;
  std::unique_ptr<common::GgufFile> bf16 = Quantize(options);
  ASSERT_NE(bf16, nullptr);
  EXPECT_EQ(bf16->GetInt("general.file_type").value(), 32);
  EXPECT_EQ(bf16->FindTensor("token_embd.weight")->type, common::GgmlType::kBF16);
  const common::GgufTensorInfo* down = bf16->FindTensor("blk.3.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, common::GgmlType::kBF16);
  const std::vector<float> source =
      gguf_->DequantizeTensor(*gguf_->FindTensor("blk.3.ffn_down.weight")).value();
  const std::vector<float> got = bf16->DequantizeTensor(*down).value();
  ASSERT_EQ(got.size(), source.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], kernels::cpu::RoundToBf16(source[i])) << i;
  }
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadModelWeights(*bf16);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->layers[3].down.format, WeightFormat::kBf16);
  EXPECT_EQ((*weights)->token_embedding.format, WeightFormat::kBf16);
  EXPECT_EQ(Unpack((*weights)->layers[3].down, 0, 576), got);
  EXPECT_THAT((*weights)->load_log, HasSubstr("BF16 -> BF16 (lossless)"));
}

TEST_F(ModelQuantizerTest, Int8CopiesMetadataAndLoadsWithoutLoss) {
  QuantizerOptions options;
  options.format = QuantizeFormat::kInt8;
  std::unique_ptr<common::GgufFile> int8 = Quantize(options);
  ASSERT_NE(int8, nullptr);
  // Metadata verbatim (tokenizer, template, hyper-parameters), file type replaced.
  for (const auto& [key, value] : gguf_->metadata()) {
    if (key == "general.file_type") continue;
    const common::GgufValue* copy = int8->Find(key);
    ASSERT_NE(copy, nullptr) << key;
    EXPECT_EQ(copy->type(), value.type()) << key;
    EXPECT_TRUE(SameValue(*copy, value)) << key;
  }
  EXPECT_EQ(int8->Find("general.file_type"), nullptr);
  EXPECT_EQ(int8->GetString("loom.quantization.format").value(), "int8");
  EXPECT_EQ(int8->GetString("loom.quantization.method").value(), "rtn");
  // Embedding and norms as they were.
  EXPECT_EQ(int8->FindTensor("token_embd.weight")->type, common::GgmlType::kQ8_0);
  EXPECT_EQ(int8->FindTensor("blk.0.attn_norm.weight")->type, common::GgmlType::kF32);

  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadModelWeights(*int8);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const LayerWeights& layer = (*weights)->layers[2];
  EXPECT_EQ(layer.qkv.format, WeightFormat::kInt8);
  EXPECT_EQ(layer.qkv.group_size, 576);  // per output channel
  EXPECT_EQ(layer.down.group_size, 1536);
  // The loaded Q rows are exactly RTN of the source's values.
  const std::vector<float> source =
      gguf_->DequantizeTensor(*gguf_->FindTensor("blk.2.attn_q.weight")).value();
  const kernels::cpu::QuantizedMatrix want =
      kernels::cpu::QuantizeRtn(source.data(), 576, 576, WeightFormat::kInt8, 576).value();
  std::vector<float> want_values(576 * 576);
  kernels::cpu::DequantizeMatrix(want, want_values.data());
  EXPECT_EQ(Unpack(layer.qkv, 0, 576), want_values);
  // INT8 per channel stays close to the source (a weight is off by at most half a step).
  float max_error = 0;
  for (size_t i = 0; i < source.size(); ++i)
    max_error = std::max(max_error, std::fabs(source[i] - want_values[i]));
  EXPECT_LT(max_error, 0.02f);
}

TEST_F(ModelQuantizerTest, Int4UsesTheGroupThatDividesEachMatrix) {
  QuantizerOptions options;
  options.format = QuantizeFormat::kInt4;
  options.group_size = 128;
  std::unique_ptr<common::GgufFile> int4 = Quantize(options);
  ASSERT_NE(int4, nullptr);
  EXPECT_EQ(int4->FindTensor("blk.0.ffn_down.weight.scale")->shape,
            (std::vector<uint64_t>{1536 / 128, 576}));
  EXPECT_EQ(int4->FindTensor("blk.0.attn_q.weight.scale")->shape,
            (std::vector<uint64_t>{576 / 64, 576}));
  EXPECT_EQ(int4->FindTensor("blk.0.attn_q.weight.q4")->shape, (std::vector<uint64_t>{288, 576}));
  EXPECT_EQ(int4->FindTensor("blk.0.attn_q.weight"), nullptr);
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadModelWeights(*int4);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->layers[0].gate_up.format, WeightFormat::kInt4);
  EXPECT_EQ((*weights)->layers[0].down.group_size, 128);
  EXPECT_THAT((*weights)->load_log, HasSubstr("Loom INT4 g64"));

  // Re-quantizing a Loom file to F32 reads the Loom tensors back and drops the companions.
  common::GgufWriter writer;
  QuantizerOptions f32_options;
  f32_options.format = QuantizeFormat::kF32;
  ASSERT_TRUE(QuantizeModel(*int4, f32_options, {}, writer).ok());
  auto f32 = common::GgufFile::FromBytes(writer.Serialize().value());
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ((*f32)->FindTensor("blk.0.attn_q.weight.scale"), nullptr);
  EXPECT_EQ((*f32)->FindTensor("blk.0.attn_q.weight.q4"), nullptr);
  EXPECT_EQ((*f32)->tensors().size(), gguf_->tensors().size());
  EXPECT_EQ((*f32)->Find("loom.quantization.format"), nullptr);
  EXPECT_EQ((*f32)->FindTensor("blk.0.attn_q.weight")->shape, (std::vector<uint64_t>{576, 576}));
}

TEST_F(ModelQuantizerTest, RefusesAwqWithoutCalibrationOrForFloatFormats) {
  QuantizerOptions options;
  options.method = QuantizeMethod::kAwq;
  common::GgufWriter writer;
  EXPECT_THAT(QuantizeModel(*gguf_, options, {}, writer).status().message(),
              HasSubstr("calibration"));
  options.format = QuantizeFormat::kF16;
  EXPECT_THAT(QuantizeModel(*gguf_, options, {{1, 2, 3}}, writer).status().message(),
              HasSubstr("int8 and int4 formats only"));
}

TEST_F(ModelQuantizerTest, AwqFoldsItsScalesIntoAPlainModel) {
  auto tokenizer = common::Tokenizer::FromGguf(*gguf_);
  ASSERT_TRUE(tokenizer.ok());
  const std::vector<int32_t> text =
      (*tokenizer)
          ->Encode(
              "The cache keeps the keys and the values of every token that the model has already "
              "seen, so a decode step only computes the newest token. Quantization stores the "
              "weights in fewer bits; activation-aware scaling protects the channels whose inputs "
              "are large, because their rounding errors are multiplied by those inputs.",
              false, false);
  const std::vector<std::vector<int32_t>> calibration = CalibrationSequences(text, 2, 24);
  ASSERT_EQ(calibration.size(), 2u);
  QuantizerOptions options;
  options.format = QuantizeFormat::kInt4;
  options.group_size = 128;
  options.method = QuantizeMethod::kAwq;
  options.awq_grid = 4;  // alphas 0, 0.25, 0.5, 0.75; clip ratios 1, 0.75, 0.5
  options.awq_max_samples = 48;
  QuantizerReport report;
  std::unique_ptr<common::GgufFile> awq = Quantize(options, calibration, &report);
  ASSERT_NE(awq, nullptr);
  ASSERT_EQ(report.awq.size(), 30u * 3);
  double error = 0, rtn_error = 0;
  int scaled = 0;
  for (const AwqLayerReport& layer : report.awq) {
    EXPECT_LE(layer.error, layer.rtn_error) << layer.layer << " " << layer.group;
    error += layer.error;
    rtn_error += layer.rtn_error;
    scaled += layer.alpha > 0;
  }
  EXPECT_LT(error, rtn_error);
  EXPECT_GT(scaled, 0);
  double clipped = 0, unclipped = 0;
  for (const AwqLayerReport& layer : report.awq) {
    EXPECT_LE(layer.clipped_error, layer.unclipped_error) << layer.layer << " " << layer.group;
    clipped += layer.clipped_error;
    unclipped += layer.unclipped_error;
  }
  EXPECT_LT(clipped, unclipped);
  EXPECT_TRUE(awq->GetBool("loom.quantization.awq.clip").value());
  // The norms changed (the scales are folded into them) and the model still loads.
  EXPECT_NE(awq->DequantizeTensor(*awq->FindTensor("blk.5.attn_norm.weight")).value(),
            gguf_->DequantizeTensor(*gguf_->FindTensor("blk.5.attn_norm.weight")).value());
  EXPECT_EQ(awq->GetString("loom.quantization.method").value(), "awq");
  ASSERT_TRUE(LoadModelWeights(*awq).ok());
}

class QuantizedTensorParallelTest : public ModelQuantizerTest,
                                    public testing::WithParamInterface<QuantizeFormat> {};

// Row-parallel layers slice a quantized matrix by columns (O at 320 + 256 columns for
// 5 + 4 heads, down at 768 + 768): both ranks together compute what one rank does.
TEST_P(QuantizedTensorParallelTest, TwoRanksMatchOne) {
  QuantizerOptions options;
  options.format = GetParam();
  std::unique_ptr<common::GgufFile> quantized = Quantize(options);
  ASSERT_NE(quantized, nullptr);
  auto tokenizer = common::Tokenizer::FromGguf(*gguf_);
  ASSERT_TRUE(tokenizer.ok());
  const std::vector<int32_t> prompt = (*tokenizer)->Encode("The capital of France is", true, true);
  constexpr int kSteps = 6;
  CpuForwardPassOptions pass_options;
  pass_options.num_threads = 1;
  pass_options.num_kv_blocks = 8;
  pass_options.kv_dtype = kernels::cpu::KvDtype::kF32;
  auto whole = CpuForwardPass::Create(*quantized, pass_options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<test_util::EngineTrace> want =
      test_util::GreedyThroughEngine(*std::move(whole), **tokenizer, prompt, kSteps);
  ASSERT_TRUE(want.ok()) << want.status();

  constexpr int kRanks = 2;
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<absl::StatusOr<test_util::EngineTrace>> got(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto communicator = GlooCommunicator::Connect(store, rank, kRanks, {});
      if (!communicator.ok()) {
        got[rank] = communicator.status();
        return;
      }
      CpuForwardPassOptions shard = pass_options;
      shard.tp_rank = rank;
      shard.tp_size = kRanks;
      shard.communicator = communicator->get();
      auto forward_pass = CpuForwardPass::Create(*quantized, shard);
      if (!forward_pass.ok()) {
        got[rank] = forward_pass.status();
        return;
      }
      got[rank] =
          test_util::GreedyThroughEngine(*std::move(forward_pass), **tokenizer, prompt, kSteps);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_TRUE(got[rank].ok()) << "rank " << rank << ": " << got[rank].status();
    EXPECT_EQ(got[rank]->tokens, want->tokens) << "rank " << rank;
    ASSERT_EQ(got[rank]->logprobs.size(), want->logprobs.size());
    double max_diff = 0.0;
    for (size_t i = 0; i < want->logprobs.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(got[rank]->logprobs[i] - want->logprobs[i]));
    }
    // Float rounding only: the logits' 1e-3 of their ~25 largest magnitude, twice.
    EXPECT_LT(max_diff, 0.05) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedTensorParallelTest,
                         testing::Values(QuantizeFormat::kInt8, QuantizeFormat::kInt4));

TEST(CalibrationSequencesTest, SpreadsDisjointSequencesOverTheText) {
  std::vector<int32_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = i;
  const auto sequences = CalibrationSequences(tokens, 4, 100);
  ASSERT_EQ(sequences.size(), 4u);
  EXPECT_EQ(sequences[0].front(), 0);
  EXPECT_EQ(sequences[3].back(), 999);
  for (size_t i = 0; i < sequences.size(); ++i) {
    ASSERT_EQ(sequences[i].size(), 100u);
    if (i > 0) {
      EXPECT_GT(sequences[i].front(), sequences[i - 1].back());
    }
  }
  EXPECT_EQ(CalibrationSequences(tokens, 50, 100).size(), 10u);  // text too short for 50
  EXPECT_EQ(CalibrationSequences({1, 2, 3}, 5, 100).size(), 1u);
  EXPECT_TRUE(CalibrationSequences({}, 5, 100).empty());
}

}  // namespace
}  // namespace loom::quant
