#include "worker/kv_push.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "model/cpu_kv_cache.h"
#include "tests/worker/kv_pool_test_util.h"
#include "worker/kv_push_stream.h"
#include "worker/kv_transfer.h"

namespace loom::worker {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kLayers = 3, kBlocks = 6, kBlockSize = 16, kHeadDim = 64;

std::unique_ptr<model::CpuKvCache> Pool(int64_t kv_heads, kernels::cpu::KvDtype dtype) {
  common::ModelConfig config;
  config.num_layers = kLayers;
  config.num_kv_heads = kv_heads;
  config.head_dim = kHeadDim;
  return *model::CpuKvCache::Create(config, kBlocks, kBlockSize, dtype);
}

// Heads [begin, + count) of `full`'s blocks: what a tensor-parallel rank holding them has.
std::unique_ptr<model::CpuKvCache> Slice(const model::CpuKvCache& full, int64_t begin,
                                         int64_t count, kernels::cpu::KvDtype dtype) {
  auto pool = Pool(count, dtype);
  test_util::CopyKvHeads(full, begin, count, *pool);
  return pool;
}

// A host tier over `pool` knowing it holds the model's heads [begin, + count).
std::unique_ptr<KvHostTier> Tier(const model::CpuKvCache& pool, int64_t begin, int64_t count,
                                 kernels::cpu::KvDtype dtype) {
  auto tier = *KvHostTier::Create(4 * pool.block_bytes(), &pool);
  KvSlotLayout layout;
  layout.num_layers = kLayers;
  layout.block_size = kBlockSize;
  layout.head_dim = kHeadDim;
  layout.element_bytes = kernels::cpu::KvElementBytes(dtype);
  layout.scale_bytes = kernels::cpu::KvScaleBytes(dtype);
  layout.kv_head_begin = begin;
  layout.num_kv_heads = count;
  EXPECT_EQ(layout.slot_bytes(), tier->slot_bytes());
  tier->set_layout(layout);
  return tier;
}

std::vector<uint8_t> Saved(const model::CpuKvCache& pool, int32_t block) {
  std::vector<uint8_t> bytes(static_cast<size_t>(pool.block_bytes()));
  uint8_t* out = bytes.data();
  EXPECT_TRUE(pool.SaveBlocks(absl::MakeConstSpan(&block, 1), absl::MakeConstSpan(&out, 1)).ok());
  return bytes;
}

// The prefill worker's side without a model: its pool, and the forward pass's half-layer
// calls made by the test (RunLayers), as the CPU forward pass makes them. `observes`
// false: a backend without the observer, as CUDA's (its pushes go whole after the pass).
class PoolBackend final : public StepBackend {
 public:
  explicit PoolBackend(const model::CpuKvCache* pool, bool observes = true)
      : pool_(pool), observes_(observes) {}
  std::string_view name() const override { return observes_ ? "pool" : "cuda-like"; }
  const common::ModelConfig& config() const override { return config_; }
  int64_t num_kv_blocks() const override { return pool_->num_blocks(); }
  int64_t block_size() const override { return pool_->block_size(); }
  bool uses_samplers() const override { return false; }
  const model::KvCache* kv_pool() const override { return pool_; }
  bool SetHalfLayerObserver(std::function<void()> observer) override {
    if (!observes_) return false;
    observer_ = std::move(observer);
    return true;
  }
  absl::Status Run(const StepBatch&, absl::Span<const SampleRow>, std::vector<SampledToken>&,
                   std::vector<int32_t>&, BackendTimings&) override {
    return absl::OkStatus();
  }
  void RunLayers(int64_t layers) {
    for (int64_t i = 0; i < 2 * layers; ++i) {
      if (observer_) observer_();
    }
  }
  bool observed() const { return static_cast<bool>(observer_); }

 private:
  const model::CpuKvCache* pool_;
  bool observes_;
  common::ModelConfig config_;
  std::function<void()> observer_;
};

loom::v1::KvPushDest Dest(const KvHostTier& tier, int32_t begin, int32_t count) {
  loom::v1::KvPushDest dest;
  dest.mutable_shared()->set_boot_id(BootId());
  dest.mutable_shared()->set_pid(static_cast<int32_t>(getpid()));
  dest.mutable_shared()->set_fd(tier.shared_fd());
  dest.mutable_shared()->set_size(tier.mapped_bytes());
  dest.set_kv_head_begin(begin);
  dest.set_num_kv_heads(count);
  return dest;
}

// A decode worker serving only WriteKvBlocks into `tier`, on a real local gRPC server: a
// push's destination over TCP. `stalled`: a receiver that never reads (until cancelled).
class Receiver final : public loom::v1::Worker::Service {
 public:
  explicit Receiver(KvHostTier* tier, bool stalled = false) : tier_(tier), stalled_(stalled) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~Receiver() override { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::Status WriteKvBlocks(grpc::ServerContext* context,
                             grpc::ServerReader<loom::v1::KvBlockWrite>* reader,
                             loom::v1::WriteKvBlocksResponse* response) override {
    while (stalled_ && !context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return ReceiveKvBlocks(context, tier_, reader, response);
  }

 private:
  KvHostTier* tier_;
  bool stalled_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// The same rank reached over TCP: no memory to map, its address.
loom::v1::KvPushDest TcpDest(const std::string& address, int32_t begin, int32_t count) {
  loom::v1::KvPushDest dest;
  dest.set_address(address);
  dest.set_kv_head_begin(begin);
  dest.set_num_kv_heads(count);
  return dest;
}

loom::v1::StepPlan PushPlan(std::vector<int32_t> blocks, std::vector<int32_t> slots,
                            std::vector<loom::v1::KvPushDest> dests) {
  loom::v1::StepPlan plan;
  loom::v1::KvPush* push = plan.add_kv_pushes();
  push->mutable_device_blocks()->Add(blocks.begin(), blocks.end());
  push->mutable_dest_slots()->Add(slots.begin(), slots.end());
  for (loom::v1::KvPushDest& dest : dests) *push->add_dests() = std::move(dest);
  return plan;
}

// What one step of `plan`'s pushes, its forward pass stopping after `layers`, says went
// wrong ("" when nothing did).
std::string PushError(PoolBackend& backend, KvHostTier* tier, const loom::v1::StepPlan& plan,
                      int64_t layers) {
  KvPusher pusher(backend, tier);
  pusher.Begin(plan);
  backend.RunLayers(layers);
  loom::v1::StepResult result;
  pusher.End(result);
  return result.kv_push_error();
}

// Through the decode tier's memory (false), or over TCP (true).
class KvPushTransportTest : public ::testing::TestWithParam<bool> {};

// Pushed layer by layer (or whole after the pass, by a backend without the observer),
// adopted, reloaded: the decode pool holds the prefill pool's blocks bit for bit, K, V and
// 8-bit scales, with the same slices on both sides and from two tensor-parallel ranks (one
// KV head each) into one rank holding both (over TCP the receiver maps the heads).
TEST_P(KvPushTransportTest, PushedBlocksReloadBitIdenticalAcrossTensorParallelSizes) {
  const bool tcp = GetParam();
  for (const bool observes : {true, false})
    for (const kernels::cpu::KvDtype dtype :
         {kernels::cpu::KvDtype::kF16, kernels::cpu::KvDtype::kInt8}) {
      SCOPED_TRACE(absl::StrCat(kernels::cpu::KvDtypeName(dtype),
                                observes ? " layer by layer" : " after the pass"));
      std::unique_ptr<model::CpuKvCache> full = Pool(2, dtype), decode_pool = Pool(2, dtype);
      test_util::RandomizeKvPool(*full, 7);
      auto decode_tier = Tier(*decode_pool, 0, 2, dtype);
      std::unique_ptr<Receiver> receiver =
          tcp ? std::make_unique<Receiver>(decode_tier.get()) : nullptr;
      auto to_decode = [&] {
        return tcp ? TcpDest(receiver->address(), 0, 2) : Dest(*decode_tier, 0, 2);
      };
      // One rank with both heads.
      {
        auto tier = Tier(*full, 0, 2, dtype);
        PoolBackend backend(full.get(), observes);
        // Staging of one block: the whole-block copies go one by one.
        KvPusher pusher(backend, tier.get(), /*staging_bytes=*/1);
        pusher.Begin(PushPlan({2, 5}, {1, 3}, {to_decode()}));
        ASSERT_EQ(backend.observed(), observes);
        backend.RunLayers(kLayers);
        loom::v1::StepResult result;
        pusher.End(result);
        EXPECT_EQ(result.kv_push_error(), "");
        EXPECT_FALSE(backend.observed()) << "the observer outlived its step";
        EXPECT_EQ(tier->stats().bytes_served, 2 * tier->slot_bytes());  // counted as to_peer
      }
      loom::v1::StepPlan adopt;
      adopt.add_kv_pushed_slots(1);
      adopt.add_kv_pushed_slots(3);
      ASSERT_TRUE(AdoptPushedSlots(decode_tier.get(), adopt).ok());
      ASSERT_TRUE(decode_tier->Apply({{false, 0, 1}, {false, 4, 3}}).ok());
      EXPECT_EQ(Saved(*decode_pool, 0), Saved(*full, 2));
      EXPECT_EQ(Saved(*decode_pool, 4), Saved(*full, 5));
      // Two ranks of one head each push their heads into the same slot.
      for (int64_t rank = 0; rank < 2; ++rank) {
        auto slice = Slice(*full, rank, 1, dtype);
        auto tier = Tier(*slice, rank, 1, dtype);
        PoolBackend backend(slice.get(), observes);
        KvPusher pusher(backend, tier.get());
        pusher.Begin(PushPlan({1}, {2}, {to_decode()}));
        backend.RunLayers(kLayers);
        loom::v1::StepResult result;
        pusher.End(result);
        EXPECT_EQ(result.kv_push_error(), "") << "rank " << rank;
        EXPECT_EQ(tier->stats().bytes_served, tier->slot_bytes()) << "rank " << rank;
      }
      adopt.Clear();
      adopt.add_kv_pushed_slots(2);
      ASSERT_TRUE(AdoptPushedSlots(decode_tier.get(), adopt).ok());
      ASSERT_TRUE(decode_tier->Apply({{false, 5, 2}}).ok());
      EXPECT_EQ(Saved(*decode_pool, 5), Saved(*full, 1));
      if (tcp) {
        EXPECT_EQ(decode_tier->stats().bytes_fetched, 3 * decode_tier->slot_bytes());
      }
      // One rank with both heads into two ranks of one head each: each gets its own head
      // (over TCP only that head's bytes travel).
      {
        auto tier = Tier(*full, 0, 2, dtype);
        PoolBackend backend(full.get(), observes);
        std::vector<std::unique_ptr<model::CpuKvCache>> rank_pools;
        std::vector<std::unique_ptr<KvHostTier>> rank_tiers;
        std::vector<std::unique_ptr<Receiver>> rank_receivers;
        std::vector<loom::v1::KvPushDest> dests;
        for (int32_t rank = 0; rank < 2; ++rank) {
          rank_pools.push_back(Pool(1, dtype));
          rank_tiers.push_back(Tier(*rank_pools.back(), rank, 1, dtype));
          if (tcp) {
            rank_receivers.push_back(std::make_unique<Receiver>(rank_tiers.back().get()));
            dests.push_back(TcpDest(rank_receivers.back()->address(), rank, 1));
          } else {
            dests.push_back(Dest(*rank_tiers.back(), rank, 1));
          }
        }
        KvPusher pusher(backend, tier.get());
        pusher.Begin(PushPlan({3}, {1}, dests));
        backend.RunLayers(kLayers);
        loom::v1::StepResult result;
        pusher.End(result);
        EXPECT_EQ(result.kv_push_error(), "");
        EXPECT_EQ(tier->stats().bytes_served, tier->slot_bytes());  // each head once
        for (int32_t rank = 0; rank < 2; ++rank) {
          loom::v1::StepPlan adopt_one;
          adopt_one.add_kv_pushed_slots(1);
          ASSERT_TRUE(AdoptPushedSlots(rank_tiers[rank].get(), adopt_one).ok());
          ASSERT_TRUE(rank_tiers[rank]->Apply({{false, 0, 1}}).ok());
          EXPECT_EQ(Saved(*rank_pools[rank], 0), Saved(*Slice(*full, rank, 1, dtype), 3))
              << "rank " << rank;
          if (tcp) {
            EXPECT_EQ(rank_tiers[rank]->stats().bytes_fetched, rank_tiers[rank]->slot_bytes());
          }
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Transports, KvPushTransportTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tcp" : "SharedMemory";
                         });

// A decode tier another container's worker cannot map (its memory file is not reachable
// from here) is written over TCP at its address; without an address the push says why.
TEST(KvPushTest, AnUnmappableTierIsWrittenOverTcp) {
  const auto dtype = kernels::cpu::KvDtype::kF16;
  std::unique_ptr<model::CpuKvCache> pool = Pool(2, dtype), decode_pool = Pool(2, dtype);
  test_util::RandomizeKvPool(*pool, 3);
  auto tier = Tier(*pool, 0, 2, dtype);
  auto decode_tier = Tier(*decode_pool, 0, 2, dtype);
  Receiver receiver(decode_tier.get());
  PoolBackend backend(pool.get());
  loom::v1::KvPushDest dest = Dest(*decode_tier, 0, 2);
  dest.mutable_shared()->set_pid(0);  // /proc/0/fd/...: nothing to map
  EXPECT_NE(PushError(backend, tier.get(), PushPlan({4}, {0}, {dest}), kLayers), "");
  dest.set_address(receiver.address());
  EXPECT_EQ(PushError(backend, tier.get(), PushPlan({4}, {0}, {dest}), kLayers), "");
  loom::v1::StepPlan adopt;
  adopt.add_kv_pushed_slots(0);
  ASSERT_TRUE(AdoptPushedSlots(decode_tier.get(), adopt).ok());
  ASSERT_TRUE(decode_tier->Apply({{false, 1, 0}}).ok());
  EXPECT_EQ(Saved(*decode_pool, 1), Saved(*pool, 4));
}

// A prefill pool and a decode pool (F16, random, distinct) with their tiers and the decode
// worker's WriteKvBlocks; the tests offload the decode pool's block 1 into slot 0 (what
// the coordinator plans once it gave a push's slots back) and check that it stays.
struct ReusedSlotRig {
  static constexpr kernels::cpu::KvDtype kDtype = kernels::cpu::KvDtype::kF16;
  ReusedSlotRig()
      : pool(Pool(2, kDtype)),
        decode_pool(Pool(2, kDtype)),
        tier(Tier(*pool, 0, 2, kDtype)),
        decode_tier(Tier(*decode_pool, 0, 2, kDtype)),
        receiver(decode_tier.get()),
        backend(pool.get()) {
    test_util::RandomizeKvPool(*pool, 3);
    test_util::RandomizeKvPool(*decode_pool, 4);
  }
  // Whether slot 0 still holds the decode pool's block 1 (reloaded through block 2).
  bool KeptTheOffloadedBlock() {
    if (!decode_tier->Apply({{false, 2, 0}}).ok()) return false;
    return Saved(*decode_pool, 2) == Saved(*decode_pool, 1) &&
           Saved(*decode_pool, 2) != Saved(*pool, 4);
  }
  std::unique_ptr<model::CpuKvCache> pool, decode_pool;
  std::unique_ptr<KvHostTier> tier, decode_tier;
  Receiver receiver;
  PoolBackend backend;
};

// Once a plan closed the decode replica's hold on the slots (the coordinator gave them back,
// and an offload reused one), a push over TCP that names the hold writes nothing: the slot
// keeps the offloaded block. A push under another hold goes on.
TEST(KvPushTest, APushOverTcpForAClosedHoldWritesNothing) {
  ReusedSlotRig rig;
  const uint64_t closed[] = {7};
  rig.decode_tier->CloseHolds(closed);                       // by a plan (StepExecutor::Execute)
  ASSERT_TRUE(rig.decode_tier->Apply({{true, 1, 0}}).ok());  // the plan's offload into slot 0
  loom::v1::KvPushDest dest = TcpDest(rig.receiver.address(), 0, 2);
  dest.set_hold_id(7);
  EXPECT_THAT(PushError(rig.backend, rig.tier.get(), PushPlan({4}, {0}, {dest}), kLayers),
              HasSubstr("push hold 7 has ended"));
  EXPECT_TRUE(rig.KeptTheOffloadedBlock());

  dest.set_hold_id(8);
  EXPECT_EQ(PushError(rig.backend, rig.tier.get(), PushPlan({4}, {1}, {dest}), kLayers), "");
  loom::v1::StepPlan adopt;
  adopt.add_kv_pushed_slots(1);
  ASSERT_TRUE(AdoptPushedSlots(rig.decode_tier.get(), adopt).ok());
  ASSERT_TRUE(rig.decode_tier->Apply({{false, 3, 1}}).ok());
  EXPECT_EQ(Saved(*rig.decode_pool, 3), Saved(*rig.pool, 4));
}

// A step the coordinator gave up (it lost this worker and gives the push's slots back)
// writes no layer, through shared memory or over TCP: the slot keeps what it held.
TEST_P(KvPushTransportTest, AnAbandonedStepPushesNothing) {
  ReusedSlotRig rig;
  ASSERT_TRUE(rig.decode_tier->Apply({{true, 1, 0}}).ok());
  const loom::v1::KvPushDest dest =
      GetParam() ? TcpDest(rig.receiver.address(), 0, 2) : Dest(*rig.decode_tier, 0, 2);
  KvPusher pusher(rig.backend, rig.tier.get());
  bool abandoned = false;
  pusher.Begin(PushPlan({4}, {0}, {dest}), [&abandoned] { return abandoned; });
  abandoned = true;  // the coordinator cancelled the step stream before the first layer
  rig.backend.RunLayers(kLayers);
  loom::v1::StepResult result;
  pusher.End(result);
  EXPECT_THAT(result.kv_push_error(), HasSubstr("gave this step up"));
  EXPECT_TRUE(rig.KeptTheOffloadedBlock());
}

// Over TCP, what cannot be written is said: a slot outside the decode tier, a decode tier
// of another layout, heads it does not hold, a decode worker that is gone, one that stops
// reading (the sender gives up after its stall timeout, not at the deadline), and a worker
// without a tier.
TEST(KvPushTest, APushOverTcpThatCannotCompleteSaysWhy) {
  const auto dtype = kernels::cpu::KvDtype::kF16;
  std::unique_ptr<model::CpuKvCache> pool = Pool(2, dtype), decode_pool = Pool(2, dtype);
  auto tier = Tier(*pool, 0, 2, dtype);
  auto decode_tier = Tier(*decode_pool, 0, 2, dtype);
  auto int8_pool = Pool(2, kernels::cpu::KvDtype::kInt8);
  auto int8_tier = Tier(*int8_pool, 0, 2, kernels::cpu::KvDtype::kInt8);
  Receiver receiver(decode_tier.get()), int8_receiver(int8_tier.get());
  PoolBackend backend(pool.get());
  auto push_error = [&](const loom::v1::StepPlan& plan) {
    return PushError(backend, tier.get(), plan, kLayers);
  };
  EXPECT_THAT(push_error(PushPlan({1}, {9}, {TcpDest(receiver.address(), 0, 2)})),
              HasSubstr("not in the host tier"));
  EXPECT_THAT(push_error(PushPlan({1}, {0}, {TcpDest(int8_receiver.address(), 0, 2)})),
              HasSubstr("pushed slots of"));
  std::string gone;
  {
    Receiver stopped(decode_tier.get());
    gone = stopped.address();
  }
  EXPECT_THAT(push_error(PushPlan({1}, {0}, {TcpDest(gone, 0, 2)})), HasSubstr(gone));

  // The receiver maps heads: a writer holding none of its heads is refused.
  auto other = Pool(1, dtype);
  auto other_tier = Tier(*other, 1, 1, dtype);
  Receiver other_receiver(other_tier.get());
  {
    KvPushStream stream(other_receiver.address(), other_tier->slot_bytes(),
                        absl::Now() + absl::Seconds(20), decode_tier->layout().WithHeads(0, 1));
    KvSlotLayout layer = decode_tier->layout().WithHeads(0, 1);
    layer.num_layers = 1;
    std::vector<uint8_t> bytes(static_cast<size_t>(layer.slot_bytes()));
    ASSERT_TRUE(stream.Send(0, 0, bytes).ok());
    EXPECT_THAT(stream.Finish().message(), HasSubstr("none of this worker's"));
  }

  // A decode worker that stops reading: the sender stops waiting after the stall timeout.
  Receiver stalled(decode_tier.get(), /*stalled=*/true);
  {
    KvPushStream stream(stalled.address(), decode_tier->slot_bytes(),
                        absl::Now() + absl::Seconds(60), {}, absl::Milliseconds(300),
                        /*max_queued_bytes=*/0);
    std::vector<uint8_t> piece(static_cast<size_t>(decode_tier->slot_bytes()));
    const absl::Time start = absl::Now();
    absl::Status sent;
    for (int i = 0; i < 4096 && sent.ok(); ++i) sent = stream.Send(0, 0, piece);
    EXPECT_EQ(sent.code(), absl::StatusCode::kDeadlineExceeded) << sent;
    EXPECT_LT(absl::Now() - start, absl::Seconds(30));
    EXPECT_FALSE(stream.Finish().ok());
  }
  // A small push to it queues at once; Finish then waits for an answer that never comes and
  // gives up after the stall timeout, not at the deadline a minute away.
  {
    KvPushStream stream(stalled.address(), decode_tier->slot_bytes(),
                        absl::Now() + absl::Seconds(60), {}, absl::Milliseconds(300));
    std::vector<uint8_t> piece(static_cast<size_t>(decode_tier->slot_bytes()));
    ASSERT_TRUE(stream.Send(0, 0, piece).ok());
    const absl::Time start = absl::Now();
    const absl::Status finished = stream.Finish();
    EXPECT_EQ(finished.code(), absl::StatusCode::kDeadlineExceeded) << finished;
    EXPECT_THAT(finished.message(), HasSubstr("no progress"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  }

  // A piece whose bytes do not match its checksum (debug builds send one) is refused.
  {
    auto stub = loom::v1::Worker::NewStub(
        grpc::CreateChannel(receiver.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    loom::v1::WriteKvBlocksResponse response;
    auto writer = stub->WriteKvBlocks(&context, &response);
    loom::v1::KvBlockWrite message;
    message.set_slot_bytes(decode_tier->slot_bytes());
    loom::v1::KvSlotWrite* piece = message.add_writes();
    piece->set_slot(0);
    piece->set_data(std::string(64, 'x'));
    piece->set_checksum(KvSlotChecksum(absl::MakeConstSpan(
                            reinterpret_cast<const uint8_t*>(piece->data().data()), 64)) ^
                        1);
    writer->Write(message);
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("checksum"));
  }

  Receiver no_tier(nullptr);
  {
    KvPushStream stream(no_tier.address(), decode_tier->slot_bytes(),
                        absl::Now() + absl::Seconds(20));
    EXPECT_THAT(stream.Finish().message(), HasSubstr("no host KV tier"));
  }
}

// What cannot be pushed is said, never a failed step: a forward pass that stopped early or
// failed, a destination on another machine, slots or blocks out of range. Bad adoptions are
// refused.
TEST(KvPushTest, APushThatCannotCompleteSaysWhy) {
  const auto dtype = kernels::cpu::KvDtype::kF16;
  std::unique_ptr<model::CpuKvCache> pool = Pool(2, dtype), decode_pool = Pool(2, dtype);
  auto tier = Tier(*pool, 0, 2, dtype);
  auto decode_tier = Tier(*decode_pool, 0, 2, dtype);
  PoolBackend backend(pool.get());
  auto push_error = [&](const loom::v1::StepPlan& plan, int64_t layers) {
    return PushError(backend, tier.get(), plan, layers);
  };
  EXPECT_THAT(push_error(PushPlan({1}, {0}, {Dest(*decode_tier, 0, 2)}), 2),
              HasSubstr("stopped after 2 of 3 layers"));
  loom::v1::KvPushDest elsewhere = Dest(*decode_tier, 0, 2);
  elsewhere.mutable_shared()->set_boot_id("another-machine");
  EXPECT_THAT(push_error(PushPlan({1}, {0}, {elsewhere}), kLayers), HasSubstr("another machine"));
  EXPECT_THAT(push_error(PushPlan({1}, {9}, {Dest(*decode_tier, 0, 2)}), kLayers),
              HasSubstr("outside the decode worker's tier"));
  EXPECT_THAT(push_error(PushPlan({kBlocks}, {0}, {Dest(*decode_tier, 0, 2)}), kLayers),
              HasSubstr("outside the pool"));
  EXPECT_EQ(push_error(loom::v1::StepPlan(), 0), "");  // nothing to push
  EXPECT_FALSE(backend.observed());

  // A backend without the observer copies after the pass, and not after a failed one.
  PoolBackend no_observer(pool.get(), /*observes=*/false);
  KvPusher pusher(no_observer, tier.get());
  pusher.Begin(PushPlan({1}, {0}, {Dest(*decode_tier, 0, 2)}));
  loom::v1::StepResult result;
  result.set_error_code(static_cast<int32_t>(absl::StatusCode::kInternal));
  pusher.End(result);
  EXPECT_THAT(result.kv_push_error(), HasSubstr("forward pass failed"));

  loom::v1::StepPlan adopt;
  adopt.add_kv_pushed_slots(4);
  EXPECT_EQ(AdoptPushedSlots(decode_tier.get(), adopt).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdoptPushedSlots(nullptr, adopt).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace loom::worker
