#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"
#include "model/communicator.h"
#include "model/device.h"

namespace loom::model {

struct CudaDeviceOptions {
  /// The element type of weights on the device and of the GEMMs' inputs (F16 or BF16);
  /// activations between operations stay F32, as on the CPU.
  kernels::cuda::DataType dtype = kernels::cuda::DataType::kF16;
  /// The KV pool's element type (F16 or BF16); with kv_quant the type its codes
  /// dequantize to in the attention kernels.
  kernels::cuda::DataType kv_dtype = kernels::cuda::DataType::kF16;
  /// 8-bit KV (--kv-cache-dtype int8|fp8_e4m3): codes and a BF16 scale per token and KV
  /// head, rows rotated (kernels/cuda/kv_cache.h); the attention rotates query and output.
  kernels::cuda::KvQuant kv_quant = kernels::cuda::KvQuant::kNone;
  /// INT4 weights the W4A16 GEMM takes stay 4-bit (a quarter of the bytes a decode step
  /// reads; K-quant F32 scales rounded to F16), and INT8 ones stay 8-bit for the W8A16 GEMM
  /// (half the bytes): F16 scales per channel or in groups of 32/64/128 (GGUF Q8_0,
  /// IQ4_NL, and Q5_0 as q - 16), F32 scales and mins in groups of 16 or 32 (Q6_K, Q5_K,
  /// Q5_1, and Q4_K_M's fused projections); other groups (F32-scaled INT8 in groups of 64
  /// or 128) and shapes are dequantized to `dtype`. An embedding table kept quantized cannot be
  /// gathered: the graph's tables are uploaded dense (see UploadTable).
  bool keep_quantized = false;
  /// --quantization fp8: every linear layer whose sizes are multiples of 16 is quantized at
  /// load to FP8 E4M3 with one scale per output channel (amax / 448) and runs as W8A8 on
  /// the FP8 tensor cores (cuBLASLt), its input quantized per token on the fly (dynamic
  /// amax of each row). Needs compute capability 8.9 or newer (Ada, Hopper): Create refuses it
  /// below. Applies before keep_quantized (a 4-bit layer is dequantized, then quantized to FP8).
  bool fp8_weights = false;
  /// The layers an FP8 checkpoint stores as FP8 (those with row scales, PackedWeight::
  /// fp8_row_scales) run the FP8 GEMM with the checkpoint's own codes and scales, recovered
  /// exactly from their F16 values; the others as without. Needs what fp8_weights needs
  /// (Create refuses it likewise); the caller sets it only where Fp8GemmSupported().
  bool fp8_checkpoint = false;
  /// Tensor parallelism: the group's collectives; null for a single rank. Not owned.
  /// A communicator with device collectives (NCCL) runs them on the device's stream, in
  /// stream order and capture-safe, even in a world of one, and Synchronize (and with it
  /// every download) then waits through its WaitOnDevice, under its timeout; any other
  /// (gloo) is staged through host memory (Synchronize, copy, the host call, copy back).
  Communicator* communicator = nullptr;
};

/// A CUDA graph captured from a CudaDevice's stream (CudaDevice::Capture) and replayed
/// by CudaDevice::Replay. It reads and writes the device addresses it was captured with,
/// so it is valid only while the device's memory_generation() equals generation().
class CudaGraph {
 public:
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// The device's memory_generation() when the graph was captured.
  int64_t generation() const { return generation_; }

 private:
  friend class CudaDevice;
  CudaGraph() = default;
  void* exec_ = nullptr;  // cudaGraphExec_t, owned
  int64_t generation_ = 0;
};

/// The CUDA implementation of model::Device on the current CUDA device: one stream of its
/// own on which every operation is enqueued (kernels/cuda launch functions, cuBLAS through
/// a GemmHandle bound to the stream), device memory from cudaMalloc, weights dense in F16/
/// BF16 for cuBLAS, INT4/INT8 for the W4A16/W8A16 GEMM or FP8 for the FP8 GEMM. Activations are F32
/// between operations, as on the CPU; a GEMM's input is rounded to the weight dtype first (a gather
/// kernel that converts), and prefill attention reads Q rounded to the KV dtype (its tensor cores'
/// input). Calls return once enqueued; DownloadF32 and Synchronize wait. Not thread-safe.
/// Without CUDA (or a device) Create answers FailedPrecondition.
class CudaDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const CudaDeviceOptions& options);
  ~CudaDevice() override;

  /// The stream every call enqueues on (for CUDA graph capture and on-device sampling).
  cudaStream_t stream() const { return stream_; }
  kernels::cuda::DataType dtype() const { return options_.dtype; }
  /// Linear layers UploadLinear kept quantized (INT4 or INT8) for the W4A16/W8A16 GEMM so far.
  int64_t quantized_linears() const { return quantized_linears_; }
  /// Linear layers uploaded as FP8 (fp8_weights, fp8_checkpoint).
  int64_t fp8_linears() const { return fp8_linears_; }
  /// Whether UploadLmHead kept the LM head quantized.
  bool lm_head_quantized() const { return lm_head_quantized_; }
  /// Bytes of weights (UploadF32, UploadLinear, UploadTable, RandomLinear) on the device.
  int64_t weight_bytes() const { return weight_bytes_; }

  /// The largest step the device's own buffers (GEMM input and output in dtype, split-K
  /// and attention workspaces, step arrays) are sized for by Reserve.
  struct Capacity {
    int64_t tokens = 0;           // rows of every activation (T)
    int64_t sample_rows = 0;      // rows GatherRows gathers (R)
    int64_t width = 0;            // columns of the widest activation GatherRows reads
    int64_t step_elements = 0;    // int32 elements of one UploadStep (every array)
    int64_t decode_seqs = 0;      // sequences of the largest decode attention call
    int64_t max_context_len = 0;  // its context bound (PagedAttention's max_context_len)
    int64_t num_heads = 0;        // its local query heads, KV heads and head dim
    int64_t num_kv_heads = 0;
    int64_t head_dim = 0;
    // Columns AllGatherColumns assembles from the ranks' slices (the vocabulary) for
    // sample_rows rows, when collectives run on the stream (NCCL): its staging buffers.
    int64_t gather_columns = 0;
  };
  /// Capacity::step_elements for steps of at most `max_tokens` tokens (and as many
  /// sequences and sample rows) and `block_entries` block indices: UploadStep's layout.
  static int64_t StepElements(int64_t max_tokens, int64_t block_entries);
  /// Grows the device's internal buffers for steps up to `capacity` (after every weight
  /// is uploaded: the GEMM buffers are sized for the widest one), so such steps allocate
  /// nothing. A larger step still grows them (and changes memory_generation()).
  absl::Status Reserve(const Capacity& capacity);

  /// Changes whenever device memory the enqueued work may address is allocated
  /// (Allocate, or one of the device's own buffers growing); a CudaGraph captured before
  /// may then name freed memory and must not be replayed.
  int64_t memory_generation() const { return memory_generation_; }
  /// Captures the work `enqueue` enqueues (Device calls; nothing runs) into a graph. While
  /// capturing, a call that would grow a buffer fails (Internal) instead of allocating:
  /// run the same shapes eagerly once first. The stream leaves capture mode on every path.
  absl::StatusOr<std::unique_ptr<CudaGraph>> Capture(absl::FunctionRef<absl::Status()> enqueue);
  /// Enqueues `graph` on the stream; FailedPrecondition when memory moved since its
  /// capture.
  absl::Status Replay(const CudaGraph& graph);

  DeviceType type() const override { return DeviceType::kCuda; }
  std::string Describe() const override;

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<Buffer>> UploadF32(const std::vector<float>& host) override;
  absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadLinear(
      const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias) override;
  /// Dense in dtype always (the embedding gather reads dense rows); `bias` in F32, added by
  /// Linear.
  absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadTable(
      const kernels::cpu::PackedWeight& table, const std::vector<float>* bias = nullptr) override;
  /// Kept quantized (keep_quantized, never FP8) where the quantized GEMM holds exactly the
  /// values a dense copy would: INT8 per channel or with F32 scales, and with F16
  /// activations INT8 with F16 group scales, INT5 and INT4 with F16 scales (BF16 would round
  /// those scales first); dense otherwise. A Q6_K head (Q4_K_M's) is 1.25 bytes a weight.
  absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadLmHead(
      const kernels::cpu::PackedWeight& head) override;
  /// Dense in dtype, filled on the stream by kernels/cuda/random_fill.
  absl::StatusOr<std::unique_ptr<DeviceLinear>> RandomLinear(
      int64_t rows, int64_t cols, uint64_t seed, float scale,
      const std::vector<float>* bias = nullptr) override;
  /// The pool starts zeroed (a block read before it is written holds finite values).
  absl::StatusOr<std::unique_ptr<KvCache>> CreateKvCache(const common::ModelConfig& config,
                                                         int64_t num_blocks,
                                                         int64_t block_size) override;
  /// Copies the batch through a pinned host buffer into one device buffer of the
  /// device's (reused: a later UploadStep overwrites the tensors an earlier one returned,
  /// in stream order). The block indices come last, so every other array's address
  /// depends only on the step's token, sequence and sample-row counts (what a captured
  /// graph reads). Waits for the previous step's copy first.
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
  /// One launch (kernels/cuda/rope_write_kv.h) for an F16/BF16 cache, k and v left unwritten;
  /// an 8-bit cache takes the separate ops.
  absl::Status QkvToCache(const Tensor& qkv, Tensor q, Tensor k, Tensor v, const Tensor& positions,
                          const QkvSpec& spec, KvCache& cache, int64_t layer,
                          const Tensor& slots) override;
  /// Decode kernel when every sequence has one query token, the prefill kernel otherwise
  /// (launches of at most 65535 sequences each); head_dim 64 or 128.
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
  /// Routed on the host (the router's logits come back: a stream wait, so a step with a
  /// mixture-of-experts layer cannot be captured), then one GEMM pair per chosen expert
  /// over its tokens' rows (model/cuda_device_moe.cc).
  absl::Status MoeFeedForward(const Tensor& x, const Tensor& router_logits,
                              absl::Span<const DeviceLinear* const> gate_up,
                              absl::Span<const DeviceLinear* const> down, const MoeSpec& spec,
                              Tensor out) override;

  int world_size() const override {
    return options_.communicator == nullptr ? 1 : options_.communicator->world_size();
  }
  /// Every collective of a communicator with device collectives (NCCL) runs, even at
  /// world size 1; with host-staged ones (gloo) only when there are several ranks.
  bool runs_collectives() const override { return world_size() > 1 || collectives_on_stream(); }
  /// The collectives are enqueued on the stream (NCCL), so a CUDA graph can capture them.
  bool collectives_on_stream() const {
    return options_.communicator != nullptr && options_.communicator->has_device_collectives();
  }
  absl::Status AllReduceSum(Tensor x) override;
  absl::Status AllGatherColumns(const Tensor& local, Tensor out) override;

 private:
  CudaDevice() = default;
  // Grows `buffer` to at least `bytes` (never shrinks); Internal while capturing.
  absl::Status Ensure(kernels::cuda::DeviceBuffer& buffer, size_t bytes);
  // A fresh dense [rows, cols] weight of dtype (uninitialised).
  absl::StatusOr<std::unique_ptr<DeviceLinear>> DenseLinear(int64_t rows, int64_t cols);
  // `weight` dequantized to dense dtype rows (in chunks, bounded host scratch), and `bias`.
  absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadDense(
      const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias);
  // `weight` (one QuantGemmTakes takes) repacked for the W4A16 / W8A16 GEMM, and `bias`
  // in F32.
  absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadQuantized(
      const kernels::cpu::PackedWeight& weight, const std::vector<float>* bias);
  // `weight` as FP8 E4M3 rows with a per-row scale (fp8_weights), and `bias` in F32.
  absl::StatusOr<std::unique_ptr<DeviceLinear>> UploadFp8(const kernels::cpu::PackedWeight& weight,
                                                          const std::vector<float>* bias);
  // out = x W^T (+ bias) through the FP8 GEMM: x quantized per row (token) first.
  absl::Status Fp8Linear(const Tensor& x, const DeviceLinear& w, Tensor out);
  // Linear's input already in dtype in gemm_input_: an op whose output a GEMM reads next
  // (RmsNorm, AddRmsNorm, SiluMul, GeluMul) also writes it there rounded to dtype (its
  // kernel's second output, no conversion launch) and names it here; Linear skips its own
  // conversion for exactly that tensor, and every other op forgets it first, so the copy is
  // only ever used by the op right after its producer (also inside captured graphs).
  struct ConvertedInput {
    const void* data = nullptr;
    int64_t rows = 0, cols = 0;
  };
  void ForgetConverted() { converted_ = {}; }
  // Where a producer of `rows` x `cols` writes its dtype copy (gemm_input_), or nullptr when
  // gemm_input_ is smaller (then Linear converts as before).
  void* ConvertedTarget(int64_t rows, int64_t cols) const;
  // SiluMul, GeluMul and the experts' clamped SwiGLU (`limit`, kSwigluOai only): the gated
  // activation, with its dtype copy for the down projection.
  absl::Status Gated(const Tensor& gate_up, Tensor out, kernels::cuda::GateActivation activation,
                     float limit = 0.0f);
  // SoftCap and Scale: an element-wise map of F32 `x` in place.
  absl::Status InPlace(Tensor x, kernels::cuda::InPlaceOp op, float value);
  // `bytes` at `host` into a fresh device buffer, copied on the stream (waits).
  absl::StatusOr<kernels::cuda::DeviceBuffer> UploadBytes(const void* host, size_t bytes);
  // iota_ holds 0, 1, ..., n - 1 (at least n of them).
  absl::Status EnsureIota(int64_t n);
  // The W4A16 split-K counters (QuantGemmParams::counters): at least `words`, zeroed on the
  // stream when (re)allocated; the kernels leave them zero.
  absl::Status EnsureGemmCounters(size_t words);
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
  kernels::cuda::DeviceBuffer workspace_;   // split-K / split-context partial sums
  ConvertedInput converted_;                // see ForgetConverted
  kernels::cuda::DeviceBuffer gemm_counters_;  // W4A16 split-K tile counters, zero between GEMMs
  kernels::cuda::DeviceBuffer fp8_input_;      // an FP8 GEMM's input in E4M3 ...
  kernels::cuda::DeviceBuffer fp8_x_scale_;    // ... and its scales (one float per row)
  kernels::cuda::DeviceBuffer gathered_;    // GatherRows' second operand
  kernels::cuda::DeviceBuffer step_;        // UploadStep's arrays
  int32_t* step_host_ = nullptr;            // pinned mirror of step_ (cudaMallocHost), owned
  size_t step_host_elements_ = 0;
  int64_t memory_generation_ = 0;
  bool capturing_ = false;  // inside Capture: Ensure must not allocate
  int64_t quantized_linears_ = 0;
  int64_t fp8_linears_ = 0;
  bool lm_head_quantized_ = false;
  int64_t weight_bytes_ = 0;
  int64_t widest_input_ = 0;                 // the most columns of any uploaded linear
  size_t quant_workspace_bytes_ = 0;         // the most split-K workspace any 4-bit linear needs
  size_t quant_counter_words_ = 0;           // ... and the most split-K tile counters
  int64_t widest_fp8_output_ = 0;            // the most rows of any FP8 linear
  std::vector<float> host_, host_gathered_;  // collective staging
  kernels::cuda::DeviceBuffer gather_local_;  // AllGatherColumns on the device: the padded
  kernels::cuda::DeviceBuffer gather_all_;    // local slice, and every rank's, rank-major
  // MoeFeedForward: the routing (rows and weights, expert after expert) and one expert's
  // gathered input, gate/up, activation and output rows; the router logits on the host.
  kernels::cuda::DeviceBuffer moe_rows_, moe_weights_;
  kernels::cuda::DeviceBuffer moe_x_, moe_gate_up_, moe_act_, moe_out_;
  std::vector<float> moe_logits_;
};

}  // namespace loom::model
