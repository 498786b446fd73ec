#include "cli/local_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/worker/tiny_model.h"
#include "worker/cpu_forward_pass.h"
#include "worker/model_step_backend.h"
#include "worker/noop_backend.h"
#include "worker/step_batch.h"

namespace loom::cli {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBlockSize = 16;

// A tiny random llama model (its tokenizer spells token i "t<i>"), on the CPU forward pass.
class LocalEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    worker::testing::TinyModelSpec spec;
    spec.vocab = 96;
    spec.context = 256;
    gguf_ = worker::testing::TinyModel(spec);
    auto tokenizer = common::Tokenizer::FromGguf(*gguf_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  std::unique_ptr<worker::CpuForwardPass> NewForwardPass(int64_t num_blocks) const {
    worker::CpuForwardPassOptions options;
    options.num_threads = 1;
    options.num_kv_blocks = num_blocks;
    options.block_size = kBlockSize;
    options.kv_dtype = kernels::cpu::KvDtype::kF32;
    auto forward_pass = worker::CpuForwardPass::Create(*gguf_, options);
    EXPECT_TRUE(forward_pass.ok()) << forward_pass.status();
    return forward_pass.ok() ? *std::move(forward_pass) : nullptr;
  }

  std::unique_ptr<worker::ModelStepBackend> Backend(int64_t num_blocks) const {
    return std::make_unique<worker::ModelStepBackend>(NewForwardPass(num_blocks));
  }

  // Prompt `i`: `length` token ids derived from i.
  static std::vector<int32_t> Prompt(int i, int length) {
    std::vector<int32_t> ids;
    for (int t = 0; t < length; ++t) ids.push_back((i * 37 + t * 11 + t * t) % 96);
    return ids;
  }

  static EngineRequest Request(std::vector<int32_t> prompt, int max_tokens, float temperature,
                               uint64_t seed) {
    EngineRequest request;
    request.prompt_ids = std::move(prompt);
    request.max_tokens = max_tokens;
    request.sampling.temperature = temperature;
    request.sampling.seed = seed;
    request.sampling.num_logprobs = 2;
    request.ignore_eos = true;
    return request;
  }

  // A 3-layer tiny model (vocabulary 96, context 256) with an 8-token window on the layers
  // `local` marks.
  static worker::testing::TinyModelSpec WindowedModel(std::vector<bool> local) {
    worker::testing::TinyModelSpec spec;
    spec.vocab = 96;
    spec.context = 256;
    spec.layers = 3;
    spec.sliding_window = 8;
    spec.sliding_layers = std::move(local);
    return spec;
  }

  // The CPU backend over `spec`'s tiny model: one thread, F32 KV, `num_blocks` blocks.
  static std::unique_ptr<worker::ModelStepBackend> TinyBackend(
      const worker::testing::TinyModelSpec& spec, int64_t num_blocks) {
    std::unique_ptr<common::GgufFile> gguf = worker::testing::TinyModel(spec);
    worker::CpuForwardPassOptions options;
    options.num_threads = 1;
    options.num_kv_blocks = num_blocks;
    options.block_size = kBlockSize;
    options.kv_dtype = kernels::cpu::KvDtype::kF32;
    auto forward_pass = worker::CpuForwardPass::Create(*gguf, options);
    EXPECT_TRUE(forward_pass.ok()) << forward_pass.status();
    return std::make_unique<worker::ModelStepBackend>(*std::move(forward_pass));
  }

  // Expects every block free again and no sequence left on the executor.
  static void ExpectNothingHeld(const LocalEngine& engine) {
    EXPECT_EQ(engine.block_manager().num_free(), engine.block_manager().num_blocks());
    EXPECT_EQ(engine.executor().num_sequences(), 0);
  }

  std::unique_ptr<common::GgufFile> gguf_;
  std::unique_ptr<common::Tokenizer> tokenizer_;
};

TEST_F(LocalEngineTest, BatchedEqualsSequentialAndFreesEveryBlock) {
  auto backend = Backend(64);
  LocalEngineOptions options;
  options.max_num_batched_tokens = 48;  // prompts of 20-60 tokens prefill in chunks
  LocalEngine engine(*backend, *tokenizer_, options);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(Request(Prompt(i, 20 + 8 * i), 12 + i, i % 2 == 0 ? 0.0f : 0.9f, 7 + i));
  }
  auto batched = engine.Generate(requests);
  ASSERT_TRUE(batched.ok()) << batched.status();
  ExpectNothingHeld(engine);
  auto sequential = engine.Generate(requests, nullptr, /*batched=*/false);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  ExpectNothingHeld(engine);
  for (size_t i = 0; i < requests.size(); ++i) {
    const EngineResult& a = (*batched)[i];
    const EngineResult& b = (*sequential)[i];
    ASSERT_EQ(a.outputs.size(), static_cast<size_t>(requests[i].max_tokens)) << i;
    EXPECT_EQ(a.token_ids(), b.token_ids()) << "request " << i;
    EXPECT_EQ(a.finish_reason, loom::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(a.text, b.text);
    for (size_t t = 0; t < a.outputs.size(); ++t) {
      // Batch invariance: the same logits whatever else shares the step.
      EXPECT_EQ(a.outputs[t].logprob(), b.outputs[t].logprob()) << i << " " << t;
      EXPECT_LE(a.outputs[t].logprob(), 0.0f);
    }
    EXPECT_GT(a.prefill_seconds, 0.0);
    EXPECT_GT(a.decode_seconds, 0.0);
  }
}

TEST_F(LocalEngineTest, StreamsEveryTokenAndItsText) {
  auto backend = Backend(16);
  LocalEngine engine(*backend, *tokenizer_);
  std::vector<EngineRequest> requests = {Request(Prompt(1, 10), 9, 0.0f, 0),
                                         Request(Prompt(2, 14), 5, 0.0f, 0)};
  std::vector<std::string> streamed(2);
  std::vector<std::vector<int32_t>> ids(2);
  std::vector<int> finished(2, 0);
  auto results = engine.Generate(requests, [&](size_t index, const LocalEngine::TokenEvent& event) {
    streamed[index] += event.text;
    ids[index].push_back(event.output.token_id());
    finished[index] += event.finished ? 1 : 0;
  });
  ASSERT_TRUE(results.ok()) << results.status();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(ids[i], (*results)[i].token_ids());
    EXPECT_EQ(streamed[i], (*results)[i].text);
    EXPECT_FALSE((*results)[i].text.empty());
    EXPECT_EQ(finished[i], 1);
  }
}

TEST_F(LocalEngineTest, StopStringsAndStopTokensEndTheOutput) {
  auto backend = Backend(16);
  LocalEngine engine(*backend, *tokenizer_);
  const EngineRequest plain = Request(Prompt(3, 12), 16, 0.0f, 0);
  auto free_run = engine.Generate({plain});
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  const EngineResult& reference = (*free_run)[0];
  ASSERT_EQ(reference.outputs.size(), 16u);

  // The text of the 6th token as a stop string: the output ends before its first match,
  // which the text never contains.
  const std::string stop = std::string(tokenizer_->TokenText(reference.outputs[5].token_id()));
  EngineRequest with_stop = plain;
  with_stop.stop = {stop};
  auto stopped = engine.Generate({with_stop});
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ((*stopped)[0].finish_reason, loom::v1::FINISH_REASON_STOP);
  EXPECT_EQ((*stopped)[0].text, reference.text.substr(0, reference.text.find(stop)));
  EXPECT_LE((*stopped)[0].outputs.size(), 6u);

  // A stop token: generation ends with it, its text left out.
  EngineRequest with_stop_token = plain;
  with_stop_token.stop_token_ids = {reference.outputs[7].token_id()};
  auto stopped_by_token = engine.Generate({with_stop_token});
  ASSERT_TRUE(stopped_by_token.ok()) << stopped_by_token.status();
  const std::vector<int32_t> ids = (*stopped_by_token)[0].token_ids();
  EXPECT_EQ((*stopped_by_token)[0].finish_reason, loom::v1::FINISH_REASON_STOP);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), reference.outputs[7].token_id());
  const std::vector<int32_t> reference_ids = reference.token_ids();
  EXPECT_EQ(ids, std::vector<int32_t>(reference_ids.begin(), reference_ids.begin() + ids.size()));
  ExpectNothingHeld(engine);
}

TEST_F(LocalEngineTest, ARequestLargerThanThePoolIsResourceExhausted) {
  auto backend = Backend(4);  // 64 tokens
  LocalEngine engine(*backend, *tokenizer_);
  auto too_big = engine.Generate({Request(Prompt(1, 10), 4, 0.0f, 0),
                                  Request(Prompt(2, 40), 30, 0.0f, 0)});
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_THAT(too_big.status().message(), HasSubstr("request 1"));
  EXPECT_THAT(too_big.status().message(), HasSubstr("needs 5 KV blocks"));
  EXPECT_EQ(engine.num_steps(), 0);  // nothing ran
  ExpectNothingHeld(engine);
}

TEST_F(LocalEngineTest, RequestsThatOverfillThePoolTogetherWaitOrArePreempted) {
  // Each fits alone (3 blocks); four together need 12 of 6: the scheduler queues and
  // preempts, and the tokens are those of running them one by one.
  auto backend = Backend(6);
  LocalEngine engine(*backend, *tokenizer_);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(Request(Prompt(i, 24), 20, 0.0f, 0));
  auto batched = engine.Generate(requests);
  ASSERT_TRUE(batched.ok()) << batched.status();
  ExpectNothingHeld(engine);
  auto sequential = engine.Generate(requests, nullptr, /*batched=*/false);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*batched)[i].token_ids(), (*sequential)[i].token_ids()) << i;
  }
  ExpectNothingHeld(engine);
}

TEST_F(LocalEngineTest, BadRequestsAreRefusedBeforeAnythingRuns) {
  auto backend = Backend(16);
  LocalEngine engine(*backend, *tokenizer_);
  const EngineRequest good = Request(Prompt(1, 8), 4, 0.0f, 0);
  auto expect_refused = [&](EngineRequest bad, const std::string& why) {
    auto result = engine.Generate({good, std::move(bad)});
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
    EXPECT_THAT(result.status().message(), HasSubstr("request 1: "));
    EXPECT_THAT(result.status().message(), HasSubstr(why));
  };
  EngineRequest empty = good;
  empty.prompt_ids.clear();
  expect_refused(empty, "empty");
  EngineRequest outside = good;
  outside.prompt_ids[2] = 96;
  expect_refused(outside, "outside the vocabulary");
  EngineRequest bad_top_p = good;
  bad_top_p.sampling.top_p = 0.0f;
  expect_refused(bad_top_p, "top_p");
  EngineRequest negative = good;
  negative.max_tokens = -1;
  expect_refused(negative, "max_tokens");
  EngineRequest too_long = good;
  too_long.max_tokens = 250;
  expect_refused(too_long, "context length");
  EngineRequest bad_score = good;
  bad_score.score_prompt_from = 8;
  expect_refused(bad_score, "score_prompt_from");
  EXPECT_EQ(engine.num_steps(), 0);
  ExpectNothingHeld(engine);
  // The engine still serves.
  auto result = engine.Generate({good});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ((*result)[0].outputs.size(), 4u);
}

TEST_F(LocalEngineTest, PromptScoresAreTheForwardPassLogSoftmax) {
  const std::vector<int32_t> prompt = Prompt(5, 40);
  // The reference: one step over the whole prompt, every position's logits.
  std::unique_ptr<worker::CpuForwardPass> reference = NewForwardPass(4);
  worker::StepBatch batch;
  ASSERT_TRUE(worker::AppendSequence(batch, prompt, 0, {0, 1, 2}, kBlockSize, false).ok());
  for (int32_t p = 0; p + 1 < static_cast<int32_t>(prompt.size()); ++p) batch.sample_rows.push_back(p);
  std::vector<float> logits;
  ASSERT_TRUE(reference->Step(batch, logits).ok());
  const int64_t vocab = reference->config().vocab_size;

  // Chunks of 16 tokens: scored positions fall in three steps; scoring from token 10.
  auto backend = Backend(8);
  LocalEngineOptions options;
  options.max_num_batched_tokens = 16;
  LocalEngine engine(*backend, *tokenizer_, options);
  EngineRequest request = Request(prompt, 2, 0.0f, 0);
  request.score_prompt_from = 10;
  auto result = engine.Generate({request});
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<double>& scored = (*result)[0].prompt_logprobs;
  ASSERT_EQ(scored.size(), prompt.size() - 10);
  for (size_t i = 0; i < scored.size(); ++i) {
    const size_t position = 10 + i - 1;  // the row that predicts prompt[10 + i]
    const float* row = logits.data() + position * vocab;
    double max = row[0];
    for (int64_t v = 1; v < vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
    EXPECT_NEAR(scored[i], -(max + std::log(sum) - row[prompt[10 + i]]), 1e-4) << i;
    EXPECT_LT(scored[i], 0.0);
  }
  ExpectNothingHeld(engine);

  // The prefix cache never serves a position a scoring request must compute.
  LocalEngine cached(*backend, *tokenizer_);
  ASSERT_TRUE(cached.Generate({Request(prompt, 1, 0.0f, 0)}).ok());
  auto rescored = cached.Generate({request});
  ASSERT_TRUE(rescored.ok()) << rescored.status();
  EXPECT_LE((*rescored)[0].cached_prompt_tokens, 9);
  ASSERT_EQ((*rescored)[0].prompt_logprobs.size(), scored.size());
  for (size_t i = 0; i < scored.size(); ++i) {
    EXPECT_NEAR((*rescored)[0].prompt_logprobs[i], scored[i], 1e-4) << i;
  }
}

// A model with sliding-window layers (an 8-token window on layers 0 and 2, layer 1 global)
// through the whole engine: prompts several windows long give the same tokens and
// log-probabilities unchunked, in 16-token chunks (window edges inside chunks and blocks) and
// from the prefix cache; and not those of the same weights without windows.
TEST_F(LocalEngineTest, SlidingWindowLayersAreChunkAndPrefixCacheInvariant) {
  const worker::testing::TinyModelSpec spec = WindowedModel({true, false, true});
  worker::testing::TinyModelSpec full = spec;
  full.sliding_window = 0;
  const auto run = [&](const worker::testing::TinyModelSpec& model, int64_t chunk, bool cache,
                       int rounds) {
    std::unique_ptr<worker::ModelStepBackend> backend_owner = TinyBackend(model, 96);
    worker::ModelStepBackend& backend = *backend_owner;
    LocalEngineOptions engine_options;
    engine_options.max_num_batched_tokens = chunk;
    engine_options.enable_prefix_caching = cache;
    LocalEngine engine(backend, *tokenizer_, engine_options);
    std::vector<EngineRequest> requests;
    for (int i = 0; i < 4; ++i) requests.push_back(Request(Prompt(i, 37 + 7 * i), 10, 0.0f, 0));
    std::vector<EngineResult> last;
    for (int r = 0; r < rounds; ++r) {
      auto results = engine.Generate(requests);
      EXPECT_TRUE(results.ok()) << results.status();
      if (results.ok()) last = *std::move(results);
    }
    ExpectNothingHeld(engine);
    return last;
  };
  const std::vector<EngineResult> whole = run(spec, 512, false, 1);
  const std::vector<EngineResult> chunked = run(spec, 16, false, 1);
  const std::vector<EngineResult> cached = run(spec, 16, true, 2);  // round 2 hits the cache
  const std::vector<EngineResult> no_window = run(full, 512, false, 1);
  ASSERT_EQ(whole.size(), 4u);
  ASSERT_EQ(chunked.size(), 4u);
  ASSERT_EQ(cached.size(), 4u);
  ASSERT_EQ(no_window.size(), 4u);
  int differs = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(chunked[i].token_ids(), whole[i].token_ids()) << i;
    EXPECT_EQ(cached[i].token_ids(), whole[i].token_ids()) << i;
    EXPECT_GT(cached[i].cached_prompt_tokens, 0) << i;
    for (size_t t = 0; t < whole[i].outputs.size(); ++t) {
      EXPECT_EQ(chunked[i].outputs[t].logprob(), whole[i].outputs[t].logprob()) << i << " " << t;
      EXPECT_EQ(cached[i].outputs[t].logprob(), whole[i].outputs[t].logprob()) << i << " " << t;
      differs += no_window[i].outputs[t].logprob() != whole[i].outputs[t].logprob();
    }
  }
  EXPECT_GT(differs, 0) << "the windows changed nothing: are they applied?";
}

// Every layer local (Mistral 7B v0.1's shape, an 8-token window): blocks behind every
// later query's window are freed as sequences move on. Sequences longer than a 12-block pool
// (150 outputs after prompts of 37 to 51 tokens: 12 to 13 blocks of 16 each, three at once)
// complete in it, with the tokens and log-probabilities of a pool large enough to never reuse
// a freed block.
TEST_F(LocalEngineTest, BlocksBehindEveryLayersWindowAreFreedWithoutChangingATokens) {
  const worker::testing::TinyModelSpec spec = WindowedModel({true, true, true});
  const auto run = [&](int64_t num_blocks, uint64_t& freed) {
    std::unique_ptr<worker::ModelStepBackend> backend_owner = TinyBackend(spec, num_blocks);
    worker::ModelStepBackend& backend = *backend_owner;
    LocalEngineOptions engine_options;
    engine_options.max_num_batched_tokens = 16;
    LocalEngine engine(backend, *tokenizer_, engine_options);
    std::vector<EngineRequest> requests;
    for (int i = 0; i < 3; ++i)
      requests.push_back(Request(Prompt(i, 37 + 7 * i), 150, 0.7f, 3 + i));
    auto results = engine.Generate(requests);
    EXPECT_TRUE(results.ok()) << results.status();
    freed = engine.num_window_freed_blocks();
    ExpectNothingHeld(engine);
    return results.ok() ? *std::move(results) : std::vector<EngineResult>{};
  };
  uint64_t freed_small = 0, freed_large = 0;
  const std::vector<EngineResult> small = run(12, freed_small);
  const std::vector<EngineResult> large = run(128, freed_large);
  ASSERT_EQ(small.size(), 3u);
  ASSERT_EQ(large.size(), 3u);
  EXPECT_GT(freed_small, 3u * 8u);  // each sequence frees most of its 12 or 13 blocks
  for (size_t i = 0; i < small.size(); ++i) {
    ASSERT_EQ(small[i].outputs.size(), 150u) << i;
    EXPECT_EQ(small[i].token_ids(), large[i].token_ids()) << i;
    for (size_t t = 0; t < small[i].outputs.size(); ++t) {
      EXPECT_EQ(small[i].outputs[t].logprob(), large[i].outputs[t].logprob()) << i << " " << t;
    }
  }
}

TEST_F(LocalEngineTest, AFailedStepEndsTheCallAndReleasesEverything) {
  // The noop backend cannot score prompts: the executor rejects the step.
  common::ModelConfig config;
  config.vocab_size = 96;
  config.context_length = 256;
  worker::NoopBackend backend(config, 16, kBlockSize, {});
  LocalEngine engine(backend, *tokenizer_);
  EngineRequest scoring = Request(Prompt(1, 20), 4, 0.0f, 0);
  scoring.score_prompt_from = 1;
  auto failed = engine.Generate({Request(Prompt(2, 12), 6, 0.0f, 0), scoring});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnimplemented) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("cannot score prompts"));
  ExpectNothingHeld(engine);
  // What does not score still runs.
  auto result = engine.Generate({Request(Prompt(2, 12), 6, 0.0f, 0)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ((*result)[0].outputs.size(), 6u);
  ExpectNothingHeld(engine);
}

}  // namespace
}  // namespace loom::cli
