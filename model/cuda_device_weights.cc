#include "model/cuda_device.h"

// The CUDA device's weights: dense F16/BF16 (uploaded or random), INT4/INT8 for the W4A16 /
// W8A16 GEMM, FP8 for the FP8 GEMM.
// Without CUDA, model/cuda_device.cc stubs them.
#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/fp8_rows.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weights.h"
#include "kernels/cuda/quantized_gemm.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/types.h"
#include "model/cuda_device_internal.h"
#include "model/cuda_status.h"

namespace loom::model {

namespace {

namespace kc = kernels::cuda;
using cuda_detail::CudaBuffer;
using cuda_detail::CudaLinear;

// Host rows dequantized per chunk while uploading a weight (bounds the host scratch).
constexpr int64_t kUploadChunkElements = int64_t{4} << 20;

// The quantized GEMM's weights: INT4 in groups of 16/32/64/128 (K-quant F32 scales and mins
// rounded to F16), INT8 with F16 scales per output channel or in groups of 32/64/128 (GGUF
// Q8_0), and INT8 with F32 scales (and mins) in groups of 16 or 32 (Q6_K, Q5_K, and Q4_K
// parts fused with a Q6_K one); INT5 (Q5_0, Q5_1) and NL4 (IQ4_NL, MXFP4: levels with F16
// scales in groups of 32) as INT8, exactly (UnpackQuantized).
bool QuantGemmTakes(const kernels::cpu::PackedWeight& weight) {
  const bool grouped =
      weight.group_size == 32 || weight.group_size == 64 || weight.group_size == 128;
  if (weight.rows % 16 != 0 || weight.cols % 64 != 0) return false;
  if (weight.format == kernels::cpu::WeightFormat::kInt4) {
    return grouped || weight.group_size == 16;
  }
  if (weight.format == kernels::cpu::WeightFormat::kInt5 ||
      weight.format == kernels::cpu::WeightFormat::kNl4) {
    return weight.group_size == 32;
  }
  if (weight.format != kernels::cpu::WeightFormat::kInt8) return false;
  if (weight.f32_scaled()) return weight.group_size == 16 || weight.group_size == 32;
  return grouped || weight.group_size == weight.cols;
}

// Every GEMM reads bias[0, rows): a shorter one would be read past its end.
absl::Status CheckBias(const std::vector<float>* bias, int64_t rows) {
  if (bias == nullptr || bias->empty() || static_cast<int64_t>(bias->size()) == rows) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("bias of %d values for %d rows", bias->size(), rows));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Buffer>> CudaDevice::UploadF32(const std::vector<float>& host) {
  ForgetConverted();
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
    // Split across threads: ~9 ns a weight on one (an 8B model's layers took a minute).
    kernels::cpu::ParallelForOnce(
        rows, std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(weight.cols, 1)),
        [&](int64_t first, int64_t end) {
          float* part = values.data() + first * weight.cols;
          kernels::cpu::DequantizeRows(weight, row + first, row + end, part);
          kc::ConvertFromFloat(dtype, part, (end - first) * weight.cols,
                               converted.data() + first * weight.cols * elem);
        });
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
    const kernels::cpu::PackedWeight& table, const std::vector<float>* bias) {
  LOOM_RETURN_IF_ERROR(CheckBias(bias, table.rows));
  return UploadDense(table, bias);
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadLmHead(
    const kernels::cpu::PackedWeight& head) {
  using kernels::cpu::WeightFormat;
  const bool f16 = options_.dtype == kc::DataType::kF16;
  const bool int8_exact =
      (head.format == WeightFormat::kInt8 || head.format == WeightFormat::kNl4) &&
      (head.group_size == head.cols || head.f32_scaled() || f16);
  const bool int4_exact = head.format == WeightFormat::kInt4 && !head.f32_scaled() && f16;
  // INT5 goes in as INT8: Q5_0 with F16 group scales (exact with F16 activations only),
  // Q5_1 with F32 scales and mins.
  const bool int5_exact = head.format == WeightFormat::kInt5 && f16;
  const bool exact = int8_exact || int5_exact || int4_exact;
  if (!options_.keep_quantized || !exact || !QuantGemmTakes(head))
    return UploadDense(head, nullptr);
  absl::StatusOr<std::unique_ptr<DeviceLinear>> linear = UploadQuantized(head, nullptr);
  lm_head_quantized_ = linear.ok();
  return linear;
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
    LOOM_RETURN_IF_ERROR(CheckBias(bias, rows));
    CudaLinear& linear = static_cast<CudaLinear&>(*result);
    LOOM_ASSIGN_OR_RETURN(linear.bias, UploadBytes(bias->data(), bias->size() * sizeof(float)));
    weight_bytes_ += static_cast<int64_t>(bias->size() * sizeof(float));
  }
  return result;
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadFp8(
    const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) {
  auto linear = std::make_unique<CudaLinear>();
  linear->n = weight.rows;
  linear->k = weight.cols;
  std::vector<uint8_t> codes(static_cast<size_t>(weight.rows * weight.cols));
  std::vector<float> scales(static_cast<size_t>(weight.rows));
  const int64_t chunk_rows =
      std::max<int64_t>(1, kUploadChunkElements / std::max<int64_t>(weight.cols, 1));
  // An FP8 checkpoint's own row scales give back its codes exactly; other weights get one
  // scale per output channel from the row's largest magnitude.
  const bool checkpoint = static_cast<int64_t>(weight.fp8_row_scales.size()) == weight.rows;
  std::vector<float> values;
  for (int64_t row = 0; row < weight.rows; row += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, weight.rows - row);
    values.resize(rows * weight.cols);
    kernels::cpu::DequantizeRows(weight, row, row + rows, values.data());
    // The CPU KV cache's encoder (bit operations, round to nearest even, saturating): the
    // kernels' exhaustive FloatToE4m3 would take about an hour for an 8B model.
    kernels::cpu::QuantizeRowsToFp8(values.data(), rows, weight.cols,
                                    checkpoint ? weight.fp8_row_scales.data() + row : nullptr,
                                    codes.data() + row * weight.cols, scales.data() + row);
  }
  LOOM_ASSIGN_OR_RETURN(linear->fp8_weight, UploadBytes(codes.data(), codes.size()));
  LOOM_ASSIGN_OR_RETURN(linear->fp8_scale,
                        UploadBytes(scales.data(), scales.size() * sizeof(float)));
  weight_bytes_ += static_cast<int64_t>(codes.size() + scales.size() * sizeof(float));
  if (bias != nullptr && !bias->empty()) {
    LOOM_ASSIGN_OR_RETURN(linear->bias, UploadBytes(bias->data(), bias->size() * sizeof(float)));
    weight_bytes_ += static_cast<int64_t>(bias->size() * sizeof(float));
  }
  widest_input_ = std::max(widest_input_, linear->k);
  widest_fp8_output_ = std::max(widest_fp8_output_, linear->n);
  return std::unique_ptr<DeviceLinear>(std::move(linear));
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadLinear(
    const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) {
  LOOM_RETURN_IF_ERROR(CheckBias(bias, weight.rows));
  const bool fp8 =
      options_.fp8_weights || (options_.fp8_checkpoint && !weight.fp8_row_scales.empty());
  if (fp8 && weight.rows % 16 == 0 && weight.cols % 16 == 0) {
    absl::StatusOr<std::unique_ptr<DeviceLinear>> linear = UploadFp8(weight, bias);
    if (linear.ok()) ++fp8_linears_;
    return linear;
  }
  if (!options_.keep_quantized || !QuantGemmTakes(weight)) return UploadDense(weight, bias);
  absl::StatusOr<std::unique_ptr<DeviceLinear>> linear = UploadQuantized(weight, bias);
  if (linear.ok()) ++quantized_linears_;
  return linear;
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CudaDevice::UploadQuantized(
    const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) {
  auto linear = std::make_unique<CudaLinear>();
  linear->n = weight.rows;
  linear->k = weight.cols;
  linear->group_size = weight.group_size;
  const kc::DataType dtype = options_.dtype;
  LOOM_ASSIGN_OR_RETURN(kernels::cpu::NaturalQuantizedWeight natural,
                        kernels::cpu::UnpackQuantized(weight));
  kc::Int4GpuWeight packed;  // q and scale_min (INT8: its scales' device form)
  std::vector<float> scales_f32;  // INT8 with F32 scales: their device form instead
  if (weight.format == kernels::cpu::WeightFormat::kInt4) {
    linear->format = kc::QuantWeightFormat::kInt4;
    std::vector<uint8_t> nibbles(static_cast<size_t>(weight.rows * weight.cols / 2));
    // Split across threads: an 8B model's INT4 layers are ~3 billion of these.
    kernels::cpu::ParallelForOnce(
        static_cast<int64_t>(nibbles.size()), int64_t{1} << 20, [&](int64_t first, int64_t end) {
          for (int64_t i = first; i < end; ++i) {
            nibbles[i] =
                static_cast<uint8_t>((natural.q[2 * i] & 0x0f) | (natural.q[2 * i + 1] << 4));
          }
        });
    LOOM_ASSIGN_OR_RETURN(
        packed, kc::PackInt4ForGpu(nibbles.data(), natural.scales.data(), natural.mins.data(),
                                   weight.rows, weight.cols, weight.group_size));
  } else {
    // W8A16 (INT5 and NL4 come as INT8): per-channel scales as they are, group-wise ones in the
    // kernel's layout.
    linear->format = kc::QuantWeightFormat::kInt8;
    LOOM_ASSIGN_OR_RETURN(packed.q, kc::PackInt8ForGpu(natural.q.data(), weight.rows, weight.cols));
    if (!natural.scales_f32.empty()) {
      linear->scale_type =
          natural.mins_f32.empty() ? kc::QuantScaleType::kF32 : kc::QuantScaleType::kF32WithMin;
      LOOM_ASSIGN_OR_RETURN(
          scales_f32, kc::PackInt8GroupScalesF32ForGpu(
                          natural.scales_f32.data(),
                          natural.mins_f32.empty() ? nullptr : natural.mins_f32.data(), weight.rows,
                          weight.cols, weight.group_size));
    } else if (weight.group_size == weight.cols) {
      packed.scale_min = natural.scales;
    } else {
      LOOM_ASSIGN_OR_RETURN(packed.scale_min,
                            kc::PackInt8GroupScalesForGpu(natural.scales.data(), weight.rows,
                                                          weight.cols, weight.group_size));
    }
  }
  LOOM_ASSIGN_OR_RETURN(linear->q, UploadBytes(packed.q.data(), packed.q.size()));
  const size_t scale_bytes = scales_f32.empty() ? packed.scale_min.size() * sizeof(uint16_t)
                                                : scales_f32.size() * sizeof(float);
  LOOM_ASSIGN_OR_RETURN(
      linear->scale_min,
      UploadBytes(scales_f32.empty() ? static_cast<const void*>(packed.scale_min.data())
                                     : static_cast<const void*>(scales_f32.data()),
                  scale_bytes));
  weight_bytes_ += static_cast<int64_t>(packed.q.size() + scale_bytes);
  if (bias != nullptr && !bias->empty()) {
    // F32, added to the F32 sums unrounded as the dense and FP8 layers and the CPU do (a
    // Qwen2 QKV bias in the hundreds would lose ~0.4 in BF16).
    LOOM_ASSIGN_OR_RETURN(linear->bias, UploadBytes(bias->data(), bias->size() * sizeof(float)));
    weight_bytes_ += static_cast<int64_t>(bias->size() * sizeof(float));
  }
  // What Reserve sizes the W4A16 path's buffers by: the split-K workspace and tile counters
  // at every m up to the GEMM's largest (not only powers of two: the splits round up per m,
  // and a prefill remainder that outgrew them would reallocate mid-step, dropping every
  // captured graph).
  widest_input_ = std::max(widest_input_, linear->k);
  for (int64_t m = 1; m <= kc::kQuantGemmMaxM; ++m) {
    kc::QuantGemmParams p;
    p.act_dtype = dtype;
    p.format = linear->format;
    p.m = m;
    p.n = linear->n;
    p.k = linear->k;
    p.group_size = linear->group_size;
    p.scale_type = linear->scale_type;
    p.num_splits = kc::ChooseQuantGemmSplits(m, p.n, p.k, num_sms_, p.format);
    quant_workspace_bytes_ = std::max(quant_workspace_bytes_, kc::QuantGemmWorkspaceBytes(p));
    quant_counter_words_ = std::max(quant_counter_words_, kc::QuantGemmCounterCount(p));
  }
  return std::unique_ptr<DeviceLinear>(std::move(linear));
}

}  // namespace loom::model

#endif  // LOOM_HAVE_CUDA
