#include "model/cpu_device.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "model/cpu_kv_cache.h"

namespace loom::model {
namespace {

namespace cpu = kernels::cpu;

// Host memory the device owns (64-byte aligned), or host data it views.
class CpuBuffer : public Buffer {
 public:
  explicit CpuBuffer(int64_t bytes)
      : owned_(static_cast<uint8_t*>(::operator new[](std::max<int64_t>(bytes, 1),
                                                      std::align_val_t(64)))),
        data_(owned_),
        bytes_(bytes) {}
  CpuBuffer(const void* view, int64_t bytes)
      : data_(const_cast<void*>(view)), bytes_(bytes) {}
  ~CpuBuffer() override {
    if (owned_ != nullptr) ::operator delete[](owned_, std::align_val_t(64));
  }
  CpuBuffer(const CpuBuffer&) = delete;
  CpuBuffer& operator=(const CpuBuffer&) = delete;

  void* data() const override { return data_; }
  int64_t bytes() const override { return bytes_; }

 private:
  uint8_t* owned_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// A packed weight (and bias) owned by the host ModelWeights, viewed.
class CpuLinear : public DeviceLinear {
 public:
  CpuLinear(const cpu::PackedWeight& weight, const std::vector<float>* bias)
      : weight_(weight), bias_(bias != nullptr && !bias->empty() ? bias->data() : nullptr) {}
  int64_t rows() const override { return weight_.rows; }
  int64_t cols() const override { return weight_.cols; }
  const cpu::PackedWeight& weight() const { return weight_; }
  const float* bias() const { return bias_; }

 private:
  const cpu::PackedWeight& weight_;
  const float* bias_;
};

const CpuLinear& AsCpu(const DeviceLinear& w) { return static_cast<const CpuLinear&>(w); }
const CpuKvCache& AsCpu(const KvCache& c) { return static_cast<const CpuKvCache&>(c); }

// Per-row work (norms, RoPE, column splits) goes to the pool once a step has this many
// floats of it per chunk: below that a thread wake-up costs more than it saves. A row's
// result never depends on the split.
constexpr int64_t kMinRowFloatsPerChunk = int64_t{16} << 10;

// MoeFeedForward runs experts side by side (one thread each) while none has more rows
// than this: decode steps, where each expert's GEMM is too small to split across threads.
constexpr int64_t kMaxRowsPerExpertSideBySide = 8;

Tensor HostI32(absl::Span<const int32_t> values) {
  return Tensor::Of(const_cast<int32_t*>(values.data()), DType::kI32, DeviceType::kCpu,
                    {static_cast<int64_t>(values.size())});
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuDevice>> CpuDevice::Create(const CpuDeviceOptions& options) {
  if (options.thread_pool == nullptr && options.num_threads < 1) {
    return absl::InvalidArgumentError("the CPU device needs at least one thread");
  }
  LOOM_RETURN_IF_ERROR(cpu::ActivationPrecisionStatus(options.activations));
  std::unique_ptr<CpuDevice> device(new CpuDevice());
  device->pool_ = options.thread_pool != nullptr
                      ? options.thread_pool
                      : std::make_shared<cpu::ThreadPool>(options.num_threads);
  device->kv_dtype_ = options.kv_dtype;
  device->share_kv_pool_ = options.share_kv_pool;
  device->activations_ = options.activations;
  device->communicator_ = options.communicator;
  return device;
}

std::string CpuDevice::Describe() const {
  return absl::StrFormat("cpu (%s, %d threads)", cpu::MatmulIsa(), pool_->num_threads());
}

absl::StatusOr<std::unique_ptr<Buffer>> CpuDevice::Allocate(int64_t bytes) {
  return std::make_unique<CpuBuffer>(bytes);
}

absl::StatusOr<std::unique_ptr<Buffer>> CpuDevice::UploadF32(const std::vector<float>& host) {
  return std::make_unique<CpuBuffer>(host.data(),
                                     static_cast<int64_t>(host.size() * sizeof(float)));
}

absl::StatusOr<std::unique_ptr<DeviceLinear>> CpuDevice::UploadLinear(
    const cpu::PackedWeight& weight, const std::vector<float>* bias) {
  return std::make_unique<CpuLinear>(weight, bias);
}

absl::StatusOr<std::unique_ptr<KvCache>> CpuDevice::CreateKvCache(
    const common::ModelConfig& config, int64_t num_blocks, int64_t block_size) {
  LOOM_ASSIGN_OR_RETURN(
      std::unique_ptr<CpuKvCache> cache,
      CpuKvCache::Create(config, num_blocks, block_size, kv_dtype_, share_kv_pool_));
  return std::unique_ptr<KvCache>(std::move(cache));
}

absl::StatusOr<StepTensors> CpuDevice::UploadStep(
    absl::Span<const int32_t> token_ids, absl::Span<const int32_t> positions,
    absl::Span<const int32_t> slots, absl::Span<const int32_t> query_start,
    absl::Span<const int32_t> context_len, absl::Span<const int32_t> block_indptr,
    absl::Span<const int32_t> block_indices, absl::Span<const int32_t> sample_rows) {
  StepTensors step;
  step.token_ids = HostI32(token_ids);
  step.positions = HostI32(positions);
  step.slots = HostI32(slots);
  step.query_start = HostI32(query_start);
  step.context_len = HostI32(context_len);
  step.block_indptr = HostI32(block_indptr);
  step.block_indices = HostI32(block_indices);
  step.sample_rows = HostI32(sample_rows);
  SetStepHostSizes(token_ids, query_start, context_len, sample_rows, step);
  return step;
}

absl::Status CpuDevice::DownloadF32(const Tensor& x, float* host) {
  if (x.numel() > 0 && host != x.data) std::memcpy(host, x.data, x.numel() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuDevice::Embedding(const DeviceLinear& table, const Tensor& token_ids,
                                  int64_t vocab0, float scale, Tensor out) {
  const cpu::PackedWeight& weight = AsCpu(table).weight();
  const int64_t hidden = out.cols();
  const int32_t* ids = token_ids.as<const int32_t>();
  float* rows = out.as<float>();
  for (int64_t t = 0; t < token_ids.numel(); ++t) {
    // A rank holds the embedding rows of its vocabulary slice; the others add zeros.
    const int64_t id = ids[t] - vocab0;
    if (id >= 0 && id < weight.rows) {
      float* row = rows + t * hidden;
      cpu::DequantizeRows(weight, id, id + 1, row);
      if (scale != 1.0f) {
        for (int64_t h = 0; h < hidden; ++h) row[h] *= scale;
      }
    } else {
      std::fill_n(rows + t * hidden, hidden, 0.0f);
    }
  }
  return absl::OkStatus();
}

void CpuDevice::ForRows(int64_t rows, int64_t row_floats,
                        const std::function<void(int64_t, int64_t)>& fn) const {
  pool_->ParallelFor(rows, kMinRowFloatsPerChunk / std::max<int64_t>(1, row_floats), fn);
}

absl::Status CpuDevice::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  const int64_t hidden = x.cols();
  ForRows(x.rows(), hidden, [&](int64_t begin, int64_t end) {
    cpu::RmsNorm(x.as<const float>() + begin * hidden, weight.as<const float>(), eps,
                 end - begin, hidden, out.as<float>() + begin * hidden);
  });
  return absl::OkStatus();
}

absl::Status CpuDevice::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight,
                                   float eps, Tensor out) {
  const int64_t hidden = residual.cols();
  ForRows(residual.rows(), 2 * hidden, [&](int64_t begin, int64_t end) {
    cpu::AddRmsNorm(residual.as<float>() + begin * hidden, x.as<const float>() + begin * hidden,
                    weight.as<const float>(), eps, end - begin, hidden,
                    out.as<float>() + begin * hidden);
  });
  return absl::OkStatus();
}

absl::Status CpuDevice::Linear(const Tensor& x, const DeviceLinear& w, Tensor out,
                               LinearSite site) {
  if (observer_ && site.layer >= 0) observer_(site.layer, site.input, x.as<const float>(), x.rows());
  const CpuLinear& linear = AsCpu(w);
  return cpu::Matmul({x.as<const float>(), &linear.weight(), linear.bias(), out.as<float>(),
                      x.rows(), activations_},
                     *pool_);
}

absl::Status CpuDevice::SplitColumns(const Tensor& x, absl::Span<const Tensor> parts) {
  const int64_t width = x.cols();
  const float* src = x.as<const float>();
  ForRows(x.rows(), width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = src + r * width;
      for (const Tensor& part : parts) {
        const int64_t cols = part.cols();
        std::memcpy(part.as<float>() + r * cols, row, cols * sizeof(float));
        row += cols;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuDevice::ConcatColumns(absl::Span<const Tensor> parts, Tensor out) {
  const int64_t width = out.cols();
  float* dst = out.as<float>();
  ForRows(out.rows(), width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = dst + r * width;
      for (const Tensor& part : parts) {
        const int64_t cols = part.cols();
        std::memcpy(row, part.as<const float>() + r * cols, cols * sizeof(float));
        row += cols;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuDevice::Rope(Tensor q, Tensor k, const Tensor& positions, const RopeSpec& spec) {
  if (positions.numel() == 0) return absl::OkStatus();  // the head counts divide by it
  cpu::RopeParams rope;
  rope.q = q.as<float>();
  rope.k = k.as<float>();
  rope.positions = positions.as<const int32_t>();
  rope.inv_freq = spec.inv_freq.as<const float>();
  rope.num_tokens = positions.numel();
  rope.num_heads = q.numel() / (rope.num_tokens * spec.head_dim);
  rope.num_kv_heads = k.numel() / (rope.num_tokens * spec.head_dim);
  rope.head_dim = spec.head_dim;
  rope.rope_dim = spec.rope_dim;
  rope.neox = spec.neox;
  rope.attention_factor = spec.attention_factor;
  const int64_t q_width = rope.num_heads * rope.head_dim;
  const int64_t k_width = rope.num_kv_heads * rope.head_dim;
  ForRows(rope.num_tokens, q_width + k_width, [&](int64_t begin, int64_t end) {
    cpu::RopeParams rows = rope;
    rows.q += begin * q_width;
    if (rows.k != nullptr) rows.k += begin * k_width;
    rows.positions += begin;
    rows.num_tokens = end - begin;
    cpu::Rope(rows);
  });
  return absl::OkStatus();
}

absl::Status CpuDevice::WriteKv(KvCache& cache, int64_t layer, const Tensor& k, const Tensor& v,
                                const Tensor& slots) {
  return cpu::WriteKv(AsCpu(cache).layer(layer), k.as<const float>(), v.as<const float>(),
                      slots.as<const int32_t>(), slots.numel());
}

absl::Status CpuDevice::PagedAttention(const KvCache& cache, int64_t layer, const Tensor& q,
                                       const StepTensors& step, const AttentionSpec& spec,
                                       Tensor out) {
  LOOM_RETURN_IF_ERROR(CheckAttentionSinks(spec));
  cpu::PagedAttentionParams attention;
  attention.q = q.as<const float>();
  attention.out = out.as<float>();
  attention.cache = AsCpu(cache).layer(layer);
  attention.query_start = step.query_start.as<const int32_t>();
  attention.context_len = step.context_len.as<const int32_t>();
  attention.block_indptr = step.block_indptr.as<const int32_t>();
  attention.block_indices = step.block_indices.as<const int32_t>();
  attention.num_seqs = step.num_seqs;
  attention.num_heads = spec.num_heads;
  attention.group = spec.group;
  attention.head0 = spec.head0;
  attention.kv_head0 = spec.kv_head0;
  attention.scale = spec.scale;
  attention.window = spec.window;
  attention.softcap = spec.softcap;
  attention.sinks = spec.sinks.data != nullptr ? spec.sinks.as<const float>() : nullptr;
  attention.activations = activations_;
  return cpu::PagedAttention(attention, *pool_);
}

absl::Status CpuDevice::SoftCap(Tensor x, float cap) {
  cpu::SoftCap(x.as<float>(), x.numel(), cap);
  return absl::OkStatus();
}

absl::Status CpuDevice::Scale(Tensor x, float factor) {
  cpu::Scale(x.as<float>(), x.numel(), factor);
  return absl::OkStatus();
}

absl::Status CpuDevice::AddSigmoidGated(const Tensor& x, const Tensor& gate_logits, Tensor out) {
  cpu::AddSigmoidGatedRows(x.as<const float>(),
                           gate_logits.empty() ? nullptr : gate_logits.as<const float>(), x.rows(),
                           x.cols(), out.as<float>());
  return absl::OkStatus();
}

absl::Status CpuDevice::SiluMul(const Tensor& gate_up, Tensor out) {
  cpu::SiluMul(gate_up.as<const float>(), gate_up.rows(), out.cols(), out.as<float>(), *pool_);
  return absl::OkStatus();
}

absl::Status CpuDevice::GeluMul(const Tensor& gate_up, Tensor out) {
  cpu::GeluTanhMul(gate_up.as<const float>(), gate_up.rows(), out.cols(), out.as<float>(), *pool_);
  return absl::OkStatus();
}

absl::Status CpuDevice::GatherRows(const Tensor& x, const Tensor& y, const Tensor& rows,
                                   Tensor out) {
  const int64_t width = x.cols();
  const int32_t* index = rows.as<const int32_t>();
  const float* a = x.as<const float>();
  const float* b = y.as<const float>();
  float* dst = out.as<float>();
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const float* src_a = a + index[i] * width;
    float* row = dst + i * width;
    if (b == nullptr) {
      std::memcpy(row, src_a, width * sizeof(float));
    } else {
      const float* src_b = b + index[i] * width;
      for (int64_t h = 0; h < width; ++h) row[h] = src_a[h] + src_b[h];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::MoeFeedForward(const Tensor& x, const Tensor& router_logits,
                                       absl::Span<const DeviceLinear* const> gate_up,
                                       absl::Span<const DeviceLinear* const> down,
                                       const MoeSpec& spec, Tensor out) {
  const int64_t tokens = x.rows(), hidden = x.cols(), experts = router_logits.cols();
  const int64_t top_k = spec.top_k;
  if (absl::Status status = CheckMoeShapes(spec, experts, gate_up.size(), down.size());
      !status.ok()) {
    return status;
  }
  std::vector<int32_t> chosen(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  cpu::MoeRoute(router_logits.as<const float>(), tokens, experts, RoutingOf(spec), chosen.data(),
                weights.data());
  // The experts some token chose, each with its (token, weight) rows in token order.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(experts);
  for (int64_t i = 0; i < tokens * top_k; ++i) {
    routed[chosen[i]].emplace_back(i / top_k, weights[i]);
  }
  std::vector<int64_t> active;
  size_t most_rows = 0;
  for (int64_t e = 0; e < experts; ++e) {
    if (routed[e].empty()) continue;
    active.push_back(e);
    most_rows = std::max(most_rows, routed[e].size());
  }
  // Few rows per expert (decode): the experts run side by side, one thread each (a
  // grouped GEMM: one pool dispatch for all of them); many rows (prefill): one expert at a
  // time, each GEMM split across the pool. Either way a row's result is the same bits.
  const bool side_by_side = pool_->num_threads() > 1 && active.size() > 1 &&
                            most_rows <= static_cast<size_t>(kMaxRowsPerExpertSideBySide);
  const int64_t ffn = gate_up[active.empty() ? 0 : active[0]]->rows() / 2;
  // Rows of expert active[i] start at row_begin[i] of the scratch when side by side, at 0
  // (one expert at a time) otherwise.
  std::vector<int64_t> row_begin(active.size(), 0);
  int64_t scratch_rows = static_cast<int64_t>(most_rows);
  if (side_by_side) {
    scratch_rows = 0;
    for (size_t i = 0; i < active.size(); ++i) {
      row_begin[i] = scratch_rows;
      scratch_rows += static_cast<int64_t>(routed[active[i]].size());
    }
  }
  moe_x_.resize(scratch_rows * hidden);
  moe_gate_up_.resize(scratch_rows * 2 * ffn);
  moe_act_.resize(scratch_rows * ffn);
  moe_out_.resize(scratch_rows * hidden);
  const float* input = x.as<const float>();
  float* y = out.as<float>();
  std::fill(y, y + tokens * hidden, 0.0f);
  // Expert active[i] over its rows: gather, gate/up, SiLU·up, down.
  auto run_expert = [&](size_t i, cpu::ThreadPool& pool) -> absl::Status {
    const auto& rows = routed[active[i]];
    const int64_t n = static_cast<int64_t>(rows.size()), r0 = row_begin[i];
    float* xs = moe_x_.data() + r0 * hidden;
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(xs + j * hidden, input + rows[j].first * hidden, hidden * sizeof(float));
    }
    float* gu = moe_gate_up_.data() + r0 * 2 * ffn;
    float* act = moe_act_.data() + r0 * ffn;
    const CpuLinear& w_gate_up = AsCpu(*gate_up[active[i]]);
    const CpuLinear& w_down = AsCpu(*down[active[i]]);
    LOOM_RETURN_IF_ERROR(
        cpu::Matmul({xs, &w_gate_up.weight(), w_gate_up.bias(), gu, n, activations_}, pool));
    if (spec.swiglu_limit > 0.0f) {
      cpu::SwigluOaiMul(gu, n, ffn, spec.swiglu_limit, act, pool);
    } else {
      cpu::SiluMul(gu, n, ffn, act, pool);
    }
    return cpu::Matmul(
        {act, &w_down.weight(), w_down.bias(), moe_out_.data() + r0 * hidden, n, activations_},
        pool);
  };
  // Adds expert active[i]'s weighted outputs into its tokens' rows (in expert order, so
  // a token's sum does not depend on its batch).
  auto add_expert = [&](size_t i) {
    const auto& rows = routed[active[i]];
    for (size_t j = 0; j < rows.size(); ++j) {
      const auto [token, weight] = rows[j];
      float* row = y + token * hidden;
      const float* expert_row = moe_out_.data() + (row_begin[i] + static_cast<int64_t>(j)) * hidden;
      for (int64_t h = 0; h < hidden; ++h) row[h] += weight * expert_row[h];
    }
  };
  if (!side_by_side) {
    for (size_t i = 0; i < active.size(); ++i) {
      LOOM_RETURN_IF_ERROR(run_expert(i, *pool_));
      add_expert(i);
    }
    return absl::OkStatus();
  }
  std::vector<absl::Status> status(active.size());
  pool_->ParallelFor(
      static_cast<int64_t>(active.size()), 1,
      [&](int64_t begin, int64_t end) {
        // Each pool thread runs whole experts on itself (a one-thread pool runs inline).
        thread_local cpu::ThreadPool inline_pool(1);
        for (int64_t i = begin; i < end; ++i)
          status[i] = run_expert(static_cast<size_t>(i), inline_pool);
      },
      /*chunks_per_thread=*/4);
  for (size_t i = 0; i < active.size(); ++i) {
    LOOM_RETURN_IF_ERROR(status[i]);
    add_expert(i);
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::AllReduceSum(Tensor x) {
  if (communicator_ == nullptr) return absl::OkStatus();
  return communicator_->AllReduceSum(absl::MakeSpan(x.as<float>(), x.numel()));
}

absl::Status CpuDevice::AllGatherColumns(const Tensor& local, Tensor out) {
  const int64_t rows = out.rows(), vocab = out.cols(), n = local.cols();
  const int world = world_size();
  if (world == 1) return DownloadF32(local, out.as<float>());
  // Each rank's slice padded to the common stride, gathered, put back in vocabulary order.
  const int64_t stride = (vocab + world - 1) / world;
  std::vector<float> padded(rows * stride, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(padded.data() + i * stride, local.as<const float>() + i * n, n * sizeof(float));
  }
  gathered_.resize(world * rows * stride);
  LOOM_RETURN_IF_ERROR(communicator_->AllGather(padded, absl::MakeSpan(gathered_)));
  for (int r = 0; r < world; ++r) {
    const int64_t vocab0 = std::min<int64_t>(vocab, r * stride);
    const int64_t count = std::min<int64_t>(vocab, vocab0 + stride) - vocab0;
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(out.as<float>() + i * vocab + vocab0, gathered_.data() + (r * rows + i) * stride,
                  count * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::model
