#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/formats/model_config.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/weights.h"
#include "model/kv_pool_share.h"
#include "model/tensor.h"

namespace loom::model {

/// Which linear layer's input a Linear call reads (the AWQ observer's key, see
/// CpuDeviceOptions::observer).
enum class LinearInput {
  kQkv,         // the attention RMSNorm's output, [T, hidden]
  kAttnOutput,  // the attention output, [T, local heads * head_dim]
  kGateUp,      // the FFN RMSNorm's output, [T, hidden]
  kDown,        // SiLU(gate) * up, [T, local ffn]
};

/// Where in the model a Linear call is: layer index and which input (layer -1: outside
/// the layers, e.g. the LM head, which nothing observes).
struct LinearSite {
  int64_t layer = -1;
  LinearInput input = LinearInput::kQkv;
};

/// A linear layer's weight [rows (out features), cols (in features)] (and optional bias
/// [rows]) in the device's format: packed F32/F16/BF16 or INT8/INT4 on the CPU, dense
/// F16/BF16, INT4/INT8 for the W4A16/W8A16 GEMM or FP8 on CUDA. A tensor-parallel rank's weight is
/// its slice (model/tensor_parallel.h). Immutable once uploaded.
class DeviceLinear {
 public:
  virtual ~DeviceLinear() = default;
  virtual int64_t rows() const = 0;
  virtual int64_t cols() const = 0;
};

/// The paged KV pool of one device: for every layer, K and V of `num_blocks` blocks of
/// `block_size` token slots ([num_blocks, block_size, kv_heads, head_dim] each). Block b
/// is the same slot range in every layer. Not thread-safe.
class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual int64_t num_blocks() const = 0;
  virtual int64_t block_size() const = 0;
  virtual int64_t num_layers() const = 0;
  /// Bytes of the whole pool.
  virtual int64_t bytes() const = 0;

  // ---- block copies (the host tier, worker/kv_host_tier) ----
  /// Bytes of one block across every layer: K and V (and an 8-bit pool's scales), layer by
  /// layer, contiguous: what one host-tier slot holds.
  virtual int64_t block_bytes() const = 0;
  /// Copies block blocks[i] (every layer) into host[i] (block_bytes() each), then waits
  /// for the copies. Blocks must be in range (the caller validated them).
  virtual absl::Status SaveBlocks(absl::Span<const int32_t> blocks,
                                  absl::Span<uint8_t* const> host) const = 0;
  /// Overwrites block blocks[i] (every layer) with host[i], as SaveBlocks wrote it, then
  /// waits for the copies.
  virtual absl::Status LoadBlocks(absl::Span<const uint8_t* const> host,
                                  absl::Span<const int32_t> blocks) const = 0;
  /// Copies layer `layer` of `block` into `host` as SaveBlocks lays out that layer (K,
  /// V, then the 8-bit dtypes' scales: block_bytes() / num_layers() bytes), on the calling
  /// thread: a KV push copies a layer as soon as the forward pass wrote it. Unimplemented
  /// where the pool is not host memory (CUDA).
  virtual absl::Status SaveBlockLayer(int32_t block, int64_t layer, uint8_t* host) const {
    (void)block, (void)layer, (void)host;
    return absl::UnimplementedError("this KV pool cannot copy a single layer out");
  }
  /// Makes `bytes` of host memory at `host` fast to copy to and from (CUDA pins it); the
  /// memory must stay allocated while the pool lives. Nothing to do on the CPU.
  virtual absl::Status RegisterHostMemory(void* host, int64_t bytes) const {
    (void)host, (void)bytes;
    return absl::OkStatus();
  }
  /// Undoes RegisterHostMemory (before the memory is freed).
  virtual void UnregisterHostMemory(void* host) const { (void)host; }

  // ---- pool-to-pool copies (worker/kv_pool_transfer) ----
  /// How another process of this machine reads this pool's blocks (a CPU pool created in a
  /// memory file, a CUDA pool through IPC); Unimplemented where it cannot.
  virtual absl::StatusOr<KvPoolShare> Share() const {
    return absl::UnimplementedError("this KV pool is not shared with other processes");
  }
  /// Opens another process's pool of kind kCudaIpc on this pool's device; Unimplemented
  /// elsewhere (a memory file is mapped by its reader, worker/shared_kv_mappings).
  virtual absl::StatusOr<PeerKvPool> OpenPeer(const KvPoolShare& share) const {
    (void)share;
    return absl::UnimplementedError("this KV pool cannot open another process's pool");
  }
  /// Overwrites block dest_blocks[i] (every layer) with block src_blocks[i] of `peer`, whole,
  /// or (`heads` set) the source's KV heads it names in every token row, then waits for the
  /// copies. The layouts must match part for part (the same model slice, or as much per head,
  /// KV dtype and block size: FailedPrecondition otherwise); blocks outside either pool or
  /// heads outside either pool's rows are InvalidArgument, and nothing is copied then.
  virtual absl::Status CopyBlocksFromPeer(const PeerKvPool& peer,
                                          absl::Span<const int32_t> src_blocks,
                                          absl::Span<const int32_t> dest_blocks,
                                          const PeerHeads& heads) const {
    (void)peer, (void)src_blocks, (void)dest_blocks, (void)heads;
    return absl::UnimplementedError("this KV pool cannot copy from another process's pool");
  }
};

/// One step's flattened batch in CSR form (worker::StepBatch's fields, validated by its
/// caller), as tensors of the device that runs it (DeviceType::kCpu: views of the host
/// vectors, no copy). T tokens, S sequences, R sample rows.
struct StepTensors {
  Tensor token_ids;      // I32 [T]
  Tensor positions;      // I32 [T]
  Tensor slots;          // I32 [T]: block * block_size + offset, where each token's K/V goes
  Tensor query_start;    // I32 [S + 1]
  Tensor context_len;    // I32 [S]
  Tensor block_indptr;   // I32 [S + 1]
  Tensor block_indices;  // I32 [block_indptr[S]]
  Tensor sample_rows;    // I32 [R]: token rows whose logits are wanted
  // Host copies of the sizes (for launches and loops that need them on the host).
  int64_t num_tokens = 0;
  int64_t num_seqs = 0;
  int64_t num_sample_rows = 0;
  // Host bounds a device's launches size their grids by (the CPU ignores them): the most
  // query tokens of one sequence, and the most context tokens (this step's included).
  int64_t max_query_len = 0;
  int64_t max_context_len = 0;
};

/// Fills `step`'s host sizes and bounds from the step's host arrays (what every device's
/// UploadStep records alike).
inline void SetStepHostSizes(absl::Span<const int32_t> token_ids,
                             absl::Span<const int32_t> query_start,
                             absl::Span<const int32_t> context_len,
                             absl::Span<const int32_t> sample_rows, StepTensors& step) {
  step.num_tokens = static_cast<int64_t>(token_ids.size());
  step.num_seqs = static_cast<int64_t>(context_len.size());
  step.num_sample_rows = static_cast<int64_t>(sample_rows.size());
  for (size_t s = 0; s < context_len.size(); ++s) {
    step.max_query_len = std::max<int64_t>(step.max_query_len, query_start[s + 1] - query_start[s]);
    step.max_context_len = std::max<int64_t>(step.max_context_len, context_len[s]);
  }
}

/// What RoPE needs: per-frequency inverse frequencies with scaling applied
/// (RopeInverseFrequencies), how many leading dims of a head rotate, and the pairing.
struct RopeSpec {
  Tensor inv_freq;  // F32 [rope_dim / 2]
  int64_t head_dim = 0;
  int64_t rope_dim = 0;
  bool neox = false;  // pairs (i, i + rope_dim / 2); else (2i, 2i + 1)
  float attention_factor = 1.0f;  // YaRN: scales cos and sin (1 otherwise)
};

/// How Device::QkvToCache makes attention's inputs of the QKV product.
struct QkvSpec {
  const RopeSpec* rope = nullptr;  // null: q and k keep their values (NoPE layers)
  // QK-norm (Qwen3's, Gemma 3's): each head of q, and of k, RMS-normalized with these F32
  // [head_dim] weights before the rotation; no data: none (both or neither).
  Tensor q_norm, k_norm;
  float norm_eps = 0.0f;
};

/// What paged attention needs besides its tensors: this rank's heads of the model's.
struct AttentionSpec {
  int64_t num_heads = 0;     // local query heads
  int64_t group = 1;         // query heads per KV head (of the whole model)
  int64_t head0 = 0;         // first local query head's global index
  int64_t kv_head0 = 0;      // first local KV head's global index
  int64_t head_dim = 0;
  float scale = 1.0f;        // 1 / sqrt(head_dim)
  int64_t window = 0;        // sliding window in tokens (ModelConfig::LayerWindow); 0: none
  float softcap = 0.0f;      // scores soft-capped: c * tanh(s / c) (Gemma 2); 0: none
  // Attention sinks (gpt-oss): F32 [num_heads], a learned logit per local query head that
  // joins each softmax's denominator only (weights sum to less than 1); no data: none.
  Tensor sinks;
};

/// InvalidArgument unless `spec`'s sinks, where it has them, are F32 with one per local
/// query head (what every device's attention reads).
inline absl::Status CheckAttentionSinks(const AttentionSpec& spec) {
  if (spec.sinks.empty() ||
      (spec.sinks.dtype == DType::kF32 && spec.sinks.numel() == spec.num_heads)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "attention sinks must be F32 [", spec.num_heads, "] (one per local query head), got ",
      spec.sinks.numel(), " elements of dtype ", static_cast<int>(spec.sinks.dtype)));
}

/// How a mixture-of-experts layer weighs its experts (ModelConfig's expert fields).
struct MoeSpec {
  int64_t top_k = 1;      // experts per token (num_experts_used)
  bool normalize = true;  // the chosen probabilities renormalized to sum to 1
  // GLM-4.5's and DeepSeek-V3's routing: each expert's score is its logit's sigmoid (not a
  // softmax), the choice is made on the scores plus `selection_bias` ([experts] on the host,
  // or empty), and the weights (the unbiased scores, renormalized as above) are times `scale`.
  bool sigmoid = false;
  absl::Span<const float> selection_bias;
  float scale = 1.0f;
  // Grouped routing (ModelConfig::expert_groups): the top-k inside the best groups_used of
  // `groups` equal groups. 1: none.
  int64_t groups = 1;
  int64_t groups_used = 1;
  // > 0: the experts' activation is OpenAI's clamped SwiGLU (gpt-oss) instead of
  // SiLU(gate) * up: g = min(gate, limit), u = clamp(up, -limit, limit),
  // g * sigmoid(1.702 g) * (u + 1).
  float swiglu_limit = 0.0f;
};

/// The host routing kernel's parameters for `spec`.
inline kernels::cpu::MoeRouting RoutingOf(const MoeSpec& spec) {
  return {.top_k = spec.top_k,
          .sigmoid = spec.sigmoid,
          .selection_bias = spec.selection_bias.empty() ? nullptr : spec.selection_bias.data(),
          .normalize = spec.normalize,
          .scale = spec.scale,
          .groups = spec.groups,
          .groups_used = spec.groups_used};
}

/// InvalidArgument unless `spec` chooses from `experts` router outputs, one gate/up and one
/// down matrix each, and a selection bias (if any) has one value per expert
/// (Device::MoeFeedForward's arguments).
inline absl::Status CheckMoeShapes(const MoeSpec& spec, int64_t experts, size_t num_gate_up,
                                   size_t num_down) {
  if (spec.top_k < 1 || spec.top_k > experts || static_cast<int64_t>(num_gate_up) != experts ||
      spec.groups < 1 || experts % spec.groups != 0 || spec.groups_used < 1 ||
      spec.groups_used > spec.groups || spec.top_k > spec.groups_used * (experts / spec.groups) ||
      static_cast<int64_t>(num_down) != experts ||
      (!spec.selection_bias.empty() &&
       static_cast<int64_t>(spec.selection_bias.size()) != experts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mixture of experts: top ", spec.top_k, " of ", experts, " router outputs over ",
        num_gate_up, " experts in the best ", spec.groups_used, " of ", spec.groups, " groups"));
  }
  return absl::OkStatus();
}

/// The operations the model graph (model/llama_graph.h) runs, on one device: memory,
/// uploads, and one call per operation over tensors in the device's memory. Calls are
/// enqueued in order (a device with a stream may return before the work is done:
/// Download and Synchronize wait). Every F32 activation tensor is row-major [rows, cols].
/// Implementations: CpuDevice (model/cpu_device.h, kernels/cpu) and the CUDA device.
/// Not thread-safe: one graph step at a time.
class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceType type() const = 0;
  /// "cpu (avx512, 16 threads)", "cuda:0 (H100)": for logs.
  virtual std::string Describe() const = 0;

  // ---- memory ----
  /// `bytes` of device memory (uninitialised). ResourceExhausted when it does not fit.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes) = 0;
  /// `host` on the device as F32. On the CPU the buffer views `host` (which must then
  /// outlive it) instead of copying.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> UploadF32(const std::vector<float>& host) = 0;
  /// A linear layer's weight (and bias, may be null) in the device's format. On the CPU
  /// it views `weight` and `bias` (which must outlive it).
  virtual absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadLinear(
      const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) = 0;
  /// A weight the device keeps in a form its Embedding can gather rows of, never in a lossier
  /// format than stored (the token embedding and the LM head beside it; an MoE router,
  /// whose top-k choice a coarser format could change): by default what UploadLinear makes.
  /// `bias` [table.rows()] (may be null; a gpt-oss router's) is added by Linear.
  virtual absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadTable(
      const kernels::cpu::PackedWeight& table, const std::vector<float>* bias = nullptr) {
    return UploadLinear(table, bias);
  }
  /// An untied LM head: only multiplied (Linear), never gathered, and never in a lossier
  /// format than stored. By default what UploadTable makes.
  virtual absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadLmHead(
      const kernels::cpu::PackedWeight& head) {
    return UploadTable(head);
  }
  /// A [rows, cols] weight generated on the device, with no host copy (random models for
  /// benchmarks): element i uniform in [-scale, scale) from a hash of (seed, i); the same
  /// seed gives the same weight; `bias` [rows] (may be null) is uploaded as given. Usable
  /// as a linear layer and as a table. Unimplemented on a device that does not generate
  /// weights.
  virtual absl::StatusOr<std::unique_ptr<DeviceLinear>> RandomLinear(
      int64_t /*rows*/, int64_t /*cols*/, uint64_t /*seed*/, float /*scale*/,
      const std::vector<float>* /*bias*/ = nullptr) {
    return absl::UnimplementedError(absl::StrCat(Describe(), " does not generate weights"));
  }
  /// A KV pool for `config`'s layers and KV heads (a rank's LocalConfig).
  virtual absl::StatusOr<std::unique_ptr<KvCache>> CreateKvCache(
      const common::ModelConfig& config, int64_t num_blocks, int64_t block_size) = 0;
  /// The step's batch as device tensors; the vectors must outlive the tensors (the CPU
  /// views them).
  virtual absl::StatusOr<StepTensors> UploadStep(
      absl::Span<const int32_t> token_ids, absl::Span<const int32_t> positions,
      absl::Span<const int32_t> slots, absl::Span<const int32_t> query_start,
      absl::Span<const int32_t> context_len, absl::Span<const int32_t> block_indptr,
      absl::Span<const int32_t> block_indices, absl::Span<const int32_t> sample_rows) = 0;
  /// host[0, x.numel()) <- x (F32); waits for the work that writes x.
  virtual absl::Status DownloadF32(const Tensor& x, float* host) = 0;
  /// Waits for every enqueued call.
  virtual absl::Status Synchronize() = 0;

  // ---- operations (shapes for a step of T tokens) ----
  /// out[t] <- row token_ids[t] - vocab0 of `table` (a rank's vocabulary rows
  /// [vocab0, vocab0 + table.rows())) times `scale` (1, or Gemma's sqrt(hidden)), zeros where
  /// the id is outside them. out: [T, cols].
  virtual absl::Status Embedding(const DeviceLinear& table, const Tensor& token_ids, int64_t vocab0,
                                 float scale, Tensor out) = 0;
  /// out <- x / rms(x) * weight, per row of x [rows, n] (in place allowed).
  virtual absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) = 0;
  /// residual += x, then out <- RmsNorm(residual) (the fused residual add).
  virtual absl::Status AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight,
                                  float eps, Tensor out) = 0;
  /// out [m, w.rows()] <- x [m, w.cols()] · wᵀ (+ bias). `site` says which layer input x
  /// is (for observers).
  virtual absl::Status Linear(const Tensor& x, const DeviceLinear& w, Tensor out,
                              LinearSite site = {}) = 0;
  /// The columns of x [rows, sum of parts' cols] split into `parts` (each [rows, c_i]),
  /// left to right (Q, K, V out of the fused QKV product).
  virtual absl::Status SplitColumns(const Tensor& x, absl::Span<const Tensor> parts) = 0;
  /// out [rows, sum of parts' cols] <- the parts' columns side by side, left to right
  /// (SplitColumns' inverse: multi-head latent attention's normalized latent beside its key
  /// part).
  virtual absl::Status ConcatColumns(absl::Span<const Tensor> parts, Tensor out) = 0;
  /// Rotates q [T, heads, head_dim] and k [T, kv_heads, head_dim] in place at
  /// `positions` [T].
  virtual absl::Status Rope(Tensor q, Tensor k, const Tensor& positions,
                            const RopeSpec& spec) = 0;
  /// Writes k and v [T, kv_heads, head_dim] into layer `layer` of `cache` at `slots`.
  virtual absl::Status WriteKv(KvCache& cache, int64_t layer, const Tensor& k, const Tensor& v,
                               const Tensor& slots) = 0;
  /// The fused QKV product qkv [T, (heads + 2 kv_heads) * head_dim] into attention's inputs:
  /// its columns split into q [T, heads, head_dim], k and v [T, kv_heads, head_dim]
  /// (SplitColumns), each head of q and k RMS-normalized with spec's QK-norm (RmsNorm per
  /// head), q and k rotated at `positions` [T] with spec's rope (Rope), k and v written into
  /// layer `layer` of `cache` at `slots` [T] (WriteKv), as those ops in turn do. A device may do
  /// it in one pass (the CUDA device), leaving k and v unwritten: only q and the cache are its
  /// results.
  virtual absl::Status QkvToCache(const Tensor& qkv, Tensor q, Tensor k, Tensor v,
                                  const Tensor& positions, const QkvSpec& spec, KvCache& cache,
                                  int64_t layer, const Tensor& slots);
  /// Causal paged attention of q [T, heads, head_dim] over layer `layer` of `cache` for
  /// the step's sequences (decode and prefill alike); out [T, heads * head_dim].
  virtual absl::Status PagedAttention(const KvCache& cache, int64_t layer, const Tensor& q,
                                      const StepTensors& step, const AttentionSpec& spec,
                                      Tensor out) = 0;
  /// out [T, ffn] <- SiLU(gate) * up of gate_up [T, 2 * ffn] (gate columns first).
  virtual absl::Status SiluMul(const Tensor& gate_up, Tensor out) = 0;
  /// out [T, ffn] <- GELU(gate) * up of gate_up [T, 2 * ffn] (gate columns first), GELU
  /// with the tanh approximation (Gemma's GeGLU). Unimplemented on a device without it.
  virtual absl::Status GeluMul(const Tensor& gate_up, Tensor out) {
    (void)gate_up, (void)out;
    return absl::UnimplementedError(absl::StrCat(Describe(), " has no GELU kernel"));
  }
  /// x <- cap * tanh(x / cap) elementwise, in place (Gemma 2's final logit soft-capping).
  /// Unimplemented on a device without it.
  virtual absl::Status SoftCap(Tensor x, float cap) {
    (void)x, (void)cap;
    return absl::UnimplementedError(absl::StrCat(Describe(), " has no soft-capping kernel"));
  }
  /// x <- factor * x elementwise, in place (Granite's residual and logit multipliers).
  /// Unimplemented on a device without it.
  virtual absl::Status Scale(Tensor x, float factor) {
    (void)x, (void)factor;
    return absl::UnimplementedError(absl::StrCat(Describe(), " has no scaling kernel"));
  }
  /// out[t] += sigmoid(gate_logits[t]) * x[t] for every row t of x [T, n] (gate_logits F32
  /// [T, 1]), or out += x where gate_logits is empty: a shared expert joining the routed
  /// experts' sum (Qwen2-MoE). Unimplemented on a device without it.
  virtual absl::Status AddSigmoidGated(const Tensor& x, const Tensor& gate_logits, Tensor out) {
    (void)x, (void)gate_logits, (void)out;
    return absl::UnimplementedError(absl::StrCat(Describe(), " has no gated-add kernel"));
  }
  /// out[i] <- x[rows[i]] + y[rows[i]] for rows [R] (y may be empty: x's rows alone).
  virtual absl::Status GatherRows(const Tensor& x, const Tensor& y, const Tensor& rows,
                                  Tensor out) = 0;
  /// A mixture-of-experts FFN: token t's router probabilities are softmax(router_logits[t])
  /// over E experts ([T, E]) (or their sigmoids, spec.sigmoid); its spec.top_k most probable
  /// experts (with spec.selection_bias added for the choice; ties to the lower index) are
  /// weighed by their probabilities (renormalized with spec.normalize, times spec.scale), and
  /// out [T, hidden] <- the weighted sum, in expert order, of down_e(act(gate_up_e · x[t]))
  /// over them, act SiLU(gate) * up or spec.swiglu_limit's clamped SwiGLU, each Linear with
  /// its bias where it has one. x [T, hidden]; gate_up / down: E experts as Linear and
  /// SiluMul take them (a rank's slice: the partial sums add up across ranks like a dense
  /// down projection's). A token's result does not depend on the rest of its batch.
  /// Unimplemented on a device without it.
  virtual absl::Status MoeFeedForward(const Tensor& x, const Tensor& router_logits,
                                      absl::Span<const DeviceLinear* const> gate_up,
                                      absl::Span<const DeviceLinear* const> down,
                                      const MoeSpec& spec, Tensor out) {
    (void)x, (void)router_logits, (void)gate_up, (void)down, (void)spec, (void)out;
    return absl::UnimplementedError(absl::StrCat(Describe(), " has no mixture-of-experts kernels"));
  }

  // ---- tensor parallelism (every rank makes the same calls in the same order) ----
  /// Ranks in the device's group (1: no collectives are needed).
  virtual int world_size() const = 0;
  /// Whether the graph runs its collectives: with more than one rank, and on a device
  /// whose collectives go through a communicator even in a world of one (NCCL on CUDA,
  /// so a single GPU exercises the multi-GPU path).
  virtual bool runs_collectives() const { return world_size() > 1; }
  /// x <- the sum of every rank's x.
  virtual absl::Status AllReduceSum(Tensor x) = 0;
  /// Vocabulary-parallel logits: local [R, n_r] is this rank's slice of the vocabulary
  /// (with stride = ceil(vocab / world_size), rank r holds [r * stride, min(vocab,
  /// (r + 1) * stride)), so n_r may be short or 0 at the end); out [R, vocab] <- every
  /// rank's slice, in vocabulary order.
  virtual absl::Status AllGatherColumns(const Tensor& local, Tensor out) = 0;
};

}  // namespace loom::model
