#include "worker/kv_transfer.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "model/cpu_kv_cache.h"
#include "tests/worker/kv_pool_test_util.h"
#include "tests/worker/local_server.h"

namespace loom::worker {
namespace {

using ::testing::HasSubstr;

using test_util::PoolConfig;

std::unique_ptr<model::CpuKvCache> Pool(int64_t kv_heads = 2) {
  return *model::CpuKvCache::Create(PoolConfig(kv_heads), 6, 16, kernels::cpu::KvDtype::kF16);
}

using test_util::SavedBlock;

// A worker that serves only ReadKvBlocks from `tier`, on a real local gRPC server.
class Source final : public loom::v1::Worker::Service {
 public:
  explicit Source(const KvHostTier* tier) : tier_(tier) {}
  void Stop() { server_.Stop(); }
  std::string address() const { return server_.address(); }
  std::atomic<uint64_t> executed{0};
  std::atomic<uint64_t> gone{0};  // a step whose copies will never run

  grpc::Status ReadKvBlocks(grpc::ServerContext* context,
                            const loom::v1::ReadKvBlocksRequest* request,
                            grpc::ServerWriter<loom::v1::KvBlockChunk>* writer) override {
    return ServeKvBlocks(context, tier_, *request, writer, [this](uint64_t step) {
      if (step == gone.load()) return KvStepState::kGone;
      return executed.load() >= step ? KvStepState::kRan : KvStepState::kPending;
    });
  }

 private:
  const KvHostTier* tier_;
  test_util::LocalServer server_{this};
};

// A worker that serves only FetchKvBlocks into `tier`, as WorkerService does (the call's
// context is the fetch's caller), on a real local gRPC server.
class Destination final : public loom::v1::Worker::Service {
 public:
  explicit Destination(KvHostTier* tier) : tier_(tier) {}
  std::string address() const { return server_.address(); }

  grpc::Status FetchKvBlocks(grpc::ServerContext* context,
                             const loom::v1::FetchKvBlocksRequest* request,
                             loom::v1::FetchKvBlocksResponse* response) override {
    absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched =
        worker::FetchKvBlocks(tier_, *request, context);
    result = fetched.status();
    done.Notify();
    if (!fetched.ok()) {
      return grpc::Status(static_cast<grpc::StatusCode>(fetched.status().code()),
                          std::string(fetched.status().message()));
    }
    *response = *std::move(fetched);
    return grpc::Status::OK;
  }
  // The first fetch's own outcome, once its handler returned.
  absl::Notification done;
  absl::Status result;

 private:
  KvHostTier* tier_;
  test_util::LocalServer server_{this};
};

// Whether fetches may map the source's tier (true) or must stream it over TCP.
bool shared_memory = true;

loom::v1::FetchKvBlocksRequest Fetch(const std::string& address, std::vector<int32_t> source,
                                     std::vector<int32_t> dest) {
  loom::v1::FetchKvBlocksRequest request;
  request.set_no_shared_memory(!shared_memory);
  loom::v1::KvBlockSource* from = request.add_sources();
  from->set_address(address);
  from->mutable_slots()->Add(source.begin(), source.end());
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
  test_util::RandomizeKvPool(*source_pool, 1);
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
  EXPECT_EQ(SavedBlock(*dest_pool, 0), SavedBlock(*source_pool, 5));
  EXPECT_EQ(SavedBlock(*dest_pool, 4), SavedBlock(*source_pool, 2));
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

// The step that was to offload the blocks will not run on the source (its copies failed,
// or the coordinator lost the source worker and its new stream began after that step):
// the fetch fails at once with the reason, not at its deadline, and leaves nothing.
TEST_P(KvTransferTest, AFetchWhoseSourceStepWillNotRunFailsAtOnce) {
  std::unique_ptr<model::CpuKvCache> pool = Pool();
  auto source_tier = *KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  auto dest_tier = *KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  ASSERT_TRUE(source_tier->Apply({{true, 1, 0}}).ok());
  Source source(source_tier.get());
  source.gone = 7;
  loom::v1::FetchKvBlocksRequest request = Fetch(source.address(), {0}, {1});
  request.set_after_step_id(7);
  const absl::Time start = absl::Now();
  const absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched =
      FetchKvBlocks(dest_tier.get(), request);
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kFailedPrecondition) << fetched.status();
  EXPECT_THAT(std::string(fetched.status().message()), HasSubstr("will not run here"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(dest_tier->Apply({{false, 0, 1}}).ok()) << "a failed fetch left a block behind";
}

// The coordinator cancels a fetch whose request went away: the destination's reads from
// the source are children of its call, so the fetch ends at once (not at its 20 s
// deadline) while the source still waits for its step, and leaves no block behind.
TEST_P(KvTransferTest, ACancelledFetchEndsWhileTheSourceWaitsAndLeavesNothing) {
  std::unique_ptr<model::CpuKvCache> pool = Pool();
  auto source_tier = *KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  auto dest_tier = *KvHostTier::Create(2 * pool->block_bytes(), pool.get());
  ASSERT_TRUE(source_tier->Apply({{true, 1, 0}}).ok());
  Source source(source_tier.get());
  Destination destination(dest_tier.get());
  loom::v1::FetchKvBlocksRequest request = Fetch(source.address(), {0}, {1});
  request.set_after_step_id(7);  // never executed: the source waits out the deadline
  auto stub = loom::v1::Worker::NewStub(
      grpc::CreateChannel(destination.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  std::thread cancel([&context] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    context.TryCancel();
  });
  loom::v1::FetchKvBlocksResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status status = stub->FetchKvBlocks(&context, request, &response);
  cancel.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  // The destination worker itself gave up too, well before the 20 s the source would have
  // waited (the caller's answer comes at once; the worker's handler is what holds slots).
  ASSERT_TRUE(destination.done.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "the destination still waits for the source after its caller cancelled";
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(destination.result.code(), absl::StatusCode::kCancelled) << destination.result;
  EXPECT_FALSE(dest_tier->Apply({{false, 0, 1}}).ok()) << "a cancelled fetch left a block";
  // The worker serves fetches after it: the source's step ran, the slot arrives.
  source.executed = 7;
  EXPECT_TRUE(worker::FetchKvBlocks(dest_tier.get(), Fetch(source.address(), {0}, {1})).ok());
}

// The coordinator gave a fetch up and a plan closed its hold, then offloaded another block
// into the slot: a fetch still naming that hold writes nothing there (not even the
// "half-written" mark of a failed fetch), and the offloaded block reloads intact.
TEST_P(KvTransferTest, AFetchWhoseHoldClosedWritesNothing) {
  std::unique_ptr<model::CpuKvCache> source_pool = Pool(), dest_pool = Pool();
  test_util::RandomizeKvPool(*source_pool, 1);
  test_util::RandomizeKvPool(*dest_pool, 2);
  auto source_tier = *KvHostTier::Create(2 * source_pool->block_bytes(), source_pool.get());
  auto dest_tier = *KvHostTier::Create(2 * dest_pool->block_bytes(), dest_pool.get());
  ASSERT_TRUE(source_tier->Apply({{true, 2, 0}}).ok());
  Source source(source_tier.get());
  source.executed = 1;
  const uint64_t closed[] = {9};
  dest_tier->CloseHolds(closed);
  ASSERT_TRUE(dest_tier->Apply({{true, 3, 1}}).ok());
  loom::v1::FetchKvBlocksRequest request = Fetch(source.address(), {0}, {1});
  request.set_hold_id(9);
  const absl::StatusOr<loom::v1::FetchKvBlocksResponse> late =
      FetchKvBlocks(dest_tier.get(), request);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kCancelled) << late.status();
  ASSERT_TRUE(dest_tier->Apply({{false, 0, 1}}).ok());
  EXPECT_EQ(SavedBlock(*dest_pool, 0), SavedBlock(*dest_pool, 3));
  request.set_hold_id(10);
  ASSERT_TRUE(FetchKvBlocks(dest_tier.get(), request).ok());
  ASSERT_TRUE(dest_tier->Apply({{false, 0, 1}}).ok());
  EXPECT_EQ(SavedBlock(*dest_pool, 0), SavedBlock(*source_pool, 2));
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

// The model's KV heads [begin, + count) of `full`'s blocks, as a tensor-parallel rank
// holding that slice would have computed them.
std::unique_ptr<model::CpuKvCache> Slice(const model::CpuKvCache& full, int64_t begin,
                                         int64_t count, kernels::cpu::KvDtype dtype) {
  auto pool = *model::CpuKvCache::Create(PoolConfig(count), 6, 16, dtype);
  test_util::CopyKvHeads(full, begin, count, *pool);
  return pool;
}

// A host tier over `pool` that knows its slots hold the model's heads [begin, + count).
std::unique_ptr<KvHostTier> SlicedTier(const model::CpuKvCache& pool, int64_t begin, int64_t count,
                                       kernels::cpu::KvDtype dtype) {
  auto tier = *KvHostTier::Create(2 * pool.block_bytes(), &pool);
  KvSlotLayout layout;
  layout.num_layers = pool.num_layers();
  layout.block_size = 16;
  layout.head_dim = 64;
  layout.element_bytes = kernels::cpu::KvElementBytes(dtype);
  layout.scale_bytes = kernels::cpu::KvScaleBytes(dtype);
  layout.kv_head_begin = begin;
  layout.num_kv_heads = count;
  EXPECT_EQ(layout.slot_bytes(), tier->slot_bytes());
  tier->set_layout(layout);
  return tier;
}

void AddSource(loom::v1::FetchKvBlocksRequest& request, const std::string& address, int32_t slot,
               int32_t begin, int32_t count) {
  loom::v1::KvBlockSource* source = request.add_sources();
  source->set_address(address);
  source->add_slots(slot);
  source->set_kv_head_begin(begin);
  source->set_num_kv_heads(count);
}

TEST_P(KvTransferTest, MapsKvHeadsBetweenTensorParallelSizes) {
  for (const kernels::cpu::KvDtype dtype :
       {kernels::cpu::KvDtype::kF16, kernels::cpu::KvDtype::kInt8}) {
    SCOPED_TRACE(kernels::cpu::KvDtypeName(dtype));
    // Three KV heads on two ranks (as SmolLM2's at -tp 2): head 1 on both.
    auto full = *model::CpuKvCache::Create(PoolConfig(3), 6, 16, dtype);
    test_util::RandomizeKvPool(*full, 3);
    std::unique_ptr<model::CpuKvCache> rank0 = Slice(*full, 0, 2, dtype);
    std::unique_ptr<model::CpuKvCache> rank1 = Slice(*full, 1, 2, dtype);
    auto tier0 = SlicedTier(*rank0, 0, 2, dtype), tier1 = SlicedTier(*rank1, 1, 2, dtype);
    auto full_tier = SlicedTier(*full, 0, 3, dtype);
    ASSERT_TRUE(tier0->Apply({{true, 4, 1}}).ok());
    ASSERT_TRUE(tier1->Apply({{true, 4, 1}}).ok());
    ASSERT_TRUE(full_tier->Apply({{true, 4, 0}}).ok());
    Source source0(tier0.get()), source1(tier1.get()), source_full(full_tier.get());

    // Two ranks to one: every head, bit for bit the whole model's block.
    auto dest = *model::CpuKvCache::Create(PoolConfig(3), 6, 16, dtype);
    auto dest_tier = SlicedTier(*dest, 0, 3, dtype);
    loom::v1::FetchKvBlocksRequest request = Fetch(source0.address(), {1}, {0});
    request.clear_sources();
    AddSource(request, source0.address(), 1, 0, 2);
    AddSource(request, source1.address(), 1, 1, 2);
    absl::StatusOr<loom::v1::FetchKvBlocksResponse> fetched =
        FetchKvBlocks(dest_tier.get(), request);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    ASSERT_TRUE(dest_tier->Apply({{false, 2, 0}}).ok());
    EXPECT_EQ(SavedBlock(*dest, 2), SavedBlock(*full, 4));

    // One rank to two: rank 1's heads out of the whole model's slots.
    auto half = *model::CpuKvCache::Create(PoolConfig(2), 6, 16, dtype);
    auto half_tier = SlicedTier(*half, 1, 2, dtype);
    request.clear_sources();
    AddSource(request, source_full.address(), 0, 0, 3);
    fetched = FetchKvBlocks(half_tier.get(), request);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    ASSERT_TRUE(half_tier->Apply({{false, 5, 0}}).ok());
    EXPECT_EQ(SavedBlock(*half, 5), SavedBlock(*rank1, 4));

    // A head no source holds, and a source that names no heads beside another: refused
    // by name, nothing left behind.
    request.clear_sources();
    AddSource(request, source0.address(), 1, 0, 2);
    fetched = FetchKvBlocks(dest_tier.get(), request);
    EXPECT_EQ(fetched.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(fetched.status().message(), HasSubstr("no source holds KV head 2"));
    AddSource(request, source1.address(), 1, 0, 0);
    fetched = FetchKvBlocks(dest_tier.get(), request);
    EXPECT_THAT(fetched.status().message(), HasSubstr("names no KV heads"));
    // A tier that does not know its layout cannot map heads.
    auto unknown = *KvHostTier::Create(2 * dest->block_bytes(), dest.get());
    request.clear_sources();
    AddSource(request, source0.address(), 1, 0, 2);
    AddSource(request, source1.address(), 1, 1, 2);
    fetched = FetchKvBlocks(unknown.get(), request);
    EXPECT_EQ(fetched.status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedMemoryAndTcp, KvTransferTest, ::testing::Bool());

}  // namespace
}  // namespace loom::worker
