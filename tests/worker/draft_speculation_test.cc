// Draft-model speculative decoding through the worker's own path: StepExecutor (the draft
// proposer, block tables, catch-up, trimming) and ModelStepBackend (verification), on
// tiny random models, driven by a small stand-in for the coordinator's scheduler.
//
// Greedy decoding must be token for token the same as without speculation; sampled
// decoding must be distributed exactly as the target's own sampling: chi-square tests over
// 100000 generations against the exact distributions computed from the target model.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "tests/worker/forward_pass_test_util.h"
#include "tests/worker/tiny_model.h"
#include "worker/cpu_forward_pass.h"
#include "worker/draft_proposer.h"
#include "worker/model_step_backend.h"
#include "worker/step_executor.h"

namespace loom::worker {
namespace {

using testing::TinyModel;
using testing::TinyModelSpec;

constexpr int64_t kBlockSize = 16;

std::unique_ptr<CpuForwardPass> NewForwardPass(const common::GgufFile& gguf, int64_t num_blocks) {
  return test_util::MakeCpuForwardPass(gguf, num_blocks, kBlockSize);
}

// A target backend and, when a draft model is given, a proposer beside it; one executor.
struct Rig {
  Rig(const common::GgufFile& target, const common::GgufFile* draft, int64_t num_blocks) {
    backend = std::make_unique<ModelStepBackend>(NewForwardPass(target, num_blocks));
    StepExecutorOptions options;
    if (draft != nullptr) {
      absl::StatusOr<std::unique_ptr<DraftProposer>> created = DraftProposer::Create(
          NewForwardPass(*draft, num_blocks), backend->config().vocab_size, num_blocks, kBlockSize);
      EXPECT_TRUE(created.ok()) << created.status();
      proposer = *std::move(created);
      options.draft_proposer = proposer.get();
    }
    executor = std::make_unique<StepExecutor>(*backend, options);
  }
  std::unique_ptr<ModelStepBackend> backend;
  std::unique_ptr<DraftProposer> proposer;
  std::unique_ptr<StepExecutor> executor;
};


struct SimSequence {
  uint64_t seq_id = 0;
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<int32_t> outputs;
  // Scheduler state, as the coordinator keeps it.
  bool on_worker = false;
  int64_t num_computed = 0;
  std::vector<int32_t> blocks;
  int64_t drafted = 0;
  int64_t accepted = 0;
};

// A stand-in for the coordinator's scheduler: every unfinished sequence in every plan
// (prefill whole, then decodes), 1 + k slots for speculating decodes (k capped so no
// output passes max_tokens), blocks from a LIFO free list (recently freed blocks are
// reused first, so stale K/V would show), the blocks only rejected drafts used freed after
// each result, preemption by recompute on request.
class MiniScheduler {
 public:
  MiniScheduler(StepExecutor& executor, int64_t num_blocks) : executor_(executor) {
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  }

  // Runs `sequences` until each has max_tokens outputs; `preempt(step)` names the
  // sequences to preempt before that step's work. Releases them all at the end.
  void Run(std::vector<SimSequence>& sequences, int max_tokens, int32_t speculative_tokens,
           const std::function<std::vector<uint64_t>(int)>& preempt = {}) {
    for (int step = 0;; ++step) {
      loom::v1::StepPlan plan;
      plan.set_step_id(++step_id_);
      absl::flat_hash_set<uint64_t> to_preempt;
      if (preempt) {
        for (uint64_t id : preempt(step)) to_preempt.insert(id);
      }
      std::vector<SimSequence*> scheduled;
      std::vector<int64_t> scheduled_tokens;
      std::vector<int32_t> scheduled_drafts;
      for (SimSequence& seq : sequences) {
        if (static_cast<int>(seq.outputs.size()) >= max_tokens) {
          if (seq.on_worker) plan.add_finished(Release(seq));
          continue;
        }
        if (seq.on_worker && to_preempt.contains(seq.seq_id)) plan.add_preempted(Release(seq));
        int64_t num_tokens = 1;
        if (!seq.on_worker) {
          loom::v1::NewSequence* added = plan.add_added();
          added->set_seq_id(seq.seq_id);
          added->mutable_prompt_token_ids()->Add(seq.prompt.begin(), seq.prompt.end());
          added->mutable_output_token_ids()->Add(seq.outputs.begin(), seq.outputs.end());
          *added->mutable_sampling() = common::SamplingParamsToProto(seq.params);
          seq.on_worker = true;
          seq.num_computed = 0;
          num_tokens = static_cast<int64_t>(seq.prompt.size() + seq.outputs.size());
        }
        const int32_t drafts = std::min<int32_t>(
            speculative_tokens, max_tokens - static_cast<int32_t>(seq.outputs.size()) - 1);
        const int64_t slots = seq.num_computed + num_tokens + drafts;
        loom::v1::ScheduledSequence* entry = plan.add_scheduled();
        entry->set_seq_id(seq.seq_id);
        entry->set_num_tokens(static_cast<int32_t>(num_tokens));
        entry->set_sample(true);
        entry->set_num_speculative_tokens(drafts);
        while (static_cast<int64_t>(seq.blocks.size()) * kBlockSize < slots) {
          EXPECT_FALSE(free_.empty()) << "the test's KV pool is too small";
          if (free_.empty()) return;
          seq.blocks.push_back(free_.back());
          entry->add_new_block_ids(free_.back());
          free_.pop_back();
        }
        scheduled.push_back(&seq);
        scheduled_tokens.push_back(num_tokens);
        scheduled_drafts.push_back(drafts);
      }
      const loom::v1::StepResult result = executor_.Execute(plan);
      EXPECT_EQ(result.error_code(), 0) << result.error_message();
      if (result.error_code() != 0) return;
      if (scheduled.empty()) return;  // that plan only released sequences
      int next = 0;
      for (size_t i = 0; i < scheduled.size(); ++i) {
        SimSequence& seq = *scheduled[i];
        EXPECT_LT(next, result.outputs_size());
        if (next >= result.outputs_size()) return;
        const loom::v1::SequenceOutput& first = result.outputs(next);
        EXPECT_EQ(first.seq_id(), seq.seq_id);
        int32_t emitted = 0;
        while (next < result.outputs_size() && result.outputs(next).seq_id() == seq.seq_id) {
          seq.outputs.push_back(result.outputs(next++).token_id());
          ++emitted;
        }
        seq.num_computed += scheduled_tokens[i] + emitted - 1;
        EXPECT_EQ(executor_.NumComputed(seq.seq_id), seq.num_computed);
        // The draft's K/V lie within what the target computed (blocks still held).
        EXPECT_LE(executor_.NumDraftComputed(seq.seq_id), seq.num_computed);
        if (scheduled_drafts[i] > 0) {
          EXPECT_LE(first.num_accepted_tokens(), first.num_draft_tokens());
          EXPECT_EQ(first.num_accepted_tokens(), emitted - 1);
          seq.drafted += first.num_draft_tokens();
          seq.accepted += first.num_accepted_tokens();
          // Free what only rejected drafts used, tail first (the worker trims alike).
          const size_t needed =
              static_cast<size_t>((seq.num_computed + kBlockSize - 1) / kBlockSize);
          while (seq.blocks.size() > needed) {
            free_.push_back(seq.blocks.back());
            seq.blocks.pop_back();
          }
        } else {
          EXPECT_EQ(emitted, 1);
        }
        if (static_cast<int>(seq.outputs.size()) > max_tokens) seq.outputs.resize(max_tokens);
      }
    }
  }

 private:
  // Frees the sequence's blocks; returns its id for the plan.
  uint64_t Release(SimSequence& seq) {
    seq.on_worker = false;
    seq.num_computed = 0;
    while (!seq.blocks.empty()) {
      free_.push_back(seq.blocks.back());
      seq.blocks.pop_back();
    }
    return seq.seq_id;
  }

  StepExecutor& executor_;
  std::vector<int32_t> free_;
  uint64_t step_id_ = 0;
};

SamplingParams Greedy() {
  SamplingParams params;
  params.temperature = 0.0f;
  return params;
}

std::vector<SimSequence> Sequences(const std::vector<std::vector<int32_t>>& prompts,
                                   const SamplingParams& params, uint64_t first_seed = 0) {
  std::vector<SimSequence> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SimSequence seq;
    seq.seq_id = 100 + i;
    seq.prompt = prompts[i];
    seq.params = params;
    seq.params.seed = first_seed + i;
    out.push_back(std::move(seq));
  }
  return out;
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 2, 3, 4, 5},
    {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 3},
    {20, 3},
    {9, 14, 2, 2, 11}};

TinyModelSpec TargetSpec() {
  TinyModelSpec spec;
  spec.seed = 2024;
  return spec;
}

// A draft that mostly agrees: the target's weights moved by 10%.
TinyModelSpec AgreeingDraftSpec() {
  TinyModelSpec spec = TargetSpec();
  spec.perturbation = 0.1f;
  spec.perturbation_seed = 5;
  return spec;
}

// A draft that rarely agrees: unrelated weights, sharper (its q sits on other tokens).
TinyModelSpec UnrelatedDraftSpec() {
  TinyModelSpec spec;
  spec.seed = 777;
  spec.layers = 1;
  spec.logit_scale = 4.0f;
  return spec;
}

TEST(DraftSpeculationTest, GreedyOutputIsIdenticalToPlainDecodingWithPreemptions) {
  std::unique_ptr<common::GgufFile> target = TinyModel(TargetSpec());
  constexpr int kMaxTokens = 40;
  Rig plain(*target, nullptr, 64);
  std::vector<SimSequence> expected = Sequences(kPrompts, Greedy());
  MiniScheduler(*plain.executor, 64).Run(expected, kMaxTokens, 0);
  for (const TinyModelSpec& draft_spec : {AgreeingDraftSpec(), UnrelatedDraftSpec()}) {
    std::unique_ptr<common::GgufFile> draft = TinyModel(draft_spec);
    for (int32_t k : {1, 3, 6}) {
      Rig rig(*target, draft.get(), 64);
      MiniScheduler scheduler(*rig.executor, 64);
      // Batch 1: each sequence alone.
      for (size_t i = 0; i < kPrompts.size(); ++i) {
        std::vector<SimSequence> alone = Sequences({kPrompts[i]}, Greedy());
        scheduler.Run(alone, kMaxTokens, k);
        EXPECT_EQ(alone[0].outputs, expected[i].outputs) << "prompt " << i << ", k " << k;
        EXPECT_GT(alone[0].drafted, 0);
      }
      // All together, two of them preempted and recomputed along the way.
      std::vector<SimSequence> together = Sequences(kPrompts, Greedy());
      scheduler.Run(together, kMaxTokens, k, [](int step) {
        if (step == 2) return std::vector<uint64_t>{101};
        if (step == 4) return std::vector<uint64_t>{100, 103};
        return std::vector<uint64_t>{};
      });
      int64_t drafted = 0, accepted = 0;
      for (size_t i = 0; i < kPrompts.size(); ++i) {
        EXPECT_EQ(together[i].outputs, expected[i].outputs) << "prompt " << i << ", k " << k;
        drafted += together[i].drafted;
        accepted += together[i].accepted;
      }
      EXPECT_GT(drafted, 0);
      if (draft_spec.perturbation > 0) {
        EXPECT_GT(accepted, drafted / 2) << "k " << k;  // the agreeing draft is accepted
      }
    }
  }
}

TEST(DraftSpeculationTest, GreedyWithPenaltiesIsIdenticalToPlainDecoding) {
  // The drafts' argmax and the target's count the drafts before them as outputs.
  std::unique_ptr<common::GgufFile> target = TinyModel(TargetSpec());
  std::unique_ptr<common::GgufFile> draft = TinyModel(AgreeingDraftSpec());
  SamplingParams params = Greedy();
  params.frequency_penalty = 0.6f;
  params.presence_penalty = 0.3f;
  params.repetition_penalty = 1.2f;
  constexpr int kMaxTokens = 40;
  Rig plain(*target, nullptr, 64);
  std::vector<SimSequence> expected = Sequences(kPrompts, params);
  MiniScheduler(*plain.executor, 64).Run(expected, kMaxTokens, 0);
  Rig rig(*target, draft.get(), 64);
  std::vector<SimSequence> speculated = Sequences(kPrompts, params);
  MiniScheduler(*rig.executor, 64).Run(speculated, kMaxTokens, 4);
  int64_t accepted = 0;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(speculated[i].outputs, expected[i].outputs) << "prompt " << i;
    accepted += speculated[i].accepted;
  }
  EXPECT_GT(accepted, 0);
}

TEST(DraftSpeculationTest, SeededSamplingResumesIdenticallyAfterPreemption) {
  // Every uniform is keyed to the position it decides and the draft recomputes what it
  // lost: a preempted sequence continues exactly as it would have.
  std::unique_ptr<common::GgufFile> target = TinyModel(TargetSpec());
  std::unique_ptr<common::GgufFile> draft = TinyModel(AgreeingDraftSpec());
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  params.frequency_penalty = 0.3f;
  constexpr int kMaxTokens = 30;
  Rig first(*target, draft.get(), 64);
  std::vector<SimSequence> straight = Sequences(kPrompts, params, 40);
  MiniScheduler(*first.executor, 64).Run(straight, kMaxTokens, 3);
  Rig second(*target, draft.get(), 64);
  std::vector<SimSequence> preempted = Sequences(kPrompts, params, 40);
  MiniScheduler(*second.executor, 64).Run(preempted, kMaxTokens, 3, [](int step) {
    if (step == 1 || step == 5) return std::vector<uint64_t>{100, 102};
    return std::vector<uint64_t>{};
  });
  int64_t accepted = 0;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(preempted[i].outputs, straight[i].outputs) << "prompt " << i;
    accepted += straight[i].accepted;
  }
  EXPECT_GT(accepted, 0);
}

// ---------------------------------------------------------------------------------------
// Lossless sampling.

// Q(a, x), the regularized upper incomplete gamma function (Numerical Recipes' gammq):
// the chi-square survival function is Q(df / 2, statistic / 2).
double UpperIncompleteGammaQ(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && std::fabs(term) > std::fabs(sum) * 1e-15; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  // Lentz's continued fraction.
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

struct ChiSquare {
  double statistic = 0;
  int degrees_of_freedom = 0;
  double p_value = 0;
  int64_t impossible = 0;  // observations in cells of probability 0
};

// Pearson's test of `counts` against `probabilities` (same cells); cells expecting fewer
// than 5 are pooled into one.
ChiSquare ChiSquareTest(const std::vector<int64_t>& counts,
                        const std::vector<double>& probabilities) {
  int64_t total = 0;
  for (int64_t count : counts) total += count;
  ChiSquare out;
  double pooled_expected = 0, pooled_observed = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = probabilities[i] * static_cast<double>(total);
    if (probabilities[i] == 0) out.impossible += counts[i];
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += static_cast<double>(counts[i]);
      continue;
    }
    const double diff = static_cast<double>(counts[i]) - expected;
    out.statistic += diff * diff / expected;
    ++cells;
  }
  if (pooled_expected > 0) {
    const double diff = pooled_observed - pooled_expected;
    out.statistic += diff * diff / pooled_expected;
    ++cells;
  }
  out.degrees_of_freedom = cells - 1;
  out.p_value = UpperIncompleteGammaQ(out.degrees_of_freedom / 2.0, out.statistic / 2.0);
  return out;
}

TEST(DraftSpeculationTest, ChiSquareSurvivalFunctionMatchesKnownValues) {
  // Tables: P(chi2_1 > 3.841) = 0.05, P(chi2_10 > 23.209) = 0.01, P(chi2_100 > 124.342) = 0.05.
  EXPECT_NEAR(UpperIncompleteGammaQ(0.5, 3.841 / 2), 0.05, 1e-4);
  EXPECT_NEAR(UpperIncompleteGammaQ(5, 23.209 / 2), 0.01, 1e-5);
  EXPECT_NEAR(UpperIncompleteGammaQ(50, 124.342 / 2), 0.05, 1e-4);
  EXPECT_NEAR(UpperIncompleteGammaQ(3, 0.5), 0.98561, 1e-5);
}

// The exact distributions of the first three sampled tokens after `prompt` under
// `params`, from the target's logits of every prefix (plain steps, no speculation).
struct ExactDistributions {
  std::vector<double> first;      // [V]
  std::vector<double> second;     // [V]: the marginal of the second token
  std::vector<double> third;      // [V]
  std::vector<double> first_two;  // [V * V]: the joint of the first two
};

ExactDistributions Exact(const common::GgufFile& target, const std::vector<int32_t>& prompt,
                         const SamplingParams& params) {
  const int64_t vocab = common::ModelConfigFromGguf(target)->vocab_size;
  std::unique_ptr<CpuForwardPass> forward_pass = NewForwardPass(target, vocab * vocab + 1);
  // next[prefix] = the sampler's distribution after prompt + prefix (prefix of 0-2 tokens).
  auto distributions = [&](const std::vector<std::vector<int32_t>>& prefixes) {
    StepBatch batch;
    for (size_t s = 0; s < prefixes.size(); ++s) {
      std::vector<int32_t> tokens = prompt;
      tokens.insert(tokens.end(), prefixes[s].begin(), prefixes[s].end());
      const std::vector<int32_t> blocks = {static_cast<int32_t>(s)};
      EXPECT_TRUE(AppendSequence(batch, tokens, 0, blocks, kBlockSize, true).ok());
    }
    std::vector<float> logits;
    EXPECT_TRUE(forward_pass->Step(batch, logits).ok());
    std::vector<std::vector<double>> out;
    std::vector<float> probs(vocab);
    for (size_t s = 0; s < prefixes.size(); ++s) {
      SequenceSampler sampler(params, prompt, vocab);
      sampler.Distribution(logits.data() + s * vocab, prefixes[s], probs.data());
      out.emplace_back(probs.begin(), probs.end());
    }
    return out;
  };
  ExactDistributions exact;
  exact.first = distributions({{}})[0];
  std::vector<std::vector<int32_t>> one, two;
  for (int32_t a = 0; a < vocab; ++a) {
    one.push_back({a});
    for (int32_t b = 0; b < vocab; ++b) two.push_back({a, b});
  }
  const std::vector<std::vector<double>> after_one = distributions(one);
  const std::vector<std::vector<double>> after_two = distributions(two);
  exact.second.assign(vocab, 0.0);
  exact.third.assign(vocab, 0.0);
  exact.first_two.assign(vocab * vocab, 0.0);
  for (int64_t a = 0; a < vocab; ++a) {
    for (int64_t b = 0; b < vocab; ++b) {
      const double ab = exact.first[a] * after_one[a][b];
      exact.first_two[a * vocab + b] = ab;
      exact.second[b] += ab;
      for (int64_t c = 0; c < vocab; ++c) exact.third[c] += ab * after_two[a * vocab + b][c];
    }
  }
  return exact;
}

struct LosslessCase {
  const char* name;
  TinyModelSpec draft;
  SamplingParams params;
  int32_t speculative_tokens;
  double min_acceptance;  // the draft's expected regime
  double max_acceptance;
};

void CheckLossless(const LosslessCase& c) {
  constexpr int kSamples = 100000;
  constexpr int kBatch = 1000;
  constexpr int kMaxTokens = 4;  // speculation covers the first 3 tokens (and a 4th)
  constexpr double kSignificance = 1e-3;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<common::GgufFile> target = TinyModel(TargetSpec());
  std::unique_ptr<common::GgufFile> draft = TinyModel(c.draft);
  const int64_t vocab = TargetSpec().vocab;
  const std::vector<int32_t> prompt = {5, 17, 3, 3, 8};
  const ExactDistributions exact = Exact(*target, prompt, c.params);

  Rig rig(*target, draft.get(), kBatch + 8);
  MiniScheduler scheduler(*rig.executor, kBatch + 8);
  std::vector<int64_t> first(vocab), second(vocab), third(vocab), first_two(vocab * vocab);
  int64_t drafted = 0, accepted = 0;
  for (int done = 0; done < kSamples; done += kBatch) {
    std::vector<SimSequence> batch =
        Sequences(std::vector<std::vector<int32_t>>(kBatch, prompt), c.params,
                  /*first_seed=*/1000003ULL * (done + 1));
    scheduler.Run(batch, kMaxTokens, c.speculative_tokens);
    for (const SimSequence& seq : batch) {
      ASSERT_EQ(seq.outputs.size(), static_cast<size_t>(kMaxTokens));
      first[seq.outputs[0]]++;
      second[seq.outputs[1]]++;
      third[seq.outputs[2]]++;
      first_two[seq.outputs[0] * vocab + seq.outputs[1]]++;
      drafted += seq.drafted;
      accepted += seq.accepted;
    }
  }
  const double acceptance = static_cast<double>(accepted) / static_cast<double>(drafted);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %d generations, k %d, %lld drafts, acceptance %.3f, %.1f s\n", c.name, kSamples,
              c.speculative_tokens, static_cast<long long>(drafted), acceptance, seconds);
  EXPECT_GE(acceptance, c.min_acceptance) << c.name;
  EXPECT_LE(acceptance, c.max_acceptance) << c.name;
  const std::pair<const char*, std::pair<const std::vector<int64_t>*, const std::vector<double>*>>
      tests[] = {{"1st token", {&first, &exact.first}},
                 {"2nd token", {&second, &exact.second}},
                 {"3rd token", {&third, &exact.third}},
                 {"1st and 2nd tokens (joint)", {&first_two, &exact.first_two}}};
  for (const auto& [what, data] : tests) {
    const ChiSquare chi = ChiSquareTest(*data.first, *data.second);
    std::printf("  %-27s chi2 %8.2f, df %3d, p %.4f\n", what, chi.statistic, chi.degrees_of_freedom,
                chi.p_value);
    ::testing::Test::RecordProperty(std::string(c.name) + " " + what + " p",
                                    std::to_string(chi.p_value));
    EXPECT_EQ(chi.impossible, 0) << c.name << ", " << what << ": tokens of probability 0";
    EXPECT_GT(chi.p_value, kSignificance)
        << c.name << ", " << what << ": chi2 " << chi.statistic << " with "
        << chi.degrees_of_freedom << " degrees of freedom";
  }
}

TEST(DraftSpeculationTest, SamplesFollowTheTargetDistributionWithAnAgreeingDraft) {
  SamplingParams params;
  params.temperature = 1.0f;
  CheckLossless({"agreeing draft, T 1", AgreeingDraftSpec(), params, 3, 0.6, 1.0});
}

TEST(DraftSpeculationTest, SamplesFollowTheTargetDistributionWithAnUnrelatedDraft) {
  SamplingParams params;
  params.temperature = 1.0f;
  CheckLossless({"unrelated draft, T 1", UnrelatedDraftSpec(), params, 3, 0.0, 0.3});
}

TEST(DraftSpeculationTest, SamplesFollowTheTransformedTargetDistribution) {
  // Temperature, top-k, top-p, min-p and all three penalties (which count the drafts
  // before each position).
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 12;
  params.top_p = 0.92f;
  params.min_p = 0.01f;
  params.repetition_penalty = 1.3f;
  params.presence_penalty = 0.4f;
  params.frequency_penalty = 0.5f;
  CheckLossless({"agreeing draft, transforms", AgreeingDraftSpec(), params, 2, 0.5, 1.0});
}

}  // namespace
}  // namespace loom::worker
