#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace loom::worker {
namespace {

// A double in [0, 1) from the top 53 bits: the same on every platform (unlike
// std::uniform_real_distribution, whose algorithm is unspecified).
double UniformDouble(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Argmax(const float* logits, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p, int64_t vocab_size) {
  auto bad = [](const char* name, double value, const char* range) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s must be %s, got %g", name, range, value));
  };
  if (!std::isfinite(p.temperature) || p.temperature < 0) return bad("temperature", p.temperature, "finite and >= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p", p.top_p, "in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p", p.min_p, "in [0, 1]");
  if (p.top_k < 0) return bad("top_k", p.top_k, ">= 0 (0 disables it)");
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty)) {
    return bad("repetition_penalty", p.repetition_penalty, "finite and > 0");
  }
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2)) return bad("presence_penalty", p.presence_penalty, "in [-2, 2]");
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2)) return bad("frequency_penalty", p.frequency_penalty, "in [-2, 2]");
  if (p.num_logprobs < -1 || p.num_logprobs > std::min<int64_t>(20, vocab_size)) {
    return bad("logprobs", p.num_logprobs, "between 0 and 20");
  }
  return absl::OkStatus();
}

SampledToken RawLogprobs(const float* logits, int64_t vocab_size, int32_t token_id, int32_t n) {
  const float max_logit = logits[Argmax(logits, vocab_size)];
  double sum = 0;
  for (int64_t i = 0; i < vocab_size; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
  const double log_z = max_logit + std::log(sum);
  SampledToken out;
  out.token_id = token_id;
  out.logprob = static_cast<float>(logits[token_id] - log_z);
  if (n > 0) {
    std::vector<int32_t> ids(vocab_size);
    for (int64_t i = 0; i < vocab_size; ++i) ids[i] = static_cast<int32_t>(i);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int32_t i = 0; i < n; ++i) {
      out.top_logprobs.push_back({ids[i], static_cast<float>(logits[ids[i]] - log_z)});
    }
  }
  return out;
}

SequenceSampler::SequenceSampler(const SamplingParams& params,
                                 absl::Span<const int32_t> prompt_ids, int64_t vocab_size)
    : params_(params), vocab_size_(vocab_size), rng_(params.seed), scratch_(vocab_size) {
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t id : prompt_ids) seen_[id] = true;
  }
}

void SequenceSampler::ApplyPenalties(float* logits) const {
  if (params_.repetition_penalty != 1.0f) {
    for (const auto& [id, unused] : seen_) {
      logits[id] = logits[id] > 0 ? logits[id] / params_.repetition_penalty
                                  : logits[id] * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : output_counts_) {
      logits[id] -= params_.presence_penalty + params_.frequency_penalty * count;
    }
  }
}

int32_t SequenceSampler::PickFromDistribution(const float* logits) {
  // Candidates sorted by logit, truncated by top-k; then softmax, min-p, top-p.
  candidates_.clear();
  candidates_.reserve(vocab_size_);
  for (int64_t i = 0; i < vocab_size_; ++i) candidates_.push_back({logits[i], static_cast<int32_t>(i)});
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) keep = params_.top_k;
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  candidates_.resize(keep);

  const double inv_temperature = 1.0 / params_.temperature;
  const double max_logit = candidates_[0].first;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates_[i].first - max_logit) * inv_temperature);
    sum += probs[i];
  }
  // min-p: relative to the most likely token (probs[0] / sum).
  if (params_.min_p > 0) {
    const double threshold = params_.min_p * probs[0];
    while (keep > 1 && probs[keep - 1] < threshold) sum -= probs[--keep];
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / sum;
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    for (size_t i = cut; i < keep; ++i) sum -= probs[i];
    keep = cut;
  }
  const double target = UniformDouble(rng_) * sum;
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += probs[i];
    if (target < cumulative) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

SampledToken SequenceSampler::Sample(const float* logits) {
  float* work = scratch_.data();
  std::copy(logits, logits + vocab_size_, work);
  ApplyPenalties(work);
  const int32_t token = params_.temperature == 0.0f || params_.top_k == 1
                            ? Argmax(work, vocab_size_)
                            : PickFromDistribution(work);
  SampledToken sampled;
  if (params_.num_logprobs >= 0) {
    sampled = RawLogprobs(logits, vocab_size_, token, params_.num_logprobs);
  } else {
    sampled.token_id = token;
  }
  output_counts_[token]++;
  if (params_.repetition_penalty != 1.0f) seen_[token] = true;
  return sampled;
}

void SequenceSampler::RecordOutput(int32_t token_id) {
  // PickFromDistribution draws exactly one number per sample; greedy draws none.
  if (!(params_.temperature == 0.0f || params_.top_k == 1)) UniformDouble(rng_);
  output_counts_[token_id]++;
  if (params_.repetition_penalty != 1.0f) seen_[token_id] = true;
}

}  // namespace loom::worker
