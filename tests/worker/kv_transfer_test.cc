#include "worker/kv_transfer.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "model/cpu_kv_cache.h"

namespace loom::worker {
namespace {

using ::testing::HasSubstr;

common::ModelConfig Config(int64_t kv_heads = 2) {
  common::ModelConfig config;
  config.num_layers = 3;
  config.num_kv_heads = kv_heads;
  config.head_dim = 64;
  return config;
}

std::unique_ptr<model::CpuKvCache> Pool(int64_t kv_heads = 2) {
  return *model::CpuKvCache::Create(Config(kv_heads), 6, 16, kernels::cpu::KvDtype::kF16);
}

// The pool's blocks as their host-tier slots would hold them.
std::vector<uint8_t> Saved(const model::CpuKvCache& pool, int32_t block) {
  std::vector<uint8_t> bytes(static_cast<size_t>(pool.block_bytes()));
  uint8_t* out = bytes.data();
  EXPECT_TRUE(pool.SaveBlocks(absl::MakeConstSpan(&block, 1), absl::MakeConstSpan(&out, 1)).ok());
  return bytes;
}

void Randomize(const model::CpuKvCache& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t l = 0; l < pool.num_layers(); ++l) {
    const kernels::cpu::KvLayerView view = pool.layer(l);
    const int64_t bytes = view.num_blocks * view.block_size * view.num_kv_heads * view.head_dim * 2;
    for (int64_t i = 0; i < bytes; ++i) {
      static_cast<uint8_t*>(view.k)[i] = static_cast<uint8_t>(rng());
      static_cast<uint8_t*>(view.v)[i] = static_cast<uint8_t>(rng());
    }
  }
}

// A worker that serves only ReadKvBlocks from `tier`, on a real local gRPC server.
class Source final : public loom::v1::Worker::Service {
 public:
  explicit Source(const KvHostTier* tier) : tier_(tier) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~Source() override { Stop(); }
  void Stop() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::atomic<uint64_t> executed{0};

  grpc::Status ReadKvBlocks(grpc::ServerContext* context,
                            const loom::v1::ReadKvBlocksRequest* request,
                            grpc::ServerWriter<loom::v1::KvBlockChunk>* writer) override {
    return ServeKvBlocks(context, tier_, *request, writer,
                         [this](uint64_t step) { return executed.load() >= step; });
  }

 private:
  const KvHostTier* tier_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Whether fetches may map the source's tier (true) or must stream it over TCP.
bool shared_memory = true;

loom::v1::FetchKvBlocksRequest Fetch(const std::string& address, std::vector<int32_t> source,
                                     std::vector<int32_t> dest) {
  loom::v1::FetchKvBlocksRequest request;
  request.set_no_shared_memory(!shared_memory);
  request.set_source_address(address);
  request.mutable_source_slots()->Add(source.begin(), source.end());
  request.mutable_dest_slots()->Add(dest.begin(), dest.end());
  request.set_timeout_ms(20000);
  return request;
}

// Both ways: mapping the source's memory file (one machine), and streaming over TCP.
class KvTransferTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { shared_memory = GetParam(); }
};

TEST_P(KvTransferTest, BlocksFetchedFromAnotherWorkerReloadBitIdentical) {
  std::unique_ptr<model::CpuKvCache> source_pool = Pool(), dest_pool = Pool();
  Randomize(*source_pool, 1);
  auto source_tier = *KvHostTier::Create(4 * source_pool->block_bytes(), source_pool.get());
  auto dest_tier = *KvHostTier::Create(4 * dest_pool->block_bytes(), dest_pool.get());
  ASSERT_TRUE(source_tier->Apply({{true, 2, 0}, {true, 5, 3}}).ok());
  Source source(source_tier.get());

  absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched =
      FetchKvBlocks(dest_tier.get(), Fetch(source.address(), {3, 0}, {1, 2}));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->bytes(), 2 * dest_pool->block_bytes());
  // Reloaded into the destination's pool: the source's blocks, bit for bit.
  ASSERT_TRUE(dest_tier->Apply({{false, 0, 1}, {false, 4, 2}}).ok());
  EXPECT_EQ(Saved(*dest_pool, 0), Saved(*source_pool, 5));
  EXPECT_EQ(Saved(*dest_pool, 4), Saved(*source_pool, 2));
  EXPECT_EQ(dest_tier->stats().bytes_fetched, 2 * dest_pool->block_bytes());
  EXPECT_EQ(dest_tier->stats().bytes_fetched_shared, GetParam() ? 2 * dest_pool->block_bytes() : 0);
}

TEST_P(KvTransferTest, TheSourceServesOnlyAfterTheStepThatOffloadsTheBlocks) {
  std::unique_ptr<model::CpuKvCache> pool = Pool();
  auto source_tier = *KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  auto dest_tier = *KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  ASSERT_TRUE(source_tier->Apply({{true, 1, 0}}).ok());
  Source source(source_tier.get());
  loom::v1::FetchKvBlocksRequest request = Fetch(source.address(), {0}, {1});
  request.set_after_step_id(7);
  request.set_timeout_ms(300);
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> early = FetchKvBlocks(dest_tier.get(), request);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  EXPECT_FALSE(dest_tier->Apply({{false, 0, 1}}).ok()) << "a failed fetch left a block behind";
  source.executed = 7;
  request.set_timeout_ms(20000);
  EXPECT_TRUE(FetchKvBlocks(dest_tier.get(), request).ok());
}

TEST_P(KvTransferTest, RefusesMismatchedLayoutsUnknownSlotsAndAGoneSource) {
  std::unique_ptr<model::CpuKvCache> pool = Pool(), other = Pool(/*kv_heads=*/1);
  auto source_tier = *KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  ASSERT_TRUE(source_tier->Apply({{true, 1, 0}}).ok());
  Source source(source_tier.get());

  // Another tensor-parallel slice (fewer KV heads per rank): refused by name.
  auto narrow_tier = *KvHostTier::Create(2 * other->block_bytes(), other.get());
  absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched =
      FetchKvBlocks(narrow_tier.get(), Fetch(source.address(), {0}, {0}));
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fetched.status().message(), HasSubstr("tensor-parallel slice or KV dtype"));

  auto dest_tier = *KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  fetched = FetchKvBlocks(dest_tier.get(), Fetch(source.address(), {1}, {0}));
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fetched.status().message(), HasSubstr("host slot 1 holds no block"));
  fetched = FetchKvBlocks(dest_tier.get(), Fetch(source.address(), {0}, {0, 1}));
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kInvalidArgument);
  fetched = FetchKvBlocks(dest_tier.get(), Fetch(source.address(), {0, 0}, {1, 1}));
  EXPECT_THAT(fetched.status().message(), HasSubstr("named twice"));

  source.Stop();
  fetched = FetchKvBlocks(dest_tier.get(), Fetch(source.address(), {0}, {0}));
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kUnavailable) << fetched.status();
  EXPECT_FALSE(dest_tier->Apply({{false, 0, 0}}).ok());
}

INSTANTIATE_TEST_SUITE_P(SharedMemoryAndTcp, KvTransferTest, ::testing::Bool());

}  // namespace
}  // namespace loom::worker
