#include "model/cuda_device.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "model/cuda_status.h"
#endif

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/kv_block_copy.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/quantized_gemm.h"
#include "model/cuda_device_internal.h"

namespace loom::model {

int64_t CudaDevice::StepElements(int64_t max_tokens, int64_t block_entries) {
  // Token, per-sequence and sample-row arrays of up to max_tokens each (16-byte aligned),
  // then the block indices.
  return 7 * (max_tokens + 4) + block_entries + 4;
}

// Here: the device's stream, memory and buffers, step uploads, CUDA graph capture and replay.
// Its weights, operations and collectives are in model/cuda_device_{weights,ops,collectives}.cc;
// without CUDA, every method is stubbed below.
#if !LOOM_HAVE_CUDA

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaDeviceOptions&) {
  return absl::FailedPreconditionError("the CUDA device needs a build with CUDA");
}
CudaDevice::~CudaDevice() = default;
std::string CudaDevice::Describe() const { return "cuda (not compiled in)"; }
#define LOOM_CUDA_DEVICE_STUB(signature) \
  signature { return absl::FailedPreconditionError("the CUDA device needs a build with CUDA"); }
LOOM_CUDA_DEVICE_STUB(absl::Status cuda_detail::CudaKvCache::SaveBlocks(absl::Span<const int32_t>,
                                                                        absl::Span<uint8_t* const>)
                          const)
LOOM_CUDA_DEVICE_STUB(absl::Status cuda_detail::CudaKvCache::LoadBlocks(
    absl::Span<const uint8_t* const>, absl::Span<const int32_t>) const)
LOOM_CUDA_DEVICE_STUB(absl::Status cuda_detail::CudaKvCache::RegisterHostMemory(void*, int64_t)
                          const)
void cuda_detail::CudaKvCache::UnregisterHostMemory(void*) const {}
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<Buffer>> CudaDevice::Allocate(int64_t))
LOOM_CUDA_DEVICE_STUB(
    absl::StatusOr<std::unique_ptr<Buffer>> CudaDevice::UploadF32(const std::vector<float>&))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadLinear(
    const kernels::cpu::PackedWeight&, const std::vector<float>*))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<KvCache>> CudaDevice::CreateKvCache(
    const common::ModelConfig&, int64_t, int64_t))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<StepTensors> CudaDevice::UploadStep(
    absl::Span<const int32_t>, absl::Span<const int32_t>, absl::Span<const int32_t>,
    absl::Span<const int32_t>, absl::Span<const int32_t>, absl::Span<const int32_t>,
    absl::Span<const int32_t>, absl::Span<const int32_t>))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::DownloadF32(const Tensor&, float*))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Synchronize())
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Embedding(const DeviceLinear&, const Tensor&,
                                                         int64_t, float, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::RmsNorm(const Tensor&, const Tensor&, float,
                                                       Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::AddRmsNorm(Tensor, const Tensor&, const Tensor&,
                                                          float, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Linear(const Tensor&, const DeviceLinear&, Tensor,
                                                      LinearSite))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::SplitColumns(const Tensor&,
                                                            absl::Span<const Tensor>))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::ConcatColumns(absl::Span<const Tensor>, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Rope(Tensor, Tensor, const Tensor&,
                                                    const RopeSpec&))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::WriteKv(KvCache&, int64_t, const Tensor&,
                                                       const Tensor&, const Tensor&))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::QkvToCache(const Tensor&, Tensor, Tensor, Tensor,
                                                          const Tensor&, const QkvSpec&, KvCache&,
                                                          int64_t, const Tensor&))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::PagedAttention(const KvCache&, int64_t,
                                                              const Tensor&, const StepTensors&,
                                                              const AttentionSpec&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::SiluMul(const Tensor&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::GeluMul(const Tensor&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::SoftCap(Tensor, float))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Scale(Tensor, float))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::AddSigmoidGated(const Tensor&, const Tensor&,
                                                               Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::MoeFeedForward(const Tensor&, const Tensor&,
                                                              absl::Span<const DeviceLinear* const>,
                                                              absl::Span<const DeviceLinear* const>,
                                                              const MoeSpec&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::GatherRows(const Tensor&, const Tensor&,
                                                          const Tensor&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::AllReduceSum(Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::AllGatherColumns(const Tensor&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Ensure(kernels::cuda::DeviceBuffer&, size_t))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::EnsureIota(int64_t))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::EnsureGemmCounters(size_t))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Gated(const Tensor&, Tensor,
                                                     kernels::cuda::GateActivation, float))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::InPlace(Tensor, kernels::cuda::InPlaceOp, float))
void* CudaDevice::ConvertedTarget(int64_t, int64_t) const { return nullptr; }
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadFp8(
    const kernels::cpu::PackedWeight&, const std::vector<float>*))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Fp8Linear(const Tensor&, const DeviceLinear&,
                                                         Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Convert(const void*, kernels::cuda::DataType,
                                                       void*, kernels::cuda::DataType, int64_t,
                                                       int64_t))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Reserve(const Capacity&))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<CudaGraph>> CudaDevice::Capture(
    absl::FunctionRef<absl::Status()>))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Replay(const CudaGraph&))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadTable(
    const kernels::cpu::PackedWeight&, const std::vector<float>*))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadLmHead(
    const kernels::cpu::PackedWeight&))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadQuantized(
    const kernels::cpu::PackedWeight&, const std::vector<float>*))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::RandomLinear(
    int64_t, int64_t, uint64_t, float, const std::vector<float>*))
LOOM_CUDA_DEVICE_STUB(
    absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::DenseLinear(int64_t, int64_t))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadDense(
    const kernels::cpu::PackedWeight&, const std::vector<float>*))
LOOM_CUDA_DEVICE_STUB(
    absl::StatusOr<kernels::cuda::DeviceBuffer> CudaDevice::UploadBytes(const void*, size_t))
#undef LOOM_CUDA_DEVICE_STUB
CudaGraph::~CudaGraph() = default;

#else  // LOOM_HAVE_CUDA

namespace {

namespace kc = kernels::cuda;
using cuda_detail::CudaBuffer;
using cuda_detail::CudaKvCache;
using cuda_detail::GrowingWhileCapturing;
using cuda_detail::kMaxAttentionSeqsPerLaunch;

}  // namespace

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) {
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    cudaGetLastError();  // nothing to report from a destructor
  }
}

absl::StatusOr<kc::DeviceBuffer> CudaDevice::UploadBytes(const void* host, size_t bytes) {
  LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer buffer,
                        kc::DeviceBuffer::Allocate(std::max<size_t>(bytes, 1)));
  if (bytes > 0) {
    // On the device's stream (which does not wait for the legacy default stream), then
    // waited for: `host` may be freed on return.
    LOOM_CUDA_CALL(cudaMemcpyAsync(buffer.data(), host, bytes, cudaMemcpyHostToDevice, stream_));
    LOOM_RETURN_IF_ERROR(Synchronize());
  }
  return buffer;
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaDeviceOptions& options) {
  if (kernels::CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", kernels::CudaDeviceDescription(0)));
  }
  if (options.dtype == kc::DataType::kF32 || options.kv_dtype == kc::DataType::kF32) {
    return absl::InvalidArgumentError("the CUDA device's weights and KV pool are F16 or BF16");
  }
  if ((options.fp8_weights || options.fp8_checkpoint) && !kc::Fp8GemmSupported()) {
    int index = 0;
    (void)cudaGetDevice(&index);
    return absl::FailedPreconditionError(absl::StrCat(
        "--quantization fp8 needs FP8 tensor cores (compute capability 8.9 or newer: Ada, "
        "Hopper); this GPU is ",
        kernels::CudaDeviceDescription(index), ". Use int8 or int4"));
  }
  std::unique_ptr<CudaDevice> device(new CudaDevice());
  device->options_ = options;
  LOOM_CUDA_CALL(cudaGetDevice(&device->device_index_));
  LOOM_ASSIGN_OR_RETURN(device->num_sms_, kc::CurrentDeviceSmCount());
  LOOM_CUDA_CALL(cudaStreamCreateWithFlags(&device->stream_, cudaStreamNonBlocking));
  LOOM_ASSIGN_OR_RETURN(device->gemm_, kc::GemmHandle::Create(device->stream_));
  return device;
}

CudaDevice::~CudaDevice() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }
  if (step_host_ != nullptr) cudaFreeHost(step_host_);
  cudaGetLastError();  // nothing to report from a destructor
}

std::string CudaDevice::Describe() const {
  return absl::StrFormat("cuda:%d (%s)", device_index_,
                         kernels::CudaDeviceDescription(device_index_));
}

absl::Status CudaDevice::Ensure(kc::DeviceBuffer& buffer, size_t bytes) {
  if (buffer.bytes() >= bytes) return absl::OkStatus();
  if (capturing_) return GrowingWhileCapturing(bytes);
  // The old buffer may still be read by enqueued work.
  LOOM_RETURN_IF_ERROR(Synchronize());
  ++memory_generation_;
  buffer = kc::DeviceBuffer();  // free first: the old and new sizes may not fit together
  LOOM_ASSIGN_OR_RETURN(buffer, kc::DeviceBuffer::Allocate(std::max<size_t>(bytes, 256)));
  return absl::OkStatus();
}

absl::Status CudaDevice::EnsureGemmCounters(size_t words) {
  const size_t bytes = words * sizeof(uint32_t);
  if (gemm_counters_.bytes() >= bytes) return absl::OkStatus();
  LOOM_RETURN_IF_ERROR(Ensure(gemm_counters_, bytes));
  LOOM_CUDA_CALL(cudaMemsetAsync(gemm_counters_.data(), 0, gemm_counters_.bytes(), stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::EnsureIota(int64_t n) {
  if (iota_size_ >= n) return absl::OkStatus();
  if (capturing_) return GrowingWhileCapturing(static_cast<size_t>(n) * sizeof(int32_t));
  ++memory_generation_;
  const int64_t size = std::max<int64_t>(n, 2 * iota_size_);
  std::vector<int32_t> host(size);
  for (int64_t i = 0; i < size; ++i) host[i] = static_cast<int32_t>(i);
  LOOM_RETURN_IF_ERROR(Synchronize());
  LOOM_ASSIGN_OR_RETURN(iota_, UploadBytes(host.data(), host.size() * sizeof(int32_t)));
  iota_size_ = size;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Buffer>> CudaDevice::Allocate(int64_t bytes) {
  if (capturing_) return GrowingWhileCapturing(static_cast<size_t>(bytes));
  ForgetConverted();  // the new buffer may sit where the converted tensor was
  ++memory_generation_;
  LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer buffer,
                        kc::DeviceBuffer::Allocate(static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  return std::make_unique<CudaBuffer>(std::move(buffer), bytes);
}

namespace cuda_detail {

absl::Status WaitForStream(cudaStream_t stream, Communicator* communicator) {
  if (communicator != nullptr && communicator->has_device_collectives()) {
    return communicator->WaitOnDevice(stream);
  }
  return kc::SynchronizeStream(stream);
}

// The host tier's copies (CopyBlocks) go on the device's stream (ordered after the steps
// already enqueued, before the next), then one wait: whole slots through a staging area
// (CopyStaged), or, where the device has no memory for it, one copy per piece (CopyPieces).
// Pinned host memory (RegisterHostMemory) makes them DMA copies at the link's bandwidth;
// pageable memory is staged by the driver.

// The copies dsts[i] <- srcs[i] of sizes[i] bytes on `stream`, in stream order: batches of
// cudaMemcpyBatchAsync (CUDA 12.8+: one call for thousands of pieces, where a call each cost
// more than the bytes, 32 KiB per layer's K or V of a block: 0.19 of the link's bandwidth on
// the H200 of 2026-12-04), else, or where the driver refuses the batch, one cudaMemcpyAsync
// each.
namespace {

absl::Status SubmitCopies(const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                          const std::vector<size_t>& sizes, cudaMemcpyKind kind,
                          cudaStream_t stream) {
  size_t done = 0;
#if CUDART_VERSION >= 13000  // 12.8 and 12.9 declare another signature (a failIdx argument)
  constexpr size_t kBatch = 4096;
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // after the steps enqueued
  size_t first = 0;
  while (done < dsts.size()) {
    const size_t count = std::min(kBatch, dsts.size() - done);
    if (cudaMemcpyBatchAsync(dsts.data() + done, srcs.data() + done, sizes.data() + done, count,
                             &attributes, &first, 1, stream) != cudaSuccess) {
      (void)cudaGetLastError();  // not supported here: the rest one by one
      break;
    }
    done += count;
  }
#endif
  for (; done < dsts.size(); ++done) {
    LOOM_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(dsts[done], srcs[done], sizes[done], kind, stream),
                   "cudaMemcpyAsync of a KV block piece"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaKvCache::CopyPieces(absl::Span<const int32_t> blocks,
                                     absl::Span<uint8_t* const> host, bool to_host) const {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < blocks.size(); ++i) {
    LOOM_RETURN_IF_ERROR(
        ForEachPiece(blocks[i], [&](void* pool, int64_t at, int64_t offset, int64_t size) {
          uint8_t* device = static_cast<uint8_t*>(pool) + at;
          uint8_t* slot = host[i] + offset;
          dsts.push_back(to_host ? static_cast<void*>(slot) : device);
          srcs.push_back(to_host ? static_cast<const void*>(device) : slot);
          sizes.push_back(static_cast<size_t>(size));
          return absl::OkStatus();
        }));
  }
  return SubmitCopies(dsts, srcs, sizes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                      stream_);
}

bool CudaKvCache::PrepareStaging() const {
  if (staging_tried_) return staging_slots_ > 0;
  staging_tried_ = true;
  const int64_t slot = block_bytes();
  const int64_t slots =
      std::clamp<int64_t>(kStagingBytes / std::max<int64_t>(slot, 1), 1, kc::kKvBlockCopyMaxBlocks);
  // The pools in slot order, as ForEachPiece walks a block's pieces.
  std::vector<uint8_t*> bases;
  for (const Part& part : Parts()) bases.push_back(part.base);
  absl::StatusOr<kc::DeviceBuffer> staging = kc::DeviceBuffer::Allocate(slots * slot);
  absl::StatusOr<kc::DeviceBuffer> table =
      kc::DeviceBuffer::Allocate(bases.size() * sizeof(uint8_t*));
  if (!staging.ok() || !table.ok() ||
      !table->CopyFromHost(bases.data(), bases.size() * sizeof(uint8_t*)).ok()) {
    (void)cudaGetLastError();  // out of memory: piece by piece
    return false;
  }
  staging_ = *std::move(staging);
  pool_table_ = *std::move(table);
  staging_slots_ = slots;
  return true;
}

absl::Status CudaKvCache::CopyStaged(absl::Span<const int32_t> blocks,
                                     absl::Span<uint8_t* const> host, bool to_host) const {
  const int64_t slot = block_bytes();
  kc::KvBlockCopyParams p;
  p.pools = static_cast<uint8_t* const*>(pool_table_.data());
  p.num_layers = static_cast<int>(k_.size());
  p.pools_per_layer = block_scale_bytes() > 0 ? 4 : 2;
  p.value_bytes = block_value_bytes();
  p.scale_bytes = block_scale_bytes();
  p.pool_blocks = view_.num_blocks;
  p.staging = static_cast<uint8_t*>(staging_.data());
  p.to_staging = to_host;
  const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (size_t first = 0; first < blocks.size(); first += static_cast<size_t>(staging_slots_)) {
    const size_t count = std::min(blocks.size() - first, static_cast<size_t>(staging_slots_));
    p.num_blocks = static_cast<int>(count);
    std::copy_n(blocks.begin() + first, count, p.blocks);
    if (to_host) LOOM_RETURN_IF_ERROR(kc::LaunchKvBlockCopy(p, stream_));
    // Slots that follow each other in host memory go in one copy.
    for (size_t i = 0; i < count;) {
      size_t end = i + 1;
      while (end < count && host[first + end] == host[first + i] + (end - i) * slot) ++end;
      uint8_t* staged = p.staging + i * slot;
      LOOM_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(to_host ? host[first + i] : staged, to_host ? staged : host[first + i],
                          (end - i) * slot, kind, stream_),
          "cudaMemcpyAsync of staged KV slots"));
      i = end;
    }
    if (!to_host) LOOM_RETURN_IF_ERROR(kc::LaunchKvBlockCopy(p, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaKvCache::CopyBlocks(absl::Span<const int32_t> blocks,
                                     absl::Span<uint8_t* const> host, bool to_host) const {
  LOOM_CUDA_CALL(cudaSetDevice(device_index_));
  absl::MutexLock lock(&copy_mu_);
  const absl::Status status =
      PrepareStaging() ? CopyStaged(blocks, host, to_host) : CopyPieces(blocks, host, to_host);
  const absl::Status drained = WaitForStream(stream_, communicator_);
  // A broken or timed-out communicator answers without draining (aborted, its kernels
  // end): the copies still finish here, so none outlives the call.
  if (!drained.ok()) (void)kc::SynchronizeStream(stream_);
  return status.ok() ? drained : status;
}

absl::Status CudaKvCache::SaveBlocks(absl::Span<const int32_t> blocks,
                                     absl::Span<uint8_t* const> host) const {
  if (blocks.size() != host.size()) {
    return absl::InvalidArgumentError("SaveBlocks: one host slot per block");
  }
  return CopyBlocks(blocks, host, /*to_host=*/true);
}

absl::Status CudaKvCache::LoadBlocks(absl::Span<const uint8_t* const> host,
                                     absl::Span<const int32_t> blocks) const {
  if (blocks.size() != host.size()) {
    return absl::InvalidArgumentError("LoadBlocks: one host slot per block");
  }
  // The slots are only read: CopyBlocks takes them as it takes SaveBlocks' slots.
  std::vector<uint8_t*> slots(host.size());
  for (size_t i = 0; i < host.size(); ++i) slots[i] = const_cast<uint8_t*>(host[i]);
  return CopyBlocks(blocks, slots, /*to_host=*/false);
}

absl::Status CudaKvCache::RegisterHostMemory(void* host, int64_t bytes) const {
  if (bytes <= 0) return absl::OkStatus();
  LOOM_CUDA_CALL(cudaSetDevice(device_index_));
  // Portable: pinned for every context, whichever thread's registers it.
  LOOM_CUDA_CALL(cudaHostRegister(host, static_cast<size_t>(bytes), cudaHostRegisterPortable));
  return absl::OkStatus();
}

void CudaKvCache::UnregisterHostMemory(void* host) const {
  // A failure here must not stay the thread's last error: the next kernel launch's check
  // would report it as its own.
  if (cudaSetDevice(device_index_) != cudaSuccess || cudaHostUnregister(host) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

}  // namespace cuda_detail

absl::StatusOr<std::unique_ptr<KvCache>> CudaDevice::CreateKvCache(
    const common::ModelConfig& config, int64_t num_blocks, int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0 || block_size > 1024) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV cache needs num_blocks > 0 and 0 < block_size <= 1024, got %d blocks of %d",
        num_blocks, block_size));
  }
  auto cache = std::make_unique<CudaKvCache>();
  cache->stream_ = stream_;
  cache->communicator_ = options_.communicator;
  cache->device_index_ = device_index_;
  cache->view_.dtype = options_.kv_dtype;
  cache->view_.quant = options_.kv_quant;
  cache->view_.num_blocks = num_blocks;
  cache->view_.block_size = block_size;
  cache->view_.num_kv_heads = config.num_kv_heads;
  cache->view_.head_dim = config.head_dim;
  const size_t layer_bytes = static_cast<size_t>(num_blocks * cache->block_value_bytes());
  const size_t scale_bytes = static_cast<size_t>(num_blocks * cache->block_scale_bytes());
  auto zeroed = [&](size_t bytes) -> absl::StatusOr<kc::DeviceBuffer> {
    LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer buffer, kc::DeviceBuffer::Allocate(bytes));
    LOOM_CUDA_CALL(cudaMemsetAsync(buffer.data(), 0, bytes, stream_));
    return buffer;
  };
  for (int64_t l = 0; l < config.num_layers; ++l) {
    LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer k, zeroed(layer_bytes));
    LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer v, zeroed(layer_bytes));
    cache->k_.push_back(std::move(k));
    cache->v_.push_back(std::move(v));
    if (scale_bytes > 0) {
      LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer k_scale, zeroed(scale_bytes));
      LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer v_scale, zeroed(scale_bytes));
      cache->k_scale_.push_back(std::move(k_scale));
      cache->v_scale_.push_back(std::move(v_scale));
    }
  }
  if (config.num_layers > 0) LOOM_RETURN_IF_ERROR(kc::CheckKvCacheView(cache->layer(0)));
  return std::unique_ptr<KvCache>(std::move(cache));
}

absl::StatusOr<StepTensors> CudaDevice::UploadStep(
    absl::Span<const int32_t> token_ids, absl::Span<const int32_t> positions,
    absl::Span<const int32_t> slots, absl::Span<const int32_t> query_start,
    absl::Span<const int32_t> context_len, absl::Span<const int32_t> block_indptr,
    absl::Span<const int32_t> block_indices, absl::Span<const int32_t> sample_rows) {
  ForgetConverted();
  // The block indices last: the other arrays' offsets then depend only on T, S and R, so a
  // graph captured for a padded decode shape reads each later step's arrays where it
  // read its own.
  const absl::Span<const int32_t> parts[] = {token_ids,   positions,    slots,       query_start,
                                             context_len, block_indptr, sample_rows, block_indices};
  // Each array starts 16-byte aligned in the one buffer.
  size_t total = 0;
  size_t offsets[8];
  for (int i = 0; i < 8; ++i) {
    offsets[i] = total;
    total += (parts[i].size() + 3) / 4 * 4;
  }
  total = std::max<size_t>(total, 1);
  LOOM_RETURN_IF_ERROR(Ensure(step_, total * sizeof(int32_t)));
  // The previous step's copy may still be in flight from step_host_.
  LOOM_RETURN_IF_ERROR(Synchronize());
  if (step_host_elements_ < total) {
    if (step_host_ != nullptr) {
      LOOM_CUDA_CALL(cudaFreeHost(step_host_));
      step_host_ = nullptr;
      step_host_elements_ = 0;
    }
    const size_t elements = std::max<size_t>(total, step_.bytes() / sizeof(int32_t));
    void* host = nullptr;
    const cudaError_t allocated = cudaMallocHost(&host, elements * sizeof(int32_t));
    if (allocated == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrFormat("cudaMallocHost of %d bytes: out of memory", elements * sizeof(int32_t)));
    }
    LOOM_CUDA_CALL(allocated);
    step_host_ = static_cast<int32_t*>(host);
    step_host_elements_ = elements;
  }
  std::fill(step_host_, step_host_ + total, 0);
  for (int i = 0; i < 8; ++i) {
    std::copy(parts[i].begin(), parts[i].end(), step_host_ + offsets[i]);
  }
  LOOM_CUDA_CALL(cudaMemcpyAsync(step_.data(), step_host_, total * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  int32_t* base = static_cast<int32_t*>(step_.data());
  auto view = [&](int i) {
    return Tensor::Of(base + offsets[i], DType::kI32, DeviceType::kCuda,
                      {static_cast<int64_t>(parts[i].size())});
  };
  StepTensors step;
  step.token_ids = view(0);
  step.positions = view(1);
  step.slots = view(2);
  step.query_start = view(3);
  step.context_len = view(4);
  step.block_indptr = view(5);
  step.sample_rows = view(6);
  step.block_indices = view(7);
  SetStepHostSizes(token_ids, query_start, context_len, sample_rows, step);
  return step;
}

absl::Status CudaDevice::Reserve(const Capacity& capacity) {
  ForgetConverted();
  const int64_t elem = kc::ElementBytes(options_.dtype);
  // An 8-bit cache's decode rotates the query into gemm_input_ in F32.
  const int64_t kv_elem = options_.kv_quant != kc::KvQuant::kNone
                              ? kc::ElementBytes(kc::DataType::kF32)
                              : kc::ElementBytes(options_.kv_dtype);
  const int64_t tokens = std::max<int64_t>(capacity.tokens, 1);
  const int64_t q_cols = capacity.num_heads * capacity.head_dim;
  // The GEMM input in dtype (any linear's), which prefill attention's Q in the KV dtype
  // shares (the W4A16 GEMM writes its F32 output in place).
  LOOM_RETURN_IF_ERROR(Ensure(
      gemm_input_,
      static_cast<size_t>(std::max(tokens * widest_input_ * elem, tokens * q_cols * kv_elem))));
  LOOM_RETURN_IF_ERROR(EnsureIota(tokens));
  // One workspace serves the W4A16 split-K and the decode attention's context splits.
  size_t workspace = quant_workspace_bytes_;
  // The splits round per batch size, so a batch between two others may need more than
  // either (3 sequences x 8 KV heads at 11k tokens: 129 partials per head, 128 at 2 or 4):
  // every batch size up to decode_seqs (cheap arithmetic, no launch).
  for (int64_t seqs = 1; capacity.num_kv_heads > 0 && seqs <= capacity.decode_seqs; ++seqs) {
    kc::PagedDecodeParams p;
    p.num_seqs = std::min(seqs, kMaxAttentionSeqsPerLaunch);
    p.num_heads = capacity.num_heads;
    p.cache.num_kv_heads = capacity.num_kv_heads;
    p.cache.head_dim = capacity.head_dim;
    p.max_context_len = std::max<int64_t>(capacity.max_context_len, 1);
    workspace = std::max(workspace, kc::PagedDecodeWorkspaceBytes(p));
  }
  if (workspace > 0) LOOM_RETURN_IF_ERROR(Ensure(workspace_, workspace));
  if (quant_counter_words_ > 0) LOOM_RETURN_IF_ERROR(EnsureGemmCounters(quant_counter_words_));
  if (widest_fp8_output_ > 0) {
    // The FP8 GEMM: its E4M3 input and scale, and cuBLASLt's scratch (the F32 sums go
    // into the output itself).
    const int64_t rows = std::min(tokens, cuda_detail::kFp8ChunkRows);
    LOOM_RETURN_IF_ERROR(Ensure(fp8_input_, static_cast<size_t>(rows * widest_input_)));
    LOOM_RETURN_IF_ERROR(Ensure(fp8_x_scale_, static_cast<size_t>(rows) * sizeof(float)));
    kc::Fp8GemmParams p;
    p.m = rows;
    p.n = widest_fp8_output_;
    p.out_dtype = kc::DataType::kF32;
    LOOM_RETURN_IF_ERROR(Ensure(workspace_, kc::Fp8GemmWorkspaceBytes(p)));
  }
  if (capacity.sample_rows > 0 && capacity.width > 0) {
    LOOM_RETURN_IF_ERROR(Ensure(
        gathered_, static_cast<size_t>(capacity.sample_rows * capacity.width) * sizeof(float)));
    if (ones_.bytes() < static_cast<size_t>(capacity.width) * sizeof(float)) {
      ++memory_generation_;
      const std::vector<float> ones(capacity.width, 1.0f);
      LOOM_ASSIGN_OR_RETURN(ones_, UploadBytes(ones.data(), ones.size() * sizeof(float)));
    }
  }
  if (capacity.step_elements > 0) {
    LOOM_RETURN_IF_ERROR(
        Ensure(step_, static_cast<size_t>(capacity.step_elements) * sizeof(int32_t)));
  }
  // AllGatherColumns' staging (a rank's padded slice, then every rank's), as it sizes them:
  // a captured decode step's logits gather must not be the first to allocate them.
  if (collectives_on_stream() && capacity.sample_rows > 0 && capacity.gather_columns > 0) {
    const int64_t world = world_size();
    const int64_t stride = (capacity.gather_columns + world - 1) / world;
    const size_t floats = static_cast<size_t>(capacity.sample_rows * stride);
    LOOM_RETURN_IF_ERROR(Ensure(gather_local_, floats * sizeof(float)));
    LOOM_RETURN_IF_ERROR(Ensure(gather_all_, floats * world * sizeof(float)));
  }
  return Synchronize();
}

absl::StatusOr<std::unique_ptr<CudaGraph>> CudaDevice::Capture(
    absl::FunctionRef<absl::Status()> enqueue) {
  ForgetConverted();
  // Thread-local mode: only this thread's unsafe calls (a cudaMalloc) break the capture;
  // Ensure and Allocate refuse before making one (capturing_).
  LOOM_CUDA_CALL(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  const absl::Status enqueued = enqueue();
  capturing_ = false;
  // The captured ops ran nothing: a copy they left named in gemm_input_ was never written.
  ForgetConverted();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return enqueued;
  }
  LOOM_CUDA_CALL(ended);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  LOOM_CUDA_CALL(instantiated);
  std::unique_ptr<CudaGraph> captured(new CudaGraph());
  captured->exec_ = exec;
  captured->generation_ = memory_generation_;
  return captured;
}

absl::Status CudaDevice::Replay(const CudaGraph& graph) {
  ForgetConverted();
  if (graph.generation_ != memory_generation_) {
    return absl::FailedPreconditionError(
        "CUDA device: a graph captured before device memory moved cannot be replayed");
  }
  LOOM_CUDA_CALL(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.exec_), stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::DownloadF32(const Tensor& x, float* host) {
  if (x.numel() > 0) {
    LOOM_CUDA_CALL(cudaMemcpyAsync(host, x.data, x.numel() * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
  }
  return Synchronize();
}

absl::Status CudaDevice::Synchronize() {
  return cuda_detail::WaitForStream(stream_, options_.communicator);
}

#endif  // LOOM_HAVE_CUDA

}  // namespace loom::model
