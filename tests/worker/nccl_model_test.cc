// The CUDA device's collectives through NCCL (model/cuda_device.cc with a
// worker/NcclCommunicator): the whole llama graph on one GPU as a world of one, where every
// collective the graph makes goes through NCCL on the device's stream, against the same
// graph without a communicator; and the device's vocabulary gather (NCCL's rank-major
// output reordered into vocabulary order) against a host reference. Skipped without a GPU
// or NCCL (tests/gpu/quick.sh runs them, filter Nccl*).

#include <chrono>
#include <memory>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "kernels/cuda_device.h"
#include "model/cuda_device.h"
#include "model/llama_graph.h"
#include "model/model_weights.h"
#include "tests/worker/tiny_model.h"
#include "worker/nccl_communicator.h"
#include "tests/worker/nccl_test_support.h"

#ifdef LOOM_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "worker/nccl_library.h"
#endif

namespace loom::worker {
namespace {

#ifdef LOOM_HAVE_NCCL

// Runs a random llama model (GQA, head_dim 64) on the CUDA device with `communicator`
// (null: none) through a 7-token prefill and two decode steps; the logits of each step.
std::vector<std::vector<float>> RunGraph(model::Communicator* communicator) {
  testing::TinyModelSpec spec;
  spec.vocab = 67;  // not a multiple of anything: the gather's strides are uneven
  spec.hidden = 128;
  spec.ffn = 256;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  std::unique_ptr<common::GgufFile> gguf = testing::TinyModel(spec);
  absl::StatusOr<std::unique_ptr<model::ModelWeights>> weights = model::LoadModelWeights(*gguf);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return {};
  model::CudaDeviceOptions device_options;
  device_options.communicator = communicator;
  absl::StatusOr<std::unique_ptr<model::CudaDevice>> device =
      model::CudaDevice::Create(device_options);
  EXPECT_TRUE(device.ok()) << device.status();
  if (!device.ok()) return {};
  model::LlamaGraphOptions options;
  options.num_kv_blocks = 8;
  options.block_size = 16;
  absl::StatusOr<std::unique_ptr<model::LlamaGraph>> graph =
      model::LlamaGraph::Create(std::move(*weights), std::move(*device), options);
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  model::Device& d = (*graph)->device();
  absl::StatusOr<std::unique_ptr<model::Buffer>> out = d.Allocate(2 * spec.vocab * sizeof(float));
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> ids = {3, 17, 42, 5, 9, 60, 1};
  std::vector<int32_t> positions = {0, 1, 2, 3, 4, 5, 6};
  for (int step = 0; step < 3; ++step) {
    std::vector<int32_t> slots;
    for (int32_t p : positions) slots.push_back(2 * 16 + p);
    const int32_t context = positions.back() + 1;
    const std::vector<int32_t> query_start = {0, static_cast<int32_t>(ids.size())};
    const std::vector<int32_t> context_len = {context}, indptr = {0, 1}, indices = {2};
    // Two sample rows in the prefill (the last two tokens), one afterwards.
    std::vector<int32_t> sample = {static_cast<int32_t>(ids.size()) - 1};
    if (ids.size() > 1) sample.insert(sample.begin(), static_cast<int32_t>(ids.size()) - 2);
    const int64_t rows = static_cast<int64_t>(sample.size());
    const model::Tensor out_tensor = model::Tensor::Of(
        (*out)->data(), model::DType::kF32, d.type(), {rows, spec.vocab});
    absl::StatusOr<model::StepTensors> tensors =
        d.UploadStep(ids, positions, slots, query_start, context_len, indptr, indices, sample);
    EXPECT_TRUE(tensors.ok()) << tensors.status();
    if (!tensors.ok()) return {};
    const absl::Status status = (*graph)->Forward(*tensors, out_tensor);
    EXPECT_TRUE(status.ok()) << status;
    std::vector<float> host(rows * spec.vocab);
    const absl::Status downloaded = d.DownloadF32(out_tensor, host.data());
    EXPECT_TRUE(downloaded.ok()) << downloaded;
    logits.push_back(std::move(host));
    ids = {static_cast<int32_t>((step * 13 + 7) % spec.vocab)};
    positions = {context};
  }
  return logits;
}

// NCCL at world size 1 through the full model: equal logits, bit for bit (the sum over one
// rank and the gather of one slice are copies).
TEST(NcclModelTest, LlamaGraphOverNcclWorldOfOneEqualsNoCommunicator) {
  SKIP_WITHOUT_GPU_OR_NCCL();
  std::unique_ptr<NcclCommunicator> communicator = ConnectWorldOfOne();
  ASSERT_NE(communicator, nullptr);
  const std::vector<std::vector<float>> alone = RunGraph(nullptr);
  const std::vector<std::vector<float>> joined = RunGraph(communicator.get());
  ASSERT_EQ(alone.size(), 3u);
  ASSERT_EQ(joined.size(), 3u);
  for (size_t step = 0; step < alone.size(); ++step) {
    SCOPED_TRACE(step);
    EXPECT_EQ(alone[step], joined[step]);
  }
  // The communicator is still usable after the steps (nothing timed out or broke).
  EXPECT_TRUE(communicator->Barrier().ok());
}

// CudaDevice's collectives with an NCCL communicator of one rank against the host
// reference: the all-reduce keeps the data, the gather copies the slice.
TEST(NcclModelTest, CudaDeviceCollectivesThroughNcclMatchTheHostReference) {
  SKIP_WITHOUT_GPU_OR_NCCL();
  std::unique_ptr<NcclCommunicator> communicator = ConnectWorldOfOne();
  ASSERT_NE(communicator, nullptr);
  model::CudaDeviceOptions options;
  options.communicator = communicator.get();
  absl::StatusOr<std::unique_ptr<model::CudaDevice>> device = model::CudaDevice::Create(options);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<float> x(5 * 11);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.25f - 3.0f;
  absl::StatusOr<std::unique_ptr<model::Buffer>> in = (*device)->UploadF32(x);
  absl::StatusOr<std::unique_ptr<model::Buffer>> out =
      (*device)->UploadF32(std::vector<float>(x.size(), 0.0f));
  ASSERT_TRUE(in.ok() && out.ok());
  const model::Tensor local =
      model::Tensor::Of((*in)->data(), model::DType::kF32, model::DeviceType::kCuda, {5, 11});
  const model::Tensor gathered =
      model::Tensor::Of((*out)->data(), model::DType::kF32, model::DeviceType::kCuda, {5, 11});
  ASSERT_TRUE((*device)->AllReduceSum(local).ok());
  ASSERT_TRUE((*device)->AllGatherColumns(local, gathered).ok());
  std::vector<float> reduced(x.size()), copied(x.size());
  ASSERT_TRUE((*device)->DownloadF32(local, reduced.data()).ok());
  ASSERT_TRUE((*device)->DownloadF32(gathered, copied.data()).ok());
  EXPECT_EQ(reduced, x);
  EXPECT_EQ(copied, x);
}

// A stand-in for `world` ranks that all hold the same data, with device collectives made of
// stream-ordered copies (a single GPU cannot host a real NCCL world of several ranks): for
// the CUDA device's padding and rank-major -> vocabulary-order reordering of the gather.
class LoopbackCommunicator final : public model::Communicator {
 public:
  explicit LoopbackCommunicator(int world) : world_(world) {}
  int rank() const override { return 0; }
  int world_size() const override { return world_; }
  absl::Status AllReduceSum(absl::Span<float>) override { return absl::UnimplementedError(""); }
  absl::Status AllGather(absl::Span<const float>, absl::Span<float>) override {
    return absl::UnimplementedError("");
  }
  absl::Status Broadcast(absl::Span<float>, int) override { return absl::UnimplementedError(""); }
  absl::Status Barrier() override { return absl::UnimplementedError(""); }
  bool has_device_collectives() const override { return true; }
  absl::Status AllReduceSumOnDevice(float*, int64_t, void*) override {
    return absl::UnimplementedError("");
  }
  absl::Status AllGatherOnDevice(const float* in, int64_t n, float* out, void* stream) override {
    for (int r = 0; r < world_; ++r) {
      if (cudaMemcpyAsync(out + r * n, in, n * sizeof(float), cudaMemcpyDeviceToDevice,
                          static_cast<cudaStream_t>(stream)) != cudaSuccess) {
        return absl::InternalError("copy");
      }
    }
    return absl::OkStatus();
  }
  absl::Status WaitOnDevice(void* stream) override {
    ++waits;
    return cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) == cudaSuccess
               ? absl::OkStatus()
               : absl::InternalError("sync");
  }
  int waits = 0;

 private:
  int world_;
};

TEST(NcclModelTest, GatheredVocabularySlicesLandInVocabularyOrder) {
  if (kernels::CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device: " << kernels::CudaDeviceDescription(0);
  }
  // vocab 10 over 3 ranks: stride 4, ranks hold [0, 4), [4, 8), [8, 10).
  const int64_t rows = 3, vocab = 10, world = 3, stride = 4;
  LoopbackCommunicator loopback(world);
  model::CudaDeviceOptions options;
  options.communicator = &loopback;
  absl::StatusOr<std::unique_ptr<model::CudaDevice>> device = model::CudaDevice::Create(options);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->world_size(), 3);
  std::vector<float> slice(rows * stride);
  for (size_t i = 0; i < slice.size(); ++i) slice[i] = 1.0f + static_cast<float>(i);
  absl::StatusOr<std::unique_ptr<model::Buffer>> in = (*device)->UploadF32(slice);
  absl::StatusOr<std::unique_ptr<model::Buffer>> out =
      (*device)->UploadF32(std::vector<float>(rows * vocab, -1.0f));
  ASSERT_TRUE(in.ok() && out.ok());
  const model::Tensor local = model::Tensor::Of((*in)->data(), model::DType::kF32,
                                                model::DeviceType::kCuda, {rows, stride});
  const model::Tensor logits = model::Tensor::Of((*out)->data(), model::DType::kF32,
                                                 model::DeviceType::kCuda, {rows, vocab});
  ASSERT_TRUE((*device)->AllGatherColumns(local, logits).ok());
  std::vector<float> host(rows * vocab);
  ASSERT_TRUE((*device)->DownloadF32(logits, host.data()).ok());
  EXPECT_GE(loopback.waits, 1) << "Synchronize did not wait through the communicator";
  // Every rank sent this slice: rank r's columns [r * 4, min(10, r * 4 + 4)) hold its first
  // columns, row by row.
  std::vector<float> expected(rows * vocab);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < vocab; ++c) expected[i * vocab + c] = slice[i * stride + c % stride];
  }
  EXPECT_EQ(host, expected);
  // A slice wider than the stride is refused.
  absl::StatusOr<std::unique_ptr<model::Buffer>> wide = (*device)->UploadF32(
      std::vector<float>(rows * 5, 0.0f));
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ((*device)
                ->AllGatherColumns(model::Tensor::Of((*wide)->data(), model::DType::kF32,
                                                     model::DeviceType::kCuda, {rows, 5}),
                                   logits)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

#else  // !LOOM_HAVE_NCCL

TEST(NcclModelTest, NeedsABuildWithNccl) { GTEST_SKIP() << "built without NCCL"; }

#endif  // LOOM_HAVE_NCCL

}  // namespace
}  // namespace loom::worker
