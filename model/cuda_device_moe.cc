// CudaDevice: a mixture-of-experts feed-forward layer (Mixtral, Qwen3-MoE), routed on the
// host. The router's logits come back to the host (one stream wait), cpu::MoeRoute picks
// each token's experts exactly as the CPU device does, and every expert some token chose
// runs its gate/up GEMM, SiLU·mul (or gpt-oss's clamped SwiGLU) and down GEMM, each GEMM
// with the expert's bias where it has one, over the rows of its tokens (gathered),
// whose outputs are added into the tokens' rows weighted by the routing (experts in
// increasing order, so a token's sum is made in the CPU's order). One GEMM per active
// expert, not one grouped GEMM; the host wait keeps such layers out of CUDA graphs (the
// forward pass runs mixture-of-experts models eagerly).
#include "model/cuda_device.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cuda/gather.h"
#include "model/cuda_device_internal.h"
#include "model/cuda_status.h"

namespace loom::model {

namespace kc = kernels::cuda;

absl::Status CudaDevice::MoeFeedForward(const Tensor& x, const Tensor& router_logits,
                                        absl::Span<const DeviceLinear* const> gate_up,
                                        absl::Span<const DeviceLinear* const> down,
                                        const MoeSpec& spec, Tensor out) {
  ForgetConverted();
  const int64_t tokens = x.rows(), hidden = x.cols(), experts = router_logits.cols();
  const int64_t top_k = spec.top_k;
  if (absl::Status status = CheckMoeShapes(spec, experts, gate_up.size(), down.size());
      !status.ok()) {
    return status;
  }
  if (capturing_) {
    return absl::FailedPreconditionError(
        "mixture of experts: the routing is read on the host, which a CUDA graph cannot capture");
  }
  LOOM_CUDA_CALL(
      cudaMemsetAsync(out.data, 0, static_cast<size_t>(tokens * hidden) * sizeof(float), stream_));
  if (tokens == 0) return absl::OkStatus();
  // The routing, on the host: the router's logits come back (the stream is drained).
  moe_logits_.resize(static_cast<size_t>(tokens * experts));
  LOOM_CUDA_CALL(cudaMemcpyAsync(moe_logits_.data(), router_logits.data,
                                 moe_logits_.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                 stream_));
  LOOM_RETURN_IF_ERROR(Synchronize());
  std::vector<int32_t> chosen(static_cast<size_t>(tokens * top_k));
  std::vector<float> weights(static_cast<size_t>(tokens * top_k));
  kernels::cpu::MoeRoute(moe_logits_.data(), tokens, experts, RoutingOf(spec), chosen.data(),
                         weights.data());
  // Each expert's tokens (in token order) and weights, expert after expert: one upload.
  std::vector<int64_t> begin(static_cast<size_t>(experts) + 1, 0);
  for (const int32_t e : chosen) ++begin[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < experts; ++e) begin[e + 1] += begin[e];
  const int64_t routed = tokens * top_k;
  std::vector<int32_t> rows(static_cast<size_t>(routed));
  std::vector<float> row_weights(static_cast<size_t>(routed));
  std::vector<int64_t> next(begin.begin(), begin.end() - 1);
  int64_t most_rows = 0;
  for (int64_t i = 0; i < routed; ++i) {
    const int64_t slot = next[chosen[i]]++;
    rows[slot] = static_cast<int32_t>(i / top_k);
    row_weights[slot] = weights[i];
  }
  for (int64_t e = 0; e < experts; ++e) most_rows = std::max(most_rows, begin[e + 1] - begin[e]);
  const int64_t ffn = gate_up[0]->rows() / 2;
  LOOM_RETURN_IF_ERROR(Ensure(moe_rows_, static_cast<size_t>(routed) * sizeof(int32_t)));
  LOOM_RETURN_IF_ERROR(Ensure(moe_weights_, static_cast<size_t>(routed) * sizeof(float)));
  LOOM_RETURN_IF_ERROR(Ensure(moe_x_, static_cast<size_t>(most_rows * hidden) * sizeof(float)));
  LOOM_RETURN_IF_ERROR(
      Ensure(moe_gate_up_, static_cast<size_t>(most_rows * 2 * ffn) * sizeof(float)));
  LOOM_RETURN_IF_ERROR(Ensure(moe_act_, static_cast<size_t>(most_rows * ffn) * sizeof(float)));
  LOOM_RETURN_IF_ERROR(Ensure(moe_out_, static_cast<size_t>(most_rows * hidden) * sizeof(float)));
  // Pageable sources: the copies have read them when the calls return.
  LOOM_CUDA_CALL(cudaMemcpyAsync(moe_rows_.data(), rows.data(), rows.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  LOOM_CUDA_CALL(cudaMemcpyAsync(moe_weights_.data(), row_weights.data(),
                                 row_weights.size() * sizeof(float), cudaMemcpyHostToDevice,
                                 stream_));
  const auto* device_rows = static_cast<const int32_t*>(moe_rows_.data());
  const auto* device_weights = static_cast<const float*>(moe_weights_.data());
  auto view = [](kc::DeviceBuffer& buffer, int64_t n, int64_t width) {
    return Tensor::Of(buffer.data(), DType::kF32, DeviceType::kCuda, {n, width});
  };
  // gpt-oss's experts clamp their SwiGLU (the limit is ignored by SiLU).
  const kc::GateActivation activation =
      spec.swiglu_limit > 0.0f ? kc::GateActivation::kSwigluOai : kc::GateActivation::kSilu;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = begin[e + 1] - begin[e];
    if (n == 0) continue;
    kc::GatherRowsParams gather;
    gather.table = x.data;
    gather.indices = device_rows + begin[e];
    gather.out = moe_x_.data();
    gather.src_dtype = kc::DataType::kF32;
    gather.dst_dtype = kc::DataType::kF32;
    gather.num_rows = tokens;
    gather.row_size = hidden;
    gather.num_indices = n;
    LOOM_RETURN_IF_ERROR(kc::LaunchGatherRows(gather, stream_));
    LOOM_RETURN_IF_ERROR(Linear(view(moe_x_, n, hidden), *gate_up[e],
                                view(moe_gate_up_, n, 2 * ffn), {0, LinearInput::kGateUp}));
    LOOM_RETURN_IF_ERROR(Gated(view(moe_gate_up_, n, 2 * ffn), view(moe_act_, n, ffn), activation,
                               spec.swiglu_limit));
    LOOM_RETURN_IF_ERROR(Linear(view(moe_act_, n, ffn), *down[e], view(moe_out_, n, hidden),
                                {0, LinearInput::kDown}));
    kc::ScatterAddRowsParams scatter;
    scatter.rows = static_cast<const float*>(moe_out_.data());
    scatter.indices = device_rows + begin[e];
    scatter.weights = device_weights + begin[e];
    scatter.out = out.as<float>();
    scatter.num_out_rows = tokens;
    scatter.row_size = hidden;
    scatter.num_indices = n;
    LOOM_RETURN_IF_ERROR(kc::LaunchScatterAddRows(scatter, stream_));
  }
  return absl::OkStatus();
}

}  // namespace loom::model

#endif  // LOOM_HAVE_CUDA
