#include "worker/model_step_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/speculative_verify.h"

namespace loom::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A [0, 1) double as the float the verify kernel takes, rounded down so it stays below 1.
float UniformFloat(double u) {
  return static_cast<float>(std::ldexp(std::floor(std::ldexp(u, 24)), -24));
}

// The token `sampler` emitted at `logits` (with logprobs when the sequence asked for them).
SampledToken Emitted(const SequenceSampler& sampler, const float* logits, int64_t vocab,
                     int32_t token) {
  const int32_t num_logprobs = sampler.params().num_logprobs;
  if (num_logprobs >= 0) return RawLogprobs(logits, vocab, token, num_logprobs);
  SampledToken sampled;
  sampled.token_id = token;
  return sampled;
}

// An embedding row's answer: the hidden state, L2-normalized (in double).
SampledToken Embedding(const float* hidden, int64_t size) {
  double norm = 0;
  for (int64_t i = 0; i < size; ++i) norm += static_cast<double>(hidden[i]) * hidden[i];
  norm = std::sqrt(norm);
  SampledToken out;
  out.embedding.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    out.embedding[static_cast<size_t>(i)] = norm > 0 ? static_cast<float>(hidden[i] / norm) : 0.0f;
  }
  return out;
}

}  // namespace

ModelStepBackend::ModelStepBackend(std::unique_ptr<ForwardPass> forward_pass, std::string_view name)
    : forward_pass_(std::move(forward_pass)), name_(name) {}

absl::Status ModelStepBackend::Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                                     std::vector<SampledToken>& tokens,
                                     std::vector<int32_t>& num_emitted, BackendTimings& timings) {
  PromptScores no_scores;
  return RunAndScore(batch, rows, ScoreRequest{}, tokens, num_emitted, no_scores, timings);
}

absl::Status ModelStepBackend::CheckRows(const StepBatch& batch, absl::Span<const SampleRow> rows,
                                         const ScoreRequest& score) const {
  const absl::Span<const int32_t> score_targets = score.targets;
  if (!score.top_counts.empty() && score.top_counts.size() != score_targets.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d top-token counts for %d scored rows", score.top_counts.size(), score_targets.size()));
  }
  if (NumSampleRows(rows) + score_targets.size() != batch.sample_rows.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d sample rows but the samplers cover %d and %d are scored", batch.sample_rows.size(),
        NumSampleRows(rows), score_targets.size()));
  }
  const int64_t vocab = forward_pass_->config().vocab_size;
  for (int32_t target : score_targets) {
    if (target < 0 || target >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "scored token %d is outside the vocabulary [0, %d)", target, vocab));
    }
  }
  for (const SampleRow& row : rows) {
    if (row.sampler == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("sequence %d has no sampler", row.seq_id));
    }
    if (!row.draft_probs.empty() &&
        row.draft_probs.size() != row.draft_tokens.size() * static_cast<size_t>(vocab)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: %d draft probabilities for %d drafts of a %d-token vocabulary",
          row.seq_id, row.draft_probs.size(), row.draft_tokens.size(), vocab));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelStepBackend::RunAndScore(const StepBatch& batch, absl::Span<const SampleRow> rows,
                                           const ScoreRequest& score,
                                           std::vector<SampledToken>& tokens,
                                           std::vector<int32_t>& num_emitted, PromptScores& scores,
                                           BackendTimings& timings) {
  scores.Clear();
  tokens.clear();
  num_emitted.clear();
  if (!forward_pass_->returns_logits()) {
    // A pipeline stage before the last: its layers, then the residual stream moves on.
    const auto start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(forward_pass_->Step(batch, logits_));
    timings.execute_seconds = SecondsSince(start);
    return absl::OkStatus();
  }
  if (absl::Status checked = CheckRows(batch, rows, score); !checked.ok()) {
    forward_pass_->SkipStep(batch.step_id, checked);
    return checked;
  }
  const absl::Span<const int32_t> score_targets = score.targets;
  const int64_t vocab = forward_pass_->config().vocab_size;
  // On a device that samples, a step goes there unless it scores prompts, returns hidden
  // states, or no row samples there.
  if (score_targets.empty() && forward_pass_->samples_on_device() &&
      std::none_of(rows.begin(), rows.end(), [](const SampleRow& row) { return row.embed; }) &&
      std::any_of(rows.begin(), rows.end(), [](const SampleRow& row) { return OnDevice(row); })) {
    return RunOnDevice(batch, rows, tokens, num_emitted, timings);
  }
  // A forward pass without hidden states (CUDA) answers embedding rows with no embedding:
  // those requests end with an error, the rest of the step runs.
  const bool any_embed =
      forward_pass_->returns_hidden() &&
      std::any_of(rows.begin(), rows.end(), [](const SampleRow& row) { return row.embed; });
  const auto start = std::chrono::steady_clock::now();
  LOOM_RETURN_IF_ERROR(any_embed ? forward_pass_->StepWithHidden(batch, logits_, hidden_)
                                 : forward_pass_->Step(batch, logits_));
  timings.execute_seconds = SecondsSince(start);
  const int64_t hidden_size = forward_pass_->config().hidden_size;

  const auto sample_start = std::chrono::steady_clock::now();
  tokens.reserve(batch.sample_rows.size());
  num_emitted.reserve(rows.size());
  size_t logits_row = 0;
  for (const SampleRow& row : rows) {
    const size_t drafts = row.draft_tokens.size();
    if (row.embed) {
      tokens.push_back(any_embed ? Embedding(hidden_.data() + logits_row * hidden_size, hidden_size)
                                 : SampledToken{});
      num_emitted.push_back(1);
      logits_row += drafts + 1;
      continue;
    }
    LOOM_ASSIGN_OR_RETURN(
        const int32_t emitted,
        SampleOnHost(batch, row, logits_.data() + logits_row * vocab, logits_row, tokens));
    num_emitted.push_back(emitted);
    logits_row += drafts + 1;
  }
  // The scored rows follow the sampled ones.
  for (size_t i = 0; i < score_targets.size(); ++i) {
    const int32_t top = score.top_counts.empty() ? 0 : score.top_counts[i];
    ScoreRow(logits_.data() + (logits_row + i) * vocab, vocab, score_targets[i], top, scores);
  }
  timings.sample_seconds = SecondsSince(sample_start);
  return absl::OkStatus();
}

void ModelStepBackend::ScoreRow(const float* row, int64_t vocab, int32_t target, int32_t top,
                                PromptScores& scores) {
  double max = row[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
  double sum = 0;
  int32_t above = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    sum += std::exp(static_cast<double>(row[v]) - max);
    above += row[v] > row[target] ? 1 : 0;
  }
  const double log_z = max + std::log(sum);
  scores.logprobs.push_back(-(log_z - row[target]));
  scores.ranks.push_back(above + 1);
  if (top <= 0) return;
  top_ids_.resize(vocab);
  std::iota(top_ids_.begin(), top_ids_.end(), 0);
  const int64_t k = std::min<int64_t>(top, vocab);
  std::partial_sort(top_ids_.begin(), top_ids_.begin() + k, top_ids_.end(),
                    [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  for (int64_t j = 0; j < k; ++j) {
    scores.top.push_back({top_ids_[j], static_cast<float>(row[top_ids_[j]] - log_z)});
  }
}

absl::StatusOr<int32_t> ModelStepBackend::SampleOnHost(const StepBatch& batch, const SampleRow& row,
                                                       const float* logits, size_t sample_row,
                                                       std::vector<SampledToken>& tokens) {
  const size_t drafts = row.draft_tokens.size();
  if (!row.draft_probs.empty() && !row.sampler->greedy()) {
    return VerifyDraftDistributions(batch, row, logits, sample_row, tokens);
  }
  // Sample every position as a plain decode would (same sampler, same random draws, same
  // penalties), accepting drafts while they equal the sampled token. For one-hot proposals
  // this is exactly rejection sampling (accept x with probability p(x), else draw from p
  // without x), and the output is token for token what the sequence would produce without
  // speculation; greedy stays the argmax at every position.
  const int64_t vocab = forward_pass_->config().vocab_size;
  int32_t emitted = 0;
  for (size_t i = 0; i <= drafts; ++i) {
    tokens.push_back(row.sampler->Sample(logits + i * vocab));
    ++emitted;
    if (i < drafts && tokens.back().token_id != row.draft_tokens[i]) break;
  }
  return emitted;
}

bool ModelStepBackend::SamplesOnDevice(const SampleRow& row) {
  // The device sampler picks one token per row and reports only its logprob. Drafts verify
  // there when the host would sample each position as a plain decode does (one-hot
  // proposals, or a greedy sampler): every position sampled on the device, the drafts
  // accepted on the host while they equal the samples. Draft distributions (a draft
  // model's q with a non-greedy sampler) take the host's rejection sampling.
  if (row.embed) return false;  // hidden states come back from the host path only
  if (!row.draft_probs.empty() && !row.sampler->greedy()) return false;
  if (row.sampler->params().num_logprobs > 0) return false;
  if (row.sampler->constrained()) return false;     // the grammar's mask is applied on the host
  if (row.sampler->adjusts_logits()) return false;  // logit_bias, min_tokens: on the host
  return true;
}

bool ModelStepBackend::VerifiesOnDevice(const SampleRow& row) {
  // The device's rejection sampling reports no logprobs; a grammar's mask and logit
  // adjustments are applied on the host.
  return !row.embed && !row.draft_probs.empty() && !row.sampler->greedy() &&
         row.sampler->params().num_logprobs < 0 && !row.sampler->constrained() &&
         !row.sampler->adjusts_logits();
}

absl::Status ModelStepBackend::RunOnDevice(const StepBatch& batch,
                                             absl::Span<const SampleRow> rows,
                                             std::vector<SampledToken>& tokens,
                                             std::vector<int32_t>& num_emitted,
                                             BackendTimings& timings) {
  device_rows_.Clear();
  size_t sample_row = 0;
  for (const SampleRow& row : rows) {
    if (!OnDevice(row)) {
      // Sampled on the host from its logits; the device's greedy pick of its rows unused.
      for (size_t i = 0; i <= row.draft_tokens.size(); ++i, ++sample_row) {
        SamplingParams unused;
        unused.temperature = 0.0f;
        device_rows_.params.push_back(unused);
        device_rows_.positions.push_back(int64_t{batch.positions[batch.sample_rows[sample_row]]} +
                                         1);
        device_rows_.penalty_indptr.push_back(device_rows_.penalty_indptr.back());
        device_rows_.logits_rows.push_back(static_cast<int32_t>(sample_row));
      }
      continue;
    }
    if (VerifiesOnDevice(row)) {
      // The drafts' rejection sampling, with the uniforms the host's would draw.
      DeviceSampleRows::DraftVerify& verify = device_rows_.verifies.emplace_back();
      verify.first_row = static_cast<int32_t>(sample_row);
      verify.drafts = row.draft_tokens;
      verify.draft_probs = row.draft_probs;
      const int64_t position = int64_t{batch.positions[batch.sample_rows[sample_row]]} + 1;
      for (size_t i = 0; i <= row.draft_tokens.size(); ++i) {
        const int64_t at = position + static_cast<int64_t>(i);
        verify.accept_uniforms.push_back(
            UniformFloat(row.sampler->PositionUniform(at, kAcceptStream)));
        verify.sample_uniforms.push_back(
            UniformFloat(row.sampler->PositionUniform(at, kTargetSampleStream)));
      }
    }
    // One device row per position the host would sample: the computed token's and each
    // draft's, the draft rows with the drafts before them counted in their penalties.
    for (size_t i = 0; i <= row.draft_tokens.size(); ++i, ++sample_row) {
      device_rows_.params.push_back(row.sampler->params());
      // The token this row decides comes after the sampled row's position.
      device_rows_.positions.push_back(int64_t{batch.positions[batch.sample_rows[sample_row]]} + 1);
      row.sampler->PenaltyEntries(device_rows_.penalty_tokens, device_rows_.penalty_counts,
                                  row.draft_tokens.first(i));
      device_rows_.penalty_indptr.push_back(
          static_cast<int32_t>(device_rows_.penalty_tokens.size()));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  LOOM_RETURN_IF_ERROR(forward_pass_->StepAndSample(batch, device_rows_, device_tokens_,
                                                    device_logprobs_, host_logits_));
  timings.execute_seconds = SecondsSince(start);
  const int64_t vocab = forward_pass_->config().vocab_size;
  if (device_tokens_.size() != device_rows_.params.size() ||
      device_logprobs_.size() != device_rows_.params.size() ||
      host_logits_.size() != device_rows_.logits_rows.size() * static_cast<size_t>(vocab)) {
    return absl::InternalError(absl::StrFormat(
        "the device sampled %d tokens for %d rows and returned %d logits for %d rows",
        device_tokens_.size(), device_rows_.params.size(), host_logits_.size(),
        device_rows_.logits_rows.size()));
  }
  tokens.clear();
  num_emitted.clear();
  const auto sample_start = std::chrono::steady_clock::now();
  size_t next = 0, host_row = 0;
  for (const SampleRow& row : rows) {
    const size_t drafts = row.draft_tokens.size();
    if (!OnDevice(row)) {
      LOOM_ASSIGN_OR_RETURN(
          const int32_t emitted,
          SampleOnHost(batch, row, host_logits_.data() + host_row * vocab, next, tokens));
      num_emitted.push_back(emitted);
      host_row += drafts + 1;
      next += drafts + 1;
      continue;
    }
    // Emitted as the host's loop emits them: each sample in order, the drafts accepted
    // while they equal it; the first differing sample is the correction, the rest unused.
    int32_t emitted = 0;
    for (size_t i = 0; i <= drafts; ++i) {
      const int32_t token = device_tokens_[next + i];
      // Recorded for the penalties (and the CPU RNG advanced, as a host sample would).
      row.sampler->RecordOutput(token);
      SampledToken sampled;
      sampled.token_id = token;
      if (row.sampler->params().num_logprobs >= 0) sampled.logprob = device_logprobs_[next + i];
      tokens.push_back(std::move(sampled));
      ++emitted;
      if (i < drafts && token != row.draft_tokens[i]) break;
    }
    num_emitted.push_back(emitted);
    next += drafts + 1;
  }
  // The device's sampling is inside its step; this is the host's share.
  timings.sample_seconds = SecondsSince(sample_start);
  return absl::OkStatus();
}

absl::StatusOr<int32_t> ModelStepBackend::VerifyDraftDistributions(
    const StepBatch& batch, const SampleRow& row, const float* logits, size_t sample_row,
    std::vector<SampledToken>& tokens) {
  const int64_t vocab = forward_pass_->config().vocab_size;
  const int32_t k = static_cast<int32_t>(row.draft_tokens.size());
  // p at each position, with the penalties counting the drafts before it (they are
  // emitted exactly when that position's p is consulted).
  target_probs_.resize(static_cast<size_t>(k + 1) * vocab);
  for (int32_t i = 0; i <= k; ++i) {
    row.sampler->Distribution(logits + i * vocab, row.draft_tokens.first(i),
                              target_probs_.data() + i * vocab);
  }
  // The position of the first token this row decides: after the computed token.
  const int64_t position = int64_t{batch.positions[batch.sample_rows[sample_row]]} + 1;
  accept_uniforms_.resize(k + 1);
  sample_uniforms_.resize(k + 1);
  for (int32_t i = 0; i <= k; ++i) {
    accept_uniforms_[i] = UniformFloat(row.sampler->PositionUniform(position + i, kAcceptStream));
    sample_uniforms_[i] =
        UniformFloat(row.sampler->PositionUniform(position + i, kTargetSampleStream));
  }
  LOOM_ASSIGN_OR_RETURN(const kernels::cpu::VerifiedDrafts verified,
                        kernels::cpu::VerifySampledDrafts(
                            target_probs_.data(), row.draft_probs.data(), row.draft_tokens,
                            accept_uniforms_.data(), sample_uniforms_.data(), vocab));
  const int32_t accepted = verified.accepted, next = verified.next;
  for (int32_t i = 0; i <= accepted; ++i) {
    const int32_t token = i < accepted ? row.draft_tokens[i] : next;
    tokens.push_back(Emitted(*row.sampler, logits + i * vocab, vocab, token));
    // Counts it for the penalties; the RNG advances one draw per output token as after a
    // plain sample, so a preempted and resumed sequence finds it where it was.
    row.sampler->RecordOutput(token);
  }
  return accepted + 1;
}

}  // namespace loom::worker
