// Structured-output cost on the default model's vocabulary (49,152 tokens): schema
// compile time (cold and from the cache), and the per-token cost of the grammar mask for
// a 10-field nested JSON schema (computing the allowed-token mask, applying it to a
// logits row as the sampler does, advancing the matcher), cold (a fresh automaton: every
// state's mask computed) and warm (the same schema again: masks from the per-state
// cache), held against the step time of a batch of 16 decoding sequences measured in
// the same run. Writes bench/results/grammar.json.
//
// usage: grammar_bench [--model PATH] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/machine_limits.h"
#include "common/formats/gguf_file.h"
#include "common/grammar/grammar_matcher.h"
#include "common/grammar/grammar_spec.h"
#include "common/tokenizer/token_trie.h"
#include "common/tokenizer/tokenizer.h"
#include "cli/local_engine.h"
#include "common/formats/model_config.h"
#include "worker/step_backend_factory.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Ten fields, two levels of nesting, strings, enums, ranges, arrays and a format.
constexpr char kSchema[] = R"({"type":"object","properties":{
  "id":{"type":"string","format":"uuid"},
  "name":{"type":"string","maxLength":24},
  "age":{"type":"integer","minimum":0,"maximum":150},
  "email":{"type":"string","pattern":"^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
  "score":{"type":"number"},
  "active":{"type":"boolean"},
  "role":{"enum":["admin","user","guest"]},
  "tags":{"type":"array","items":{"type":"string","maxLength":10},"maxItems":4},
  "address":{"type":"object","properties":{"street":{"type":"string","maxLength":30},
     "city":{"type":"string","maxLength":20},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
     "required":["street","city","zip"],"additionalProperties":false},
  "created":{"type":"string","format":"date-time"}},
  "required":["id","name","age","email","score","active","role","tags","address","created"],
  "additionalProperties":false})";

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// A random document of the grammar (a byte walk that prefers closing once long).
std::string RandomDocument(loom::common::GrammarAutomaton& automaton, std::mt19937& rng) {
  std::string doc;
  int32_t state = automaton.Initial();
  while (!automaton.IsAccepting(state) || automaton.CanContinue(state)) {
    if (automaton.IsAccepting(state) && rng() % 2 == 0) break;
    std::vector<uint8_t> options;
    for (int b = 32; b < 127; ++b) {  // printable ASCII keeps the documents readable
      if (automaton.Advance(state, static_cast<uint8_t>(b)) != loom::common::GrammarAutomaton::kDead) options.push_back(b);
    }
    if (options.empty()) break;
    uint8_t byte = options[rng() % options.size()];
    for (uint8_t b : options) {
      if (doc.size() > 200 && (b == '"' || b == '}' || b == ']')) byte = b;
    }
    doc.push_back(static_cast<char>(byte));
    state = automaton.Advance(state, byte);
  }
  return doc;
}

// Per-token seconds of mask + apply + advance over `docs`.
std::vector<double> MaskCosts(const std::shared_ptr<loom::common::GrammarAutomaton>& automaton,
                              const std::vector<std::vector<int32_t>>& docs, int64_t vocab) {
  std::vector<double> costs;
  std::vector<float> logits(vocab), scratch(vocab);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = static_cast<float>(i % 97) * 0.01f;
  for (const auto& ids : docs) {
    loom::common::GrammarMatcher matcher(automaton);
    for (int32_t id : ids) {
      const auto start = Clock::now();
      auto mask = matcher.AllowedTokens();
      std::copy(logits.begin(), logits.end(), scratch.begin());
      for (int64_t t = 0; t < vocab; ++t) {
        if (!loom::common::MaskAllows(*mask, static_cast<int32_t>(t))) scratch[t] = -std::numeric_limits<float>::infinity();
      }
      if (!matcher.AcceptToken(id)) {
        std::fprintf(stderr, "token %d rejected\n", id);
        std::exit(1);
      }
      costs.push_back(Since(start));
    }
  }
  return costs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (const char* env = std::getenv("LOOM_MODEL_PATH")) model_path = env;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model_path = argv[i + 1];
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
  }
  auto gguf = loom::common::GgufFile::Open(model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = loom::common::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  auto start = Clock::now();
  auto trie = loom::common::TokenTrie::FromTokenizer(**tokenizer);
  const double trie_seconds = Since(start);
  const int64_t vocab = trie->vocab_size();
  std::printf("vocabulary %lld tokens, trie %zu nodes built in %.1f ms\n", static_cast<long long>(vocab),
              trie->nodes().size(), trie_seconds * 1e3);

  // Compile: cold (every time) and through the cache.
  const loom::common::GrammarSpec spec{loom::common::GrammarKind::kJsonSchema, kSchema};
  std::vector<double> cold, cached;
  for (int r = 0; r < 5; ++r) {
    start = Clock::now();
    if (!loom::common::CompileGrammarSpec(spec).ok()) return 1;
    cold.push_back(Since(start));
  }
  loom::common::GrammarCache cache;
  auto grammar = cache.Get(spec);
  if (!grammar.ok()) {
    std::fprintf(stderr, "%s\n", grammar.status().ToString().c_str());
    return 1;
  }
  for (int r = 0; r < 1000; ++r) {
    start = Clock::now();
    if (!cache.Get(spec).ok()) return 1;
    cached.push_back(Since(start));
  }
  const double compile_cold = loom::bench::Median(cold), compile_cached = loom::bench::Median(cached);
  std::printf("schema compile: cold %.3f ms, cached %.2f us (%zu rules, %zu elements)\n", compile_cold * 1e3,
              compile_cached * 1e6, (*grammar)->rule_names().size(), (*grammar)->elements().size());

  // Documents tokenized by the tokenizer (not split by the mask).
  auto walker = std::make_shared<loom::common::GrammarAutomaton>(*grammar, nullptr);
  std::mt19937 rng(42);
  std::vector<std::vector<int32_t>> docs;
  size_t doc_tokens = 0;
  for (int d = 0; d < 40; ++d) {
    docs.push_back((*tokenizer)->Encode(RandomDocument(*walker, rng), false, false));
    doc_tokens += docs.back().size();
  }
  std::printf("40 random documents, %zu tokens\n", doc_tokens);

  auto automaton = std::make_shared<loom::common::GrammarAutomaton>(*grammar, trie);
  const std::vector<double> first = MaskCosts(automaton, {docs.begin(), docs.begin() + 20}, vocab);
  const std::vector<double> warm = MaskCosts(automaton, {docs.begin() + 20, docs.end()}, vocab);
  std::vector<double> all_costs = first;
  all_costs.insert(all_costs.end(), warm.begin(), warm.end());
  double mean = 0;
  for (double c : all_costs) mean += c;
  mean /= static_cast<double>(all_costs.size());
  std::printf("mask per token (first 20 documents, fresh automaton): median %.1f us, p99 %.1f us\n",
              loom::bench::Median(first) * 1e6, Percentile(first, 0.99) * 1e6);
  std::printf("mask per token (next 20 documents, warm): median %.1f us, p99 %.1f us; all: mean %.1f us\n",
              loom::bench::Median(warm) * 1e6, Percentile(warm, 0.99) * 1e6, mean * 1e6);
  std::printf("automaton: %lld states\n", static_cast<long long>(automaton->num_states()));

  // The step it is held against: 16 sequences decoding on the CPU forward pass, through the
  // serving engine.
  loom::worker::StepBackendOptions options;
  options.num_threads = threads;
  options.num_kv_blocks = 512;
  auto config = loom::common::ModelConfigFromGguf(**gguf);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  auto backend = loom::worker::CreateStepBackend(options, **gguf, *config);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  loom::cli::LocalEngine engine(**backend, **tokenizer);
  std::vector<loom::cli::EngineRequest> requests;
  for (int i = 0; i < 16; ++i) {
    loom::cli::EngineRequest request;
    request.prompt_ids = (*tokenizer)->Encode("Describe a user record number " + std::to_string(i), true, false);
    request.sampling.temperature = 0.0f;
    request.max_tokens = 32;
    request.ignore_eos = true;
    requests.push_back(std::move(request));
  }
  std::vector<double> step_times;
  for (int r = 0; r < 3; ++r) {
    auto results = engine.Generate(requests);
    if (!results.ok()) {
      std::fprintf(stderr, "%s\n", results.status().ToString().c_str());
      return 1;
    }
    double seconds = 0;
    for (const auto& result : *results) seconds = std::max(seconds, result.decode_seconds);
    step_times.push_back(seconds / 31);  // 31 decode steps after the prefill's token
  }
  const double step = loom::bench::Median(step_times);
  // Every sequence of the batch constrained: 16 masks per step (done on the host, in
  // sequence, in the worst case that nothing overlaps the forward pass).
  const double ratio = 16 * mean / step;
  std::printf("batch-16 decode step: %.2f ms; 16 constrained sequences add %.2f ms = %.3f of the step "
              "(target < 0.05)\n", step * 1e3, 16 * mean * 1e3, ratio);

  loom::bench::WriteResult(
      "grammar",
      absl::StrFormat(
          "{\"cpu\": \"%s\", \"threads\": %d, \"vocab\": %d, \"trie_build_ms\": %.2f, "
          "\"compile_cold_ms\": %.3f, \"compile_cached_us\": %.3f, \"doc_tokens\": %d, "
          "\"mask_us_first_median\": %.2f, \"mask_us_first_p99\": %.2f, "
          "\"mask_us_warm_median\": %.2f, \"mask_us_warm_p99\": %.2f, \"mask_us_mean\": %.2f, "
          "\"batch16_step_ms\": %.3f, \"mask_vs_step_at_batch16\": %.4f, \"target\": 0.05}",
          loom::bench::CpuModel(), threads, vocab, trie_seconds * 1e3, compile_cold * 1e3,
          compile_cached * 1e6, doc_tokens, loom::bench::Median(first) * 1e6, Percentile(first, 0.99) * 1e6,
          loom::bench::Median(warm) * 1e6, Percentile(warm, 0.99) * 1e6, mean * 1e6, step * 1e3, ratio));
  return 0;
}
