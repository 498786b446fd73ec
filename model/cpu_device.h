#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "model/communicator.h"
#include "model/device.h"

namespace loom::model {

/// Called by CpuDevice::Linear with (layer index, which input, the input activations
/// [num_tokens, in_features] row-major, num_tokens) for every layer's linear inputs:
/// calibration for `loom quantize` (AWQ). `x` is valid only during the call.
using ActivationObserver =
    std::function<void(int64_t layer, LinearInput input, const float* x, int64_t num_tokens)>;

struct CpuDeviceOptions {
  /// The pool to run on, shared with another device that never steps at the same time (a
  /// draft model beside its target); null: a pool of its own with num_threads threads.
  std::shared_ptr<kernels::cpu::ThreadPool> thread_pool;
  int num_threads = 2;
  kernels::cpu::KvDtype kv_dtype = kernels::cpu::KvDtype::kF16;
  /// The KV pool in a memory file other processes map (CpuKvCache::Create's `shared`).
  bool share_kv_pool = false;
  /// How linear layers over INT8/INT4 weights meet their input: exact F32, or int8 per
  /// 32 values with integer dot products. Float weights always use F32. Every step alike,
  /// so a sequence's logits never depend on its batch.
  kernels::cpu::ActivationPrecision activations = kernels::cpu::ActivationPrecision::kF32;
  /// Tensor parallelism: the group's collectives (gloo); null for a single rank. Not owned.
  Communicator* communicator = nullptr;
};

/// The CPU implementation of model::Device: host memory, the kernels of kernels/cpu on a
/// thread pool, weights packed by kernels/cpu/weights (viewed, not copied: the host
/// ModelWeights stay the storage), collectives through a Communicator. Every call runs to
/// completion before it returns. Not thread-safe.
class CpuDevice : public Device {
 public:
  /// InvalidArgument for fewer than one thread.
  static absl::StatusOr<std::unique_ptr<CpuDevice>> Create(const CpuDeviceOptions& options);

  /// Installs (or, with nullptr, removes) an observer of every layer's linear inputs;
  /// none by default, and then Linear pays nothing for it.
  void SetActivationObserver(ActivationObserver observer) { observer_ = std::move(observer); }
  const std::shared_ptr<kernels::cpu::ThreadPool>& thread_pool() const { return pool_; }
  kernels::cpu::KvDtype kv_dtype() const { return kv_dtype_; }

  DeviceType type() const override { return DeviceType::kCpu; }
  std::string Describe() const override;

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<Buffer>> UploadF32(const std::vector<float>& host) override;
  absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadLinear(
      const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) override;
  absl::StatusOr<std::unique_ptr<KvCache>> CreateKvCache(const common::ModelConfig& config,
                                                         int64_t num_blocks,
                                                         int64_t block_size) override;
  absl::StatusOr<StepTensors> UploadStep(
      absl::Span<const int32_t> token_ids, absl::Span<const int32_t> positions,
      absl::Span<const int32_t> slots, absl::Span<const int32_t> query_start,
      absl::Span<const int32_t> context_len, absl::Span<const int32_t> block_indptr,
      absl::Span<const int32_t> block_indices, absl::Span<const int32_t> sample_rows) override;
  absl::Status DownloadF32(const Tensor& x, float* host) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status Embedding(const DeviceLinear& table, const Tensor& token_ids, int64_t vocab0,
                         float scale, Tensor out) override;
  absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override;
  absl::Status AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                          Tensor out) override;
  absl::Status Linear(const Tensor& x, const DeviceLinear& w, Tensor out,
                      LinearSite site) override;
  absl::Status SplitColumns(const Tensor& x, absl::Span<const Tensor> parts) override;
  absl::Status ConcatColumns(absl::Span<const Tensor> parts, Tensor out) override;
  absl::Status Rope(Tensor q, Tensor k, const Tensor& positions, const RopeSpec& spec) override;
  absl::Status WriteKv(KvCache& cache, int64_t layer, const Tensor& k, const Tensor& v,
                       const Tensor& slots) override;
  absl::Status PagedAttention(const KvCache& cache, int64_t layer, const Tensor& q,
                              const StepTensors& step, const AttentionSpec& spec,
                              Tensor out) override;
  absl::Status SiluMul(const Tensor& gate_up, Tensor out) override;
  absl::Status GeluMul(const Tensor& gate_up, Tensor out) override;
  absl::Status SoftCap(Tensor x, float cap) override;
  absl::Status Scale(Tensor x, float factor) override;
  absl::Status AddSigmoidGated(const Tensor& x, const Tensor& gate_logits, Tensor out) override;
  absl::Status GatherRows(const Tensor& x, const Tensor& y, const Tensor& rows,
                          Tensor out) override;
  absl::Status MoeFeedForward(const Tensor& x, const Tensor& router_logits,
                              absl::Span<const DeviceLinear* const> gate_up,
                              absl::Span<const DeviceLinear* const> down, const MoeSpec& spec,
                              Tensor out) override;

  int world_size() const override {
    return communicator_ == nullptr ? 1 : communicator_->world_size();
  }
  absl::Status AllReduceSum(Tensor x) override;
  absl::Status AllGatherColumns(const Tensor& local, Tensor out) override;

 private:
  CpuDevice() = default;

  // fn(begin, end) over token rows [0, rows) of row_floats floats each, split across the
  // pool when the rows are many enough to pay for it.
  void ForRows(int64_t rows, int64_t row_floats,
               const std::function<void(int64_t, int64_t)>& fn) const;

  std::shared_ptr<kernels::cpu::ThreadPool> pool_;
  kernels::cpu::KvDtype kv_dtype_ = kernels::cpu::KvDtype::kF16;
  bool share_kv_pool_ = false;
  kernels::cpu::ActivationPrecision activations_ = kernels::cpu::ActivationPrecision::kF32;
  Communicator* communicator_ = nullptr;
  ActivationObserver observer_;      // empty unless calibrating
  std::vector<float> gathered_;      // AllGatherColumns scratch: [world, R, stride]
  // MoeFeedForward scratch for one expert's tokens: inputs, gate/up, SiLU·up, outputs.
  std::vector<float> moe_x_, moe_gate_up_, moe_act_, moe_out_;
};

}  // namespace loom::model
