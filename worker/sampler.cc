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

// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijective mix of 64 bits.
uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The first index of the largest logit (NaNs never win). Two passes over independent lanes
// so that both vectorize: the vocabulary scan runs once per sampled token.
int32_t Argmax(const float* logits, int64_t n) {
  constexpr int kLanes = 16;
  float lane_max[kLanes];
  for (int j = 0; j < kLanes; ++j) lane_max[j] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      lane_max[j] = logits[i + j] > lane_max[j] ? logits[i + j] : lane_max[j];
    }
  }
  float best = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < kLanes; ++j) best = lane_max[j] > best ? lane_max[j] : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (int64_t k = 0; k < n; ++k) {
    if (logits[k] == best) return static_cast<int32_t>(k);
  }
  return 0;  // every logit NaN or -inf
}

}  // namespace

void WriteSampledToken(const SampledToken& token, bool with_logprobs,
                       loom::v1::SequenceOutput& output) {
  output.set_token_id(token.token_id);
  if (!token.error.empty()) output.set_error_message(token.error);
  output.mutable_embedding()->Add(token.embedding.begin(), token.embedding.end());
  if (!with_logprobs) return;
  output.set_logprob(token.logprob);
  for (const TokenLogprob& alternative : token.top_logprobs) {
    loom::v1::TokenLogprob* top = output.add_top_logprobs();
    top->set_token_id(alternative.token_id);
    top->set_logprob(alternative.logprob);
  }
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

void SequenceSampler::ApplyPenalties(float* logits, absl::Span<const int32_t> pending) const {
  if (params_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t id) {
      logits[id] = logits[id] > 0 ? logits[id] / params_.repetition_penalty
                                  : logits[id] * params_.repetition_penalty;
    };
    for (const auto& [id, unused] : seen_) penalize(id);
    // Pending tokens not seen yet, each once (a set, like seen_).
    for (size_t i = 0; i < pending.size(); ++i) {
      const int32_t id = pending[i];
      if (seen_.contains(id) ||
          std::find(pending.begin(), pending.begin() + i, id) != pending.begin() + i) {
        continue;
      }
      penalize(id);
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    // Pending tokens as if recorded: one subtraction per token with its whole count, so the
    // rounding is plain decoding's once they are (and the device sampler's).
    auto pending_count = [&](int32_t id) {
      return static_cast<int>(std::count(pending.begin(), pending.end(), id));
    };
    for (const auto& [id, count] : output_counts_) {
      logits[id] -=
          params_.presence_penalty +
          params_.frequency_penalty * (pending.empty() ? count : count + pending_count(id));
    }
    for (size_t i = 0; i < pending.size(); ++i) {
      const int32_t id = pending[i];
      if (output_counts_.contains(id) ||
          std::find(pending.begin(), pending.begin() + i, id) != pending.begin() + i) {
        continue;  // counted above, or at its first pending occurrence
      }
      logits[id] -= params_.presence_penalty + params_.frequency_penalty * pending_count(id);
    }
  }
}

void SequenceSampler::ApplyBiasAndSuppression(float* logits, size_t num_pending) const {
  for (const auto& [id, bias] : params_.logit_bias) logits[id] += bias;
  if (num_outputs_ + static_cast<int64_t>(num_pending) < params_.min_tokens) {
    for (int32_t id : params_.min_tokens_suppressed_ids) {
      logits[id] = -std::numeric_limits<float>::infinity();
    }
  }
}

const float* SequenceSampler::Penalized(const float* logits, absl::Span<const int32_t> pending) {
  const bool penalized = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                         params_.frequency_penalty != 0.0f;
  const bool adjusted =
      !params_.logit_bias.empty() ||
      num_outputs_ + static_cast<int64_t>(pending.size()) < params_.min_tokens;
  if (!penalized && !adjusted) return logits;
  std::copy(logits, logits + vocab_size_, scratch_.data());
  if (adjusted) ApplyBiasAndSuppression(scratch_.data(), pending.size());
  if (penalized) ApplyPenalties(scratch_.data(), pending);
  return scratch_.data();
}

size_t SequenceSampler::BuildCandidates(const float* logits, double& sum) {
  // The distribution: top-k over logits (ties to the lower id), softmax at the temperature,
  // min-p relative to the most likely token, top-p over the tokens in descending order.
  // Only what the filters need is sorted: the top-k survivors, or the nucleus prefix,
  // grown until it reaches top_p. Without top-k/top-p nothing is sorted and the draw walks
  // the survivors in id order (the same distribution).
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const double inv_temperature = 1.0 / params_.temperature;
  const int32_t best = Argmax(logits, vocab_size_);
  const float max_logit = logits[best];
  // min-p keeps p >= min_p * p_max, i.e. logit >= max + T ln(min_p); the exp below
  // decides the boundary exactly as the probability comparison would.
  const double min_weight = params_.min_p > 0 ? params_.min_p : 0.0;
  candidates_.clear();
  weights_.clear();
  sum = 0;
  const bool top_k = params_.top_k > 0 && params_.top_k < vocab_size_;
  if (top_k) {
    candidates_.reserve(vocab_size_);
    for (int64_t i = 0; i < vocab_size_; ++i) candidates_.push_back({logits[i], static_cast<int32_t>(i)});
    std::nth_element(candidates_.begin(), candidates_.begin() + (params_.top_k - 1),
                     candidates_.end(), by_logit);
    candidates_.resize(params_.top_k);
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
    for (const auto& [logit, id] : candidates_) {
      const double weight = std::exp((logit - max_logit) * inv_temperature);
      if (weight < min_weight) break;  // sorted: the rest are smaller still
      weights_.push_back(weight);
    }
    candidates_.resize(weights_.size());
  } else {
    // Tokens more than 40 nats below the best (weight < 5e-18 each, under the double
    // rounding of the sum) are left out without an exp.
    const float floor = static_cast<float>(max_logit - 40.0 * params_.temperature);
    for (int64_t i = 0; i < vocab_size_; ++i) {
      if (!(logits[i] >= floor)) continue;
      const double weight = std::exp((logits[i] - max_logit) * inv_temperature);
      if (weight >= min_weight) {
        candidates_.push_back({logits[i], static_cast<int32_t>(i)});
        weights_.push_back(weight);
      }
    }
  }
  if (weights_.empty()) return 0;  // no finite logit: nothing to weigh
  for (double weight : weights_) sum += weight;
  size_t keep = weights_.size();
  if (params_.top_p < 1.0f) {
    // The nucleus: the fewest most likely tokens whose mass reaches top_p. Sort a prefix
    // big enough to hold it (64, 256, ... tokens; ends at the whole list).
    const double target_mass = static_cast<double>(params_.top_p) * sum;
    size_t sorted = top_k ? keep : 0;
    double cumulative = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      if (i == sorted) {
        const size_t grow = std::min(keep, std::max<size_t>(64, 4 * sorted));
        std::nth_element(candidates_.begin() + sorted, candidates_.begin() + (grow - 1),
                         candidates_.begin() + keep, by_logit);
        std::sort(candidates_.begin() + sorted, candidates_.begin() + grow, by_logit);
        for (size_t j = sorted; j < grow; ++j) {
          weights_[j] = std::exp((candidates_[j].first - max_logit) * inv_temperature);
        }
        sorted = grow;
      }
      cumulative += weights_[i];
      if (cumulative >= target_mass) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = cumulative;
  }
  return keep;
}

int32_t SequenceSampler::PickFromDistribution(const float* logits) {
  double sum = 0;
  const size_t keep = BuildCandidates(logits, sum);
  if (keep == 0) {  // no finite logit (still one draw per sample)
    UniformDouble(rng_);
    return Argmax(logits, vocab_size_);
  }
  const double target = UniformDouble(rng_) * sum;
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += weights_[i];
    if (target < cumulative) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

void SequenceSampler::Distribution(const float* logits, absl::Span<const int32_t> pending,
                                   float* probs) {
  const float* work = Penalized(logits, pending);
  std::fill(probs, probs + vocab_size_, 0.0f);
  if (greedy()) {
    probs[Argmax(work, vocab_size_)] = 1.0f;
    return;
  }
  double sum = 0;
  const size_t keep = BuildCandidates(work, sum);
  if (keep == 0) {
    probs[Argmax(work, vocab_size_)] = 1.0f;
    return;
  }
  const double inv_sum = 1.0 / sum;
  for (size_t i = 0; i < keep; ++i) {
    probs[candidates_[i].second] = static_cast<float>(weights_[i] * inv_sum);
  }
}

int32_t SequenceSampler::PenalizedArgmax(const float* logits, absl::Span<const int32_t> pending) {
  return Argmax(Penalized(logits, pending), vocab_size_);
}

double SequenceSampler::PositionUniform(int64_t position, uint32_t stream) const {
  const uint64_t key =
      SplitMix64(SplitMix64(SplitMix64(params_.seed) ^ static_cast<uint64_t>(position)) ^ stream);
  return static_cast<double>(key >> 11) * (1.0 / 9007199254740992.0);
}

void SequenceSampler::SetGrammar(std::unique_ptr<common::GrammarMatcher> grammar) {
  grammar_ = std::move(grammar);
  if (grammar_ != nullptr) AdvanceGrammar(-1);
}

void SequenceSampler::AdvanceGrammar(int32_t token) {
  if (next_mask_.valid()) next_mask_.wait();  // the old state's computation is done with
  if (token >= 0 && !grammar_->AcceptToken(token)) {
    // A token the mask did not allow (only outputs sent again after a preemption bypass
    // it, and they were allowed when sampled): nothing can follow.
    grammar_->Invalidate();
  }
  // The next mask on another thread, overlapping the next forward pass (a state seen
  // before returns its cached mask at once).
  next_mask_ = std::async(std::launch::async,
                          [automaton = grammar_->automaton(), state = grammar_->state()] {
                            return automaton->AllowedTokens(state);
                          });
}

const float* SequenceSampler::Masked(const float* logits, const float* raw) {
  if (logits != scratch_.data()) std::copy(logits, logits + vocab_size_, scratch_.data());
  std::shared_ptr<const common::TokenMask> mask =
      next_mask_.valid() ? next_mask_.get() : grammar_->AllowedTokens();
  const int64_t mask_tokens = std::min<int64_t>(vocab_size_, static_cast<int64_t>(mask->size()) * 64);
  bool any = false;
  bool any_finite = false;
  constexpr float kForbidden = -std::numeric_limits<float>::infinity();
  for (int64_t id = 0; id < mask_tokens; ++id) {
    if (common::MaskAllows(*mask, static_cast<int32_t>(id))) {
      any = true;
      any_finite = any_finite || scratch_[id] > kForbidden;
    } else {
      scratch_[id] = kForbidden;
    }
  }
  std::fill(scratch_.begin() + mask_tokens, scratch_.end(), kForbidden);
  if (any && !any_finite) {
    // The request's other constraints forbid every token the grammar allows (min_tokens
    // suppressing the end token where the document is complete): the grammar wins, so the
    // text stays valid, with the model's own logits over what it allows.
    for (int64_t id = 0; id < mask_tokens; ++id) {
      if (common::MaskAllows(*mask, static_cast<int32_t>(id))) {
        scratch_[id] = std::isfinite(raw[id]) ? raw[id] : 0.0f;
      }
    }
  }
  if (!any) {
    // A dead end (no token can continue the text): end it rather than emit invalid text,
    // and say why (Sample reports it with the token).
    grammar_error_ = grammar_->automaton()->overflowed()
                         ? absl::StrFormat(
                               "the grammar became too ambiguous to match after this text "
                               "(more than %d parser steps for the next byte); simplify it",
                               common::GrammarAutomaton::kMaxClosureSteps)
                         : std::string("the grammar allows no token after this text (a dead end)");
    const auto& end_ids = grammar_->automaton()->trie()->end_ids();
    if (!end_ids.empty() && end_ids[0] < vocab_size_) scratch_[end_ids[0]] = 0.0f;
  }
  return scratch_.data();
}

SampledToken SequenceSampler::Sample(const float* logits) {
  const float* work = Penalized(logits, {});
  grammar_error_.clear();
  if (grammar_ != nullptr) work = Masked(work, logits);
  const int32_t token = greedy() ? Argmax(work, vocab_size_) : PickFromDistribution(work);
  if (grammar_ != nullptr) AdvanceGrammar(token);
  SampledToken sampled;
  if (params_.num_logprobs >= 0) {
    sampled = RawLogprobs(logits, vocab_size_, token, params_.num_logprobs);
  } else {
    sampled.token_id = token;
  }
  sampled.error = std::move(grammar_error_);
  ++num_outputs_;
  output_counts_[token]++;
  if (params_.repetition_penalty != 1.0f) seen_[token] = true;
  return sampled;
}

void SequenceSampler::PenaltyEntries(std::vector<int32_t>& tokens, std::vector<int32_t>& counts,
                                     absl::Span<const int32_t> pending) const {
  const bool repetition = params_.repetition_penalty != 1.0f;
  const bool counted = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  const size_t from = tokens.size();
  if (repetition) {
    for (const auto& [id, unused] : seen_) {
      const auto found = output_counts_.find(id);
      tokens.push_back(id);
      counts.push_back(found == output_counts_.end() ? 0 : found->second);
    }
  }
  if (counted) {
    for (const auto& [id, count] : output_counts_) {
      if (repetition && seen_.contains(id)) continue;  // listed above
      tokens.push_back(id);
      counts.push_back(count);
    }
  }
  if (!repetition && !counted) return;
  // Each pending token counts once more, or joins the list (the repetition penalty then
  // counts it as seen; its count matters only to presence and frequency).
  for (const int32_t token : pending) {
    const auto end = tokens.begin() + static_cast<std::ptrdiff_t>(tokens.size());
    const auto listed = std::find(tokens.begin() + static_cast<std::ptrdiff_t>(from), end, token);
    if (listed != end) {
      ++counts[listed - tokens.begin()];
    } else {
      tokens.push_back(token);
      counts.push_back(1);
    }
  }
}

void SequenceSampler::RecordOutput(int32_t token_id) {
  // PickFromDistribution draws exactly one number per sample; greedy draws none.
  if (!greedy()) UniformDouble(rng_);
  if (grammar_ != nullptr) AdvanceGrammar(token_id);
  ++num_outputs_;
  output_counts_[token_id]++;
  if (params_.repetition_penalty != 1.0f) seen_[token_id] = true;
}

}  // namespace loom::worker
