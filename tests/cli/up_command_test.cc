#include "cli/up_command.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "cli/command_line.h"
#include "cli/worker_options.h"

namespace loom::cli {
namespace {

// A value each worker flag accepts where its default is not one (unset optionals).
std::string SampleValue(const CLI::Option& option) {
  const std::string name = option.get_lnames()[0];
  if (name == "kv-cache-memory") return "64MiB";
  if (name == "kv-cache-fraction" || name == "gpu-memory-utilization") return "0.5";
  if (name == "draft-model") return "draft.gguf";
  if (name == "quantization") return "int8";
  if (name == "advertise-address") return "10.0.0.2:7001";
  if (name == "max-model-len") return "1024";
  if (name == "pipeline-layer-partition") return "18,12";
  if (name == "kv-offload-memory") return "64MiB";
  if (name == "kv-offloading-size") return "0.5";
  if (name == "backend") return "cpu";  // the deprecated --step-backend
  if (option.get_items_expected_max() == 0) return "on";  // a boolean
  return option.get_default_str();
}

std::optional<int> ParseUp(std::vector<std::string> args, UpOptions& options) {
  args.insert(args.begin(), "up");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return ParseUpCommandLine(static_cast<int>(argv.size()), argv.data(), options);
}

TEST(UpCommandTest, ForwardsEveryDeclaredWorkerFlagToEveryWorker) {
  // The worker's own declarations: a flag added to AddWorkerFlags shows up here.
  cli::CommandLine command_line("loom-worker", "worker");
  CLI::App& worker_app = command_line.app();
  WorkerOptions worker_options;
  const std::vector<std::string> names = AddWorkerFlags(worker_app, worker_options);
  std::set<std::string> owned;
  for (const char* const* name = kUpOwnedWorkerFlags; *name != nullptr; ++name) {
    owned.insert(*name);
  }
  int forwarded = 0;
  for (const std::string& name : names) {
    if (owned.count(name) > 0) continue;
    const CLI::Option* option = worker_app.get_option("--" + name);
    const std::string flag = "--" + name + "=" + SampleValue(*option);
    UpOptions options;
    ASSERT_EQ(ParseUp({"model.gguf", "--replicas", "2", flag}, options), std::nullopt) << flag;
    const auto commands = WorkerCommands(options, "127.0.0.1:1", "r");
    ASSERT_EQ(commands.size(), 2u);
    for (const auto& command : commands) {
      EXPECT_NE(std::find(command.begin(), command.end(), flag), command.end())
          << flag << " does not reach the worker";
    }
    // And the worker accepts what it is given.
    std::vector<const char*> argv = {"loom-worker", "--model", "m", "--coordinator", "c:1",
                                     flag.c_str()};
    EXPECT_TRUE(ParseWorkerFlags(static_cast<int>(argv.size()), argv.data()).ok())
        << flag;
    ++forwarded;
  }
  EXPECT_GE(forwarded, 15);
  // The flags the hand-kept list of old missed are among them.
  for (const char* name : {"device", "cuda-graphs", "metrics-port", "quantization"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
}

TEST(UpCommandTest, SetsTheFlagsItOwnsPerWorker) {
  UpOptions options;
  ASSERT_EQ(ParseUp({"--model", "m.gguf", "-tp", "2", "--threads", "3"}, options), std::nullopt);
  const auto commands = WorkerCommands(options, "127.0.0.1:1", "r");
  ASSERT_EQ(commands.size(), 2u);
  const std::vector<std::string> expected = {"--model",
                                             "m.gguf",
                                             "--coordinator",
                                             "127.0.0.1:1",
                                             "--replica-id",
                                             "replica-0",
                                             "--threads",
                                             "3",
                                             "--drain-timeout-s",
                                             "0",
                                             "--world-size",
                                             "2",
                                             "--rank",
                                             "1",
                                             "--rendezvous-id",
                                             "r"};
  EXPECT_EQ(commands[1], expected);
  // A flag up sets per worker is not one of its own options.
  UpOptions refused;
  EXPECT_EQ(ParseUp({"m.gguf", "--rank", "1"}, refused), 2);
}

TEST(UpCommandTest, StartsPrefillAndDecodeReplicasWithTheirRoles) {
  // Disaggregated: one prefill replica of two ranks, two decode replicas of one, no mixed one.
  UpOptions options;
  ASSERT_EQ(ParseUp({"m.gguf", "--prefill-replicas", "1", "--decode-replicas", "2",
                     "--prefill-tensor-parallel-size", "2", "--threads", "1"},
                    options),
            std::nullopt);
  EXPECT_EQ(options.total_replicas(), 3);
  const auto commands = WorkerCommands(options, "127.0.0.1:1", "r");
  ASSERT_EQ(commands.size(), 4u);
  auto value_of = [](const std::vector<std::string>& command, const std::string& flag) {
    const auto it = std::find(command.begin(), command.end(), flag);
    return it == command.end() || it + 1 == command.end() ? std::string() : *(it + 1);
  };
  const std::vector<std::pair<std::string, std::string>> expected = {{"prefill-0", "prefill"},
                                                                     {"prefill-0", "prefill"},
                                                                     {"decode-0", "decode"},
                                                                     {"decode-1", "decode"}};
  for (size_t i = 0; i < commands.size(); ++i) {
    EXPECT_EQ(value_of(commands[i], "--replica-id"), expected[i].first) << i;
    EXPECT_EQ(value_of(commands[i], "--role"), expected[i].second) << i;
  }
  EXPECT_EQ(value_of(commands[1], "--world-size"), "2");
  EXPECT_EQ(value_of(commands[2], "--world-size"), "");
  // --replicas given too: mixed replicas beside them, without a --role.
  UpOptions mixed;
  ASSERT_EQ(ParseUp({"m.gguf", "--replicas", "1", "--decode-replicas", "1"}, mixed), std::nullopt);
  const auto both = WorkerCommands(mixed, "127.0.0.1:1", "r");
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(value_of(both[0], "--role"), "");
  EXPECT_EQ(value_of(both[1], "--role"), "decode");
  // The role is up's to set per replica.
  UpOptions refused;
  EXPECT_EQ(ParseUp({"m.gguf", "--role", "prefill"}, refused), 2);
}

TEST(UpCommandTest, GivesEveryCudaRankItsOwnGpu) {
  // Two replicas of tensor parallelism 2 on a machine with four GPUs: GPUs 0, 1, 2, 3.
  UpOptions options;
  ASSERT_EQ(ParseUp({"m.gguf", "-tp", "2", "--replicas", "2", "--device", "cuda",
                     "--max-num-batched-tokens", "4096"},
                    options),
            std::nullopt);
  auto commands = WorkerCommands(options, "127.0.0.1:1", "r", /*cuda_device_count=*/4);
  ASSERT_EQ(commands.size(), 4u);
  auto value_of = [](const std::vector<std::string>& command, const std::string& flag) {
    const auto it = std::find(command.begin(), command.end(), flag);
    return it == command.end() || it + 1 == command.end() ? std::string() : *(it + 1);
  };
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(value_of(commands[i], "--gpu-index"), std::to_string(i)) << i;
    EXPECT_EQ(value_of(commands[i], "--rank"), std::to_string(i % 2)) << i;
    EXPECT_EQ(value_of(commands[i], "--replica-id"), "replica-" + std::to_string(i / 2)) << i;
    // The coordinator's largest step, once: the runner reserves activations for it.
    EXPECT_EQ(absl::c_count(commands[i], "--max-num-batched-tokens=4096"), 1) << i;
    EXPECT_EQ(value_of(commands[i], "--max-num-batched-tokens"), "") << i;
    // The user's --device reaches every worker as given.
    EXPECT_NE(std::find(commands[i].begin(), commands[i].end(), "--device=cuda"),
              commands[i].end());
  }
  // Not given: the coordinator's default.
  UpOptions defaults;
  ASSERT_EQ(ParseUp({"m.gguf", "--device", "cuda"}, defaults), std::nullopt);
  const auto single = WorkerCommands(defaults, "127.0.0.1:1", "r", /*cuda_device_count=*/1);
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(value_of(single[0], "--max-num-batched-tokens"),
            std::to_string(defaults.serve.cluster.replica.max_num_batched_tokens));
  // Fewer GPUs than workers (CheckUpGpus then wants the memory split): the indices wrap
  // (each replica's two ranks still differ).
  commands = WorkerCommands(options, "127.0.0.1:1", "r", /*cuda_device_count=*/2);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(value_of(commands[i], "--gpu-index"), std::to_string(i % 2)) << i;
  }
  EXPECT_EQ(UpGpuIndex(/*workers_before=*/4, /*rank=*/3, 8), 7);
  EXPECT_EQ(UpGpuIndex(8, 1, 8), 1);

  // Workers that run on the CPU get no GPU: --device cpu, no GPU on the machine, or auto
  // with tensor parallelism (auto takes CUDA for one rank only).
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"m.gguf", "-tp", "2", "--device", "cpu"},
        std::vector<std::string>{"m.gguf", "-tp", "2", "--device", "auto"},
        std::vector<std::string>{"m.gguf", "-tp", "2", "--device", "cuda", "--noop-engine"}}) {
    UpOptions cpu;
    ASSERT_EQ(ParseUp(args, cpu), std::nullopt) << args[4];
    for (const auto& command : WorkerCommands(cpu, "127.0.0.1:1", "r", 4)) {
      EXPECT_EQ(value_of(command, "--gpu-index"), "") << args[4];
    }
  }
  UpOptions no_gpu;
  ASSERT_EQ(ParseUp({"m.gguf", "-tp", "2", "--device", "cuda"}, no_gpu), std::nullopt);
  for (const auto& command : WorkerCommands(no_gpu, "127.0.0.1:1", "r", 0)) {
    EXPECT_EQ(value_of(command, "--gpu-index"), "");
  }
  // One replica, one rank, auto on a GPU machine: replicas spread over the GPUs.
  UpOptions replicas;
  ASSERT_EQ(ParseUp({"m.gguf", "--replicas", "3"}, replicas), std::nullopt);
  commands = WorkerCommands(replicas, "127.0.0.1:1", "r", 2);
  ASSERT_EQ(commands.size(), 3u);
  EXPECT_EQ(value_of(commands[2], "--gpu-index"), "0");
  EXPECT_EQ(value_of(commands[1], "--gpu-index"), "1");
  // A group larger than the machine's GPUs is refused (NCCL: one rank per GPU); replicas
  // may share GPUs only with the memory split explicitly; the CPU needs none.
  EXPECT_TRUE(CheckUpGpus(options, 4).ok());
  EXPECT_EQ(CheckUpGpus(options, 2).code(), absl::StatusCode::kFailedPrecondition);  // shared
  const absl::Status too_few = CheckUpGpus(options, 1);
  EXPECT_EQ(too_few.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(too_few.message().find("needs 2 GPUs"), std::string::npos) << too_few;
  const absl::Status shared = CheckUpGpus(replicas, 2);  // 3 workers on 2 GPUs
  EXPECT_EQ(shared.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(shared.message().find("put 2 on one GPU"), std::string::npos) << shared;
  EXPECT_NE(shared.message().find("--gpu-memory-utilization 0.50 or less"), std::string::npos)
      << shared;
  EXPECT_TRUE(CheckUpGpus(replicas, 3).ok());
  UpOptions split;
  ASSERT_EQ(ParseUp({"m.gguf", "--replicas", "3", "--gpu-memory-utilization", "0.45"}, split),
            std::nullopt);
  EXPECT_TRUE(CheckUpGpus(split, 2).ok());
  UpOptions oversplit;
  ASSERT_EQ(ParseUp({"m.gguf", "--replicas", "3", "--gpu-memory-utilization", "0.6"}, oversplit),
            std::nullopt);
  const absl::Status over = CheckUpGpus(oversplit, 2);
  EXPECT_NE(over.message().find("0.60 x 2 is over 1"), std::string::npos) << over;
  UpOptions sized;
  ASSERT_EQ(ParseUp({"m.gguf", "--replicas", "4", "--kv-cache-memory", "4G"}, sized),
            std::nullopt);
  EXPECT_TRUE(CheckUpGpus(sized, 1).ok());
  UpOptions on_cpu;
  ASSERT_EQ(ParseUp({"m.gguf", "-tp", "4", "--device", "cpu"}, on_cpu), std::nullopt);
  EXPECT_TRUE(CheckUpGpus(on_cpu, 1).ok());
  // Pipeline stages on CUDA: every stage's ranks get a GPU of their own (stage-major
  // indices); fewer GPUs need the memory split, as replicas do.
  UpOptions staged;
  ASSERT_EQ(ParseUp({"m.gguf", "-pp", "2", "-tp", "2", "--device", "cuda"}, staged), std::nullopt);
  EXPECT_TRUE(CheckUpGpus(staged, 4).ok());
  commands = WorkerCommands(staged, "127.0.0.1:1", "r", 4);
  ASSERT_EQ(commands.size(), 4u);
  for (size_t rank = 0; rank < commands.size(); ++rank) {
    EXPECT_EQ(value_of(commands[rank], "--gpu-index"), std::to_string(rank));
  }
  EXPECT_NE(CheckUpGpus(staged, 2).message().find("put 2 on one GPU"), std::string::npos);
  // loom up sets --gpu-index itself.
  UpOptions refused;
  EXPECT_EQ(ParseUp({"m.gguf", "--gpu-index", "1"}, refused), 2);
}

TEST(UpCommandTest, TakesTheVllmNamesAndTheOldOnes) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"m.gguf", "--tensor-parallel-size", "2", "--data-parallel-size",
                                 "3", "--port", "9000", "--no-enable-prefix-caching"},
        std::vector<std::string>{"--model", "m.gguf", "--tensor-parallel=2", "--replicas=3",
                                 "--http-port=9000", "--prefix-caching", "off"},
        std::vector<std::string>{"m.gguf", "-tp=2", "--workers", "2", "--replicas", "3",
                                 "--http-port", "9000", "--no-prefix-caching"}}) {
    UpOptions options;
    ASSERT_EQ(ParseUp(args, options), std::nullopt) << args[1];
    EXPECT_EQ(options.serve.model_path, "m.gguf");
    EXPECT_EQ(options.workers, 2);
    EXPECT_EQ(options.replicas, 3);
    EXPECT_EQ(options.serve.http.port, 9000);
    EXPECT_FALSE(options.serve.cluster.replica.enable_prefix_caching);
  }
}

}  // namespace
}  // namespace loom::cli
