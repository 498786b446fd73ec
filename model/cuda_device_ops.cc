#include "model/cuda_device.h"

// The CUDA device's operations: each enqueues kernels/cuda launches (or cuBLAS) on the stream.
// Without CUDA, model/cuda_device.cc stubs them.
#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/quantized_gemm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_write_kv.h"
#include "model/cuda_device_internal.h"
#include "model/cuda_status.h"

namespace loom::model {

namespace {

namespace kc = kernels::cuda;
using cuda_detail::AsCuda;
using cuda_detail::CudaLinear;
using cuda_detail::GrowingWhileCapturing;
using cuda_detail::kMaxAttentionSeqsPerLaunch;

// The gated activations (SiLU and GELU(tanh) times the up half, or the clamped SwiGLU with
// `limit`) of F32 [tokens, 2 ffn] rows. `low`: also the output in low_dtype there (nullptr:
// none).
absl::Status LaunchGated(const Tensor& gate_up, Tensor out, kc::GateActivation activation,
                         float limit, cudaStream_t stream, void* low = nullptr,
                         kc::DataType low_dtype = kc::DataType::kF16) {
  kc::SiluMulParams p;
  p.gate_up = gate_up.data;
  p.out = out.data;
  p.dtype = kc::DataType::kF32;
  p.num_tokens = gate_up.rows();
  p.ffn = out.cols();
  p.activation = activation;
  p.limit = limit;
  p.out_low = low;
  p.low_dtype = low_dtype;
  return kc::LaunchSiluMul(p, stream);
}

}  // namespace

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

absl::Status CudaDevice::Embedding(const DeviceLinear& table, const Tensor& token_ids,
                                   int64_t vocab0, float scale, Tensor out) {
  ForgetConverted();
  const CudaLinear& linear = AsCuda(table);
  if (linear.quantized() || linear.fp8()) {
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
  p.scale = scale;  // Gemma: sqrt(hidden), on the dequantized row as the CPU applies it
  return kc::LaunchGatherRows(p, stream_);
}

void* CudaDevice::ConvertedTarget(int64_t rows, int64_t cols) const {
  const size_t bytes = static_cast<size_t>(rows * cols * kc::ElementBytes(options_.dtype));
  return gemm_input_.bytes() >= bytes && bytes > 0 ? gemm_input_.data() : nullptr;
}

absl::Status CudaDevice::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  ForgetConverted();
  kc::RmsNormParams p;
  p.x = x.data;
  p.weight = weight.as<const float>();
  p.out = out.data;
  p.dtype = kc::DataType::kF32;
  p.eps = eps;
  p.num_tokens = x.rows();
  p.hidden = x.cols();
  p.out_low = ConvertedTarget(p.num_tokens, p.hidden);
  p.low_dtype = options_.dtype;
  LOOM_RETURN_IF_ERROR(kc::LaunchRmsNorm(p, stream_));
  if (p.out_low != nullptr) converted_ = {out.data, p.num_tokens, p.hidden};
  return absl::OkStatus();
}

absl::Status CudaDevice::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight,
                                    float eps, Tensor out) {
  ForgetConverted();
  kc::RmsNormParams p;
  p.x = x.data;
  p.residual = residual.data;
  p.weight = weight.as<const float>();
  p.out = out.data;
  p.dtype = kc::DataType::kF32;
  p.eps = eps;
  p.num_tokens = residual.rows();
  p.hidden = residual.cols();
  p.out_low = ConvertedTarget(p.num_tokens, p.hidden);
  p.low_dtype = options_.dtype;
  LOOM_RETURN_IF_ERROR(kc::LaunchRmsNorm(p, stream_));
  if (p.out_low != nullptr) converted_ = {out.data, p.num_tokens, p.hidden};
  return absl::OkStatus();
}

absl::Status CudaDevice::Linear(const Tensor& x, const DeviceLinear& w, Tensor out, LinearSite) {
  const CudaLinear& linear = AsCuda(w);
  const kc::DataType dtype = options_.dtype;
  const int64_t m = x.rows(), n = linear.n, k = linear.k;
  if (m == 0) return absl::OkStatus();
  const int64_t elem = kc::ElementBytes(dtype);
  // The GEMMs read their input in the weights' dtype: converted here, unless the op that
  // wrote x just left that copy in gemm_input_ (ForgetConverted).
  const bool converted = converted_.data == x.data && converted_.rows == m && converted_.cols == k;
  ForgetConverted();
  if (!converted) {
    LOOM_RETURN_IF_ERROR(Ensure(gemm_input_, static_cast<size_t>(m * k * elem)));
    LOOM_RETURN_IF_ERROR(Convert(x.data, kc::DataType::kF32, gemm_input_.data(), dtype, m, k));
  }
  if (linear.fp8()) return Fp8Linear(x, w, out);
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
  // W4A16 / W8A16, in chunks of the kernel's largest m, writing F32 straight into `out` (the sums
  // and bias unrounded: no conversion launch after the GEMM).
  for (int64_t row = 0; row < m; row += kc::kQuantGemmMaxM) {
    kc::QuantGemmParams p;
    p.x = static_cast<const uint8_t*>(gemm_input_.data()) + row * k * elem;
    p.y = static_cast<float*>(out.data) + row * n;
    p.f32_out = true;
    p.bias = linear.bias.data();
    p.bias_f32 = true;
    p.act_dtype = dtype;
    p.format = linear.format;
    p.weight = linear.q.data();
    p.scales = linear.scale_min.data();
    p.scale_type = linear.scale_type;
    p.m = std::min<int64_t>(kc::kQuantGemmMaxM, m - row);
    p.n = n;
    p.k = k;
    p.group_size = linear.group_size;
    p.num_splits = kc::ChooseQuantGemmSplits(p.m, n, k, num_sms_, p.format);
    const size_t workspace = kc::QuantGemmWorkspaceBytes(p);
    LOOM_RETURN_IF_ERROR(Ensure(workspace_, workspace));
    p.workspace = workspace_.data();
    p.workspace_bytes = workspace_.bytes();
    // The splits' sum inside the kernel: one launch per GEMM.
    if (const size_t words = kc::QuantGemmCounterCount(p); words > 0) {
      LOOM_RETURN_IF_ERROR(EnsureGemmCounters(words));
      p.counters = static_cast<uint32_t*>(gemm_counters_.data());
      p.counter_words = gemm_counters_.bytes() / sizeof(uint32_t);
    }
    LOOM_RETURN_IF_ERROR(kc::LaunchQuantGemm(p, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::Fp8Linear(const Tensor& x, const DeviceLinear& w, Tensor out) {
  const CudaLinear& linear = AsCuda(w);
  const int64_t m = x.rows(), n = linear.n, k = linear.k;
  const int64_t elem = kc::ElementBytes(options_.dtype);
  // gemm_input_ holds x in dtype (Linear converted it). In chunks of the GEMM's largest m,
  // each row quantized with its own dynamic scale (a token's result never depends on the
  // rest of the batch, padding rows included), the F32 sums landing in `out` in place.
  const int64_t chunk = std::min(m, cuda_detail::kFp8ChunkRows);
  LOOM_RETURN_IF_ERROR(Ensure(fp8_input_, static_cast<size_t>(chunk * k)));
  LOOM_RETURN_IF_ERROR(Ensure(fp8_x_scale_, static_cast<size_t>(chunk) * sizeof(float)));
  for (int64_t row = 0; row < m; row += cuda_detail::kFp8ChunkRows) {
    const int64_t rows = std::min(cuda_detail::kFp8ChunkRows, m - row);
    kc::QuantizeFp8Params q;
    q.x = static_cast<const uint8_t*>(gemm_input_.data()) + row * k * elem;
    q.out = fp8_input_.data();
    q.scale = static_cast<float*>(fp8_x_scale_.data());
    q.dynamic_scale = true;
    q.in_dtype = options_.dtype;
    q.count = rows * k;
    q.row_size = k;
    LOOM_RETURN_IF_ERROR(kc::LaunchQuantizeFp8(q, stream_));
    kc::Fp8GemmParams p;
    p.x = fp8_input_.data();
    p.x_scale = q.scale;
    p.x_scale_per_row = true;
    p.weight = linear.fp8_weight.data();
    p.w_scale = static_cast<const float*>(linear.fp8_scale.data());
    p.per_channel = true;
    p.bias = linear.bias.data();
    p.y = static_cast<float*>(out.data) + row * n;
    p.out_dtype = kc::DataType::kF32;
    p.m = rows;
    p.n = n;
    p.k = k;
    LOOM_RETURN_IF_ERROR(Ensure(workspace_, kc::Fp8GemmWorkspaceBytes(p)));
    p.workspace = workspace_.data();
    p.workspace_bytes = workspace_.bytes();
    LOOM_RETURN_IF_ERROR(kc::LaunchFp8Gemm(p, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::ConcatColumns(absl::Span<const Tensor> parts, Tensor out) {
  ForgetConverted();
  const int64_t rows = out.rows(), width = out.cols();
  if (rows == 0) return absl::OkStatus();
  // A strided copy per part (multi-head latent attention's two, once a layer).
  int64_t col = 0;
  for (const Tensor& part : parts) {
    const int64_t cols = part.cols();
    LOOM_CUDA_CALL(cudaMemcpy2DAsync(out.as<float>() + col, width * sizeof(float), part.data,
                                     cols * sizeof(float), cols * sizeof(float), rows,
                                     cudaMemcpyDeviceToDevice, stream_));
    col += cols;
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::SplitColumns(const Tensor& x, absl::Span<const Tensor> parts) {
  ForgetConverted();
  const int64_t rows = x.rows(), width = x.cols();
  if (rows == 0) return absl::OkStatus();
  if (parts.size() > static_cast<size_t>(kc::kSplitColumnsMaxParts)) {
    // More parts than one launch takes: a copy each.
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
  kc::SplitColumnsParams p;
  p.x = x.as<const float>();
  p.x_stride = width;
  p.rows = rows;
  p.num_parts = static_cast<int>(parts.size());
  for (size_t j = 0; j < parts.size(); ++j) {
    p.parts[j] = static_cast<float*>(parts[j].data);
    p.cols[j] = parts[j].cols();
  }
  return kc::LaunchSplitColumns(p, stream_);
}

absl::Status CudaDevice::Rope(Tensor q, Tensor k, const Tensor& positions, const RopeSpec& spec) {
  ForgetConverted();
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
  ForgetConverted();
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

absl::Status CudaDevice::QkvToCache(const Tensor& qkv, Tensor q, Tensor k, Tensor v,
                                    const Tensor& positions, const QkvSpec& spec, KvCache& cache,
                                    int64_t layer, const Tensor& slots) {
  const kc::KvCacheView view = AsCuda(cache).layer(layer);
  if (view.quant != kc::KvQuant::kNone) {
    return Device::QkvToCache(qkv, q, k, v, positions, spec, cache, layer, slots);
  }
  const RopeSpec* rope = spec.rope;
  ForgetConverted();
  const int64_t tokens = qkv.rows();
  if (tokens == 0) return absl::OkStatus();
  if (slots.numel() != tokens || (rope != nullptr && positions.numel() != tokens) ||
      q.numel() % (tokens * view.head_dim) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "QkvToCache: %d QKV rows, %d slots, %d positions, %d query elements of head dim %d", tokens,
        slots.numel(), positions.numel(), q.numel(), view.head_dim));
  }
  kc::RopeWriteKvParams p;
  p.qkv = qkv.as<const float>();
  p.qkv_stride = qkv.cols();
  p.q_out = q.as<float>();
  p.cache = view;
  p.slots = slots.as<const int32_t>();
  p.num_tokens = tokens;
  p.num_heads = q.numel() / (tokens * view.head_dim);
  if (rope != nullptr) {
    p.positions = positions.as<const int32_t>();
    p.inv_freq = rope->inv_freq.as<const float>();
    p.rope_dim = rope->rope_dim;
    p.neox = rope->neox;
    p.attention_factor = rope->attention_factor;
  }
  if (spec.q_norm.data != nullptr) {
    if (spec.q_norm.numel() != view.head_dim || spec.k_norm.numel() != view.head_dim) {
      return absl::InvalidArgumentError(
          absl::StrFormat("QkvToCache: QK-norm weights of %d and %d for head dim %d",
                          spec.q_norm.numel(), spec.k_norm.numel(), view.head_dim));
    }
    p.q_norm = spec.q_norm.as<const float>();
    p.k_norm = spec.k_norm.as<const float>();
    p.norm_eps = spec.norm_eps;
  }
  return kc::LaunchRopeWriteKv(p, stream_);
}

absl::Status CudaDevice::PagedAttention(const KvCache& cache, int64_t layer, const Tensor& q,
                                        const StepTensors& step, const AttentionSpec& spec,
                                        Tensor out) {
  ForgetConverted();
  if (step.num_seqs == 0 || step.num_tokens == 0) return absl::OkStatus();
  const kc::KvCacheView view = AsCuda(cache).layer(layer);
  // A rank's cache holds its KV heads only; its query heads are their groups, in order.
  if (spec.num_heads != view.num_kv_heads * spec.group) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA attention: %d local query heads are not %d KV heads x group %d",
                        spec.num_heads, view.num_kv_heads, spec.group));
  }
  LOOM_RETURN_IF_ERROR(CheckAttentionSinks(spec));
  const int64_t q_cols = spec.num_heads * spec.head_dim;
  // An 8-bit cache holds rotated rows (kernels/cuda/kv_cache.h): the query is rotated into
  // gemm_input_ (in F32 for decode, in the cache dtype for prefill's tensor cores) and the
  // output back in place, as cpu::PagedAttention does.
  const bool rotated = view.quant != kc::KvQuant::kNone;
  auto rotate_query = [&](kc::DataType dtype) -> absl::Status {
    LOOM_RETURN_IF_ERROR(Ensure(
        gemm_input_, static_cast<size_t>(step.num_tokens * q_cols * kc::ElementBytes(dtype))));
    kc::RotateHeadsParams r;
    r.src = q.as<const float>();
    r.dst = gemm_input_.data();
    r.dst_dtype = dtype;
    r.rows = step.num_tokens * spec.num_heads;
    r.head_dim = spec.head_dim;
    return kc::LaunchRotateHeads(r, stream_);
  };
  auto rotate_output = [&]() -> absl::Status {
    if (!rotated) return absl::OkStatus();
    kc::RotateHeadsParams r;
    r.src = out.as<const float>();
    r.dst = out.data;
    r.rows = step.num_tokens * spec.num_heads;
    r.head_dim = spec.head_dim;
    return kc::LaunchRotateHeads(r, stream_);
  };
  if (step.num_tokens == step.num_seqs) {
    if (rotated) LOOM_RETURN_IF_ERROR(rotate_query(kc::DataType::kF32));
    const float* decode_q =
        rotated ? static_cast<const float*>(gemm_input_.data()) : q.as<const float>();
    // The output also in the GEMMs' dtype, for the output projection (not with an 8-bit cache:
    // its output is rotated back first, and gemm_input_ holds the rotated query).
    auto* low = rotated ? nullptr : static_cast<uint8_t*>(ConvertedTarget(step.num_tokens, q_cols));
    const int64_t low_row_bytes = q_cols * kc::ElementBytes(options_.dtype);
    // Launches of at most kMaxAttentionSeqsPerLaunch sequences; block_indptr values index
    // the whole block_indices array, so a chunk offsets only the per-sequence arrays.
    for (int64_t first = 0; first < step.num_seqs; first += kMaxAttentionSeqsPerLaunch) {
      kc::PagedDecodeParams p;
      p.num_seqs = std::min(kMaxAttentionSeqsPerLaunch, step.num_seqs - first);
      p.q = decode_q + first * q_cols;
      p.out = out.as<float>() + first * q_cols;
      p.out_low = low != nullptr ? low + first * low_row_bytes : nullptr;
      p.out_low_dtype = options_.dtype;
      p.q_dtype = kc::DataType::kF32;
      p.cache = view;
      p.context_len = step.context_len.as<const int32_t>() + first;
      p.block_indptr = step.block_indptr.as<const int32_t>() + first;
      p.block_indices = step.block_indices.as<const int32_t>();
      p.num_heads = spec.num_heads;
      p.scale = spec.scale;
      p.window = spec.window;
      p.softcap = spec.softcap;
      p.sinks = spec.sinks.as<const float>();
      p.max_context_len = std::max<int64_t>(step.max_context_len, 1);
      const size_t workspace = kc::PagedDecodeWorkspaceBytes(p);
      LOOM_RETURN_IF_ERROR(Ensure(workspace_, workspace));
      p.workspace = workspace_.data();
      p.workspace_bytes = workspace_.bytes();
      LOOM_RETURN_IF_ERROR(kc::LaunchPagedDecode(p, stream_));
    }
    if (low != nullptr) converted_ = {out.data, step.num_tokens, q_cols};
    return rotate_output();
  }
  // Prefill reads Q in the cache dtype (the tensor cores' input).
  if (rotated) {
    LOOM_RETURN_IF_ERROR(rotate_query(view.dtype));
  } else {
    LOOM_RETURN_IF_ERROR(Ensure(
        gemm_input_, static_cast<size_t>(step.num_tokens * q_cols * kc::ElementBytes(view.dtype))));
    LOOM_RETURN_IF_ERROR(Convert(q.data, kc::DataType::kF32, gemm_input_.data(), view.dtype,
                                 step.num_tokens, q_cols));
  }
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
    p.window = spec.window;
    p.softcap = spec.softcap;
    p.sinks = spec.sinks.as<const float>();
    p.max_query_len = std::max<int64_t>(step.max_query_len, 1);
    LOOM_RETURN_IF_ERROR(kc::LaunchPagedPrefill(p, stream_));
  }
  return rotate_output();
}

absl::Status CudaDevice::SiluMul(const Tensor& gate_up, Tensor out) {
  return Gated(gate_up, out, kc::GateActivation::kSilu);
}

absl::Status CudaDevice::GeluMul(const Tensor& gate_up, Tensor out) {
  return Gated(gate_up, out, kc::GateActivation::kGeluTanh);
}

absl::Status CudaDevice::Gated(const Tensor& gate_up, Tensor out,
                               kernels::cuda::GateActivation activation, float limit) {
  ForgetConverted();
  void* low = ConvertedTarget(out.rows(), out.cols());
  LOOM_RETURN_IF_ERROR(LaunchGated(gate_up, out, activation, limit, stream_, low, options_.dtype));
  if (low != nullptr) converted_ = {out.data, out.rows(), out.cols()};
  return absl::OkStatus();
}

absl::Status CudaDevice::InPlace(Tensor x, kc::InPlaceOp op, float value) {
  ForgetConverted();
  kc::InPlaceParams p;
  p.x = x.data;
  p.dtype = kc::DataType::kF32;
  p.num_elements = x.numel();
  p.op = op;
  p.value = value;
  return kc::LaunchInPlace(p, stream_);
}

absl::Status CudaDevice::SoftCap(Tensor x, float cap) {
  return InPlace(x, kc::InPlaceOp::kSoftCap, cap);
}

absl::Status CudaDevice::Scale(Tensor x, float factor) {
  return InPlace(x, kc::InPlaceOp::kScale, factor);
}

absl::Status CudaDevice::AddSigmoidGated(const Tensor& x, const Tensor& gate_logits, Tensor out) {
  ForgetConverted();
  kc::AddGatedRowsParams p;
  p.x = x.as<const float>();
  p.gate_logits = gate_logits.empty() ? nullptr : gate_logits.as<const float>();
  p.out = out.as<float>();
  p.rows = x.rows();
  p.cols = x.cols();
  return kc::LaunchAddGatedRows(p, stream_);
}

absl::Status CudaDevice::GatherRows(const Tensor& x, const Tensor& y, const Tensor& rows,
                                    Tensor out) {
  ForgetConverted();
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

}  // namespace loom::model

#endif  // LOOM_HAVE_CUDA
