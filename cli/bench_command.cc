#include "cli/bench_command.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/bench_client.h"
#include "cli/bench_openai_client.h"
#include "cli/bench_report.h"
#include "cli/bench_workload.h"
#include "cli/command_line.h"
#include "common/sampling_params.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/inference.grpc.pb.h"

namespace loom::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string api = "grpc";  // grpc | openai
  std::string address = "127.0.0.1:50051";
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;          // openai: the model to request (default: the first listed)
  std::string api_key;        // openai: sent as a bearer token when not empty
  int64_t vocab_size = 0;     // openai: token ids are drawn below it (0: from the server)
  WorkloadOptions workload;
  std::vector<double> concurrencies;  // fixed-concurrency levels
  std::vector<double> request_rates;  // Poisson levels (inf: all at once)
  int64_t max_concurrency = 256;      // rate mode: requests in flight at most
  int64_t warmup = 2;
  int64_t num_speculative_tokens = -1;  // per request; -1: the server's setting
  Slo slo;
  double timeout_s = 600;
  std::string output;
};

// The gRPC API: one Generate call per request, token ids streamed back.
class GrpcBenchClient final : public BenchClient {
 public:
  GrpcBenchClient(std::unique_ptr<loom::v1::Inference::Stub> stub, int64_t num_speculative_tokens)
      : stub_(std::move(stub)), num_speculative_tokens_(num_speculative_tokens) {}

  bool ReturnsTokenIds() const override { return true; }

  std::vector<int32_t> Run(const std::vector<int32_t>& prompt, int32_t max_tokens,
                           double timeout_s, RequestSample& sample) override {
    loom::v1::GenerateRequest request;
    request.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    request.set_max_tokens(max_tokens);
    request.set_ignore_eos(true);
    if (num_speculative_tokens_ >= 0) {
      request.set_num_speculative_tokens(static_cast<int32_t>(num_speculative_tokens_));
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    sample.prompt_tokens = static_cast<int64_t>(prompt.size());
    std::vector<int32_t> output;
    const auto start = Clock::now();
    auto previous = start;
    auto reader = stub_->Generate(&context, request);
    loom::v1::GenerateResponse response;
    while (reader->Read(&response)) {
      const auto now = Clock::now();
      const int n = response.token_ids_size();
      if (n > 0) {
        if (output.empty()) {
          sample.ttft = std::chrono::duration<double>(now - start).count();
          // Tokens that arrived together with the first share the rest of the gap.
          for (int i = 1; i < n; ++i) sample.itl.push_back(0.0);
        } else {
          const double gap = std::chrono::duration<double>(now - previous).count() / n;
          for (int i = 0; i < n; ++i) sample.itl.push_back(gap);
        }
        previous = now;
        output.insert(output.end(), response.token_ids().begin(), response.token_ids().end());
      }
      if (response.finish_reason() != loom::v1::FINISH_REASON_UNSPECIFIED) {
        sample.cached_prompt_tokens = response.cached_prompt_tokens();
        sample.draft_tokens = response.num_draft_tokens();
        sample.accepted_tokens = response.num_accepted_tokens();
        if (response.finish_reason() == loom::v1::FINISH_REASON_ERROR ||
            response.finish_reason() == loom::v1::FINISH_REASON_ABORT) {
          sample.error = response.error_message();
        }
      }
    }
    const grpc::Status status = reader->Finish();
    sample.e2e = std::chrono::duration<double>(Clock::now() - start).count();
    sample.output_tokens = static_cast<int64_t>(output.size());
    if (!status.ok()) {
      sample.error = absl::StrFormat("%d %s", status.error_code(), status.error_message());
    }
    sample.ok = status.ok() && sample.error.empty() && !output.empty();
    return output;
  }

 private:
  std::unique_ptr<loom::v1::Inference::Stub> stub_;
  int64_t num_speculative_tokens_ = -1;
};

// Runs a session's turns in order; appends one sample per turn.
void RunSession(BenchClient& client, const BenchSession& session, double timeout_s,
                std::mutex& mu, std::vector<RequestSample>& samples) {
  std::vector<int32_t> conversation = session.prefix;
  for (const BenchTurn& turn : session.turns) {
    conversation.insert(conversation.end(), turn.new_tokens.begin(), turn.new_tokens.end());
    RequestSample sample;
    const std::vector<int32_t> reply =
        client.Run(conversation, turn.max_tokens, timeout_s, sample);
    conversation.insert(conversation.end(), reply.begin(), reply.end());
    const bool ok = sample.ok;
    {
      std::lock_guard<std::mutex> lock(mu);
      samples.push_back(std::move(sample));
    }
    if (!ok) return;  // the rest of the conversation depends on this turn
  }
}

// Draws a progress bar on stderr while `done` < `total` (only on a terminal).
class Progress {
 public:
  Progress(const std::string& label, int64_t total) : label_(label), total_(total) {
    if (!isatty(STDERR_FILENO)) return;
    thread_ = std::thread([this] {
      const auto start = Clock::now();
      while (!stop_.load()) {
        Draw(std::chrono::duration<double>(Clock::now() - start).count());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      Draw(std::chrono::duration<double>(Clock::now() - start).count());
      std::fputc('\n', stderr);
    });
  }
  ~Progress() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::atomic<int64_t> done{0};

 private:
  void Draw(double seconds) {
    constexpr int kWidth = 30;
    const int64_t d = done.load();
    const int filled = total_ > 0 ? static_cast<int>(kWidth * d / total_) : kWidth;
    std::fprintf(stderr, "\r%-18s [%s%s] %lld/%lld %.1fs", label_.c_str(),
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                 static_cast<long long>(d), static_cast<long long>(total_), seconds);
    std::fflush(stderr);
  }
  std::string label_;
  int64_t total_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int64_t CountTurns(const std::vector<BenchSession>& sessions) {
  int64_t turns = 0;
  for (const BenchSession& session : sessions) turns += static_cast<int64_t>(session.turns.size());
  return turns;
}

// One load level: `concurrency` clients, or Poisson arrivals at `rate` (with at most
// max_concurrency sessions in flight).
nlohmann::json RunLevel(BenchClient& client, const std::vector<BenchSession>& sessions,
                        const BenchOptions& options, bool rate_mode, double level) {
  std::mutex mu;
  std::vector<RequestSample> samples;
  Progress progress(rate_mode ? absl::StrFormat("rate %g/s", level)
                              : absl::StrFormat("concurrency %g", level),
                    CountTurns(sessions));
  auto run = [&](const BenchSession& session) {
    RunSession(client, session, options.timeout_s, mu, samples);
    progress.done.fetch_add(static_cast<int64_t>(session.turns.size()));
  };
  const auto start = Clock::now();
  if (!rate_mode) {
    std::atomic<size_t> next{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < static_cast<int>(level); ++c) {
      clients.emplace_back([&] {
        for (size_t i = next.fetch_add(1); i < sessions.size(); i = next.fetch_add(1)) {
          run(sessions[i]);
        }
      });
    }
    for (std::thread& client : clients) client.join();
  } else {
    std::mt19937_64 rng(options.workload.seed + 1);
    std::exponential_distribution<double> gap(std::isinf(level) ? 1.0 : level);
    std::mutex slots_mu;
    std::condition_variable slots_cv;
    int64_t in_flight = 0;
    std::vector<std::thread> requests;
    for (const BenchSession& session : sessions) {
      if (!std::isinf(level)) {
        std::this_thread::sleep_for(std::chrono::duration<double>(gap(rng)));
      }
      {
        std::unique_lock<std::mutex> lock(slots_mu);
        slots_cv.wait(lock, [&] { return in_flight < options.max_concurrency; });
        ++in_flight;
      }
      requests.emplace_back([&, s = &session] {
        run(*s);
        std::lock_guard<std::mutex> lock(slots_mu);
        --in_flight;
        slots_cv.notify_one();
      });
    }
    for (std::thread& request : requests) request.join();
  }
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();
  nlohmann::json report = SummarizeRun(samples, duration, options.slo);
  if (rate_mode) {
    report["request_rate"] = std::isinf(level) ? nlohmann::json("inf") : nlohmann::json(level);
  } else {
    report["concurrency"] = static_cast<int64_t>(level);
  }
  return report;
}

absl::Status ParseLevels(const std::string& flag, const std::string& value,
                         std::vector<double>& out) {
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    double level = 0;
    if (part == "inf") {
      level = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(part, &level) || level <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: bad level '%s'", flag, part));
    }
    out.push_back(level);
  }
  return absl::OkStatus();
}

// Parses the command line into `options`; nullopt to go on, else the exit code.
std::optional<int> ParseBenchFlags(int argc, char** argv, BenchOptions& options) {
  cli::CommandLine command_line(
      "loom bench",
      "loom bench: load-test a running cluster. Runs the workload once per load level (fixed "
      "concurrency, or Poisson arrivals at each request rate; 'inf' sends all at once) and "
      "prints throughput, TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99), goodput "
      "and the prefix-cache hit rate. Prompts are random token ids with exact lengths; outputs "
      "ignore EOS");
  CLI::App& app = command_line.app();
  WorkloadOptions& w = options.workload;
  constexpr int64_t kMax = int64_t{1} << 30;
  cli::AddString(app, "--api", options.api,
                 "the API to drive: grpc (Loom's) or openai (POST /v1/completions, streaming, on "
                 "Loom or any OpenAI-compatible server)",
                 {"grpc", "openai"});
  app.add_option_function<std::string>(
         "--backend",
         [&options](const std::string& value) {
           options.api = value;
           std::fprintf(stderr, "loom bench: --backend is deprecated: use --api %s\n",
                        value.c_str());
         },
         "deprecated name of --api (default: not given)")
      ->check(CLI::IsMember({"grpc", "openai"}));
  cli::AddString(app, "--address", options.address, "grpc: the coordinator's gRPC endpoint")
      ->check(cli::HostPort());
  cli::AddString(app, "--base-url", options.base_url,
                 "openai: the server's URL (http://host:port, or its /v1 root)");
  cli::AddString(app, "--model", options.model,
                 "openai: the model to request (default: the first of GET /v1/models)");
  cli::AddString(app, "--api-key", options.api_key,
                 "openai: sent as 'Authorization: Bearer KEY' (default: none)");
  cli::AddInt(app, "--vocab-size", options.vocab_size, 0, kMax,
              "openai: prompt token ids are drawn below it (0: the server's, where /v1/models "
              "gives it as llama.cpp's server does)");
  cli::AddString(app, "--dataset", w.dataset, "the workload",
                 {"random", "shared-prefix", "multi-turn"});
  cli::AddInt(app, "--num-requests", w.num_requests, 1, kMax, "requests per level");
  cli::AddInt(app, "--input-len", w.input_len, 1, kMax, "tokens of each request's own part");
  cli::AddInt(app, "--output-len", w.output_len, 1, kMax, "tokens generated per request");
  cli::AddNumber(app, "--range-ratio", w.range_ratio, 0, 1,
                 "lengths uniform in len * [1 - r, 1 + r]");
  cli::AddInt(app, "--prefix-len", w.prefix_len, 0, kMax,
              "shared-prefix: tokens of the shared system prompt");
  cli::AddInt(app, "--num-prefixes", w.num_prefixes, 1, kMax,
              "shared-prefix: distinct system prompts");
  cli::AddInt(app, "--turns", w.turns, 1, kMax, "multi-turn: turns per session");
  cli::AddUint64(app, "--seed", w.seed, "the workload's random seed");
  std::string concurrency;
  std::string request_rate;
  cli::AddString(app, "--concurrency", concurrency,
                 "fixed-concurrency levels C1,C2,... (default 1)");
  cli::AddString(app, "--request-rate", request_rate,
                 "Poisson request rates R1,R2,... per second ('inf': all at once)");
  cli::AddInt(app, "--max-concurrency", options.max_concurrency, 1, kMax,
              "rate mode: requests in flight at most");
  cli::AddInt(app, "--warmup", options.warmup, 0, kMax, "requests sent before each level");
  cli::AddInt(app, "--num-speculative-tokens", options.num_speculative_tokens, -1,
              common::kMaxSpeculativeTokens,
              "speculative drafts per step each request asks for (-1: the server's setting; "
              "the gRPC API reports the drafts proposed and accepted)");
  cli::AddNumber(app, "--slo-ttft-ms", options.slo.ttft_ms, 0, 1e9, "goodput: TTFT limit (0: none)");
  cli::AddNumber(app, "--slo-tpot-ms", options.slo.tpot_ms, 0, 1e9, "goodput: TPOT limit (0: none)");
  cli::AddNumber(app, "--slo-e2e-ms", options.slo.e2e_ms, 0, 1e9,
                 "goodput: end-to-end limit (0: none)");
  cli::AddNumber(app, "--timeout-s", options.timeout_s, 1e-3, 1e9, "deadline of each request");
  cli::AddString(app, "--output", options.output, "write the results as JSON to this file");
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return exit_code;
  if (!concurrency.empty()) {
    if (absl::Status status = ParseLevels("--concurrency", concurrency, options.concurrencies);
        !status.ok()) {
      return command_line.Fail(std::string(status.message()));
    }
  }
  if (!request_rate.empty()) {
    if (absl::Status status = ParseLevels("--request-rate", request_rate, options.request_rates);
        !status.ok()) {
      return command_line.Fail(std::string(status.message()));
    }
  }
  if (!options.concurrencies.empty() && !options.request_rates.empty()) {
    return command_line.Fail("give --concurrency or --request-rate, not both");
  }
  if (options.concurrencies.empty() && options.request_rates.empty()) {
    options.concurrencies = {1};
  }
  if (options.api == "openai" && w.dataset == "multi-turn") {
    return command_line.Fail(
        "--dataset multi-turn appends each reply's token ids to the next prompt, which only "
        "--api grpc streams back");
  }
  return std::nullopt;
}

void PrintLevel(const nlohmann::json& run, const nlohmann::json& baseline) {
  auto ms = [&](const char* key, const char* q) { return run[key][q].get<double>(); };
  const double base = baseline["output_throughput"].get<double>();
  const double out = run["output_throughput"].get<double>();
  std::printf(
      "%-16s %6lld ok %3lld failed  %7.2f req/s  %8.1f out tok/s (%.2fx the first level)  "
      "goodput %.2f req/s  cache hit %.1f%%\n",
      run.contains("concurrency") ? absl::StrFormat("concurrency %s", run["concurrency"].dump()).c_str()
                                  : absl::StrFormat("rate %s/s", run["request_rate"].dump()).c_str(),
      static_cast<long long>(run["completed"].get<int64_t>()),
      static_cast<long long>(run["failed"].get<int64_t>()), run["request_throughput"].get<double>(),
      out, base > 0 ? out / base : 0.0, run["goodput"].get<double>(),
      100 * run["cache_hit_rate"].get<double>());
  for (const char* key : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) {
    std::printf("    %-8s mean %9.1f  p50 %9.1f  p90 %9.1f  p99 %9.1f\n", key, ms(key, "mean"),
                ms(key, "p50"), ms(key, "p90"), ms(key, "p99"));
  }
  for (const auto& error : run["errors"]) std::printf("    error: %s\n", error.get<std::string>().c_str());
}

}  // namespace

int RunBenchCommand(int argc, char** argv) {
  BenchOptions parsed;
  if (std::optional<int> exit_code = ParseBenchFlags(argc, argv, parsed)) return *exit_code;
  BenchOptions* options = &parsed;
  // The served model's name and vocabulary, and the client that drives it.
  std::unique_ptr<BenchClient> client;
  std::string model_id;
  std::string target;
  int64_t vocab_size = 0;
  if (options->api == "grpc") {
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(64 << 20);
    auto channel = grpc::CreateCustomChannel(options->address,
                                             grpc::InsecureChannelCredentials(), arguments);
    auto stub = loom::v1::Inference::NewStub(channel);
    loom::v1::ListModelsResponse models;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status status = stub->ListModels(&context, loom::v1::ListModelsRequest(), &models);
    if (!status.ok() || models.models_size() == 0) {
      std::fprintf(stderr, "loom bench: cannot reach %s: %s\n", options->address.c_str(),
                   status.error_message().c_str());
      return 1;
    }
    model_id = models.models(0).id();
    vocab_size = models.models(0).info().vocab_size();
    target = options->address;
    client = std::make_unique<GrpcBenchClient>(std::move(stub), options->num_speculative_tokens);
  } else {
    absl::StatusOr<OpenAiServedModel> served =
        FetchOpenAiModel(options->base_url, options->api_key, /*timeout_s=*/10);
    if (!served.ok()) {
      std::fprintf(stderr, "loom bench: cannot reach %s: %s\n", options->base_url.c_str(),
                   std::string(served.status().message()).c_str());
      return 1;
    }
    model_id = options->model.empty() ? served->id : options->model;
    vocab_size = options->vocab_size > 0 ? options->vocab_size : served->vocab_size;
    if (vocab_size <= 0) {
      std::fprintf(stderr,
                   "loom bench: %s does not say its vocabulary size: give --vocab-size (`loom "
                   "models` prints it for Loom)\n",
                   options->base_url.c_str());
      return 2;
    }
    target = options->base_url;
    client = MakeOpenAiBenchClient(options->base_url, model_id, options->api_key,
                                   options->num_speculative_tokens);
  }
  // Random prompt tokens above the byte and special tokens of common vocabularies.
  const int32_t vocab = static_cast<int32_t>(std::min<int64_t>(vocab_size, INT32_MAX));
  absl::StatusOr<std::vector<BenchSession>> sessions =
      MakeWorkload(options->workload, vocab, std::min<int32_t>(256, vocab - 1));
  if (!sessions.ok()) {
    std::fprintf(stderr, "loom bench: %s\n", std::string(sessions.status().message()).c_str());
    return 2;
  }
  if (options->warmup > 0) {
    WorkloadOptions warm = options->workload;
    warm.num_requests = options->warmup;
    warm.seed += 1000;
    warm.dataset = "random";
    warm.output_len = std::min<int64_t>(warm.output_len, 8);
    auto warm_sessions = MakeWorkload(warm, vocab, std::min<int32_t>(256, vocab - 1));
    BenchOptions quiet = *options;
    if (warm_sessions.ok()) RunLevel(*client, *warm_sessions, quiet, false, 1);
  }
  const bool rate_mode = !options->request_rates.empty();
  const std::vector<double>& levels = rate_mode ? options->request_rates : options->concurrencies;
  nlohmann::json runs = nlohmann::json::array();
  std::printf("loom bench: %s on %s (%s), dataset %s, %lld turns per level\n", model_id.c_str(),
              target.c_str(), options->api.c_str(), options->workload.dataset.c_str(),
              static_cast<long long>(CountTurns(*sessions)));
  for (size_t l = 0; l < levels.size(); ++l) {
    // Fresh prompts per level: a level must not find the previous level's prompts in the
    // prefix cache (within a level, shared-prefix and multi-turn hit it by design).
    if (l > 0) {
      WorkloadOptions fresh = options->workload;
      fresh.seed += 7919 * l;
      sessions = MakeWorkload(fresh, vocab, std::min<int32_t>(256, vocab - 1));
      if (!sessions.ok()) return 2;
    }
    const double level = levels[l];
    runs.push_back(RunLevel(*client, *sessions, *options, rate_mode, level));
    PrintLevel(runs.back(), runs.front());
    std::fflush(stdout);
  }
  if (!options->output.empty()) {
    const WorkloadOptions& w = options->workload;
    nlohmann::json report = {
        {"benchmark", "serving"},
        {"model", model_id},
        {"api", options->api},
        {"address", target},
        {"workload",
         {{"dataset", w.dataset}, {"num_requests", w.num_requests}, {"input_len", w.input_len},
          {"output_len", w.output_len}, {"range_ratio", w.range_ratio},
          {"prefix_len", w.prefix_len}, {"num_prefixes", w.num_prefixes}, {"turns", w.turns},
          {"seed", w.seed}}},
        {"slo", {{"ttft_ms", options->slo.ttft_ms}, {"tpot_ms", options->slo.tpot_ms},
                 {"e2e_ms", options->slo.e2e_ms}}},
        {"baseline", "the first load level of this run"},
        {"runs", runs}};
    std::ofstream out(options->output);
    out << report.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "loom bench: cannot write %s\n", options->output.c_str());
      return 1;
    }
    std::printf("wrote %s\n", options->output.c_str());
  }
  return 0;
}

}  // namespace loom::cli
