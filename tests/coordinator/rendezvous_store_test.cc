#include "coordinator/rendezvous_store.h"

#include <memory>
#include <thread>
#include <vector>

#include "common/cluster_secret.h"
#include "coordinator/cluster.h"
#include "coordinator/coordinator_service.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/coordinator_store.h"
#include "worker/gloo_communicator.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(RendezvousStoreTest, GetWaitsForEveryKey) {
  RendezvousStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(store.Set("a", "1").ok());
    ASSERT_TRUE(store.Set("b", "2").ok());
  });
  absl::StatusOr<std::vector<std::string>> values = store.Get({"b", "a"}, absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<std::string>{"2", "1"}));
}

TEST(RendezvousStoreTest, MissingKeysTimeOutAndBadInputIsRefused) {
  RendezvousStore store;
  absl::StatusOr<std::vector<std::string>> values = store.Get({"never"}, absl::Milliseconds(20));
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(values.status().message(), HasSubstr("never"));
  EXPECT_EQ(store.Set("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("big", std::string(RendezvousStore::kMaxValueBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
}

// `service` on a free local port (set in `port`); null when it cannot start.
std::unique_ptr<grpc::Server> Serve(CoordinatorService& service, int& port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  return builder.BuildAndStart();
}

// Three gloo ranks rendezvous through a real Coordinator service over gRPC.
TEST(RendezvousStoreTest, GlooRanksRendezvousThroughTheCoordinatorService) {
  Cluster cluster(ClusterOptions{}, "fingerprint");
  CoordinatorService service(cluster);
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, port);
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  constexpr int kRanks = 3;
  std::vector<float> sums(kRanks, 0.0f);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto store = std::make_shared<worker::CoordinatorStore>(channel, "replica-0/1/",
                                                              std::chrono::seconds(20));
      auto communicator = worker::GlooCommunicator::Connect(store, rank, kRanks, {});
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      std::vector<float> value = {static_cast<float>(rank + 1)};
      ASSERT_TRUE((*communicator)->AllReduceSum(absl::MakeSpan(value)).ok());
      sums[rank] = value[0];
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(sums, (std::vector<float>{6.0f, 6.0f, 6.0f}));

  // A rank alone times out at rendezvous with an error, not a hang.
  auto store = std::make_shared<worker::CoordinatorStore>(channel, "replica-1/1/",
                                                          std::chrono::milliseconds(300));
  auto alone = worker::GlooCommunicator::Connect(store, 0, 2, {"127.0.0.1", std::chrono::milliseconds(300)});
  EXPECT_FALSE(alone.ok());
  server->Shutdown();
}

// With a cluster secret installed, the Coordinator service answers only callers presenting
// it: a stranger can neither register a replica nor write the rendezvous store.
TEST(RendezvousStoreTest, TheCoordinatorServiceRefusesCallersWithoutTheClusterSecret) {
  common::SetClusterSecret("secret");
  struct Uninstall {
    ~Uninstall() { common::SetClusterSecret(""); }
  } uninstall;
  Cluster cluster(ClusterOptions{}, "fingerprint");
  CoordinatorService service(cluster);
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, port);
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto stranger = loom::v1::Coordinator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto member = loom::v1::Coordinator::NewStub(common::CreateClusterChannel(address));
  loom::v1::StoreSetRequest set;
  set.set_key("k");
  set.set_value("v");
  loom::v1::RegisterRequest registration;
  registration.set_replica_id("intruder");
  for (auto* stub : {stranger.get(), member.get()}) {
    const bool presents = stub == member.get();
    grpc::ClientContext store_context;
    loom::v1::StoreSetResponse stored;
    EXPECT_EQ(stub->StoreSet(&store_context, set, &stored).ok(), presents);
    grpc::ClientContext register_context;
    loom::v1::RegisterResponse registered;
    const grpc::Status status = stub->Register(&register_context, registration, &registered);
    // The member gets past the check to the registration's own refusal (no model).
    EXPECT_EQ(status.error_code() == grpc::StatusCode::UNAUTHENTICATED, !presents)
        << status.error_message();
  }
  EXPECT_EQ(cluster.num_healthy(), 0);
  server->Shutdown();
}

}  // namespace
}  // namespace loom::coordinator
