#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"
#include "model/communicator.h"
#include "model/device.h"

namespace loom::model {

struct CudaDeviceOptions {
  /// The element type of weights on the device and of the GEMMs' inputs (F16 or BF16);
  /// activations between operations stay F32, as on the CPU.
  kernels::cuda::DataType dtype = kernels::cuda::DataType::kF16;
  /// The KV pool's element type (F16 or BF16).
  kernels::cuda::DataType kv_dtype = kernels::cuda::DataType::kF16;
  /// INT4 weights the W4A16 GEMM takes stay 4-bit (a quarter of the bytes a decode step
  /// reads); else (and for every other format) they are dequantized to `dtype`. An
  /// embedding table kept 4-bit cannot be gathered: the graph's tables are uploaded with
  /// this off (see UploadLinear).
  bool keep_quantized = false;
  /// Tensor parallelism: the group's collectives; null for a single rank. Not owned.
  /// A communicator with device collectives (NCCL) runs them on the device's stream, in
  /// stream order and capture-safe, even in a world of one, and Synchronize (and with it
  /// every download) then waits through its WaitOnDevice, under its timeout; any other
  /// (gloo) is staged through host memory (Synchronize, copy, the host call, copy back).
  Communicator* communicator = nullptr;
};

/// The CUDA implementation of model::Device on the current CUDA device: one stream of its
/// own on which every operation is enqueued (kernels/cuda launch functions, cuBLAS through
/// a GemmHandle bound to the stream), device memory from cudaMalloc, weights dense in F16/
/// BF16 for cuBLAS or 4-bit for the W4A16 GEMM. Activations are F32 between operations, as
/// on the CPU; a GEMM's input is rounded to the weight dtype first (a gather kernel that
/// converts), and prefill attention reads Q rounded to the KV dtype (its tensor cores'
/// input). Calls return once enqueued; DownloadF32 and Synchronize wait. Not thread-safe.
/// Without CUDA (or a device) Create answers FailedPrecondition.
class CudaDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const CudaDeviceOptions& options);
  ~CudaDevice() override;

  /// The stream every call enqueues on (for CUDA graph capture and on-device sampling).
  cudaStream_t stream() const { return stream_; }
  kernels::cuda::DataType dtype() const { return options_.dtype; }

  DeviceType type() const override { return DeviceType::kCuda; }
  std::string Describe() const override;

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<Buffer>> UploadF32(const std::vector<float>& host) override;
  absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadLinear(
      const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) override;
  absl::StatusOr<std::unique_ptr<KvCache>> CreateKvCache(const common::ModelConfig& config,
                                                         int64_t num_blocks,
                                                         int64_t block_size) override;
  /// Copies the batch into one device buffer of the device's (reused: a later UploadStep
  /// overwrites the tensors an earlier one returned, in stream order).
  absl::StatusOr<StepTensors> UploadStep(
      absl::Span<const int32_t> token_ids, absl::Span<const int32_t> positions,
      absl::Span<const int32_t> slots, absl::Span<const int32_t> query_start,
      absl::Span<const int32_t> context_len, absl::Span<const int32_t> block_indptr,
      absl::Span<const int32_t> block_indices, absl::Span<const int32_t> sample_rows) override;
  absl::Status DownloadF32(const Tensor& x, float* host) override;
  absl::Status Synchronize() override;

  /// The table must be dense (uploaded with keep_quantized off or not 4-bit);
  /// Unimplemented for a 4-bit one.
  absl::Status Embedding(const DeviceLinear& table, const Tensor& token_ids, int64_t vocab0,
                         Tensor out) override;
  absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override;
  absl::Status AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                          Tensor out) override;
  absl::Status Linear(const Tensor& x, const DeviceLinear& w, Tensor out,
                      LinearSite site) override;
  absl::Status SplitColumns(const Tensor& x, absl::Span<const Tensor> parts) override;
  absl::Status Rope(Tensor q, Tensor k, const Tensor& positions, const RopeSpec& spec) override;
  absl::Status WriteKv(KvCache& cache, int64_t layer, const Tensor& k, const Tensor& v,
                       const Tensor& slots) override;
  /// Decode kernel when every sequence has one query token, the prefill kernel otherwise;
  /// head_dim 64 or 128.
  absl::Status PagedAttention(const KvCache& cache, int64_t layer, const Tensor& q,
                              const StepTensors& step, const AttentionSpec& spec,
                              Tensor out) override;
  absl::Status SiluMul(const Tensor& gate_up, Tensor out) override;
  absl::Status GatherRows(const Tensor& x, const Tensor& y, const Tensor& rows,
                          Tensor out) override;

  int world_size() const override {
    return options_.communicator == nullptr ? 1 : options_.communicator->world_size();
  }
  absl::Status AllReduceSum(Tensor x) override;
  absl::Status AllGatherColumns(const Tensor& local, Tensor out) override;

 private:
  CudaDevice() = default;
  // Grows `buffer` to at least `bytes` (never shrinks).
  absl::Status Ensure(kernels::cuda::DeviceBuffer& buffer, size_t bytes);
  // iota_ holds 0, 1, ..., n - 1 (at least n of them).
  absl::Status EnsureIota(int64_t n);
  // `rows` x `cols` F32 at `src` -> `dst` of `type` (the gather kernel over iota_).
  absl::Status Convert(const void* src, kernels::cuda::DataType src_type, void* dst,
                       kernels::cuda::DataType dst_type, int64_t rows, int64_t cols);

  CudaDeviceOptions options_;
  int device_index_ = 0;
  int num_sms_ = 1;
  cudaStream_t stream_ = nullptr;  // owned
  std::unique_ptr<kernels::cuda::GemmHandle> gemm_;
  kernels::cuda::DeviceBuffer iota_;        // I32 [iota_size_]
  int64_t iota_size_ = 0;
  kernels::cuda::DeviceBuffer ones_;        // F32 ones (GatherRows' sum through AddRmsNorm)
  kernels::cuda::DeviceBuffer gemm_input_;  // a GEMM's input in dtype
  kernels::cuda::DeviceBuffer gemm_output_; // the W4A16 GEMM's output in dtype
  kernels::cuda::DeviceBuffer workspace_;   // split-K / split-context partial sums
  kernels::cuda::DeviceBuffer gathered_;    // GatherRows' second operand
  kernels::cuda::DeviceBuffer step_;        // UploadStep's arrays
  std::vector<int32_t> step_host_;
  std::vector<float> host_, host_gathered_;  // collective staging
  kernels::cuda::DeviceBuffer gather_local_;  // AllGatherColumns on the device: the padded
  kernels::cuda::DeviceBuffer gather_all_;    // local slice, and every rank's, rank-major
};

}  // namespace loom::model
