// Encode throughput of Loom's tokenizer in MB/s of UTF-8 input, single-threaded, median
// of several runs over a few MB of mixed text (prose, code, numbers, other scripts,
// emoji, whitespace runs). bench/tokenizer_bench.py runs this on the same text as
// Hugging Face `tokenizers` and reports the ratio; alone it prints only its own figure.
//
// usage: tokenizer_bench [--model PATH] [--text FILE] [--runs N] [--json]
//   --text FILE  documents separated by NUL bytes (default: ~4 MB generated here)
//   --json       print one JSON object (MB/s, token count, FNV-1a hash of all ids)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/formats/gguf_file.h"
#include "common/tokenizer/tokenizer.h"

namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Deterministic mixed text: ~`total_bytes` split into documents of 1-8 KB.
std::vector<std::string> GenerateDocuments(size_t total_bytes) {
  static const char* const kWords[] = {
      "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be",
      "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which", "but",
      "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
      "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
      "tokenizer", "throughput", "inference", "scheduler", "attention", "Transformer", "GPU",
      "don't", "it's", "we'll", "they're", "I've", "naïve", "café", "Straße", "über"};
  static const char* const kOther[] = {
      "привет мир", "Καλημέρα κόσμε", "你好，世界", "我想在apple工作", "こんにちは世界",
      "안녕하세요", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Cửa Việt", "😀", "🚀🚀",
      "👩\u200d💻", "🦙", "✅", "→", "€100", "±0.5°C"};
  static const char* const kCode[] = {
      "def forward(self, x):\n    return self.proj(x) + x\n",
      "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
      "{\"model\": \"smollm2\", \"max_tokens\": 256, \"stream\": true}\n",
      "SELECT id, name FROM users WHERE age > 30 ORDER BY name;\n",
      "<div class=\"row\"><span>42</span></div>\n", "x = [i ** 2 for i in range(10)]\n"};
  std::mt19937 rng(12345);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::vector<std::string> documents;
  size_t produced = 0;
  while (produced < total_bytes) {
    std::string doc;
    const size_t target = 1024 + pick(7 * 1024);
    while (doc.size() < target) {
      const size_t kind = pick(20);
      if (kind < 14) {
        doc += kWords[pick(std::size(kWords))];
        doc += pick(12) == 0 ? ", " : " ";
      } else if (kind < 16) {
        doc += std::to_string(rng() % 100000);
        doc += " ";
      } else if (kind < 17) {
        doc += kOther[pick(std::size(kOther))];
        doc += " ";
      } else if (kind < 18) {
        doc += kCode[pick(std::size(kCode))];
      } else if (kind < 19) {
        doc += ". ";
      } else {
        doc += pick(3) == 0 ? "\n\n" : (pick(2) == 0 ? "\n" : "    ");
      }
    }
    produced += doc.size();
    documents.push_back(std::move(doc));
  }
  return documents;
}

std::vector<std::string> ReadDocuments(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "tokenizer_bench: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<std::string> documents;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) documents.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return documents;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env_model = std::getenv("LOOM_MODEL_PATH");
  std::string model_path =
      env_model != nullptr ? env_model : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string text_path;
  int runs = 7;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--model" && i + 1 < argc) {
      model_path = argv[++i];
    } else if (arg == "--text" && i + 1 < argc) {
      text_path = argv[++i];
    } else if (arg == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--json") {
      json = true;
    } else {
      std::fprintf(stderr,
                   "usage: tokenizer_bench [--model PATH] [--text FILE] [--runs N] [--json]\n");
      return 2;
    }
  }
  auto gguf = loom::common::GgufFile::Open(model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", gguf.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = loom::common::Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  const std::vector<std::string> documents =
      text_path.empty() ? GenerateDocuments(4 << 20) : ReadDocuments(text_path);
  size_t total_bytes = 0;
  for (const std::string& doc : documents) total_bytes += doc.size();

  // One untimed pass warms caches and gives the ids to check against the reference.
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the ids' 32-bit values
  size_t num_tokens = 0;
  for (const std::string& doc : documents) {
    for (int32_t id : (*tokenizer)->Encode(doc, /*add_special=*/false, /*parse_special=*/true)) {
      hash = (hash ^ static_cast<uint32_t>(id)) * 1099511628211ull;
      ++num_tokens;
    }
  }
  std::vector<double> mb_per_s;
  for (int run = 0; run < runs; ++run) {
    size_t tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& doc : documents) tokens += (*tokenizer)->Encode(doc, false, true).size();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (tokens != num_tokens) std::abort();  // keeps the work observable
    mb_per_s.push_back(static_cast<double>(total_bytes) / 1e6 / seconds);
  }
  const double median = Median(mb_per_s);
  if (json) {
    std::printf("{\"mb_per_s\": %.3f, \"bytes\": %zu, \"documents\": %zu, \"tokens\": %zu, "
                "\"ids_fnv1a\": \"%016llx\", \"runs\": %d}\n",
                median, total_bytes, documents.size(), num_tokens,
                static_cast<unsigned long long>(hash), runs);
  } else {
    std::printf("loom encode: %.2f MB/s single-threaded (median of %d runs, %.2f MB in %zu "
                "documents, %zu tokens)\n",
                median, runs, total_bytes / 1e6, documents.size(), num_tokens);
    std::printf("baseline: run bench/tokenizer_bench.py for Hugging Face tokenizers on the same "
                "text and the ratio\n");
  }
  return 0;
}
