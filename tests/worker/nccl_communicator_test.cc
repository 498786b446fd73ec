#include "worker/nccl_communicator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "kernels/cuda_device.h"
#include "tests/worker/nccl_test_support.h"

#ifdef LOOM_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "worker/nccl_library.h"
#endif

namespace loom::worker {
namespace {

using std::chrono::milliseconds;

TEST(NcclCommunicatorTest, RefusesBadRanksBeforeTouchingAnyDevice) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto communicator = NcclCommunicator::Connect(store, 2, 2, 0, milliseconds(100));
  ASSERT_FALSE(communicator.ok());
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kInvalidArgument);
  communicator = NcclCommunicator::Connect(store, 0, 0, 0, milliseconds(100));
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kInvalidArgument);
}

// Where NCCL or a GPU is missing (this CI machine, a CPU node, a build without nccl.h),
// connecting is a clear FailedPrecondition naming what is missing, at once: the worker
// prints it and exits at start instead of failing its first step.
TEST(NcclCommunicatorTest, WithoutNcclOrGpuConnectIsFailedPrecondition) {
#ifdef LOOM_HAVE_NCCL
  if (kernels::CudaDeviceCount() > 0 && detail::LoadNccl().ok()) {
    GTEST_SKIP() << "NCCL and a CUDA device are both present";
  }
#endif
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  auto communicator = NcclCommunicator::Connect(store, 0, 2, 0, milliseconds(60000));
  ASSERT_FALSE(communicator.ok());
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kFailedPrecondition)
      << communicator.status();
  EXPECT_TRUE(absl::StrContains(communicator.status().message(), "NCCL not found") ||
              absl::StrContains(communicator.status().message(), "no CUDA device"))
      << communicator.status();
  // Refused before the rendezvous: nothing waited for the missing rank 1.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

#ifdef LOOM_HAVE_NCCL
// NCCL is loaded at run time: a library that is missing or too old is a clear
// FailedPrecondition, never a crash or a worker that cannot start.
TEST(NcclLibraryTest, MissingOrIncompleteLibraryIsAClearError) {
  absl::StatusOr<detail::NcclApi> missing =
      detail::OpenNcclLibrary({"/nonexistent/libnccl.so.2"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("NCCL not found"), std::string::npos);
  EXPECT_NE(missing.status().message().find("/nonexistent/libnccl.so.2"), std::string::npos);
  // A library that loads but is not NCCL: every missing entry point is named.
  absl::StatusOr<detail::NcclApi> not_nccl = detail::OpenNcclLibrary({"libm.so.6"});
  ASSERT_FALSE(not_nccl.ok());
  EXPECT_NE(not_nccl.status().message().find("ncclCommInitRankConfig"), std::string::npos)
      << not_nccl.status();
}

// NCCL missing (LOOM_NCCL_LIBRARY naming no library; the library is loaded once per
// process, hence a fresh one): Connect answers FailedPrecondition "NCCL not found" before it
// touches a device or the store, on any machine.
TEST(NcclCommunicatorTest, NcclNotFoundIsFailedPreconditionAtConnect) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("LOOM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
        auto store = std::make_shared<gloo::rendezvous::HashStore>();
        auto communicator = NcclCommunicator::Connect(store, 1, 2, 0, milliseconds(60000));
        const bool clear =
            communicator.status().code() == absl::StatusCode::kFailedPrecondition &&
            absl::StrContains(communicator.status().message(), "NCCL not found") &&
            absl::StrContains(communicator.status().message(), "/nonexistent/libnccl.so.2");
        std::fprintf(stderr, "%s\n", communicator.status().ToString().c_str());
        std::exit(clear ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "NCCL not found");
}


// World size 1 through the same code path as multi-GPU runs: the host-span calls stage
// through the device and leave the data as it is; gather copies it.
TEST(NcclCommunicatorTest, HostCollectivesInAWorldOfOne) {
  SKIP_WITHOUT_GPU_OR_NCCL();
  std::unique_ptr<NcclCommunicator> communicator = ConnectWorldOfOne();
  ASSERT_NE(communicator, nullptr);
  EXPECT_TRUE(communicator->has_device_collectives());
  std::vector<float> data = {1.5f, -2.0f, 3.25f, 4.0f};
  const std::vector<float> original = data;
  ASSERT_TRUE(communicator->AllReduceSum(absl::MakeSpan(data)).ok());
  EXPECT_EQ(data, original);
  ASSERT_TRUE(communicator->Broadcast(absl::MakeSpan(data), 0).ok());
  EXPECT_EQ(data, original);
  std::vector<float> gathered(data.size(), 0.0f);
  ASSERT_TRUE(communicator->AllGather(data, absl::MakeSpan(gathered)).ok());
  EXPECT_EQ(gathered, original);
  EXPECT_TRUE(communicator->Barrier().ok());
  // A wrong output size is refused, not run.
  std::vector<float> short_out(2);
  EXPECT_EQ(communicator->AllGather(data, absl::MakeSpan(short_out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(communicator->Broadcast(absl::MakeSpan(data), 1).code(),
            absl::StatusCode::kInvalidArgument);
  // A large buffer grows the staging scratch.
  std::vector<float> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 1000) * 0.5f;
  const std::vector<float> big_original = big;
  ASSERT_TRUE(communicator->AllReduceSum(absl::MakeSpan(big)).ok());
  EXPECT_EQ(big, big_original);
}

// The device collectives against a host reference (world of one: the sum over one rank is
// the data, the gather a copy), enqueued on the caller's stream, then the same collective
// captured into a CUDA graph and replayed (what the CUDA device's decode graphs do).
TEST(NcclCommunicatorTest, DeviceCollectivesInStreamOrderAndInsideACudaGraph) {
  SKIP_WITHOUT_GPU_OR_NCCL();
  std::unique_ptr<NcclCommunicator> communicator = ConnectWorldOfOne();
  ASSERT_NE(communicator, nullptr);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const int64_t n = 4099;
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  float* data = nullptr;
  float* gathered = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&gathered), n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(data, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  ASSERT_TRUE(communicator->AllReduceSumOnDevice(data, n, stream).ok());
  ASSERT_TRUE(communicator->AllGatherOnDevice(data, n, gathered, stream).ok());
  ASSERT_TRUE(communicator->WaitOnDevice(stream).ok());
  std::vector<float> back(n), back_gathered(n);
  ASSERT_EQ(cudaMemcpy(back.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back_gathered.data(), gathered, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);
  EXPECT_EQ(back_gathered, host);
  EXPECT_TRUE(communicator->AllReduceSumOnDevice(data, 0, stream).ok());
  EXPECT_EQ(communicator->AllReduceSumOnDevice(data, -1, stream).code(),
            absl::StatusCode::kInvalidArgument);

  // Captured: nothing in the calls waits on the stream, so capture succeeds.
  ASSERT_EQ(cudaMemsetAsync(gathered, 0, n * sizeof(float), stream), cudaSuccess);
  ASSERT_TRUE(communicator->WaitOnDevice(stream).ok());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status reduce = communicator->AllReduceSumOnDevice(data, n, stream);
  const absl::Status gather = communicator->AllGatherOnDevice(data, n, gathered, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(reduce.ok()) << reduce;
  ASSERT_TRUE(gather.ok()) << gather;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  }
  ASSERT_TRUE(communicator->WaitOnDevice(stream).ok());
  ASSERT_EQ(cudaMemcpy(back_gathered.data(), gathered, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back_gathered, host);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(data);
  cudaFree(gathered);
  communicator.reset();
  cudaStreamDestroy(stream);
}

// A rank that never comes: the others' non-blocking init gives up after the timeout
// (DeadlineExceeded, the communicator aborted), never a hang.
TEST(NcclCommunicatorTest, MissingPeerIsATimeoutNotAHang) {
  SKIP_WITHOUT_GPU_OR_NCCL();
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  auto communicator = NcclCommunicator::Connect(store, 0, 2, 0, milliseconds(1500));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(communicator.ok());
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kDeadlineExceeded)
      << communicator.status();
  EXPECT_LT(took, std::chrono::seconds(20));
}

// Two ranks of one communicator on one GPU (two threads, each its own NcclCommunicator):
// NCCL refuses a communicator whose ranks share a device ("Duplicate GPU detected"), in
// which case this skips with NCCL's reason; where it allows it, the all-reduce sums.
TEST(NcclCommunicatorTest, TwoRanksOnOneGpuWhereNcclAllowsIt) {
  SKIP_WITHOUT_GPU_OR_NCCL();
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> ranks[2] = {
      absl::UnknownError("not run"), absl::UnknownError("not run")};
  std::vector<float> data[2] = {{1.0f, 2.0f, 3.0f}, {10.0f, 20.0f, 30.0f}};
  absl::Status reduced[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ranks[r] = NcclCommunicator::Connect(store, r, 2, 0, milliseconds(8000));
      if (ranks[r].ok()) reduced[r] = (*ranks[r])->AllReduceSum(absl::MakeSpan(data[r]));
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < 2; ++r) {
    if (!ranks[r].ok()) {
      GTEST_SKIP() << "NCCL does not run two ranks of one communicator on one GPU: "
                   << ranks[r].status();
    }
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(reduced[r].ok()) << reduced[r];
    EXPECT_EQ(data[r], (std::vector<float>{11.0f, 22.0f, 33.0f}));
  }
}
#endif  // LOOM_HAVE_NCCL

}  // namespace
}  // namespace loom::worker
