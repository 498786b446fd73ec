#include "model/cuda_device.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "model/cuda_status.h"
#endif

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/quantized_gemm.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/rope.h"

namespace loom::model {

int64_t CudaDevice::StepElements(int64_t max_tokens, int64_t block_entries) {
  // Token, per-sequence and sample-row arrays of up to max_tokens each (16-byte aligned),
  // then the block indices.
  return 7 * (max_tokens + 4) + block_entries + 4;
}

#if !LOOM_HAVE_CUDA

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaDeviceOptions&) {
  return absl::FailedPreconditionError("the CUDA device needs a build with CUDA");
}
CudaDevice::~CudaDevice() = default;
std::string CudaDevice::Describe() const { return "cuda (not compiled in)"; }
#define LOOM_CUDA_DEVICE_STUB(signature) \
  signature { return absl::FailedPreconditionError("the CUDA device needs a build with CUDA"); }
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
                                                         int64_t, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::RmsNorm(const Tensor&, const Tensor&, float,
                                                       Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::AddRmsNorm(Tensor, const Tensor&, const Tensor&,
                                                          float, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Linear(const Tensor&, const DeviceLinear&, Tensor,
                                                      LinearSite))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::SplitColumns(const Tensor&,
                                                            absl::Span<const Tensor>))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Rope(Tensor, Tensor, const Tensor&,
                                                    const RopeSpec&))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::WriteKv(KvCache&, int64_t, const Tensor&,
                                                       const Tensor&, const Tensor&))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::PagedAttention(const KvCache&, int64_t,
                                                              const Tensor&, const StepTensors&,
                                                              const AttentionSpec&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::SiluMul(const Tensor&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::GatherRows(const Tensor&, const Tensor&,
                                                          const Tensor&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::AllReduceSum(Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::AllGatherColumns(const Tensor&, Tensor))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Ensure(kernels::cuda::DeviceBuffer&, size_t))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::EnsureIota(int64_t))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Convert(const void*, kernels::cuda::DataType,
                                                       void*, kernels::cuda::DataType, int64_t,
                                                       int64_t))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Reserve(const Capacity&))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<CudaGraph>> CudaDevice::Capture(
    absl::FunctionRef<absl::Status()>))
LOOM_CUDA_DEVICE_STUB(absl::Status CudaDevice::Replay(const CudaGraph&))
LOOM_CUDA_DEVICE_STUB(absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadTable(
    const kernels::cpu::PackedWeight&))
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

// Host rows dequantized per chunk while uploading a weight (bounds the host scratch).
constexpr int64_t kUploadChunkElements = int64_t{4} << 20;

class CudaBuffer : public Buffer {
 public:
  explicit CudaBuffer(kc::DeviceBuffer buffer, int64_t bytes)
      : buffer_(std::move(buffer)), bytes_(bytes) {}
  void* data() const override { return buffer_.data(); }
  int64_t bytes() const override { return bytes_; }

 private:
  kc::DeviceBuffer buffer_;
  int64_t bytes_;
};

// A linear layer's weight on the device: dense [rows, cols] of the device dtype with an
// F32 bias (cuBLAS), or 4-bit in the W4A16 GEMM's layout with the bias in dtype.
class CudaLinear : public DeviceLinear {
 public:
  int64_t rows() const override { return n; }
  int64_t cols() const override { return k; }
  bool quantized() const { return q.data() != nullptr; }

  kc::DeviceBuffer dense, q, scale_min, bias;
  int64_t n = 0, k = 0, group_size = 0;
};

class CudaKvCache : public KvCache {
 public:
  int64_t num_blocks() const override { return view_.num_blocks; }
  int64_t block_size() const override { return view_.block_size; }
  int64_t num_layers() const override { return static_cast<int64_t>(k_.size()); }
  int64_t bytes() const override {
    int64_t total = 0;
    for (size_t l = 0; l < k_.size(); ++l) total += k_[l].bytes() + v_[l].bytes();
    return total;
  }
  kc::KvCacheView layer(int64_t index) const {
    kc::KvCacheView view = view_;
    view.k = k_[index].data();
    view.v = v_[index].data();
    return view;
  }

  kc::KvCacheView view_;  // shape and dtype; k and v per layer below
  std::vector<kc::DeviceBuffer> k_, v_;
};

const CudaLinear& AsCuda(const DeviceLinear& w) { return static_cast<const CudaLinear&>(w); }
const CudaKvCache& AsCuda(const KvCache& c) { return static_cast<const CudaKvCache&>(c); }

bool QuantGemmTakes(const kernels::cpu::PackedWeight& weight) {
  return weight.format == kernels::cpu::WeightFormat::kInt4 && weight.rows % 16 == 0 &&
         weight.cols % 64 == 0 &&
         (weight.group_size == 32 || weight.group_size == 64 || weight.group_size == 128);
}

// The attention kernels' grids hold at most this many sequences per launch.
constexpr int64_t kMaxAttentionSeqsPerLaunch = 65535;

absl::Status GrowingWhileCapturing(size_t bytes) {
  return absl::InternalError(absl::StrFormat(
      "CUDA device: a buffer would grow to %d bytes during CUDA graph capture (the shape "
      "was not run eagerly first)",
      bytes));
}

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

absl::Status CudaDevice::Convert(const void* src, kc::DataType src_type, void* dst,
                                 kc::DataType dst_type, int64_t rows, int64_t cols) {
  if (rows == 0) return absl::OkStatus();
  LOOM_RETURN_IF_ERROR(EnsureIota(rows));
  kc::GatherRowsParams p;
  p.table = src;
  p.indices = static_cast<const int32_t*>(iota_.data());
  p.out = dst;
  p.src_dtype = src_type;
  p.dst_dtype = dst_type;
  p.num_rows = rows;
  p.row_size = cols;
  p.num_indices = rows;
  return kc::LaunchGatherRows(p, stream_);
}

absl::StatusOr<std::unique_ptr<Buffer>> CudaDevice::Allocate(int64_t bytes) {
  if (capturing_) return GrowingWhileCapturing(static_cast<size_t>(bytes));
  ++memory_generation_;
  LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer buffer,
                        kc::DeviceBuffer::Allocate(static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  return std::make_unique<CudaBuffer>(std::move(buffer), bytes);
}

absl::StatusOr<std::unique_ptr<Buffer>> CudaDevice::UploadF32(const std::vector<float>& host) {
  const size_t bytes = host.size() * sizeof(float);
  LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer buffer, UploadBytes(host.data(), bytes));
  weight_bytes_ += static_cast<int64_t>(bytes);
  return std::make_unique<CudaBuffer>(std::move(buffer), static_cast<int64_t>(bytes));
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::DenseLinear(int64_t rows, int64_t cols) {
  auto linear = std::make_unique<CudaLinear>();
  linear->n = rows;
  linear->k = cols;
  const int64_t bytes = std::max<int64_t>(rows * cols * kc::ElementBytes(options_.dtype), 1);
  LOOM_ASSIGN_OR_RETURN(linear->dense, kc::DeviceBuffer::Allocate(static_cast<size_t>(bytes)));
  weight_bytes_ += bytes;
  widest_input_ = std::max(widest_input_, cols);
  return std::unique_ptr<DeviceLinear>(std::move(linear));
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadDense(
    const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) {
  const kc::DataType dtype = options_.dtype;
  const int64_t elem = kc::ElementBytes(dtype);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceLinear> result,
                        DenseLinear(weight.rows, weight.cols));
  CudaLinear& linear = static_cast<CudaLinear&>(*result);
  const int64_t chunk_rows =
      std::max<int64_t>(1, kUploadChunkElements / std::max<int64_t>(weight.cols, 1));
  std::vector<float> values;
  std::vector<uint8_t> converted;
  for (int64_t row = 0; row < weight.rows; row += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, weight.rows - row);
    values.resize(rows * weight.cols);
    converted.resize(rows * weight.cols * elem);
    kernels::cpu::DequantizeRows(weight, row, row + rows, values.data());
    kc::ConvertFromFloat(dtype, values.data(), rows * weight.cols, converted.data());
    // On the device's stream (later work is ordered after it), waited for before
    // `converted` is reused.
    LOOM_CUDA_CALL(
        cudaMemcpyAsync(static_cast<uint8_t*>(linear.dense.data()) + row * weight.cols * elem,
                        converted.data(), converted.size(), cudaMemcpyHostToDevice, stream_));
    LOOM_RETURN_IF_ERROR(Synchronize());
  }
  if (bias != nullptr && !bias->empty()) {
    LOOM_ASSIGN_OR_RETURN(linear.bias, UploadBytes(bias->data(), bias->size() * sizeof(float)));
    weight_bytes_ += static_cast<int64_t>(bias->size() * sizeof(float));
  }
  return result;
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadTable(
    const kernels::cpu::PackedWeight& table) {
  return UploadDense(table, nullptr);
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::RandomLinear(
    int64_t rows, int64_t cols, uint64_t seed, float scale, const std::vector<float>* bias) {
  if (rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("random weight of %d x %d: both sizes must be >= 1", rows, cols));
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceLinear> result, DenseLinear(rows, cols));
  kc::RandomFillParams fill;
  fill.out = static_cast<CudaLinear&>(*result).dense.data();
  fill.dtype = options_.dtype;
  fill.count = rows * cols;
  fill.seed = seed;
  fill.offset = 0.0f;
  fill.scale = scale;
  LOOM_RETURN_IF_ERROR(kc::LaunchRandomFill(fill, stream_));
  if (bias != nullptr && !bias->empty()) {
    if (static_cast<int64_t>(bias->size()) != rows) {
      return absl::InvalidArgumentError(
          absl::StrFormat("bias of %d values for %d rows", bias->size(), rows));
    }
    CudaLinear& linear = static_cast<CudaLinear&>(*result);
    LOOM_ASSIGN_OR_RETURN(linear.bias, UploadBytes(bias->data(), bias->size() * sizeof(float)));
    weight_bytes_ += static_cast<int64_t>(bias->size() * sizeof(float));
  }
  return result;
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadLinear(
    const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) {
  if (!options_.keep_quantized || !QuantGemmTakes(weight)) return UploadDense(weight, bias);
  auto linear = std::make_unique<CudaLinear>();
  linear->n = weight.rows;
  linear->k = weight.cols;
  linear->group_size = weight.group_size;
  const kc::DataType dtype = options_.dtype;
  LOOM_ASSIGN_OR_RETURN(kernels::cpu::NaturalQuantizedWeight natural,
                        kernels::cpu::UnpackQuantized(weight));
  std::vector<uint8_t> nibbles(static_cast<size_t>(weight.rows * weight.cols / 2));
  for (size_t i = 0; i < nibbles.size(); ++i) {
    nibbles[i] = static_cast<uint8_t>((natural.q[2 * i] & 0x0f) | (natural.q[2 * i + 1] << 4));
  }
  LOOM_ASSIGN_OR_RETURN(kc::Int4GpuWeight packed,
                        kc::PackInt4ForGpu(nibbles.data(), natural.scales.data(),
                                           natural.mins.data(), weight.rows, weight.cols,
                                           weight.group_size));
  LOOM_ASSIGN_OR_RETURN(linear->q, UploadBytes(packed.q.data(), packed.q.size()));
  LOOM_ASSIGN_OR_RETURN(linear->scale_min, UploadBytes(packed.scale_min.data(),
                                                       packed.scale_min.size() * sizeof(uint16_t)));
  weight_bytes_ +=
      static_cast<int64_t>(packed.q.size() + packed.scale_min.size() * sizeof(uint16_t));
  if (bias != nullptr && !bias->empty()) {
    std::vector<uint8_t> converted(bias->size() * kc::ElementBytes(dtype));
    kc::ConvertFromFloat(dtype, bias->data(), static_cast<int64_t>(bias->size()),
                         converted.data());
    LOOM_ASSIGN_OR_RETURN(linear->bias, UploadBytes(converted.data(), converted.size()));
  }
  // What Reserve sizes the W4A16 path's buffers by: the widest output, and the split-K
  // workspace at every power-of-two m up to the GEMM's largest.
  ++quantized_linears_;
  widest_input_ = std::max(widest_input_, linear->k);
  widest_quantized_output_ = std::max(widest_quantized_output_, linear->n);
  for (int64_t m = 1; m <= kc::kQuantGemmMaxM; m *= 2) {
    kc::QuantGemmParams p;
    p.act_dtype = dtype;
    p.format = kc::QuantWeightFormat::kInt4;
    p.m = m;
    p.n = linear->n;
    p.k = linear->k;
    p.group_size = linear->group_size;
    p.num_splits = kc::ChooseQuantGemmSplits(m, p.n, p.k, num_sms_);
    quant_workspace_bytes_ = std::max(quant_workspace_bytes_, kc::QuantGemmWorkspaceBytes(p));
  }
  return std::unique_ptr<DeviceLinear>(std::move(linear));
}

absl::StatusOr<std::unique_ptr<KvCache>> CudaDevice::CreateKvCache(
    const common::ModelConfig& config, int64_t num_blocks, int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0 || block_size > 1024) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV cache needs num_blocks > 0 and 0 < block_size <= 1024, got %d blocks of %d",
        num_blocks, block_size));
  }
  auto cache = std::make_unique<CudaKvCache>();
  cache->view_.dtype = options_.kv_dtype;
  cache->view_.num_blocks = num_blocks;
  cache->view_.block_size = block_size;
  cache->view_.num_kv_heads = config.num_kv_heads;
  cache->view_.head_dim = config.head_dim;
  const size_t layer_bytes = static_cast<size_t>(num_blocks * block_size * config.num_kv_heads *
                                                 config.head_dim *
                                                 kc::ElementBytes(options_.kv_dtype));
  for (int64_t l = 0; l < config.num_layers; ++l) {
    LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer k, kc::DeviceBuffer::Allocate(layer_bytes));
    LOOM_ASSIGN_OR_RETURN(kc::DeviceBuffer v, kc::DeviceBuffer::Allocate(layer_bytes));
    LOOM_CUDA_CALL(cudaMemsetAsync(k.data(), 0, layer_bytes, stream_));
    LOOM_CUDA_CALL(cudaMemsetAsync(v.data(), 0, layer_bytes, stream_));
    cache->k_.push_back(std::move(k));
    cache->v_.push_back(std::move(v));
  }
  if (config.num_layers > 0) LOOM_RETURN_IF_ERROR(kc::CheckKvCacheView(cache->layer(0)));
  return std::unique_ptr<KvCache>(std::move(cache));
}

absl::StatusOr<StepTensors> CudaDevice::UploadStep(
    absl::Span<const int32_t> token_ids, absl::Span<const int32_t> positions,
    absl::Span<const int32_t> slots, absl::Span<const int32_t> query_start,
    absl::Span<const int32_t> context_len, absl::Span<const int32_t> block_indptr,
    absl::Span<const int32_t> block_indices, absl::Span<const int32_t> sample_rows) {
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
  const int64_t elem = kc::ElementBytes(options_.dtype);
  const int64_t kv_elem = kc::ElementBytes(options_.kv_dtype);
  const int64_t tokens = std::max<int64_t>(capacity.tokens, 1);
  const int64_t q_cols = capacity.num_heads * capacity.head_dim;
  // The GEMM input in dtype (any linear's), which prefill attention's Q in the KV dtype
  // shares; the W4A16 GEMM's output in dtype.
  LOOM_RETURN_IF_ERROR(Ensure(
      gemm_input_,
      static_cast<size_t>(std::max(tokens * widest_input_ * elem, tokens * q_cols * kv_elem))));
  if (widest_quantized_output_ > 0) {
    LOOM_RETURN_IF_ERROR(
        Ensure(gemm_output_, static_cast<size_t>(tokens * widest_quantized_output_ * elem)));
  }
  LOOM_RETURN_IF_ERROR(EnsureIota(tokens));
  // One workspace serves the W4A16 split-K and the decode attention's context splits.
  size_t workspace = quant_workspace_bytes_;
  // Fewer sequences may take more context splits: every power of two up to decode_seqs.
  for (int64_t seqs = 1; capacity.num_kv_heads > 0 && seqs <= capacity.decode_seqs;
       seqs = seqs < capacity.decode_seqs ? std::min(2 * seqs, capacity.decode_seqs) : seqs + 1) {
    kc::PagedDecodeParams p;
    p.num_seqs = std::min(seqs, kMaxAttentionSeqsPerLaunch);
    p.num_heads = capacity.num_heads;
    p.cache.num_kv_heads = capacity.num_kv_heads;
    p.cache.head_dim = capacity.head_dim;
    p.max_context_len = std::max<int64_t>(capacity.max_context_len, 1);
    workspace = std::max(workspace, kc::PagedDecodeWorkspaceBytes(p));
  }
  if (workspace > 0) LOOM_RETURN_IF_ERROR(Ensure(workspace_, workspace));
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
  return Synchronize();
}

absl::StatusOr<std::unique_ptr<CudaGraph>> CudaDevice::Capture(
    absl::FunctionRef<absl::Status()> enqueue) {
  // Thread-local mode: only this thread's unsafe calls (a cudaMalloc) break the capture;
  // Ensure and Allocate refuse before making one (capturing_).
  LOOM_CUDA_CALL(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  const absl::Status enqueued = enqueue();
  capturing_ = false;
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
  // With stream-ordered collectives on the stream, wait under the communicator's timeout
  // (a dead or stalled peer fails the step instead of hanging it).
  Communicator* comm = options_.communicator;
  if (comm != nullptr && comm->has_device_collectives()) return comm->WaitOnDevice(stream_);
  return kc::SynchronizeStream(stream_);
}

absl::Status CudaDevice::Embedding(const DeviceLinear& table, const Tensor& token_ids,
                                   int64_t vocab0, Tensor out) {
  const CudaLinear& linear = AsCuda(table);
  if (linear.quantized()) {
    return absl::UnimplementedError("the CUDA device gathers embeddings from dense tables only");
  }
  if (token_ids.numel() == 0) return absl::OkStatus();
  kc::GatherRowsParams p;
  p.table = linear.dense.data();
  p.indices = token_ids.as<const int32_t>();
  p.out = out.data;
  p.src_dtype = options_.dtype;
  p.dst_dtype = kc::DataType::kF32;
  p.num_rows = linear.n;
  p.row_size = linear.k;
  p.num_indices = token_ids.numel();
  p.index_offset = vocab0;
  return kc::LaunchGatherRows(p, stream_);
}

absl::Status CudaDevice::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  kc::RmsNormParams p;
  p.x = x.data;
  p.weight = weight.as<const float>();
  p.out = out.data;
  p.dtype = kc::DataType::kF32;
  p.eps = eps;
  p.num_tokens = x.rows();
  p.hidden = x.cols();
  return kc::LaunchRmsNorm(p, stream_);
}

absl::Status CudaDevice::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight,
                                    float eps, Tensor out) {
  kc::RmsNormParams p;
  p.x = x.data;
  p.residual = residual.data;
  p.weight = weight.as<const float>();
  p.out = out.data;
  p.dtype = kc::DataType::kF32;
  p.eps = eps;
  p.num_tokens = residual.rows();
  p.hidden = residual.cols();
  return kc::LaunchRmsNorm(p, stream_);
}

absl::Status CudaDevice::Linear(const Tensor& x, const DeviceLinear& w, Tensor out, LinearSite) {
  const CudaLinear& linear = AsCuda(w);
  const kc::DataType dtype = options_.dtype;
  const int64_t m = x.rows(), n = linear.n, k = linear.k;
  if (m == 0) return absl::OkStatus();
  const int64_t elem = kc::ElementBytes(dtype);
  // The GEMMs read their input in the weights' dtype.
  LOOM_RETURN_IF_ERROR(Ensure(gemm_input_, static_cast<size_t>(m * k * elem)));
  LOOM_RETURN_IF_ERROR(Convert(x.data, kc::DataType::kF32, gemm_input_.data(), dtype, m, k));
  if (!linear.quantized()) {
    kc::GemmParams p;
    p.x = gemm_input_.data();
    p.w = linear.dense.data();
    p.bias = static_cast<const float*>(linear.bias.data());
    p.y = out.data;
    p.dtype = dtype;
    p.y_dtype = kc::DataType::kF32;
    p.m = m;
    p.n = n;
    p.k = k;
    return kc::LaunchGemm(p, *gemm_);
  }
  // W4A16: output in dtype, in chunks of the kernel's largest m, then widened to F32.
  LOOM_RETURN_IF_ERROR(Ensure(gemm_output_, static_cast<size_t>(m * n * elem)));
  for (int64_t row = 0; row < m; row += kc::kQuantGemmMaxM) {
    kc::QuantGemmParams p;
    p.x = static_cast<const uint8_t*>(gemm_input_.data()) + row * k * elem;
    p.y = static_cast<uint8_t*>(gemm_output_.data()) + row * n * elem;
    p.bias = linear.bias.data();
    p.act_dtype = dtype;
    p.format = kc::QuantWeightFormat::kInt4;
    p.weight = linear.q.data();
    p.scales = linear.scale_min.data();
    p.m = std::min<int64_t>(kc::kQuantGemmMaxM, m - row);
    p.n = n;
    p.k = k;
    p.group_size = linear.group_size;
    p.num_splits = kc::ChooseQuantGemmSplits(p.m, n, k, num_sms_);
    const size_t workspace = kc::QuantGemmWorkspaceBytes(p);
    LOOM_RETURN_IF_ERROR(Ensure(workspace_, workspace));
    p.workspace = workspace_.data();
    p.workspace_bytes = workspace_.bytes();
    LOOM_RETURN_IF_ERROR(kc::LaunchQuantGemm(p, stream_));
  }
  return Convert(gemm_output_.data(), dtype, out.data, kc::DataType::kF32, m, n);
}

absl::Status CudaDevice::SplitColumns(const Tensor& x, absl::Span<const Tensor> parts) {
  const int64_t rows = x.rows(), width = x.cols();
  if (rows == 0) return absl::OkStatus();
  int64_t col = 0;
  for (const Tensor& part : parts) {
    const int64_t cols = part.cols();
    LOOM_CUDA_CALL(cudaMemcpy2DAsync(part.data, cols * sizeof(float), x.as<const float>() + col,
                                     width * sizeof(float), cols * sizeof(float), rows,
                                     cudaMemcpyDeviceToDevice, stream_));
    col += cols;
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::Rope(Tensor q, Tensor k, const Tensor& positions, const RopeSpec& spec) {
  const int64_t tokens = positions.numel();
  if (tokens == 0) return absl::OkStatus();
  kc::RopeParams p;
  p.q = q.data;
  p.k = k.data;
  p.positions = positions.as<const int32_t>();
  p.inv_freq = spec.inv_freq.as<const float>();
  p.dtype = kc::DataType::kF32;
  p.num_tokens = tokens;
  p.num_heads = q.numel() / (tokens * spec.head_dim);
  p.num_kv_heads = k.numel() / (tokens * spec.head_dim);
  p.head_dim = spec.head_dim;
  p.rope_dim = spec.rope_dim;
  p.neox = spec.neox;
  p.attention_factor = spec.attention_factor;
  return kc::LaunchRope(p, stream_);
}

absl::Status CudaDevice::WriteKv(KvCache& cache, int64_t layer, const Tensor& k, const Tensor& v,
                                 const Tensor& slots) {
  if (slots.numel() == 0) return absl::OkStatus();
  kc::WriteKvParams p;
  p.cache = AsCuda(cache).layer(layer);
  p.k = k.data;
  p.v = v.data;
  p.src_dtype = kc::DataType::kF32;
  p.slots = slots.as<const int32_t>();
  p.num_tokens = slots.numel();
  return kc::LaunchWriteKv(p, stream_);
}

absl::Status CudaDevice::PagedAttention(const KvCache& cache, int64_t layer, const Tensor& q,
                                        const StepTensors& step, const AttentionSpec& spec,
                                        Tensor out) {
  if (step.num_seqs == 0 || step.num_tokens == 0) return absl::OkStatus();
  const kc::KvCacheView view = AsCuda(cache).layer(layer);
  // A rank's cache holds its KV heads only; its query heads are their groups, in order.
  if (spec.num_heads != view.num_kv_heads * spec.group) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA attention: %d local query heads are not %d KV heads x group %d", spec.num_heads,
        view.num_kv_heads, spec.group));
  }
  const int64_t q_cols = spec.num_heads * spec.head_dim;
  if (step.num_tokens == step.num_seqs) {
    // Launches of at most kMaxAttentionSeqsPerLaunch sequences; block_indptr values index
    // the whole block_indices array, so a chunk offsets only the per-sequence arrays.
    for (int64_t first = 0; first < step.num_seqs; first += kMaxAttentionSeqsPerLaunch) {
      kc::PagedDecodeParams p;
      p.num_seqs = std::min(kMaxAttentionSeqsPerLaunch, step.num_seqs - first);
      p.q = q.as<const float>() + first * q_cols;
      p.out = out.as<float>() + first * q_cols;
      p.q_dtype = kc::DataType::kF32;
      p.cache = view;
      p.context_len = step.context_len.as<const int32_t>() + first;
      p.block_indptr = step.block_indptr.as<const int32_t>() + first;
      p.block_indices = step.block_indices.as<const int32_t>();
      p.num_heads = spec.num_heads;
      p.scale = spec.scale;
      p.max_context_len = std::max<int64_t>(step.max_context_len, 1);
      const size_t workspace = kc::PagedDecodeWorkspaceBytes(p);
      LOOM_RETURN_IF_ERROR(Ensure(workspace_, workspace));
      p.workspace = workspace_.data();
      p.workspace_bytes = workspace_.bytes();
      LOOM_RETURN_IF_ERROR(kc::LaunchPagedDecode(p, stream_));
    }
    return absl::OkStatus();
  }
  // Prefill reads Q in the cache dtype (the tensor cores' input).
  LOOM_RETURN_IF_ERROR(Ensure(
      gemm_input_, static_cast<size_t>(step.num_tokens * q_cols * kc::ElementBytes(view.dtype))));
  LOOM_RETURN_IF_ERROR(
      Convert(q.data, kc::DataType::kF32, gemm_input_.data(), view.dtype, step.num_tokens, q_cols));
  for (int64_t first = 0; first < step.num_seqs; first += kMaxAttentionSeqsPerLaunch) {
    // query_start values index the whole step's rows: q and out stay whole.
    kc::PagedPrefillParams p;
    p.q = gemm_input_.data();
    p.out = out.data;
    p.q_dtype = view.dtype;
    p.out_dtype = kc::DataType::kF32;
    p.cache = view;
    p.query_start = step.query_start.as<const int32_t>() + first;
    p.context_len = step.context_len.as<const int32_t>() + first;
    p.block_indptr = step.block_indptr.as<const int32_t>() + first;
    p.block_indices = step.block_indices.as<const int32_t>();
    p.num_seqs = std::min(kMaxAttentionSeqsPerLaunch, step.num_seqs - first);
    p.num_heads = spec.num_heads;
    p.scale = spec.scale;
    p.max_query_len = std::max<int64_t>(step.max_query_len, 1);
    LOOM_RETURN_IF_ERROR(kc::LaunchPagedPrefill(p, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::SiluMul(const Tensor& gate_up, Tensor out) {
  kc::SiluMulParams p;
  p.gate_up = gate_up.data;
  p.out = out.data;
  p.dtype = kc::DataType::kF32;
  p.num_tokens = gate_up.rows();
  p.ffn = out.cols();
  return kc::LaunchSiluMul(p, stream_);
}

absl::Status CudaDevice::GatherRows(const Tensor& x, const Tensor& y, const Tensor& rows,
                                    Tensor out) {
  const int64_t count = rows.numel(), width = x.cols();
  if (count == 0) return absl::OkStatus();
  kc::GatherRowsParams p;
  p.table = x.data;
  p.indices = rows.as<const int32_t>();
  p.out = out.data;
  p.src_dtype = kc::DataType::kF32;
  p.dst_dtype = kc::DataType::kF32;
  p.num_rows = x.rows();
  p.row_size = width;
  p.num_indices = count;
  LOOM_RETURN_IF_ERROR(kc::LaunchGatherRows(p, stream_));
  if (y.empty()) return absl::OkStatus();
  // out += y's rows: the fused residual add of RMSNorm (residual += x, in float, as the
  // CPU's a + b) does the sum; its normalized output goes to scratch.
  LOOM_RETURN_IF_ERROR(Ensure(gathered_, static_cast<size_t>(count * width * sizeof(float))));
  p.table = y.data;
  p.out = gathered_.data();
  LOOM_RETURN_IF_ERROR(kc::LaunchGatherRows(p, stream_));
  if (ones_.bytes() < static_cast<size_t>(width) * sizeof(float)) {
    if (capturing_) return GrowingWhileCapturing(static_cast<size_t>(width) * sizeof(float));
    ++memory_generation_;
    LOOM_RETURN_IF_ERROR(Synchronize());
    const std::vector<float> ones(width, 1.0f);
    LOOM_ASSIGN_OR_RETURN(ones_, UploadBytes(ones.data(), ones.size() * sizeof(float)));
  }
  kc::RmsNormParams norm;
  norm.x = gathered_.data();
  norm.residual = out.data;
  norm.weight = static_cast<const float*>(ones_.data());
  norm.out = gathered_.data();
  norm.dtype = kc::DataType::kF32;
  norm.eps = 1e-5f;
  norm.num_tokens = count;
  norm.hidden = width;
  return kc::LaunchRmsNorm(norm, stream_);
}

absl::Status CudaDevice::AllReduceSum(Tensor x) {
  Communicator* comm = options_.communicator;
  if (comm == nullptr || x.numel() == 0) return absl::OkStatus();
  if (x.dtype != DType::kF32) {
    return absl::InvalidArgumentError("AllReduceSum takes F32 activations");
  }
  if (comm->has_device_collectives()) {
    // In stream order, no host wait (capture-safe); even a world of one goes through the
    // communicator, so that path is the one a single GPU tests. Errors show at Synchronize.
    return comm->AllReduceSumOnDevice(static_cast<float*>(x.data), x.numel(), stream_);
  }
  if (comm->world_size() == 1) return absl::OkStatus();
  host_.resize(x.numel());
  LOOM_RETURN_IF_ERROR(DownloadF32(x, host_.data()));
  LOOM_RETURN_IF_ERROR(comm->AllReduceSum(absl::MakeSpan(host_)));
  LOOM_CUDA_CALL(cudaMemcpyAsync(x.data, host_.data(), host_.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_));
  return Synchronize();
}

absl::Status CudaDevice::AllGatherColumns(const Tensor& local, Tensor out) {
  const int64_t rows = out.rows(), vocab = out.cols(), n = local.cols();
  const int world = world_size();
  Communicator* comm = options_.communicator;
  const bool on_device = comm != nullptr && comm->has_device_collectives();
  if (world == 1 && !on_device) {
    if (out.numel() == 0) return absl::OkStatus();
    LOOM_CUDA_CALL(cudaMemcpyAsync(out.data, local.data, out.numel() * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }
  // As CpuDevice: each rank's slice padded to the common stride, gathered (rank-major),
  // reordered into vocabulary order.
  const int64_t stride = (vocab + world - 1) / world;
  if (n > stride) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllGatherColumns: a slice of %d columns does not fit [%d, %d] over %d ranks", n, rows,
        vocab, world));
  }
  if (on_device) {
    if (rows == 0 || vocab == 0) return absl::OkStatus();
    // Every step below is an async copy or collective on stream_ (capture-safe once the
    // buffers have their size: Ensure only reallocates, and waits, when one grows).
    const size_t floats = static_cast<size_t>(rows * stride);
    LOOM_RETURN_IF_ERROR(Ensure(gather_local_, floats * sizeof(float)));
    LOOM_RETURN_IF_ERROR(Ensure(gather_all_, floats * world * sizeof(float)));
    float* padded = static_cast<float*>(gather_local_.data());
    float* gathered = static_cast<float*>(gather_all_.data());
    if (n > 0) {
      LOOM_CUDA_CALL(cudaMemcpy2DAsync(padded, stride * sizeof(float), local.data,
                                       n * sizeof(float), n * sizeof(float), rows,
                                       cudaMemcpyDeviceToDevice, stream_));
    }
    LOOM_RETURN_IF_ERROR(
        comm->AllGatherOnDevice(padded, static_cast<int64_t>(floats), gathered, stream_));
    for (int r = 0; r < world; ++r) {
      const int64_t vocab0 = std::min<int64_t>(vocab, r * stride);
      const int64_t count = std::min<int64_t>(vocab, vocab0 + stride) - vocab0;
      if (count == 0) continue;
      LOOM_CUDA_CALL(cudaMemcpy2DAsync(static_cast<float*>(out.data) + vocab0,
                                       vocab * sizeof(float), gathered + r * floats,
                                       stride * sizeof(float), count * sizeof(float), rows,
                                       cudaMemcpyDeviceToDevice, stream_));
    }
    return absl::OkStatus();
  }
  std::vector<float> padded(rows * stride, 0.0f);
  if (n > 0 && rows > 0) {
    LOOM_CUDA_CALL(cudaMemcpy2DAsync(padded.data(), stride * sizeof(float), local.data,
                                     n * sizeof(float), n * sizeof(float), rows,
                                     cudaMemcpyDeviceToHost, stream_));
  }
  LOOM_RETURN_IF_ERROR(Synchronize());
  host_gathered_.resize(world * rows * stride);
  LOOM_RETURN_IF_ERROR(comm->AllGather(padded, absl::MakeSpan(host_gathered_)));
  host_.assign(rows * vocab, 0.0f);
  for (int r = 0; r < world; ++r) {
    const int64_t vocab0 = std::min<int64_t>(vocab, r * stride);
    const int64_t count = std::min<int64_t>(vocab, vocab0 + stride) - vocab0;
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(host_.data() + i * vocab + vocab0,
                  host_gathered_.data() + (r * rows + i) * stride, count * sizeof(float));
    }
  }
  LOOM_CUDA_CALL(cudaMemcpyAsync(out.data, host_.data(), host_.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_));
  return Synchronize();
}

#endif  // LOOM_HAVE_CUDA

}  // namespace loom::model
