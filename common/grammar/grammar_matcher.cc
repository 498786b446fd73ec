#include "common/grammar/grammar_matcher.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"

namespace loom::common {

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar,
                                   std::shared_ptr<const TokenTrie> trie)
    : grammar_(std::move(grammar)), trie_(std::move(trie)) {
  absl::MutexLock lock(&mu_);
  nodes_.push_back({-1, 0});  // node 0: the document is complete
  Closure closure;
  for (int32_t start : grammar_->rule_alternatives()[grammar_->root_rule()]) {
    Expand(start, 0, closure);
  }
  initial_ = InternClosure(std::move(closure));
}

absl::Status GrammarAutomaton::CheckStartFits(std::shared_ptr<const Grammar> grammar) {
  GrammarAutomaton automaton(std::move(grammar), nullptr);
  if (!automaton.overflowed()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the grammar is too ambiguous to match: listing the parses open before its first byte "
      "takes more than %d steps (nested optional repeats such as ((a?){n}){m} multiply them, "
      "as do empty rules used twice in a chain); simplify it",
      kMaxClosureSteps));
}

bool GrammarAutomaton::overflowed() {
  absl::MutexLock lock(&mu_);
  return overflowed_;
}

int32_t GrammarAutomaton::InternClosure(Closure closure) {
  if (closure.overflowed) {
    overflowed_ = true;
    return kDead;
  }
  return InternState(std::move(closure.nodes));
}

int32_t GrammarAutomaton::InternNode(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(pos) << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = node_index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void GrammarAutomaton::Expand(int32_t pos, int32_t parent, Closure& closure) {
  const auto& elements = grammar_->elements();
  std::vector<int32_t>& out = closure.nodes;
  // The closure over (element, return node) pairs, with a worklist and each pair once:
  // rules enter rules as deep as a grammar nests them (no recursion: a worker's stack), and
  // an empty rule passes straight to the element after it, so the same pair is reached on
  // many paths. Distinct pairs can still multiply (kMaxClosureSteps bounds them).
  std::vector<std::pair<int32_t, int32_t>> work = {{pos, parent}};
  while (!work.empty() && !closure.overflowed) {
    const auto [at, back] = work.back();
    work.pop_back();
    if (!closure.seen.insert((static_cast<uint64_t>(at) << 32) | static_cast<uint32_t>(back))
             .second) {
      continue;
    }
    if (static_cast<int64_t>(closure.seen.size()) > kMaxClosureSteps) {
      closure.overflowed = true;
      break;
    }
    const GrammarElement& el = elements[at];
    if (el.kind == GrammarElement::Kind::kEnd) {
      if (back == 0) {
        out.push_back(0);
      } else {
        const Node up = nodes_[back];
        work.emplace_back(up.pos, up.parent);
      }
      continue;
    }
    if (el.kind == GrammarElement::Kind::kBytes) {
      out.push_back(InternNode(at, back));
      continue;
    }
    // A rule reference as the last element returns straight to `back` (a tail call), so
    // right-recursive repetition adds no node.
    const int32_t ret =
        elements[at + 1].kind == GrammarElement::Kind::kEnd ? back : InternNode(at + 1, back);
    for (int32_t start : grammar_->rule_alternatives()[el.value]) work.emplace_back(start, ret);
  }
}

int32_t GrammarAutomaton::InternState(std::vector<int32_t> nodes) {
  if (nodes.empty()) return kDead;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  auto it = state_index_.find(nodes);
  if (it != state_index_.end()) return it->second;
  State state;
  const auto& elements = grammar_->elements();
  for (int32_t node : nodes) {
    if (node == 0) continue;
    state.next_bytes |= grammar_->byte_sets()[elements[nodes_[node].pos].value];
  }
  state.nodes = nodes;
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back(std::move(state));
  state_index_.emplace(std::move(nodes), id);
  return id;
}

int32_t GrammarAutomaton::AdvanceLocked(int32_t state, uint8_t byte) {
  if (state == kDead || !states_[state].next_bytes.test(byte)) return kDead;
  const uint64_t key = (static_cast<uint64_t>(state) << 8) | byte;
  auto it = transitions_.find(key);
  if (it != transitions_.end()) return it->second;
  const auto& elements = grammar_->elements();
  Closure closure;
  const std::vector<int32_t> current = states_[state].nodes;
  for (int32_t node_id : current) {
    if (node_id == 0) continue;
    const Node node = nodes_[node_id];
    if (grammar_->byte_sets()[elements[node.pos].value].test(byte)) {
      Expand(node.pos + 1, node.parent, closure);
    }
  }
  const int32_t next = InternClosure(std::move(closure));
  transitions_.emplace(key, next);
  return next;
}

int32_t GrammarAutomaton::Advance(int32_t state, uint8_t byte) {
  absl::MutexLock lock(&mu_);
  return AdvanceLocked(state, byte);
}

int32_t GrammarAutomaton::AdvanceBytes(int32_t state, std::string_view bytes) {
  absl::MutexLock lock(&mu_);
  for (char c : bytes) {
    state = AdvanceLocked(state, static_cast<uint8_t>(c));
    if (state == kDead) break;
  }
  return state;
}

bool GrammarAutomaton::IsAccepting(int32_t state) {
  if (state == kDead) return false;
  absl::MutexLock lock(&mu_);
  return !states_[state].nodes.empty() && states_[state].nodes[0] == 0;
}

bool GrammarAutomaton::CanContinue(int32_t state) {
  if (state == kDead) return false;
  absl::MutexLock lock(&mu_);
  return states_[state].next_bytes.any();
}

int64_t GrammarAutomaton::num_states() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(states_.size());
}

std::shared_ptr<const TokenMask> GrammarAutomaton::AllowedTokens(int32_t state) {
  absl::MutexLock lock(&mu_);
  auto cached = masks_.find(state);
  if (cached != masks_.end()) return cached->second;
  auto mask = std::make_shared<TokenMask>((trie_->vocab_size() + 63) / 64, 0);
  auto allow = [&mask](int32_t id) { (*mask)[id >> 6] |= uint64_t{1} << (id & 63); };
  if (state != kDead) {
    if (!states_[state].nodes.empty() && states_[state].nodes[0] == 0) {
      for (int32_t id : trie_->end_ids()) allow(id);
    }
    // Depth-first over the trie, pruning subtrees the configuration rejects.
    const auto& nodes = trie_->nodes();
    const auto& ids = trie_->token_ids();
    struct Frame {
      int32_t trie_node;
      int32_t state;
    };
    std::vector<Frame> stack = {{0, state}};
    while (!stack.empty()) {
      const Frame frame = stack.back();
      stack.pop_back();
      const TokenTrie::Node& tn = nodes[frame.trie_node];
      const std::bitset<256> next_bytes = states_[frame.state].next_bytes;  // states_ grows below
      for (int32_t c = tn.first_child; c < tn.first_child + tn.num_children; ++c) {
        if (!next_bytes.test(nodes[c].byte)) continue;
        const int32_t next = AdvanceLocked(frame.state, nodes[c].byte);
        if (next == kDead) continue;
        for (int32_t t = 0; t < nodes[c].num_tokens; ++t) allow(ids[nodes[c].first_token + t]);
        if (nodes[c].num_children > 0) stack.push_back({c, next});
      }
    }
  }
  masks_.emplace(state, mask);
  return mask;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton)
    : automaton_(std::move(automaton)), state_(automaton_->Initial()) {}

bool GrammarMatcher::AcceptToken(int32_t id) {
  if (finished_) return false;
  const TokenTrie* trie = automaton_->trie();
  if (id < 0 || id >= trie->vocab_size()) return false;
  if (trie->IsEnd(id)) {
    if (!automaton_->IsAccepting(state_)) return false;
    history_.push_back(state_);
    finished_ = true;
    return true;
  }
  const std::string& bytes = trie->token_bytes(id);
  if (bytes.empty()) return false;
  const int32_t next = automaton_->AdvanceBytes(state_, bytes);
  if (next == GrammarAutomaton::kDead) return false;
  history_.push_back(state_);
  state_ = next;
  return true;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (finished_) return false;
  const int32_t next = automaton_->AdvanceBytes(state_, bytes);
  if (next == GrammarAutomaton::kDead) return false;
  state_ = next;
  return true;
}

void GrammarMatcher::Rollback(int32_t n) {
  for (; n > 0 && !history_.empty(); --n) {
    state_ = history_.back();
    history_.pop_back();
    finished_ = false;
  }
}

std::shared_ptr<const TokenMask> GrammarMatcher::AllowedTokens() {
  if (finished_) {
    return std::make_shared<const TokenMask>((automaton_->trie()->vocab_size() + 63) / 64, 0);
  }
  return automaton_->AllowedTokens(state_);
}

bool GrammarMatcher::IsAccepting() const { return automaton_->IsAccepting(state_); }

}  // namespace loom::common
