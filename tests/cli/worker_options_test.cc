#include "cli/worker_options.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "cli/generate_command.h"
#include "cli/worker_command.h"
#include "kernels/cuda_device.h"

namespace loom::cli {
namespace {

absl::StatusOr<WorkerOptions> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "loom-worker");
  return ParseWorkerFlags(static_cast<int>(args.size()), args.data());
}

TEST(WorkerOptionsTest, ParsesByteSizesWithBinarySuffixes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("512M"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("64KiB"), 64 << 10);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("2g"), int64_t{2} << 30);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
  EXPECT_FALSE(ParseByteSize("99999999TiB").ok());
}

TEST(WorkerOptionsTest, SplitsHostAndPort) {
  auto parts = SplitHostPort("127.0.0.1:0");
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(parts->first, "127.0.0.1");
  EXPECT_EQ(parts->second, 0);
  parts = SplitHostPort("[::1]:5000");
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(parts->first, "[::1]");
  EXPECT_EQ(parts->second, 5000);
  EXPECT_FALSE(SplitHostPort("localhost").ok());
  EXPECT_FALSE(SplitHostPort(":80").ok());
  EXPECT_FALSE(SplitHostPort("host:99999").ok());
  EXPECT_FALSE(SplitHostPort("host:http").ok());
}

TEST(WorkerOptionsTest, ParsesTheTestOnlyStepHooks) {
  auto options = Parse({"--model", "m.gguf", "--coordinator", "c:1"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->debug_step_delay_ms, 0);
  EXPECT_EQ(options->debug_hang_at_step, 0);
  options = Parse({"--model", "m.gguf", "--coordinator", "c:1", "--debug-step-delay-ms", "2500",
                   "--debug-hang-at-step", "7"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->debug_step_delay_ms, 2500);
  EXPECT_EQ(options->debug_hang_at_step, 7);
  const auto bad =
      Parse({"--model", "m.gguf", "--coordinator", "c:1", "--debug-step-delay-ms", "-5"}).status();
  EXPECT_NE(bad.message().find("--debug-step-delay-ms"), std::string::npos) << bad;
}

TEST(WorkerOptionsTest, ParsesEveryFlagAndAppliesDefaults) {
  auto options = Parse({"--model", "m.gguf", "--coordinator", "10.0.0.1:7000"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->listen_address, "127.0.0.1:0");
  EXPECT_EQ(options->replica_id, "replica-0");
  EXPECT_EQ(options->step_backend, "model");
  EXPECT_EQ(options->block_size, 16);
  EXPECT_EQ(*KvCacheBudgetBytes(*options), int64_t{512} << 20);
  EXPECT_EQ(options->activations, kernels::cpu::ActivationPrecision::kF32);

  options = Parse({"--model",
                   "m.gguf",
                   "--coordinator",
                   "c:1",
                   "--listen",
                   "0.0.0.0:9000",
                   "--advertise-address",
                   "w-1.loom:9000",
                   "--replica-id",
                   "r7",
                   "--rank",
                   "0",
                   "--world-size",
                   "1",
                   "--step-backend",
                   "noop",
                   "--threads",
                   "3",
                   "--kv-cache-memory",
                   "1GiB",
                   "--block-size",
                   "32",
                   "--kv-dtype",
                   "f32",
                   "--activations",
                   "int8"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->advertise_address, "w-1.loom:9000");
  EXPECT_EQ(options->replica_id, "r7");
  EXPECT_EQ(options->step_backend, "noop");
  EXPECT_EQ(options->num_threads, 3);
  EXPECT_EQ(*KvCacheBudgetBytes(*options), int64_t{1} << 30);
  EXPECT_EQ(options->block_size, 32);
  EXPECT_EQ(options->kv_dtype, kernels::cpu::KvDtype::kF32);
  EXPECT_EQ(options->activations, kernels::cpu::ActivationPrecision::kInt8);
  EXPECT_TRUE(options->draft_model_path.empty());  // n-gram lookup by default
}

TEST(WorkerOptionsTest, CoordinatorTakesSeveralAddressesForFailover) {
  auto options = Parse({"--model", "m.gguf", "--coordinator", "a:7000,10.0.0.2:7000"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->coordinator_address, "a:7000,10.0.0.2:7000");
  EXPECT_FALSE(Parse({"--model", "m.gguf", "--coordinator", "a:7000,b"}).ok());
  EXPECT_FALSE(Parse({"--model", "m.gguf", "--coordinator", "a:7000,"}).ok());
}

TEST(WorkerOptionsTest, StepBackendHasAShortFlagAndTheOldName) {
  EXPECT_EQ(Parse({"--model", "m", "--coordinator", "c:1"})->step_backend, "model");
  EXPECT_EQ(Parse({"--model", "m", "--coordinator", "c:1", "--noop-engine"})->step_backend, "noop");
  // The deprecated --backend: cpu was the forward pass's name whatever its device.
  EXPECT_EQ(Parse({"--model", "m", "--coordinator", "c:1", "--backend", "cpu"})->step_backend,
            "model");
  EXPECT_EQ(Parse({"--model", "m", "--coordinator", "c:1", "--backend", "noop"})->step_backend,
            "noop");
}

TEST(WorkerOptionsTest, ParsesTheDraftModel) {
  auto options = Parse({"--model", "m.gguf", "--coordinator", "c:1", "--draft-model", "d.gguf"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->draft_model_path, "d.gguf");
  const auto empty = Parse({"--model", "m", "--coordinator", "c:1", "--draft-model", ""}).status();
  EXPECT_NE(empty.message().find("--draft-model"), std::string::npos) << empty;
}

TEST(WorkerOptionsTest, FractionOfAvailableMemory) {
  auto options = Parse({"--model", "m", "--coordinator", "c:1", "--kv-cache-fraction", "0.01"});
  ASSERT_TRUE(options.ok()) << options.status();
  auto available = MemAvailableBytes();
  if (!available.ok()) GTEST_SKIP() << available.status();
  auto budget = KvCacheBudgetBytes(*options);
  ASSERT_TRUE(budget.ok());
  EXPECT_NEAR(static_cast<double>(*budget), *available * 0.01, *available * 0.002);
}

TEST(WorkerOptionsTest, RejectsBadCommandLines) {
  EXPECT_FALSE(Parse({"--coordinator", "c:1"}).ok());  // no model
  EXPECT_FALSE(Parse({"--model", "m"}).ok());          // no coordinator
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "nocolon"}).ok());
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--backend", "gpu"}).ok());
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--step-backend", "cpu"}).ok());
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--threads", "0"}).ok());
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--kv-cache-fraction", "1.5"}).ok());
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--kv-cache-memory", "1G",
                      "--kv-cache-fraction", "0.5"})
                   .ok());
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--frobnicate", "1"}).ok());
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator"}).ok());  // missing value
  const auto status =
      Parse({"--model", "m", "--coordinator", "c:1", "--kv-dtype", "bfloat16"}).status();
  EXPECT_NE(status.message().find("--kv-dtype"), std::string::npos) << status;
  // BF16 and the 8-bit KV types under either name; vLLM's flag takes vLLM's values only, and
  // the two flags exclude each other.
  for (const auto& [flag, value, dtype] :
       std::vector<std::tuple<std::string, std::string, kernels::cpu::KvDtype>>{
           {"--kv-dtype", "auto", kernels::cpu::KvDtype::kF16},
           {"--kv-dtype", "f16", kernels::cpu::KvDtype::kF16},
           {"--kv-dtype", "int8", kernels::cpu::KvDtype::kInt8},
           {"--kv-dtype", "bf16", kernels::cpu::KvDtype::kBf16},
           {"--kv-cache-dtype", "bfloat16", kernels::cpu::KvDtype::kBf16},
           {"--kv-dtype", "fp8_e4m3", kernels::cpu::KvDtype::kFp8E4m3},
           {"--kv-cache-dtype", "fp8", kernels::cpu::KvDtype::kFp8E4m3},
           {"--kv-cache-dtype", "fp8_e4m3", kernels::cpu::KvDtype::kFp8E4m3},
           {"--kv-cache-dtype", "int8", kernels::cpu::KvDtype::kInt8},
           {"--kv-cache-dtype", "auto", kernels::cpu::KvDtype::kF16}}) {
    auto parsed = Parse({"--model", "m", "--coordinator", "c:1", flag.c_str(), value.c_str()});
    ASSERT_TRUE(parsed.ok()) << flag << " " << value << ": " << parsed.status();
    EXPECT_EQ(parsed->kv_dtype, dtype) << flag << " " << value;
    EXPECT_EQ(parsed->kv_dtype_auto, value == "auto") << flag << " " << value;
  }
  auto unset = Parse({"--model", "m", "--coordinator", "c:1"});
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_TRUE(unset->kv_dtype_auto);
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--kv-cache-dtype", "f32"}).ok());
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--kv-cache-dtype", "int8",
                      "--kv-dtype", "f16"})
                   .ok());
  const auto activations =
      Parse({"--model", "m", "--coordinator", "c:1", "--activations", "int4"}).status();
  EXPECT_NE(activations.message().find("--activations"), std::string::npos) << activations;
  // bf16 parses on any CPU; a CPU without AMX-BF16 refuses it when the backend starts.
  const auto bf16 = Parse({"--model", "m", "--coordinator", "c:1", "--activations", "bf16"});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->activations, kernels::cpu::ActivationPrecision::kBf16);
}

TEST(WorkerOptionsTest, ParsesDeviceAndCudaGraphs) {
  auto options = Parse({"--model", "m", "--coordinator", "c:1"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->device, "auto");
  EXPECT_TRUE(options->cuda_graphs);
  options = Parse({"--model", "m", "--coordinator", "c:1", "--device", "cuda", "--cuda-graphs",
                   "off"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->device, "cuda");
  EXPECT_FALSE(options->cuda_graphs);
  options = Parse({"--model", "m", "--coordinator", "c:1", "--device", "cpu", "--cuda-graphs",
                   "on"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->device, "cpu");
  EXPECT_TRUE(options->cuda_graphs);
}

TEST(WorkerOptionsTest, RejectsBadDeviceAndCudaGraphsValues) {
  absl::Status status = Parse({"--model", "m", "--coordinator", "c:1", "--device", "gpu"}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--device"), std::string::npos) << status;
  EXPECT_NE(status.message().find("'gpu'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("cuda, cpu or auto"), std::string::npos) << status;
  status = Parse({"--model", "m", "--coordinator", "c:1", "--cuda-graphs=maybe"}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--cuda-graphs"), std::string::npos) << status;
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--device"}).ok());  // no value
}

TEST(WorkerOptionsTest, ResolvesDeviceFromFlagAndMachine) {
  using kernels::cpu::KvDtype;
  EXPECT_EQ(*ResolveDevice("cpu", KvDtype::kF16, 1, 8), "cpu");
  EXPECT_EQ(*ResolveDevice("auto", KvDtype::kF16, 1, 0), "cpu");
  EXPECT_EQ(*ResolveDevice("auto", KvDtype::kF16, 1, 1), "cuda");
  // auto keeps what the CUDA forward pass cannot do on the CPU.
  EXPECT_EQ(*ResolveDevice("auto", KvDtype::kF32, 1, 1), "cpu");
  EXPECT_EQ(*ResolveDevice("auto", KvDtype::kF16, 2, 1), "cpu");
  EXPECT_EQ(*ResolveDevice("cuda", KvDtype::kF16, 1, 1), "cuda");

  absl::StatusOr<std::string> device = ResolveDevice("cuda", KvDtype::kF16, 1, 0);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(device.status().message().find("no usable CUDA device"), std::string::npos)
      << device.status();
  device = ResolveDevice("cuda", KvDtype::kF32, 1, 1);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("--kv-dtype f32"), std::string::npos)
      << device.status();
  // The 8-bit KV types run on both: auto picks the GPU where there is one.
  EXPECT_EQ(*ResolveDevice("auto", KvDtype::kInt8, 1, 1), "cuda");
  EXPECT_EQ(*ResolveDevice("auto", KvDtype::kInt8, 1, 0), "cpu");
  EXPECT_EQ(*ResolveDevice("cuda", KvDtype::kFp8E4m3, 1, 1), "cuda");
  // f32 KV is CPU-only: auto picks the CPU.
  EXPECT_EQ(*ResolveDevice("auto", KvDtype::kF32, 1, 1), "cpu");
  // Tensor parallelism on CUDA (NCCL) is asked for explicitly; auto keeps it on the CPU.
  EXPECT_EQ(*ResolveDevice("cuda", KvDtype::kF16, 2, 1), "cuda");
  EXPECT_EQ(*ResolveDevice("cuda", KvDtype::kF16, 4, 8), "cuda");
  EXPECT_EQ(ResolveDevice("tpu", KvDtype::kF16, 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkerOptionsTest, ParsesTheGpuIndex) {
  auto options = Parse({"--model", "m", "--coordinator", "c:1"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->gpu_index, -1);
  options = Parse({"--model", "m", "--coordinator", "c:1", "--device", "cuda", "--gpu-index",
                   "3", "--world-size", "4", "--rank", "2"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->gpu_index, 3);
  EXPECT_EQ(options->rank, 2);
  EXPECT_EQ(options->world_size, 4);
  const absl::Status bad =
      Parse({"--model", "m", "--coordinator", "c:1", "--gpu-index", "x"}).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--gpu-index"), std::string::npos) << bad;
  EXPECT_FALSE(Parse({"--model", "m", "--coordinator", "c:1", "--gpu-index", "-2"}).ok());
}

TEST(WorkerOptionsTest, ResolvesTheGpuOfARank) {
  // Default: the rank modulo the visible devices.
  EXPECT_EQ(*ResolveGpuIndex(-1, 0, 4), 0);
  EXPECT_EQ(*ResolveGpuIndex(-1, 3, 4), 3);
  EXPECT_EQ(*ResolveGpuIndex(-1, 5, 4), 1);
  EXPECT_EQ(*ResolveGpuIndex(-1, 1, 1), 0);
  // --gpu-index wins over the rank.
  EXPECT_EQ(*ResolveGpuIndex(2, 0, 4), 2);
  EXPECT_EQ(*ResolveGpuIndex(0, 3, 4), 0);
  absl::StatusOr<int> gpu = ResolveGpuIndex(4, 0, 4);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gpu.status().message().find("--gpu-index 4"), std::string::npos) << gpu.status();
  EXPECT_NE(gpu.status().message().find("4 CUDA device(s)"), std::string::npos) << gpu.status();
  gpu = ResolveGpuIndex(-1, 0, 0);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Runs a command's entry point in-process with `args`, returning (exit code, stderr).
template <typename Command>
std::pair<int, std::string> RunCommand(Command command, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  testing::internal::CaptureStderr();
  const int code = command(static_cast<int>(args.size()), argv.data());
  return {code, testing::internal::GetCapturedStderr()};
}

TEST(WorkerCommandTest, DeviceCudaWithoutGpuFailsAtStartWithClearError) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  // The device is resolved before the model is opened or anything starts: the missing
  // model file is never reached, and the process would exit with status 1.
  auto [code, err] = RunCommand(RunWorkerCommand, {"loom-worker", "--model", "/nonexistent.gguf",
                                                   "--coordinator", "127.0.0.1:1", "--device",
                                                   "cuda"});
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("--device cuda: no usable CUDA device"), std::string::npos) << err;
  EXPECT_EQ(err.find("nonexistent"), std::string::npos) << err;
}

TEST(WorkerCommandTest, TensorParallelCudaWithoutGpuFailsAtStartWithClearError) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  // Accepted as a command line (CUDA tensor parallelism exists), refused for the machine:
  // status 1 with the reason, before the model is opened or the coordinator is dialled.
  auto [code, err] = RunCommand(
      RunWorkerCommand, {"loom-worker", "--model", "/nonexistent.gguf", "--coordinator",
                         "127.0.0.1:1", "--device", "cuda", "--world-size", "2", "--rank", "1",
                         "--gpu-index", "1"});
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("--device cuda: no usable CUDA device"), std::string::npos) << err;
  EXPECT_EQ(err.find("not implemented"), std::string::npos) << err;
  EXPECT_EQ(err.find("nonexistent"), std::string::npos) << err;
}

TEST(WorkerCommandTest, DraftModelNeedsTheModelRunnerOnOneRank) {
  // Refused before any file is opened.
  auto [code, err] = RunCommand(
      RunWorkerCommand, {"loom-worker", "--model", "/nonexistent.gguf", "--coordinator",
                         "127.0.0.1:1", "--draft-model", "/draft.gguf", "--step-backend", "noop"});
  EXPECT_EQ(code, 2) << err;
  EXPECT_NE(err.find("--draft-model needs the model runner on one rank"), std::string::npos) << err;
  EXPECT_EQ(err.find("nonexistent"), std::string::npos) << err;
  auto [tp_code, tp_err] = RunCommand(
      RunWorkerCommand, {"loom-worker", "--model", "/nonexistent.gguf", "--coordinator",
                         "127.0.0.1:1", "--draft-model", "/draft.gguf", "--device", "cpu",
                         "--world-size", "2", "--rank", "0"});
  EXPECT_EQ(tp_code, 2) << tp_err;
  EXPECT_NE(tp_err.find("--world-size 2"), std::string::npos) << tp_err;
  // On a GPU the draft runs beside the target: here the only refusal is the missing device.
  if (kernels::CudaDeviceCount() > 0) return;  // (with one, the missing model file)
  auto [cuda_code, cuda_err] = RunCommand(
      RunWorkerCommand, {"loom-worker", "--model", "/nonexistent.gguf", "--coordinator",
                         "127.0.0.1:1", "--draft-model", "/draft.gguf", "--device", "cuda"});
  EXPECT_EQ(cuda_code, 1) << cuda_err;
  EXPECT_NE(cuda_err.find("--device cuda: no usable CUDA device"), std::string::npos) << cuda_err;
  EXPECT_EQ(cuda_err.find("--draft-model"), std::string::npos) << cuda_err;
}

}  // namespace
}  // namespace loom::cli
