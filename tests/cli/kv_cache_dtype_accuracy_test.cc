// The 8-bit KV cache types (--kv-dtype int8 | fp8_e4m3, kernels/cpu/kv_dtype.h) against the
// F16 cache on the default model (SmolLM2-135M-Instruct, Q4_1), the accuracy bars:
// * perplexity of a fixed text (the Python tutorial's "Data Structures" page from Debian's
//   python3-doc, installed by scripts/install-deps.sh; its first 2,048 tokens as 4 disjoint
//   windows of 512, every row's logits): INT8 within +0.5%, FP8 within +1% of F16's;
// * mean KL divergence KL(F16 || 8-bit) over those rows <= 0.01 nats;
// * greedy agreement on 50 prompts (README lines) x 128 tokens >= 95%: F16's greedy
//   continuation is fed back (teacher forcing) and at each of the 128 steps the 8-bit
//   cache's argmax must be F16's token. Free-running continuations are not compared: on a
//   135M model near-ties are common, and once two greedy sequences part, every later
//   position compares unrelated text, so they measure where the first near-tie falls more
//   than the cache's accuracy (measured before rotation: 54% of INT8's and 38% of FP8's
//   tokens came before the first difference from F16's; 20 and 13 of 50 sequences were
//   identical).
// Measured when written (perplexity ratio / mean KL, AVX-512 and AVX2 alike): INT8 0.9993 /
// 0.00023, FP8 1.0005 / 0.0045; teacher-forced greedy agreement INT8 99.6%, FP8 98.9%.
// Before K and V were rotated (kv_dtype.h's RotatesKv), FP8 was 1.0092 / 0.0067 here and
// 1.0133 on AVX2, over the bar; other tutorial pages give FP8 1.006-1.009.
// BF16 KV (--kv-dtype bf16: 8 mantissa bits to F16's 11, F32's range) is held to the same
// test with bars of +0.2% and 0.0005 nats; measured 1.0003 / 0.00004 (AVX-512).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/local_engine.h"
#include "common/formats/gguf_file.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/test_paths.h"
#include "worker/cpu_forward_pass.h"
#include "worker/model_step_backend.h"
#include "worker/step_batch.h"

namespace loom::cli {
namespace {

using kernels::cpu::KvDtype;

constexpr int64_t kBlockSize = 16;
constexpr int64_t kWindow = 512;
constexpr int64_t kWindows = 4;
constexpr int kPrompts = 50;
constexpr int kGenerated = 128;

class KvCacheDtypeAccuracyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = common::GgufFile::Open(test_env::ModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    gguf_ = gguf->release();
    auto tokenizer = common::Tokenizer::FromGguf(*gguf_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = tokenizer->release();
    readme_ = new std::string(ReadFile(test_env::SourceDir() + "/README.md"));
    text_ = new std::string(ReadFile(kTextPath));
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream file(path);
    EXPECT_TRUE(file.good()) << path << " is missing (python3-doc: scripts/install-deps.sh)";
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  }
  static void TearDownTestSuite() {
    delete readme_;
    delete text_;
    delete tokenizer_;
    delete gguf_;
  }

  static std::unique_ptr<worker::CpuForwardPass> NewForwardPass(KvDtype dtype, int64_t num_blocks) {
    worker::CpuForwardPassOptions options;
    options.num_kv_blocks = num_blocks;
    options.block_size = kBlockSize;
    options.kv_dtype = dtype;
    auto forward_pass = worker::CpuForwardPass::Create(*gguf_, options);
    EXPECT_TRUE(forward_pass.ok()) << forward_pass.status();
    return forward_pass.ok() ? *std::move(forward_pass) : nullptr;
  }

  // The logits of every row of `tokens`, prefilled from position 0.
  static std::vector<float> Logits(worker::CpuForwardPass& forward_pass,
                                   const std::vector<int32_t>& tokens) {
    std::vector<int32_t> blocks;
    const int32_t num_blocks = static_cast<int32_t>((tokens.size() + kBlockSize - 1) / kBlockSize);
    for (int32_t b = 0; b < num_blocks; ++b) blocks.push_back(b);
    worker::StepBatch batch;
    EXPECT_TRUE(worker::AppendSequence(batch, tokens, 0, blocks, kBlockSize, false).ok());
    for (int32_t row = 0; row < static_cast<int32_t>(tokens.size()); ++row) {
      batch.sample_rows.push_back(row);
    }
    std::vector<float> logits;
    const absl::Status status = forward_pass.Step(batch, logits);
    EXPECT_TRUE(status.ok()) << status;
    return logits;
  }

  // Log-softmax of every row of one window.
  static std::vector<std::vector<float>> WindowLogProbs(worker::CpuForwardPass& forward_pass,
                                                        const std::vector<int32_t>& tokens) {
    const std::vector<float> logits = Logits(forward_pass, tokens);
    const size_t vocab = logits.size() / tokens.size();
    std::vector<std::vector<float>> rows(tokens.size());
    for (size_t r = 0; r < tokens.size(); ++r) {
      const float* row = logits.data() + r * vocab;
      const float top = *std::max_element(row, row + vocab);
      double sum = 0;
      for (size_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i] - top));
      const float log_sum = top + static_cast<float>(std::log(sum));
      rows[r].resize(vocab);
      for (size_t i = 0; i < vocab; ++i) rows[r][i] = row[i] - log_sum;
    }
    return rows;
  }

  static common::GgufFile* gguf_;
  static common::Tokenizer* tokenizer_;
  static std::string* readme_;
  static std::string* text_;
  static constexpr const char* kTextPath =
      "/usr/share/doc/python3.11/html/_sources/tutorial/datastructures.rst.txt";
};

common::GgufFile* KvCacheDtypeAccuracyTest::gguf_ = nullptr;
common::Tokenizer* KvCacheDtypeAccuracyTest::tokenizer_ = nullptr;
std::string* KvCacheDtypeAccuracyTest::readme_ = nullptr;
std::string* KvCacheDtypeAccuracyTest::text_ = nullptr;

TEST_F(KvCacheDtypeAccuracyTest, PerplexityAndKlDivergenceStayWithinTheBars) {
  const std::vector<int32_t> tokens = tokenizer_->Encode(*text_, false, false);
  ASSERT_GE(static_cast<int64_t>(tokens.size()), kWindow * kWindows);
  auto f16 = NewForwardPass(KvDtype::kF16, kWindow / kBlockSize);
  for (const auto& [dtype, max_ratio, max_kl] :
       std::vector<std::tuple<KvDtype, double, double>>{{KvDtype::kInt8, 1.005, 0.01},
                                                        {KvDtype::kFp8E4m3, 1.01, 0.01},
                                                        {KvDtype::kBf16, 1.002, 0.0005}}) {
    auto quantized = NewForwardPass(dtype, kWindow / kBlockSize);
    double nll_f16 = 0, nll_q = 0, kl = 0;
    int64_t scored = 0;
    for (int64_t w = 0; w < kWindows; ++w) {
      const std::vector<int32_t> window(tokens.begin() + w * kWindow,
                                        tokens.begin() + (w + 1) * kWindow);
      const auto p = WindowLogProbs(*f16, window);
      const auto q = WindowLogProbs(*quantized, window);
      for (int64_t r = 0; r + 1 < kWindow; ++r) {
        nll_f16 -= p[r][window[r + 1]];
        nll_q -= q[r][window[r + 1]];
        double row_kl = 0;
        for (size_t i = 0; i < p[r].size(); ++i) {
          row_kl += std::exp(static_cast<double>(p[r][i])) * (p[r][i] - q[r][i]);
        }
        kl += row_kl;
        ++scored;
      }
    }
    const double ratio = std::exp((nll_q - nll_f16) / scored);
    const double mean_kl = kl / scored;
    std::printf("kv %s: perplexity %.4f vs f16 %.4f (ratio %.4f), mean KL %.5f over %lld rows\n",
                kernels::cpu::KvDtypeName(dtype), std::exp(nll_q / scored),
                std::exp(nll_f16 / scored), ratio, mean_kl, static_cast<long long>(scored));
    EXPECT_LE(ratio, max_ratio) << kernels::cpu::KvDtypeName(dtype);
    EXPECT_LE(mean_kl, max_kl) << kernels::cpu::KvDtypeName(dtype);
    EXPECT_GT(mean_kl, 0.0) << "the cache type changed nothing: is it used at all?";
  }
}

TEST_F(KvCacheDtypeAccuracyTest, GreedyDecodingAgreesWithF16) {
  // 50 prompts: README lines of some length, each its own request.
  std::vector<std::vector<int32_t>> prompts;
  std::istringstream lines(*readme_);
  for (std::string line;
       std::getline(lines, line) && static_cast<int>(prompts.size()) < kPrompts;) {
    if (line.size() < 60) continue;
    prompts.push_back(tokenizer_->Encode(line, false, false));
  }
  ASSERT_EQ(static_cast<int>(prompts.size()), kPrompts);
  std::vector<EngineRequest> requests;
  int64_t blocks = 0;
  for (const auto& prompt : prompts) {
    EngineRequest request;
    request.prompt_ids = prompt;
    request.max_tokens = kGenerated;
    request.sampling.temperature = 0.0f;
    request.ignore_eos = true;
    requests.push_back(request);
    blocks += (static_cast<int64_t>(prompt.size()) + kGenerated + kBlockSize) / kBlockSize;
  }
  std::vector<std::vector<int32_t>> reference;
  int64_t longest = 0;
  {
    worker::ModelStepBackend backend(NewForwardPass(KvDtype::kF16, blocks + 8));
    LocalEngine engine(backend, *tokenizer_);
    auto results = engine.Generate(requests);
    ASSERT_TRUE(results.ok()) << results.status();
    for (size_t i = 0; i < results->size(); ++i) {
      reference.push_back((*results)[i].token_ids());
      ASSERT_EQ(static_cast<int>(reference.back().size()), kGenerated);
      longest = std::max<int64_t>(longest, prompts[i].size() + reference.back().size());
    }
  }
  for (KvDtype dtype : {KvDtype::kInt8, KvDtype::kFp8E4m3}) {
    // Teacher-forced: the prompt and F16's continuation in one prefill, every row's argmax.
    auto forward_pass = NewForwardPass(dtype, (longest + kBlockSize - 1) / kBlockSize);
    int64_t same_argmax = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> tokens = prompts[i];
      tokens.insert(tokens.end(), reference[i].begin(), reference[i].end() - 1);
      const std::vector<float> logits = Logits(*forward_pass, tokens);
      const size_t vocab = logits.size() / tokens.size();
      for (size_t t = 0; t < reference[i].size(); ++t) {
        const float* row = logits.data() + (prompts[i].size() - 1 + t) * vocab;
        same_argmax += std::max_element(row, row + vocab) - row == reference[i][t];
      }
    }
    const double forced = static_cast<double>(same_argmax) / (kPrompts * kGenerated);
    std::printf("kv %s: greedy agreement %.4f teacher-forced (%lld of %d steps)\n",
                kernels::cpu::KvDtypeName(dtype), forced, static_cast<long long>(same_argmax),
                kPrompts * kGenerated);
    EXPECT_GE(forced, 0.95) << kernels::cpu::KvDtypeName(dtype);
  }
}

}  // namespace
}  // namespace loom::cli
