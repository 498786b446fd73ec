#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/sampling.h"
#include "kernels/cuda/sampling_internal.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

// ---------------------------------------------------------------- the CPU semantics
// Transcribed from worker/sampler.cc (loom_kernels_tests does not link loom::worker):
// Argmax, SequenceSampler::ApplyPenalties and the filters of PickFromDistribution.

// The first index of the largest logit; NaNs never win (a -inf does); a row of NaNs: 0.
int32_t CpuArgmax(const float* logits, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (int64_t k = 0; k < n; ++k) {
    if (logits[k] == best) return static_cast<int32_t>(k);
  }
  return 0;
}

// One row's penalty list: distinct tokens with their output counts (0: prompt only).
struct PenaltyList {
  std::vector<int32_t> tokens;
  std::vector<int32_t> counts;
};

// SequenceSampler::ApplyPenalties: repetition over every seen token, then presence +
// frequency * count over the generated ones.
void CpuApplyPenalties(const SamplingRowParams& p, const PenaltyList& list, float* logits) {
  if (p.repetition_penalty != 1.0f) {
    for (int32_t id : list.tokens) {
      logits[id] =
          logits[id] > 0 ? logits[id] / p.repetition_penalty : logits[id] * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (size_t e = 0; e < list.tokens.size(); ++e) {
      if (list.counts[e] > 0) {
        logits[list.tokens[e]] -= p.presence_penalty + p.frequency_penalty * list.counts[e];
      }
    }
  }
}

// PickFromDistribution's candidates after top-k, min-p and top-p, with their
// probabilities (normalized over the kept ones), in the CPU's order. `margin` receives
// how far the min-p and top-p decisions were from their thresholds (relative), so a test
// can insist its inputs are not ambiguous at F32 precision.
struct Filtered {
  std::vector<int32_t> ids;
  std::vector<double> probabilities;
  double margin = std::numeric_limits<double>::infinity();
};

Filtered CpuFilteredDistribution(const float* logits, int64_t vocab, const SamplingRowParams& p) {
  std::vector<std::pair<float, int32_t>> candidates;
  for (int64_t i = 0; i < vocab; ++i) candidates.push_back({logits[i], static_cast<int32_t>(i)});
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t keep = candidates.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < keep) keep = p.top_k;
  candidates.resize(keep);
  const double inv_temperature = 1.0 / p.temperature;
  const double max_logit = candidates[0].first;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates[i].first - max_logit) * inv_temperature);
    sum += probs[i];
  }
  Filtered out;
  if (p.min_p > 0) {
    const double threshold = p.min_p * probs[0];
    for (size_t i = 1; i < keep; ++i) {
      out.margin = std::min(out.margin, std::abs(probs[i] - threshold) / threshold);
    }
    while (keep > 1 && probs[keep - 1] < threshold) sum -= probs[--keep];
  }
  if (p.top_p < 1.0f) {
    double cumulative = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / sum;
      out.margin = std::min(out.margin, std::abs(cumulative - p.top_p));
      if (cumulative >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    for (size_t i = cut; i < keep; ++i) sum -= probs[i];
    keep = cut;
  }
  for (size_t i = 0; i < keep; ++i) {
    out.ids.push_back(candidates[i].second);
    out.probabilities.push_back(probs[i] / sum);
  }
  return out;
}

// The token the GPU draws, computed on the host as sampling.h documents it: F32 weights
// exp2f((x - max) * (log2(e) / T)) in 40-bit fixed point over the kept ids, the Philox
// draw floor(bits * total / 2^64), found in id order. `kept` comes from
// CpuFilteredDistribution (the same set wherever its margin is comfortable).
int32_t EmulatedDraw(const float* logits, const std::vector<int32_t>& kept,
                     const SamplingRowParams& p) {
  float max_value = -std::numeric_limits<float>::infinity();
  for (int32_t id : kept) max_value = std::max(max_value, logits[id]);
  const float inverse_temperature = 1.4426950408889634f / p.temperature;
  std::vector<int32_t> ids = kept;
  std::sort(ids.begin(), ids.end());
  std::vector<uint64_t> weights;
  uint64_t total = 0;
  for (int32_t id : ids) {
    const float x = logits[id];
    const float probability =
        x == max_value ? 1.0f : std::exp2((x - max_value) * inverse_temperature);
    weights.push_back(static_cast<uint64_t>(probability * 1099511627776.0f));
    total += weights.back();
  }
  const uint64_t bits = SamplingRandomBits(p.seed, p.step);
  const uint64_t draw = static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * total) >> 64);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cumulative += weights[i];
    if (cumulative > draw) return ids[i];
  }
  return -1;
}

// ---------------------------------------------------------------- checks (no GPU needed)

TEST(CudaSamplingTest, PhiloxMatchesRandom123KnownAnswers) {
  // Random123's kat_vectors, the three "philox4x32 10" lines.
  struct Vector {
    uint32_t counter[4];
    uint32_t key[2];
    uint32_t expected[4];
  };
  const Vector vectors[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Vector& v : vectors) {
    uint32_t out[4];
    internal::Philox4x32x10(v.counter, v.key, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], v.expected[i]) << i;
  }
  // The public draw is words 0 (low) and 1 (high) with counter (step, 0, 0).
  EXPECT_EQ(SamplingRandomBits(0, 0), 0xe169c58d6627e8d5ull);
  EXPECT_NE(SamplingRandomBits(1, 0), SamplingRandomBits(0, 1));
}

SampleTokensParams ValidParams(void* some_device_pointer) {
  SampleTokensParams p;
  p.logits = static_cast<const float*>(some_device_pointer);
  p.num_rows = 4;
  p.vocab_size = 1000;
  p.rows = static_cast<const SamplingRowParams*>(some_device_pointer);
  p.tokens = static_cast<int32_t*>(some_device_pointer);
  return p;
}

TEST(CudaSamplingTest, RejectsUnsupportedShapesBeforeLaunch) {
  alignas(16) int32_t storage[64] = {};
  ASSERT_TRUE(CheckSampleTokensParams(ValidParams(storage)).ok());
  EXPECT_EQ(SampleTokensWorkspaceBytes(ValidParams(storage)), 0u);
  auto expect_invalid = [&](SampleTokensParams p, const std::string& fragment) {
    const absl::Status status = CheckSampleTokensParams(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_NE(status.message().find(fragment), std::string::npos) << status;
    EXPECT_EQ(LaunchSampleTokens(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  };
  SampleTokensParams p = ValidParams(storage);
  p.vocab_size = 0;
  expect_invalid(p, "vocab_size 0");
  p.vocab_size = kSamplingMaxVocab + 1;
  expect_invalid(p, "vocab_size 8388609");
  p = ValidParams(storage);
  p.num_rows = -1;
  expect_invalid(p, "num_rows -1");
  p = ValidParams(storage);
  p.logits_stride = 999;
  expect_invalid(p, "logits_stride 999");
  p = ValidParams(storage);
  p.tokens = nullptr;
  expect_invalid(p, "null");
  p = ValidParams(storage);
  p.penalty_indptr = storage;  // without tokens and counts
  expect_invalid(p, "go together");
  p.penalty_tokens = p.penalty_counts = storage;
  expect_invalid(p, "workspace of 0 bytes, 16000 needed");
  EXPECT_EQ(SampleTokensWorkspaceBytes(p), 4u * 1000 * sizeof(float));
  p.workspace = reinterpret_cast<float*>(storage);
  p.workspace_bytes = SampleTokensWorkspaceBytes(p);
  EXPECT_TRUE(CheckSampleTokensParams(p).ok());
  // No rows, no pointers needed.
  p = SampleTokensParams{};
  p.vocab_size = 10;
  EXPECT_TRUE(CheckSampleTokensParams(p).ok());
}

// ---------------------------------------------------------------- GPU

struct Batch {
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<SamplingRowParams> rows;
  std::vector<PenaltyList> penalties;  // empty: no penalty arrays at all
};

// Runs the kernel; tokens and logprobs (and, when asked, the rows' distributions) come back from
// NaN / 0xff-poisoned buffers.
void RunOnGpu(const Batch& batch, std::vector<int32_t>* tokens, std::vector<float>* logprobs,
              std::vector<float>* probs = nullptr) {
  const int64_t num_rows = static_cast<int64_t>(batch.rows.size());
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_logits, testing_util::UploadRaw(batch.logits));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_rows, testing_util::UploadRaw(batch.rows));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_tokens,
                            testing_util::Poisoned(DataType::kF32, num_rows));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_logprobs,
                            testing_util::Poisoned(DataType::kF32, num_rows));
  SampleTokensParams p;
  p.logits = static_cast<const float*>(d_logits.data());
  p.num_rows = num_rows;
  p.vocab_size = batch.vocab;
  p.rows = static_cast<const SamplingRowParams*>(d_rows.data());
  p.tokens = static_cast<int32_t*>(d_tokens.data());
  p.logprobs = static_cast<float*>(d_logprobs.data());
  DeviceBuffer d_probs;
  if (probs != nullptr) {
    LOOM_ASSERT_OK_AND_ASSIGN(d_probs,
                              testing_util::Poisoned(DataType::kF32, num_rows * batch.vocab));
    p.probs = static_cast<float*>(d_probs.data());
  }
  DeviceBuffer d_indptr, d_penalty_tokens, d_counts, workspace;
  if (!batch.penalties.empty()) {
    std::vector<int32_t> indptr{0}, penalty_tokens, counts;
    for (const PenaltyList& list : batch.penalties) {
      penalty_tokens.insert(penalty_tokens.end(), list.tokens.begin(), list.tokens.end());
      counts.insert(counts.end(), list.counts.begin(), list.counts.end());
      indptr.push_back(static_cast<int32_t>(penalty_tokens.size()));
    }
    LOOM_ASSERT_OK_AND_ASSIGN(d_indptr, testing_util::UploadRaw(indptr));
    LOOM_ASSERT_OK_AND_ASSIGN(d_penalty_tokens, testing_util::UploadRaw(penalty_tokens));
    LOOM_ASSERT_OK_AND_ASSIGN(d_counts, testing_util::UploadRaw(counts));
    p.penalty_indptr = static_cast<const int32_t*>(d_indptr.data());
    p.penalty_tokens = static_cast<const int32_t*>(d_penalty_tokens.data());
    p.penalty_counts = static_cast<const int32_t*>(d_counts.data());
    LOOM_ASSERT_OK_AND_ASSIGN(workspace, DeviceBuffer::Allocate(SampleTokensWorkspaceBytes(p)));
    ASSERT_TRUE(workspace.Fill(0xff).ok());  // stale values must never be read
    p.workspace = static_cast<float*>(workspace.data());
    p.workspace_bytes = workspace.bytes();
  }
  const absl::Status launched = LaunchSampleTokens(p, nullptr);
  ASSERT_TRUE(launched.ok()) << launched;
  const absl::Status synced = SynchronizeStream(nullptr);
  ASSERT_TRUE(synced.ok()) << synced;
  tokens->assign(num_rows, -1);
  ASSERT_TRUE(d_tokens.CopyToHost(tokens->data(), num_rows * sizeof(int32_t)).ok());
  LOOM_ASSERT_OK_AND_ASSIGN(*logprobs,
                            testing_util::Download(d_logprobs, DataType::kF32, num_rows));
  if (probs != nullptr) {
    LOOM_ASSERT_OK_AND_ASSIGN(
        *probs, testing_util::Download(d_probs, DataType::kF32, num_rows * batch.vocab));
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    ASSERT_GE((*tokens)[r], 0) << "row " << r;
    ASSERT_LT((*tokens)[r], batch.vocab) << "row " << r;
  }
}

// log-softmax of the raw logits at `token`, as worker::RawLogprobs.
double CpuLogprob(const float* logits, int64_t vocab, int32_t token) {
  const float max_logit = logits[CpuArgmax(logits, vocab)];
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
  return logits[token] - (max_logit + std::log(sum));
}

SamplingRowParams Greedy() {
  SamplingRowParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(CudaSamplingTest, GreedyEqualsCpuArgmaxExactly) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (int64_t vocab : {1, 3, 1000, 32003, 49152, 151936}) {
    SCOPED_TRACE(testing::Message() << "vocab=" << vocab);
    Batch batch;
    batch.vocab = vocab;
    const int64_t num_rows = vocab > 50000 ? 24 : 64;
    batch.logits =
        testing_util::RandomFloats(num_rows * vocab, static_cast<uint32_t>(vocab), -10, 10);
    std::mt19937 rng(static_cast<uint32_t>(vocab) + 1);
    for (int64_t r = 0; r < num_rows; ++r) {
      float* row = batch.logits.data() + r * vocab;
      SamplingRowParams params = Greedy();
      if (r % 2 == 1) {  // top_k 1 is greedy at any temperature
        params.temperature = 0.8f;
        params.top_k = 1;
      }
      if (r % 4 == 2 && vocab > 2) {
        // Ties at the max: the lowest id wins.
        const int64_t a = rng() % vocab, b = rng() % vocab;
        row[a] = row[b] = 11.0f;
      }
      if (r % 8 == 3 && vocab > 2) {
        // NaN (never chosen, at index 0 either), and -0 tying +0 at the max.
        std::fill(row, row + vocab, -1.0f);
        row[r % 16 == 3 ? 0 : 1] = NAN;
        row[vocab - 1] = 0.0f;
        row[vocab / 2] = -0.0f;
      }
      if (r == 5) std::fill(row, row + vocab, -INFINITY);  // all -inf: token 0
      if (r == 9) {  // NaN first, then -inf: the first -inf (the CPU's choice)
        std::fill(row, row + vocab, -INFINITY);
        row[0] = NAN;
      }
      if (r == 13) std::fill(row, row + vocab, NAN);  // all NaN: token 0
      batch.rows.push_back(params);
    }
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    ASSERT_NO_FATAL_FAILURE(RunOnGpu(batch, &tokens, &logprobs));
    for (int64_t r = 0; r < num_rows; ++r) {
      const float* row = batch.logits.data() + r * vocab;
      ASSERT_EQ(tokens[r], CpuArgmax(row, vocab)) << "row " << r;
      // NaN / -inf rows: no logprob check.
      if (r == 5 || r == 9 || r == 13 || (r % 8 == 3 && vocab > 2)) continue;
      EXPECT_NEAR(logprobs[r], CpuLogprob(row, vocab, tokens[r]),
                  1e-4 + 1e-5 * std::abs(logprobs[r]))
          << "row " << r;
    }
  }
}

TEST(CudaSamplingTest, FiltersThatLeaveOneTokenGiveTheArgmax) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (int64_t vocab : {7, 49152, 151936}) {
    SCOPED_TRACE(testing::Message() << "vocab=" << vocab);
    Batch batch;
    batch.vocab = vocab;
    const int64_t num_rows = 24;
    batch.logits =
        testing_util::RandomFloats(num_rows * vocab, static_cast<uint32_t>(vocab) + 7, -10, 10);
    for (int64_t r = 0; r < num_rows; ++r) {
      float* row = batch.logits.data() + r * vocab;
      row[CpuArgmax(row, vocab)] += 1.0f;  // a clear winner: its probability leads by e
      SamplingRowParams params;
      params.temperature = 1.0f;
      params.seed = 1234 + r;
      params.step = static_cast<uint64_t>(r);
      switch (r % 4) {
        case 0:
          params.min_p = 1.0f;  // only the max has weight >= 1
          break;
        case 1:
          params.min_p = 0.999f;
          break;
        case 2:
          params.top_p = 1e-6f;  // the first token alone reaches it
          break;
        case 3:
          params.top_k = 1;
          params.temperature = 1.5f;
          break;
      }
      batch.rows.push_back(params);
    }
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    ASSERT_NO_FATAL_FAILURE(RunOnGpu(batch, &tokens, &logprobs));
    for (int64_t r = 0; r < num_rows; ++r) {
      EXPECT_EQ(tokens[r], CpuArgmax(batch.logits.data() + r * vocab, vocab)) << "row " << r;
    }
  }
}

// The chi-square critical value at significance 1e-3 (Wilson-Hilferty; z = 3.0902).
double ChiSquareCritical(int degrees) {
  const double k = degrees, z = 3.0902;
  const double term = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * term * term * term;
}

// A small vocabulary under each filter (and penalties), with its CPU distribution.
struct DistributionCase {
  SamplingRowParams params;
  bool with_penalties = false;
  std::vector<float> penalized;  // the logits after the CPU's penalties
  Filtered expected;
};

constexpr int64_t kSmallVocab = 12;
// Tokens 0..3 seen in the prompt; 2, 3 and 5 generated 1, 2 and 3 times.
const PenaltyList kSmallPenalties{{0, 1, 2, 3, 5}, {0, 0, 1, 2, 3}};

std::vector<float> SmallLogits() { return testing_util::RandomFloats(kSmallVocab, 77, -2, 2); }

std::vector<DistributionCase> DistributionCases() {
  struct Setting {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
    float repetition, presence, frequency;
  };
  const Setting settings[] = {
      {1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f},    // plain softmax
      {0.7f, 5, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f},    // top-k
      {1.3f, 0, 0.8f, 0.0f, 1.0f, 0.0f, 0.0f},    // top-p
      {1.0f, 0, 1.0f, 0.2f, 1.0f, 0.0f, 0.0f},    // min-p
      {0.9f, 8, 0.9f, 0.05f, 1.0f, 0.0f, 0.0f},   // all three
      {1.0f, 0, 0.95f, 0.0f, 1.3f, 0.4f, 0.25f},  // penalties reshape the distribution
  };
  std::vector<DistributionCase> cases;
  uint64_t seed = 99;
  for (const Setting& setting : settings) {
    DistributionCase c;
    c.params.temperature = setting.temperature;
    c.params.top_k = setting.top_k;
    c.params.top_p = setting.top_p;
    c.params.min_p = setting.min_p;
    c.params.repetition_penalty = setting.repetition;
    c.params.presence_penalty = setting.presence;
    c.params.frequency_penalty = setting.frequency;
    c.params.seed = seed++;
    c.with_penalties = setting.repetition != 1.0f || setting.presence != 0.0f;
    c.penalized = SmallLogits();
    if (c.with_penalties) CpuApplyPenalties(c.params, kSmallPenalties, c.penalized.data());
    c.expected = CpuFilteredDistribution(c.penalized.data(), kSmallVocab, c.params);
    cases.push_back(std::move(c));
  }
  return cases;
}

// Chi-square of `counts` (over the whole vocabulary) against the expected distribution;
// tokens outside it must never appear.
void ExpectDistribution(const std::vector<int64_t>& counts, const Filtered& expected) {
  const std::set<int32_t> kept(expected.ids.begin(), expected.ids.end());
  int64_t draws = 0;
  for (size_t id = 0; id < counts.size(); ++id) {
    draws += counts[id];
    if (!kept.count(static_cast<int32_t>(id))) {
      EXPECT_EQ(counts[id], 0) << "token " << id << " was filtered out";
    }
  }
  double chi_square = 0;
  for (size_t i = 0; i < expected.ids.size(); ++i) {
    const double wanted = expected.probabilities[i] * draws;
    const double diff = counts[expected.ids[i]] - wanted;
    chi_square += diff * diff / wanted;
  }
  const int degrees = static_cast<int>(expected.ids.size()) - 1;
  EXPECT_LT(chi_square, ChiSquareCritical(degrees))
      << "chi-square " << chi_square << " with " << degrees << " degrees of freedom";
}

constexpr int64_t kDraws = 40000;

// Host-only: the documented draw (Philox bits, fixed-point weights, id order) follows the
// CPU sampler's filtered distribution, so the GPU only has to reproduce it.
TEST(CudaSamplingTest, DocumentedDrawFollowsTheFilteredSoftmax) {
  for (const DistributionCase& c : DistributionCases()) {
    SCOPED_TRACE(testing::Message() << "seed " << c.params.seed);
    ASSERT_GT(c.expected.margin, 1e-3) << "inputs too close to a filter threshold";
    ASSERT_GE(c.expected.ids.size(), 2u);
    std::vector<int64_t> counts(kSmallVocab, 0);
    SamplingRowParams params = c.params;
    for (int64_t r = 0; r < kDraws; ++r) {
      params.step = static_cast<uint64_t>(r);
      const int32_t token = EmulatedDraw(c.penalized.data(), c.expected.ids, params);
      ASSERT_GE(token, 0);
      ++counts[token];
    }
    ExpectDistribution(counts, c.expected);
  }
}

TEST(CudaSamplingTest, EmpiricalFrequenciesMatchTheFilteredSoftmax) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<float> logits = SmallLogits();
  for (const DistributionCase& c : DistributionCases()) {
    SCOPED_TRACE(testing::Message() << "seed " << c.params.seed);
    Batch batch;
    batch.vocab = kSmallVocab;
    for (int64_t r = 0; r < kDraws; ++r) {
      batch.logits.insert(batch.logits.end(), logits.begin(), logits.end());
      batch.rows.push_back(c.params);
      batch.rows.back().step = static_cast<uint64_t>(r);
      if (c.with_penalties) batch.penalties.push_back(kSmallPenalties);
    }
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    ASSERT_NO_FATAL_FAILURE(RunOnGpu(batch, &tokens, &logprobs));
    std::vector<int64_t> counts(kSmallVocab, 0);
    int64_t mismatched_draws = 0;
    for (int64_t r = 0; r < kDraws; ++r) {
      ++counts[tokens[r]];
      if (tokens[r] != EmulatedDraw(c.penalized.data(), c.expected.ids, batch.rows[r])) {
        ++mismatched_draws;
      }
    }
    ExpectDistribution(counts, c.expected);
    // The GPU draws what the documentation says (checked above on the host) but for a
    // draw landing within F32 rounding (exp2f on host vs device) of a boundary.
    EXPECT_LE(mismatched_draws, kDraws / 1000) << mismatched_draws << " of " << kDraws;
  }
}

// The rows' distributions (speculative decoding's target p): each filter's kept set with the CPU
// sampler's probabilities (F32 weights against its doubles), zeros elsewhere, penalties
// applied; a greedy row and a top-k 1 row one-hot at the argmax; a 151,936-token row under
// top-p sums to 1.
TEST(CudaSamplingTest, DistributionsMatchTheCpuSamplersFilteredSoftmax) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<float> logits = SmallLogits();
  Batch batch;
  batch.vocab = kSmallVocab;
  const std::vector<DistributionCase> cases = DistributionCases();
  for (const DistributionCase& c : cases) {
    batch.logits.insert(batch.logits.end(), logits.begin(), logits.end());
    batch.rows.push_back(c.params);
    batch.penalties.push_back(c.with_penalties ? kSmallPenalties : PenaltyList{});
  }
  SamplingRowParams top1 = cases[0].params;
  top1.top_k = 1;
  for (const SamplingRowParams& one_hot : {Greedy(), top1}) {
    batch.logits.insert(batch.logits.end(), logits.begin(), logits.end());
    batch.rows.push_back(one_hot);
    batch.penalties.push_back({});
  }
  std::vector<int32_t> tokens;
  std::vector<float> logprobs, probs;
  ASSERT_NO_FATAL_FAILURE(RunOnGpu(batch, &tokens, &logprobs, &probs));
  for (size_t r = 0; r < cases.size(); ++r) {
    SCOPED_TRACE(testing::Message() << "seed " << cases[r].params.seed);
    ASSERT_GT(cases[r].expected.margin, 1e-3) << "inputs too close to a filter threshold";
    std::vector<double> expected(kSmallVocab, 0.0);
    for (size_t i = 0; i < cases[r].expected.ids.size(); ++i) {
      expected[cases[r].expected.ids[i]] = cases[r].expected.probabilities[i];
    }
    for (int64_t id = 0; id < kSmallVocab; ++id) {
      const float got = probs[r * kSmallVocab + id];
      if (expected[id] == 0.0) {
        EXPECT_EQ(got, 0.0f) << "token " << id << " was filtered out";
      } else {
        EXPECT_NEAR(got, expected[id], 1e-5 * expected[id] + 1e-7) << "token " << id;
      }
    }
  }
  const int32_t argmax = CpuArgmax(logits.data(), kSmallVocab);
  for (size_t r = cases.size(); r < batch.rows.size(); ++r) {
    for (int64_t id = 0; id < kSmallVocab; ++id) {
      EXPECT_EQ(probs[r * kSmallVocab + id], id == argmax ? 1.0f : 0.0f) << "row " << r;
    }
  }

  Batch large;
  large.vocab = 151936;
  large.logits = testing_util::RandomFloats(large.vocab, 78, -8, 8);
  SamplingRowParams nucleus;
  nucleus.temperature = 0.8f;
  nucleus.top_p = 0.9f;
  large.rows.push_back(nucleus);
  ASSERT_NO_FATAL_FAILURE(RunOnGpu(large, &tokens, &logprobs, &probs));
  double sum = 0;
  for (float p : probs) sum += p;
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_GT(probs[tokens[0]], 0.0f) << "the drawn token is outside the distribution";
}

TEST(CudaSamplingTest, LargeVocabularySamplesFromTheKeptSetAsDocumented) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (int64_t vocab : {49152, 151936, 100003}) {
    SCOPED_TRACE(testing::Message() << "vocab=" << vocab);
    Batch batch;
    batch.vocab = vocab;
    const int64_t num_rows = 16;
    batch.logits =
        testing_util::RandomFloats(num_rows * vocab, static_cast<uint32_t>(vocab) + 3, -8, 8);
    for (int64_t r = 0; r < num_rows; ++r) {
      SamplingRowParams params;
      params.temperature = 0.5f + 0.1f * (r % 8);
      params.top_k = r % 3 == 0 ? 0 : (r % 3 == 1 ? 50 : 2000);
      params.top_p = r % 2 == 0 ? 0.9f : 1.0f;
      params.min_p = r % 4 == 3 ? 0.01f : 0.0f;
      params.seed = 5000 + r;
      params.step = 17;
      batch.rows.push_back(params);
    }
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    ASSERT_NO_FATAL_FAILURE(RunOnGpu(batch, &tokens, &logprobs));
    int checked = 0, mismatched = 0;
    for (int64_t r = 0; r < num_rows; ++r) {
      const float* row = batch.logits.data() + r * vocab;
      EXPECT_NEAR(logprobs[r], CpuLogprob(row, vocab, tokens[r]),
                  1e-4 + 1e-5 * std::abs(logprobs[r]));
      const Filtered expected = CpuFilteredDistribution(row, vocab, batch.rows[r]);
      if (expected.margin < 1e-5) continue;  // a filter ambiguous at F32 precision
      ++checked;
      EXPECT_NE(std::find(expected.ids.begin(), expected.ids.end(), tokens[r]), expected.ids.end())
          << "row " << r << " drew token " << tokens[r] << " outside the kept set";
      mismatched += tokens[r] != EmulatedDraw(row, expected.ids, batch.rows[r]);
    }
    // Thousands of kept tokens: host and device exp2f may differ by an ulp per weight, so
    // a draw near a boundary may land one token over; never more than a stray row.
    EXPECT_GE(checked, num_rows / 2);
    EXPECT_LE(mismatched, 1) << "of " << checked << " rows";
  }
}

TEST(CudaSamplingTest, GreedyWithPenaltiesMatchesCpuApplyPenalties) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  for (int64_t vocab : {1000, 32003}) {
    SCOPED_TRACE(testing::Message() << "vocab=" << vocab);
    std::mt19937 rng(static_cast<uint32_t>(vocab));
    Batch batch;
    batch.vocab = vocab;
    const int64_t num_rows = 96;
    batch.logits =
        testing_util::RandomFloats(num_rows * vocab, static_cast<uint32_t>(vocab) + 9, -5, 5);
    const float repetitions[] = {1.0f, 1.3f, 0.7f};
    const float presences[] = {0.0f, 0.5f, -0.5f, 2.0f};
    const float frequencies[] = {0.0f, 0.3f, -0.2f};
    for (int64_t r = 0; r < num_rows; ++r) {
      float* row = batch.logits.data() + r * vocab;
      SamplingRowParams params = Greedy();
      params.repetition_penalty = repetitions[r % 3];
      params.presence_penalty = presences[(r / 3) % 4];
      params.frequency_penalty = frequencies[(r / 12) % 3];
      // Penalize the current leaders (positive and negative logits alike), so that the
      // penalties decide the argmax.
      std::vector<int32_t> order(vocab);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 6, order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      PenaltyList list;
      for (int i = 0; i < 5; ++i) {
        list.tokens.push_back(order[i]);
        list.counts.push_back(static_cast<int32_t>(rng() % 4));  // 0: prompt only
      }
      if (r % 5 == 0) row[order[0]] = -row[order[0]];  // a negative logit under penalty
      for (int i = 0; i < 20; ++i) {                   // and some from anywhere
        const int32_t id = static_cast<int32_t>(rng() % vocab);
        if (std::find(list.tokens.begin(), list.tokens.end(), id) != list.tokens.end()) continue;
        list.tokens.push_back(id);
        list.counts.push_back(static_cast<int32_t>(rng() % 3));
      }
      if (r % 7 == 0) list = PenaltyList{};  // a row without entries
      batch.rows.push_back(params);
      batch.penalties.push_back(list);
    }
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    ASSERT_NO_FATAL_FAILURE(RunOnGpu(batch, &tokens, &logprobs));
    int changed = 0;
    for (int64_t r = 0; r < num_rows; ++r) {
      const float* row = batch.logits.data() + r * vocab;
      std::vector<float> penalized(row, row + vocab);
      CpuApplyPenalties(batch.rows[r], batch.penalties[r], penalized.data());
      const int32_t expected = CpuArgmax(penalized.data(), vocab);
      ASSERT_EQ(tokens[r], expected) << "row " << r;
      changed += expected != CpuArgmax(row, vocab);
      // The logprob stays that of the raw logits.
      EXPECT_NEAR(logprobs[r], CpuLogprob(row, vocab, tokens[r]),
                  1e-4 + 1e-5 * std::abs(logprobs[r]));
    }
    EXPECT_GT(changed, num_rows / 3) << "the penalties should move many argmaxes";
  }
}

TEST(CudaSamplingTest, SameSeedAndStepGiveTheSameTokenAtAnyBatchPosition) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t vocab = 32000, num_seqs = 40;
  Batch first;
  first.vocab = vocab;
  first.logits = testing_util::RandomFloats(num_seqs * vocab, 31, -6, 6);
  for (int64_t s = 0; s < num_seqs; ++s) {
    SamplingRowParams params;
    params.temperature = 0.6f + 0.02f * s;
    params.top_k = s % 2 == 0 ? 40 : 0;
    params.top_p = s % 3 == 0 ? 0.9f : 1.0f;
    params.repetition_penalty = s % 4 == 0 ? 1.2f : 1.0f;
    params.seed = 1000 + s;
    params.step = 7 + s;
    first.rows.push_back(params);
    first.penalties.push_back({{static_cast<int32_t>(s), static_cast<int32_t>(s + 100)}, {1, 0}});
  }
  // The same sequences reversed, with unrelated rows in between.
  Batch second;
  second.vocab = vocab;
  const std::vector<float> filler = testing_util::RandomFloats(vocab, 32, -6, 6);
  std::vector<int64_t> position(num_seqs);
  for (int64_t s = num_seqs - 1; s >= 0; --s) {
    second.logits.insert(second.logits.end(), filler.begin(), filler.end());
    second.rows.push_back(first.rows[(s + 1) % num_seqs]);
    second.rows.back().seed += 1;  // another sequence's draw
    second.penalties.push_back({});
    position[s] = static_cast<int64_t>(second.rows.size());
    second.logits.insert(second.logits.end(), first.logits.begin() + s * vocab,
                         first.logits.begin() + (s + 1) * vocab);
    second.rows.push_back(first.rows[s]);
    second.penalties.push_back(first.penalties[s]);
  }
  std::vector<int32_t> first_tokens, second_tokens;
  std::vector<float> first_logprobs, second_logprobs;
  ASSERT_NO_FATAL_FAILURE(RunOnGpu(first, &first_tokens, &first_logprobs));
  ASSERT_NO_FATAL_FAILURE(RunOnGpu(second, &second_tokens, &second_logprobs));
  std::set<int32_t> distinct;
  for (int64_t s = 0; s < num_seqs; ++s) {
    EXPECT_EQ(second_tokens[position[s]], first_tokens[s]) << "sequence " << s;
    EXPECT_EQ(second_logprobs[position[s]], first_logprobs[s]) << "sequence " << s;
    distinct.insert(first_tokens[s]);
  }
  // And another step does draw differently somewhere (the counter matters).
  Batch later = first;
  for (SamplingRowParams& params : later.rows) params.step += 1;
  std::vector<int32_t> later_tokens;
  std::vector<float> later_logprobs;
  ASSERT_NO_FATAL_FAILURE(RunOnGpu(later, &later_tokens, &later_logprobs));
  EXPECT_NE(later_tokens, first_tokens);
}

}  // namespace
}  // namespace loom::kernels::cuda
