#include "worker/health_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace loom::worker {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    health_.Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // Check's status for `service`, or the RPC's error code as a negative number.
  int Check(const std::string& service) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    const grpc::Status status = stub_->Check(&context, request, &response);
    return status.ok() ? static_cast<int>(response.status())
                       : -static_cast<int>(status.error_code());
  }

  HealthService health_{"loom.v1.Worker"};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

TEST_F(HealthServiceTest, CheckAnswersTheServerAndItsServiceAndRejectsOtherNames) {
  EXPECT_EQ(Check(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check("loom.v1.Worker"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check("loom.v1.Inference"), -static_cast<int>(grpc::StatusCode::NOT_FOUND));
  health_.SetServing(false);
  EXPECT_EQ(Check(""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check("loom.v1.Worker"), HealthCheckResponse::NOT_SERVING);
  health_.SetServing(true);
  EXPECT_EQ(Check(""), HealthCheckResponse::SERVING);
}

TEST_F(HealthServiceTest, WatchSendsTheStatusThenEachChangeAndEndsAtShutdown) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  HealthCheckRequest request;
  auto reader = stub_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  health_.SetServing(false);
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  health_.SetServing(false);  // no change, no message
  health_.SetServing(true);
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  health_.Shutdown();
  while (reader->Read(&response)) {
    EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(Check(""), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthServiceTest, WatchOfAnUnknownServiceSaysSoAndEndsWhenTheClientLeaves) {
  auto context = std::make_unique<grpc::ClientContext>();
  HealthCheckRequest request;
  request.set_service("nope");
  auto reader = stub_->Watch(context.get(), request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  EXPECT_EQ(health_.num_watching(), 1);
  context->TryCancel();
  EXPECT_FALSE(reader->Read(&response));
  reader->Finish();
  // The server's handler notices within its poll and returns (it holds a server thread).
  for (int i = 0; i < 200 && health_.num_watching() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(health_.num_watching(), 0);
}

}  // namespace
}  // namespace loom::worker
