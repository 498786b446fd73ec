#include "worker/gloo_communicator.h"

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

using std::chrono::milliseconds;

// Runs `body(rank, communicator)` on world_size threads, each rank connected through one
// in-process store (the coordinator's gRPC store plays this part between processes).
void RunRanks(int world_size, milliseconds timeout,
              const std::function<void(int, GlooCommunicator&)>& body) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      auto communicator = GlooCommunicator::Connect(store, rank, world_size, {"127.0.0.1", timeout});
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      body(rank, **communicator);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

class GlooCommunicatorTest : public testing::TestWithParam<int> {};

TEST_P(GlooCommunicatorTest, CollectivesComputeWhatTheySay) {
  const int world = GetParam();
  RunRanks(world, milliseconds(20000), [world](int rank, GlooCommunicator& comm) {
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.world_size(), world);
    // All-reduce: sum over ranks of (rank + 1) * (i + 1), exact in float for these sizes.
    std::vector<float> data(1000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>((rank + 1) * (i + 1));
    ASSERT_TRUE(comm.AllReduceSum(absl::MakeSpan(data)).ok());
    const float ranks_sum = world * (world + 1) / 2.0f;
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], ranks_sum * (i + 1)) << i;

    // All-gather: rank r contributes {r, r + 0.5}.
    const std::vector<float> in = {static_cast<float>(rank), rank + 0.5f};
    std::vector<float> out(2 * world);
    ASSERT_TRUE(comm.AllGather(in, absl::MakeSpan(out)).ok());
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(out[2 * r], r);
      EXPECT_EQ(out[2 * r + 1], r + 0.5f);
    }

    // Broadcast from the last rank.
    std::vector<float> value = {static_cast<float>(rank * 10), 7.0f};
    ASSERT_TRUE(comm.Broadcast(absl::MakeSpan(value), world - 1).ok());
    EXPECT_EQ(value[0], (world - 1) * 10.0f);
    EXPECT_TRUE(comm.Barrier().ok());
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooCommunicatorTest, testing::Values(1, 2, 3));

TEST(GlooCommunicatorErrorsTest, BadArgumentsAreRefusedBeforeAnyCollective) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  EXPECT_EQ(GlooCommunicator::Connect(store, 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  RunRanks(2, milliseconds(20000), [](int, GlooCommunicator& comm) {
    std::vector<float> out(3);
    const std::vector<float> in(2);
    EXPECT_EQ(comm.AllGather(in, absl::MakeSpan(out)).code(), absl::StatusCode::kInvalidArgument);
    std::vector<float> data(1);
    EXPECT_EQ(comm.Broadcast(absl::MakeSpan(data), 5).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(comm.Barrier().ok());  // still usable: nothing was sent
  });
}

TEST(GlooCommunicatorErrorsTest, AMissingPeerAtRendezvousIsADeadlineNotAHang) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  auto communicator = GlooCommunicator::Connect(store, 0, 2, {"127.0.0.1", milliseconds(500)});
  EXPECT_FALSE(communicator.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(GlooCommunicatorErrorsTest, APeerThatStopsTakingPartFailsTheCollectiveAndBreaksIt) {
  RunRanks(2, milliseconds(1000), [](int rank, GlooCommunicator& comm) {
    std::vector<float> data(16, 1.0f);
    ASSERT_TRUE(comm.AllReduceSum(absl::MakeSpan(data)).ok());
    if (rank == 1) return;  // rank 1 leaves (its communicator is destroyed)
    // Rank 0 waits at least until rank 1 is gone, then its all-reduce has no partner.
    std::this_thread::sleep_for(milliseconds(200));
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = comm.AllReduceSum(absl::MakeSpan(data));
    EXPECT_FALSE(status.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
    // Broken from now on: later calls fail at once with the same error.
    EXPECT_EQ(comm.Barrier(), status);
  });
}

}  // namespace
}  // namespace loom::worker
