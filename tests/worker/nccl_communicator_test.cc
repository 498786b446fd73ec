#include "worker/nccl_communicator.h"

#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

#ifdef LOOM_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "worker/nccl_library.h"
#endif

namespace loom::worker {
namespace {

TEST(NcclCommunicatorTest, RefusesBadRanksBeforeTouchingAnyDevice) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto communicator =
      NcclCommunicator::Connect(store, 2, 2, 0, nullptr, std::chrono::milliseconds(100));
  EXPECT_FALSE(communicator.ok());
#ifdef LOOM_HAVE_NCCL
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kInvalidArgument);
#else
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kUnimplemented);
#endif
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
#endif

// World size 1 through the same code path as multi-GPU runs (only one GPU is ever lent
// here): the collectives on device memory leave the data as it is, gather copies it.
TEST(NcclCommunicatorTest, WorldOfOneOnTheGpu) {
#ifndef LOOM_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto communicator =
      NcclCommunicator::Connect(store, 0, 1, 0, stream, std::chrono::milliseconds(30000));
  if (!communicator.ok() &&
      absl::StrContains(communicator.status().message(), "NCCL not found")) {
    cudaStreamDestroy(stream);
    GTEST_SKIP() << communicator.status().message();  // tests/gpu/quick.sh: "NCCL not found"
  }
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  const std::vector<float> host = {1.5f, -2.0f, 3.25f, 4.0f};
  float* data = nullptr;
  float* gathered = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&gathered), host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_TRUE((*communicator)->AllReduceSum(absl::MakeSpan(data, host.size())).ok());
  EXPECT_TRUE((*communicator)->Broadcast(absl::MakeSpan(data, host.size()), 0).ok());
  EXPECT_TRUE((*communicator)
                  ->AllGather(absl::MakeConstSpan(data, host.size()),
                              absl::MakeSpan(gathered, host.size()))
                  .ok());
  EXPECT_TRUE((*communicator)->Barrier().ok());
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), gathered, back.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);
  cudaFree(data);
  cudaFree(gathered);
  communicator->reset();
  cudaStreamDestroy(stream);
#endif
}

}  // namespace
}  // namespace loom::worker
