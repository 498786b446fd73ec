#include "cli/serve_flags.h"

#include <string>

#include "absl/time/time.h"
#include "cli/command_line.h"
#include "common/sampling_params.h"

namespace loom::cli {
namespace {

// A duration flag in whole `unit`s, shown with its default.
CLI::Option* AddDuration(CLI::App& app, const std::string& names, absl::Duration& value,
                         absl::Duration unit, int64_t min, int64_t max, const std::string& help) {
  return app
      .add_option_function<int64_t>(
          names, [&value, unit](const int64_t& count) { value = unit * count; }, help)
      ->check(IntegerIn(min, max))
      ->default_str(std::to_string(absl::ToInt64Nanoseconds(value) /
                                   absl::ToInt64Nanoseconds(unit)));
}

// Standby coordinators: the leader election and where workers reach the leader.
void AddHighAvailabilityFlags(CLI::App& app, api::ServeOptions& options) {
  AddString(app, "--leader-lock", options.leader_lock,
            "high availability: coordinators started with the same lock file elect one leader "
            "(workers register with it); the others follow and take over when it exits or "
            "dies (default: none, standalone)");
  AddString(app, "--leader-lease", options.leader_lease,
            "high availability on Kubernetes: coordinators with the same Lease name elect one "
            "leader through the API server (the pod's service account needs get/create/update "
            "on leases); exclusive with --leader-lock (default: none)");
  AddString(app, "--advertise-address", options.advertise_address,
            "with --leader-lock or --leader-lease: HOST:PORT where workers reach this "
            "coordinator's gRPC port (default: --host and the bound port)")
      ->check(HostPort());
  AddInt(app, "--endpoint-picker-port", options.endpoint_picker_port, -1, 65535,
         "serve the Gateway API Inference Extension's endpoint picker (Envoy ext_proc gRPC) on "
         "this port, for an InferencePool of coordinators: it sends each request to the leader's "
         "HTTP API and picks its replica by prefix cache and load; TLS with --ssl-certfile; "
         "0: any free port, -1: off (default: -1)");
}

// Moving KV between replicas: prefix fetches and disaggregated serving's hand-offs.
void AddKvTransferFlags(CLI::App& app, api::ServeOptions& options) {
  coordinator::ReplicaOptions& replica = options.cluster.replica;
  AddInt(app, "--kv-fetch-min-blocks", options.cluster.kv_fetch_min_blocks, 0, 1 << 20,
         "a request placed on one replica while another (same layout, both with a host KV "
         "tier) holds at least this many more blocks of its prefix fetches them from it "
         "instead of recomputing (0: never)");
  AddInt(app, "--max-local-prefill-length", replica.max_local_prefill_length, 0, 1 << 24,
         "disaggregated serving (workers started with --role prefill / decode): a prompt with "
         "more uncached tokens than this is prefilled on a prefill replica and handed to a "
         "decode replica with its KV (Dynamo's flag; 0: each decode replica's measure, the "
         "prompt length that would double its decode step, and a prompt of at most "
         "--max-num-batched-tokens stays on its decode replica when every prefill replica's "
         "expected first token, by its queued prompt tokens, comes later)");
  AddInt(app, "--max-prefill-queue-size", options.cluster.max_prefill_queue_size, 0, 1 << 20,
         "disaggregated serving: a prefill replica holding this many requests, or more queued "
         "prompt tokens than the prompt's own, is passed over, and when every one is, the "
         "prompt is prefilled on its decode replica instead, in chunks beside its decodes "
         "(Dynamo's flag; trades the decodes' inter-token latency for the prompts' TTFT when "
         "prefill replicas are busy; 0: no limit)");
  AddDuration(app, "--kv-transfer-timeout-ms", replica.kv_transfer_timeout, absl::Milliseconds(1),
              100, 600000,
              "how long a request waits for KV from another replica (a prefix fetch or a "
              "prefill-to-decode hand-off) before it is recomputed where it is");
  app.add_flag("--kv-push,!--no-kv-push", replica.kv_push,
               std::string("disaggregated serving: prefill workers write a hand-off's KV into "
                           "the decode workers' host tiers layer by layer as they compute it "
                           "(through shared memory on one machine, else over TCP; off: the "
                           "decode replica pulls it after the first token) (default: ") +
                   (replica.kv_push ? "on)" : "off)"));
}

}  // namespace

void AddServeFlags(CLI::App& app, api::ServeOptions& options) {
  coordinator::ReplicaOptions& replica = options.cluster.replica;
  AddString(app, "model,--model", options.model_path,
            "the model: a GGUF file or a Hugging Face directory (first positional argument or "
            "--model); required");
  AddString(app, "--served-model-name", options.served_model_name,
            "the model id clients use (default: the file's stem)")
      ->check(CLI::Validator(
          [](std::string& v) { return v.empty() ? std::string("needs a non-empty name") : ""; },
          "NAME"));
  app.add_option_function<std::string>(
         "--generation-config",
         [&options](const std::string& mode) { options.model_sampling_defaults = mode == "auto"; },
         "auto: generation_config.json's sampling parameters are the defaults of requests that "
         "leave them unset; vllm: the API's own defaults only")
      ->check(OneOf({"auto", "vllm"}))
      ->default_str(options.model_sampling_defaults ? "auto" : "vllm");
  app.add_option_function<std::string>(
         "--metrics-naming",
         [&options](const std::string& naming) {
           options.metric_naming = *coordinator::ParseMetricNaming(naming);  // checked below
         },
         "/metrics names: loom (loom_x), vllm (vllm:x for every metric vLLM has, so its "
         "dashboards and autoscaler queries work unchanged) or both")
      ->check(OneOf({"loom", "vllm", "both"}))
      ->default_str("both");
  AddHighAvailabilityFlags(app, options);
  AddString(app, "--chat-template", options.chat_template,
            "a Jinja chat template (a file, or the template itself) used instead of the "
            "model's (default: the model's)");
  app.add_option_function<std::string>(
         "--reasoning-parser",
         [&options](const std::string& name) {
           options.http.reasoning = *api::ParseReasoningFormat(name);  // checked below
         },
         "chat replies' <think>...</think> part returned as reasoning_content (and streamed "
         "as delta.reasoning_content): deepseek_r1, qwen3 or glm45 (default: off)")
      ->check(CLI::Validator(
          [](std::string& name) {
            absl::StatusOr<api::ReasoningFormat> format = api::ParseReasoningFormat(name);
            return format.ok() ? std::string() : std::string(format.status().message());
          },
          "NAME"));
  AddString(app, "--host", options.host, "listen address of the gRPC and HTTP servers");
  AddInt(app, "--port,--http-port", options.http.port, -1, 65535,
         "the OpenAI-compatible HTTP port (0: any free port; -1: off)");
  AddInt(app, "--grpc-port", options.grpc_port, 0, 65535, "the gRPC port (0: any free port)");
  AddInt(app, "--http-threads", options.http.threads, 1, 1024,
         "HTTP threads that parse requests and render answers (open streams and idle "
         "connections hold none)");
  AddInt(app, "--max-model-len", options.max_model_len, 0, int64_t{1} << 30,
         "the context length served: prompt + generated tokens per sequence (0: the model's "
         "own); larger than the model's is refused");
  AddInt(app, "--max-num-seqs", replica.max_num_seqs, 1, 1 << 16,
         "running sequences per replica");
  AddInt(app, "--max-num-batched-tokens", replica.max_num_batched_tokens, 1, 1 << 20,
         "tokens per step");
  AddInt(app, "--max-waiting", replica.max_waiting, 0, 1 << 24,
         "waiting requests per replica before RESOURCE_EXHAUSTED");
  AddInt(app, "--migration-limit", replica.migration_limit, 0, 100,
         "times a request that already streamed output may move to another replica when its "
         "replica fails, continuing after its outputs (0: it ends with an error; requests "
         "without output are always placed again)");
  AddKvTransferFlags(app, options);
  AddInt(app, "--max-plans-in-flight", replica.max_plans_in_flight, 1, 8,
         "step plans sent ahead of results (a pipeline-parallel replica keeps at least one per "
         "stage)");
  AddDuration(app, "--stream-interval-ms", options.stream_interval, absl::Milliseconds(1), 0,
              10000,
              "a stream's messages go out at most once per MS (the first and the last at once); "
              "0: one per step");
  AddDuration(app, "--step-timeout-ms", replica.liveness.no_progress_timeout,
              absl::Milliseconds(1), 1, 3600000,
              "no-progress timeout: a worker whose running step reports no progress for this "
              "long is stuck (the limit grows with the step's expected time per unit of "
              "progress)");
  AddDuration(app, "--heartbeat-timeout-ms", options.cluster.heartbeat_timeout,
              absl::Milliseconds(1), 1, 3600000, "a worker silent this long is dead");
  AddDuration(app, "--drain-timeout-s", options.drain_timeout, absl::Seconds(1), 0, 86400,
              "on SIGTERM, wait this long for requests in flight");
  app.add_flag("--enable-prefix-caching,--prefix-caching,!--no-enable-prefix-caching,"
               "!--no-prefix-caching",
               replica.enable_prefix_caching,
               std::string("reuse cached KV blocks of shared prefixes (default: ") +
                   (replica.enable_prefix_caching ? "on)" : "off)"));
  AddInt(app, "--speculative-tokens,--num-speculative-tokens",
         replica.speculation.num_speculative_tokens, 0, common::kMaxSpeculativeTokens,
         "speculative decoding (n-gram lookup, or the worker's draft model): drafts per step "
         "at most, 0 = off; requests override with num_speculative_tokens");
  AddBool(app, "--speculative-adaptive", replica.speculation.adaptive,
          "pick each step's drafts from the measured acceptance and step cost, off when it "
          "does not pay");
  app.add_option_function<std::string>(
         "--routing",
         [&options](const std::string& name) {
           options.cluster.router.policy = *coordinator::ParseRoutingPolicy(name);
         },
         "how requests are placed on replicas")
      ->check(OneOf({"prefix", "round-robin", "least-loaded"}))
      ->default_str(std::string(coordinator::RoutingPolicyName(options.cluster.router.policy)));
  AddNumber(app, "--router-load-weight", options.cluster.router.load_weight, 0, 1000,
            "prefix routing: score weight per token of load");
  AddInt(app, "--router-balance-threshold", options.cluster.router.balance_threshold_tokens, 0,
         int64_t{1} << 40,
         "prefix routing: load (tokens) above the least-loaded replica past which load wins");
  AddUint64(app, "--seed", options.http.seed,
            "OpenAI API: requests that set no seed draw theirs from this one, so a run "
            "repeats (vLLM's --seed; default: random). The gRPC API's unset seed stays 0");
  app.add_flag_callback("--disable-log-requests", [] {},
                        "accepted for vLLM compatibility: Loom does not log requests "
                        "(default: off)");
  app.add_option("--api-key", options.api_keys,
                 "clients must send 'Authorization: Bearer KEY' (HTTP) or the same "
                 "'authorization' metadata (gRPC); repeatable, any of them works; /health, "
                 "/ready and /metrics stay open")
      ->check(CLI::Validator(
          [](std::string& v) { return v.empty() ? std::string("needs a non-empty key") : ""; },
          "KEY"))
      ->default_str("none");
  app.add_option("--api-key-file", options.api_key_files,
                 "API keys, one per line ('#' comments); repeatable")
      ->default_str("none");
  AddString(app, "--cluster-secret-file", options.cluster_secret_file,
            "a file whose first line is the secret the coordinator and its workers present to "
            "each other (Register, Step, KV transfers); every worker needs the same (default: "
            "LOOM_CLUSTER_SECRET, else none: the internal services are open to whoever reaches "
            "the ports; loom up makes one)");
  AddString(app, "--ssl-certfile", options.http.ssl_certfile,
            "serve HTTPS on the HTTP port with this PEM certificate (chain) and --ssl-keyfile");
  AddString(app, "--ssl-keyfile", options.http.ssl_keyfile, "the certificate's private key (PEM)");
  AddBool(app, "--debug-colliding-block-hashes", options.debug_colliding_block_hashes,
          "tests only: all prefix-cache block hashes collide; hits are still verified");
}

}  // namespace loom::cli
