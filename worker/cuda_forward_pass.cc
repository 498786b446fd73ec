#include "worker/cuda_forward_pass.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda_device.h"
#include "model/kv_layout.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cpu/weights.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/quantized_gemm.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "model/model_weights.h"
#include "worker/cuda_device_linear.h"
#endif

namespace loom::worker {

namespace kc = kernels::cuda;

int64_t CudaForwardPass::KvBytesPerBlock(const common::ModelConfig& config, int64_t block_size,
                                         kc::DataType kv_dtype) {
  return model::KvBytesPerBlock(config, block_size, kc::ElementBytes(kv_dtype));
}

CudaForwardPass::CudaForwardPass(std::unique_ptr<State> state) : state_(std::move(state)) {}

// The runner calls this for decode steps only, where it maps the step to itself (up to
// trailing blocks) before graph padding; steps with multi-token sequences go to the
// prefill kernel over the batch's own CSR arrays. For multi-token batches it remains the
// reference path (one decode-kernel sequence per query token) that tests compare against.
StepBatch ExpandToSingleTokenSequences(const StepBatch& batch, int64_t block_size) {
  StepBatch expanded;
  expanded.token_ids = batch.token_ids;
  expanded.positions = batch.positions;
  expanded.slots = batch.slots;
  expanded.sample_rows = batch.sample_rows;
  const int64_t num_tokens = batch.num_tokens();
  expanded.query_start.resize(num_tokens + 1);
  expanded.context_len.resize(num_tokens);
  expanded.block_indptr.resize(num_tokens + 1);
  expanded.query_start[0] = 0;
  expanded.block_indptr[0] = 0;
  for (int64_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t* table = batch.block_indices.data() + batch.block_indptr[s];
    for (int64_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) {
      const int32_t context = batch.positions[t] + 1;
      const int64_t blocks = (context + block_size - 1) / block_size;
      expanded.query_start[t + 1] = static_cast<int32_t>(t + 1);
      expanded.context_len[t] = context;
      expanded.block_indices.insert(expanded.block_indices.end(), table, table + blocks);
      expanded.block_indptr[t + 1] = static_cast<int32_t>(expanded.block_indices.size());
    }
  }
  return expanded;
}

void PadDecodeBatch(StepBatch& batch, int64_t num_seqs, int64_t num_samples,
                    int32_t scratch_block, int64_t block_size) {
  while (batch.num_seqs() < num_seqs) {
    batch.token_ids.push_back(0);
    batch.positions.push_back(0);
    batch.slots.push_back(static_cast<int32_t>(scratch_block * block_size));
    batch.query_start.push_back(static_cast<int32_t>(batch.token_ids.size()));
    batch.context_len.push_back(1);
    batch.block_indices.push_back(scratch_block);
    batch.block_indptr.push_back(static_cast<int32_t>(batch.block_indices.size()));
  }
  while (static_cast<int64_t>(batch.sample_rows.size()) < num_samples)
    batch.sample_rows.push_back(0);
}

#if !LOOM_HAVE_CUDA

struct CudaForwardPass::State {};

CudaForwardPass::~CudaForwardPass() = default;

absl::StatusOr<std::unique_ptr<CudaForwardPass>> CudaForwardPass::Create(
    const common::GgufFile&, const CudaForwardPassOptions&) {
  return absl::FailedPreconditionError(
      "the CUDA runner is unavailable: Loom was built without CUDA (configure with "
      "-DLOOM_CUDA=ON where the CUDA toolkit is installed)");
}

absl::StatusOr<std::unique_ptr<CudaForwardPass>> CudaForwardPass::CreateRandom(
    const common::ModelConfig&, const CudaForwardPassOptions&, uint64_t) {
  return absl::FailedPreconditionError(
      "the CUDA runner is unavailable: Loom was built without CUDA (configure with "
      "-DLOOM_CUDA=ON where the CUDA toolkit is installed)");
}

absl::Status CudaForwardPass::Step(const StepBatch&, std::vector<float>&) {
  return absl::FailedPreconditionError("the CUDA runner is unavailable: built without CUDA");
}

absl::Status CudaForwardPass::StepAndSample(const StepBatch&, const DeviceSampleRows&,
                                             std::vector<int32_t>&, std::vector<float>&) {
  return absl::FailedPreconditionError("the CUDA runner is unavailable: built without CUDA");
}

CudaForwardPass::Stats CudaForwardPass::stats() const { return {}; }

#else  // LOOM_HAVE_CUDA

namespace {

using kc::DataType;
using kc::DeviceBuffer;

// Decode steps up to 256 sequences are padded to the next bucket and replayed from a graph.
constexpr int64_t kGraphBatchBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
constexpr int64_t kMaxGraphBatch = 256;
// Graphs are also keyed by the context bucket (a power of two, at least this): the split
// count of the decode kernel is baked into a graph and depends on the context length.
constexpr int64_t kMinContextBucket = 256;
// The attention kernels' grids hold at most this many sequences per launch.
constexpr int64_t kMaxAttentionSeqsPerLaunch = 65535;

int64_t GraphBatchBucket(int64_t num_seqs) {
  for (int64_t bucket : kGraphBatchBuckets) {
    if (num_seqs <= bucket) return bucket;
  }
  return 0;
}

// A power of two >= max_context_len, at least kMinContextBucket; capped at 2^30 (the
// kernel attends a longer sequence in full anyway: its last split runs longer).
int64_t ContextBucket(int64_t max_context_len) {
  const uint64_t bucket =
      std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(max_context_len, 1)));
  return std::clamp<int64_t>(static_cast<int64_t>(std::min<uint64_t>(bucket, uint64_t{1} << 30)),
                             kMinContextBucket, int64_t{1} << 30);
}

// Grows `buffer` to at least `bytes` (a fresh allocation; the contents are not kept).
// Returns whether it was reallocated.
absl::StatusOr<bool> Reserve(DeviceBuffer& buffer, size_t bytes) {
  if (buffer.data() != nullptr && buffer.bytes() >= bytes) return false;
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer grown, DeviceBuffer::Allocate(std::max<size_t>(bytes, 256)));
  buffer = std::move(grown);
  return true;
}

// The shapes of one step as the device sees them (padded for a graph), and where each
// int32 input array sits in the one uploaded buffer. A decode step has one query token
// per sequence (ExpandToSingleTokenSequences, then graph padding), so N == T and the
// decode kernel runs; a step with any multi-token sequence (`prefill`) keeps the batch's
// own sequences and runs the prefill kernel over them.
struct StepShape {
  int64_t num_tokens = 0;         // T: rows of every activation
  int64_t num_seqs = 0;           // N: attention sequences
  int64_t num_samples = 0;        // S: rows through the final norm and LM head
  int64_t num_block_entries = 0;  // E: the attention sequences' block tables
  int64_t max_context_len = 1;    // bound given to the decode kernel (sizes its splits)
  int64_t max_query_len = 1;      // bound given to the prefill kernel (sizes its grid)
  bool prefill = false;           // attention through the prefill kernel, not decode

  // Offsets in int32 elements: token ids [T], positions [T], slots [T], query_start
  // [N + 1], context lengths [N], block_indptr [N + 1], sample rows [S], block indices [E].
  int64_t token_ids() const { return 0; }
  int64_t positions() const { return num_tokens; }
  int64_t slots() const { return 2 * num_tokens; }
  int64_t query_start() const { return 3 * num_tokens; }
  int64_t context_len() const { return 3 * num_tokens + num_seqs + 1; }
  int64_t block_indptr() const { return 3 * num_tokens + 2 * num_seqs + 1; }
  int64_t sample_rows() const { return 3 * num_tokens + 3 * num_seqs + 2; }
  int64_t block_indices() const { return sample_rows() + num_samples; }
  int64_t input_elements() const { return block_indices() + num_block_entries; }
};

}  // namespace

struct CudaForwardPass::State {
  struct Layer {
    DeviceBuffer attn_norm;    // [hidden] F32
    DeviceLinear qkv;          // [qkv_dim, hidden]
    DeviceBuffer qkv_bias;     // [qkv_dim] F32 (cuBLAS path), or empty
    DeviceLinear attn_output;  // [hidden, q_dim]
    DeviceBuffer ffn_norm;     // [hidden] F32
    DeviceLinear gate_up;      // [2 * ffn, hidden]
    DeviceLinear down;         // [hidden, ffn]
  };

  int device = 0;
  DataType dtype = DataType::kF16;
  DataType kv_dtype = DataType::kF16;
  bool use_graphs = true;
  bool neox = false;
  common::ModelConfig config;
  int64_t q_dim = 0, kv_dim = 0, qkv_dim = 0;
  int64_t num_blocks = 0;     // blocks the coordinator may name
  int64_t scratch_block = 0;  // == num_blocks: one more block, target of graph padding
  int64_t block_size = 0;
  int num_sms = 1;

  cudaStream_t stream = nullptr;  // owned; every launch and copy of the runner goes here
  std::unique_ptr<kc::GemmHandle> gemm;
  DeviceBuffer quant_workspace;   // split-K partial sums of the quantized GEMM

  std::vector<Layer> layers;
  DeviceBuffer embedding;      // [vocab, hidden] of dtype
  DeviceBuffer lm_head;        // [vocab, hidden] of dtype; empty when tied to the embedding
  DeviceBuffer output_norm;    // [hidden] F32
  DeviceBuffer rope_inv_freq;  // [rope_dim / 2] F32
  // [layer][K, V][num_blocks + 1, block_size, kv_heads, head_dim] of kv_dtype.
  DeviceBuffer kv_pool;
  int64_t kv_layer_bytes = 0;  // one layer's K (or V) pool

  // Activations, for token_capacity tokens (T) and sample_capacity sample rows (S).
  int64_t token_capacity = 0;
  int64_t sample_capacity = 0;
  DeviceBuffer residual;        // [T, hidden]
  DeviceBuffer normed;          // [T, hidden]
  DeviceBuffer qkv;             // [T, qkv_dim]: Q, K, V of each token side by side
  DeviceBuffer attn;            // [T, q_dim]
  DeviceBuffer proj;            // [T, hidden]: O or down projection
  DeviceBuffer gate_up;         // [T, 2 * ffn]
  DeviceBuffer act;             // [T, ffn]
  DeviceBuffer final_residual;  // [S, hidden]
  DeviceBuffer final_proj;      // [S, hidden]
  DeviceBuffer final_normed;    // [S, hidden]
  DeviceBuffer logits;          // [S, vocab] F32
  DeviceBuffer inputs;          // int32 step inputs (StepShape's layout)
  int64_t input_capacity = 0;   // int32 elements of `inputs` and `staging`
  int32_t* staging = nullptr;   // pinned host mirror of `inputs`, owned (cudaMallocHost)
  DeviceBuffer attn_workspace;  // decode kernel splits
  // Device sampling (StepAndSample): per-row parameters, the penalty CSR, the penalized
  // logits' workspace and the picked tokens / logprobs, grown as steps need.
  DeviceBuffer sample_params;
  DeviceBuffer penalty_indptr, penalty_tokens, penalty_counts;
  DeviceBuffer sample_workspace;
  DeviceBuffer sampled_tokens, sampled_logprobs;

  // Decode graphs by (batch bucket, context bucket). A key is captured the second time
  // it is seen (the first runs eagerly, which loads lazily loaded kernels outside capture).
  // Reallocating any buffer they use drops them all.
  std::map<std::pair<int64_t, int64_t>, cudaGraphExec_t> graphs;
  std::set<std::pair<int64_t, int64_t>> warmed;
  Stats stats;
  absl::Status broken;  // the first device error; every later step fails with it

  ~State() {
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    DropGraphs();
    gemm.reset();
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (staging != nullptr) cudaFreeHost(staging);
    cudaGetLastError();  // nothing to report from a destructor
  }

  void DropGraphs() {
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    graphs.clear();
  }

  // Everything but the weights and buffers: device, dtypes, stream, cuBLAS, model shape.
  absl::Status Init(const CudaForwardPassOptions& options, const common::ModelConfig& model) {
    device = options.device;
    LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
    dtype = options.dtype;
    kv_dtype = options.kv_dtype;
    use_graphs = options.cuda_graphs;
    block_size = options.block_size;
    LOOM_ASSIGN_OR_RETURN(num_sms, kc::CurrentDeviceSmCount());
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LOOM_ASSIGN_OR_RETURN(gemm, kc::GemmHandle::Create(stream));
    config = model;
    neox = config.rope_neox;
    q_dim = config.num_heads * config.head_dim;
    kv_dim = config.num_kv_heads * config.head_dim;
    qkv_dim = q_dim + 2 * kv_dim;
    return absl::OkStatus();
  }

  kc::KvCacheView KvView(size_t layer) const {
    kc::KvCacheView view;
    uint8_t* base = static_cast<uint8_t*>(kv_pool.data()) + 2 * layer * kv_layer_bytes;
    view.k = base;
    view.v = base + kv_layer_bytes;
    view.dtype = kv_dtype;
    view.num_blocks = num_blocks + 1;  // the kernels may touch the scratch block
    view.block_size = block_size;
    view.num_kv_heads = config.num_kv_heads;
    view.head_dim = config.head_dim;
    return view;
  }

  int DecodeSplits(int64_t num_seqs, int64_t max_context_len) const {
    // Blocks per split as the kernel counts them: (sequence, KV head, chunk of up to 8
    // query heads). Only a heuristic input: any split count gives the same result.
    const int64_t group = config.num_heads / config.num_kv_heads;
    return kc::ChoosePagedDecodeSplits(num_seqs * config.num_kv_heads * ((group + 7) / 8),
                                       max_context_len, num_sms);
  }

  size_t DecodeWorkspaceBytes(int64_t num_tokens, int64_t max_context_len) const {
    size_t bytes = 0;
    for (int64_t first = 0; first < num_tokens; first += kMaxAttentionSeqsPerLaunch) {
      kc::PagedDecodeParams p;
      p.num_seqs = std::min(kMaxAttentionSeqsPerLaunch, num_tokens - first);
      p.num_heads = config.num_heads;
      p.cache.head_dim = config.head_dim;
      p.cache.num_kv_heads = config.num_kv_heads;
      p.max_context_len = max_context_len;
      p.num_splits = DecodeSplits(p.num_seqs, max_context_len);
      bytes = std::max(bytes, kc::PagedDecodeWorkspaceBytes(p));
    }
    return bytes;
  }

  // Makes every buffer large enough for `shape`; drops the graphs when any buffer they
  // use moved. Allocation failures leave the capacities consistent (ResourceExhausted).
  absl::Status EnsureCapacity(const StepShape& shape) {
    const int64_t elem = kc::ElementBytes(dtype);
    const int64_t hidden = config.hidden_size;
    const int64_t ffn = config.intermediate_size;
    if (shape.num_tokens > token_capacity) {
      const int64_t t = std::max(shape.num_tokens, token_capacity + token_capacity / 2);
      DropGraphs();
      token_capacity = 0;  // until every buffer below has its new size
      for (auto [buffer, row_elements] :
           {std::pair{&residual, hidden}, {&normed, hidden}, {&qkv, qkv_dim}, {&attn, q_dim},
            {&proj, hidden}, {&gate_up, 2 * ffn}, {&act, ffn}}) {
        *buffer = DeviceBuffer();  // free first: the old and new sizes may not fit together
        LOOM_ASSIGN_OR_RETURN(*buffer, DeviceBuffer::Allocate(t * row_elements * elem));
      }
      token_capacity = t;
    }
    if (shape.num_samples > sample_capacity) {
      const int64_t s = std::max(shape.num_samples, sample_capacity + sample_capacity / 2);
      DropGraphs();
      sample_capacity = 0;
      for (DeviceBuffer* buffer : {&final_residual, &final_proj, &final_normed}) {
        *buffer = DeviceBuffer();
        LOOM_ASSIGN_OR_RETURN(*buffer, DeviceBuffer::Allocate(s * hidden * elem));
      }
      logits = DeviceBuffer();
      LOOM_ASSIGN_OR_RETURN(logits,
                            DeviceBuffer::Allocate(s * config.vocab_size * sizeof(float)));
      sample_capacity = s;
    }
    if (shape.input_elements() > input_capacity) {
      const int64_t n = std::max(shape.input_elements(), input_capacity + input_capacity / 2);
      DropGraphs();
      input_capacity = 0;
      inputs = DeviceBuffer();
      LOOM_ASSIGN_OR_RETURN(inputs, DeviceBuffer::Allocate(n * sizeof(int32_t)));
      if (staging != nullptr) {
        LOOM_CUDA_RETURN_IF_ERROR(cudaFreeHost(staging));
        staging = nullptr;
      }
      void* host = nullptr;
      const cudaError_t allocated = cudaMallocHost(&host, n * sizeof(int32_t));
      if (allocated == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return absl::ResourceExhaustedError(
            absl::StrFormat("cudaMallocHost of %d bytes: out of memory", n * sizeof(int32_t)));
      }
      LOOM_RETURN_IF_ERROR(CudaCallStatus(allocated, "cudaMallocHost"));
      staging = static_cast<int32_t*>(host);
      input_capacity = n;
    }
    if (shape.prefill) return absl::OkStatus();  // the prefill kernel needs no workspace
    const size_t workspace = DecodeWorkspaceBytes(shape.num_seqs, shape.max_context_len);
    LOOM_ASSIGN_OR_RETURN(const bool workspace_moved, Reserve(attn_workspace, workspace));
    if (workspace_moved) DropGraphs();
    return absl::OkStatus();
  }

  // Writes `step` (a decode step expanded and padded, or a prefill step as given) into
  // `staging` in `shape`'s layout.
  void PackInputs(const StepBatch& step, const StepShape& shape) {
    auto put = [&](int64_t offset, const std::vector<int32_t>& values) {
      std::memcpy(staging + offset, values.data(), values.size() * sizeof(int32_t));
    };
    put(shape.token_ids(), step.token_ids);
    put(shape.positions(), step.positions);
    put(shape.slots(), step.slots);
    put(shape.query_start(), step.query_start);
    put(shape.context_len(), step.context_len);
    put(shape.block_indptr(), step.block_indptr);
    put(shape.sample_rows(), step.sample_rows);
    put(shape.block_indices(), step.block_indices);
  }

  // Enqueues the attention of layer `l`: the causal prefill kernel over the batch's own
  // sequences when any has several query tokens, else the decode kernel over the
  // one-token sequences (the only path a graph captures).
  absl::Status EnqueueAttention(size_t l, const StepShape& shape, const int32_t* in) {
    const int64_t elem = kc::ElementBytes(dtype);
    if (shape.prefill) {
      for (int64_t first = 0; first < shape.num_seqs; first += kMaxAttentionSeqsPerLaunch) {
        kc::PagedPrefillParams p;
        // query_start and block_indptr values index the whole step's rows and block
        // indices, so a chunk of sequences offsets only the per-sequence arrays.
        p.q = qkv.data();
        p.out = attn.data();
        p.q_dtype = dtype;
        p.out_dtype = dtype;
        p.cache = KvView(l);
        p.query_start = in + shape.query_start() + first;
        p.context_len = in + shape.context_len() + first;
        p.block_indptr = in + shape.block_indptr() + first;
        p.block_indices = in + shape.block_indices();
        p.num_seqs = std::min(kMaxAttentionSeqsPerLaunch, shape.num_seqs - first);
        p.num_heads = config.num_heads;
        p.q_stride = qkv_dim;
        p.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
        p.max_query_len = shape.max_query_len;
        LOOM_RETURN_IF_ERROR(kc::LaunchPagedPrefill(p, stream));
      }
      return absl::OkStatus();
    }
    for (int64_t first = 0; first < shape.num_seqs; first += kMaxAttentionSeqsPerLaunch) {
      kc::PagedDecodeParams p;
      p.num_seqs = std::min(kMaxAttentionSeqsPerLaunch, shape.num_seqs - first);
      p.q = static_cast<const uint8_t*>(qkv.data()) + first * qkv_dim * elem;
      p.out = static_cast<uint8_t*>(attn.data()) + first * q_dim * elem;
      p.q_dtype = dtype;
      p.cache = KvView(l);
      p.context_len = in + shape.context_len() + first;
      // indptr values index the whole block_indices array, so a chunk offsets only indptr.
      p.block_indptr = in + shape.block_indptr() + first;
      p.block_indices = in + shape.block_indices();
      p.num_heads = config.num_heads;
      p.q_stride = qkv_dim;
      p.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
      p.max_context_len = shape.max_context_len;
      p.num_splits = DecodeSplits(p.num_seqs, shape.max_context_len);
      p.workspace = attn_workspace.data();
      p.workspace_bytes = attn_workspace.bytes();
      LOOM_RETURN_IF_ERROR(kc::LaunchPagedDecode(p, stream));
    }
    return absl::OkStatus();
  }

  // y = x · Wᵀ (+ bias) for a layer's weight: the quantized GEMM in slices of at most
  // kQuantGemmMaxM tokens, or cuBLAS over the dense weight.
  absl::Status Linear(const void* x, const DeviceLinear& w, const DeviceBuffer* bias, void* y,
                      int64_t m) {
    if (!w.quantized()) return Gemm(x, w.dense, bias, y, dtype, m, w.n, w.k);
    const int64_t elem = kc::ElementBytes(dtype);
    for (int64_t row = 0; row < m; row += kc::kQuantGemmMaxM) {
      kc::QuantGemmParams p = QuantParams(w, dtype, std::min(kc::kQuantGemmMaxM, m - row));
      p.x = static_cast<const uint8_t*>(x) + row * w.k * elem;
      p.y = static_cast<uint8_t*>(y) + row * w.n * elem;
      p.workspace = quant_workspace.data();
      p.workspace_bytes = quant_workspace.bytes();
      LOOM_RETURN_IF_ERROR(kc::LaunchQuantGemm(p, stream));
    }
    return absl::OkStatus();
  }

  absl::Status Gemm(const void* x, const DeviceBuffer& w, const DeviceBuffer* bias, void* y,
                    DataType y_dtype, int64_t m, int64_t n, int64_t k) {
    kc::GemmParams p;
    p.x = x;
    p.w = w.data();
    p.bias = bias != nullptr && bias->data() != nullptr ? static_cast<const float*>(bias->data())
                                                        : nullptr;
    p.y = y;
    p.dtype = dtype;
    p.y_dtype = y_dtype;
    p.m = m;
    p.n = n;
    p.k = k;
    return kc::LaunchGemm(p, *gemm);
  }

  // Enqueues the whole forward pass for `shape` reading the inputs already on the device.
  // No host synchronization and no allocation: this is what a graph captures.
  absl::Status EnqueueForward(const StepShape& shape) {
    const int32_t* in = static_cast<const int32_t*>(inputs.data());
    const int64_t T = shape.num_tokens;
    const int64_t S = shape.num_samples;
    const int64_t H = config.hidden_size;
    const int64_t ffn = config.intermediate_size;
    const int64_t elem = kc::ElementBytes(dtype);
    const float eps = static_cast<float>(config.rms_norm_eps);

    kc::GatherRowsParams embed;
    embed.table = embedding.data();
    embed.indices = in + shape.token_ids();
    embed.out = residual.data();
    embed.src_dtype = dtype;
    embed.dst_dtype = dtype;
    embed.num_rows = config.vocab_size;
    embed.row_size = H;
    embed.num_indices = T;
    LOOM_RETURN_IF_ERROR(kc::LaunchGatherRows(embed, stream));

    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& layer = layers[l];
      kc::RmsNormParams norm;
      // Layer 0 normalizes the embedding; later layers first add the previous MLP output.
      norm.x = l == 0 ? residual.data() : proj.data();
      norm.residual = l == 0 ? nullptr : residual.data();
      norm.weight = static_cast<const float*>(layer.attn_norm.data());
      norm.out = normed.data();
      norm.dtype = dtype;
      norm.eps = eps;
      norm.num_tokens = T;
      norm.hidden = H;
      LOOM_RETURN_IF_ERROR(kc::LaunchRmsNorm(norm, stream));
      LOOM_RETURN_IF_ERROR(
          Linear(normed.data(), layer.qkv, &layer.qkv_bias, qkv.data(), T));

      kc::RopeParams rope;
      rope.q = qkv.data();
      rope.k = static_cast<uint8_t*>(qkv.data()) + q_dim * elem;
      rope.positions = in + shape.positions();
      rope.inv_freq = static_cast<const float*>(rope_inv_freq.data());
      rope.dtype = dtype;
      rope.num_tokens = T;
      rope.num_heads = config.num_heads;
      rope.num_kv_heads = config.num_kv_heads;
      rope.head_dim = config.head_dim;
      rope.rope_dim = config.rope_dim;
      rope.q_stride = qkv_dim;
      rope.k_stride = qkv_dim;
      rope.neox = neox;
      rope.attention_factor = static_cast<float>(config.rope_attention_factor);
      LOOM_RETURN_IF_ERROR(kc::LaunchRope(rope, stream));

      kc::WriteKvParams write;
      write.cache = KvView(l);
      write.k = static_cast<const uint8_t*>(qkv.data()) + q_dim * elem;
      write.v = static_cast<const uint8_t*>(qkv.data()) + (q_dim + kv_dim) * elem;
      write.src_dtype = dtype;
      write.k_stride = qkv_dim;
      write.v_stride = qkv_dim;
      write.slots = in + shape.slots();
      write.num_tokens = T;
      LOOM_RETURN_IF_ERROR(kc::LaunchWriteKv(write, stream));
      LOOM_RETURN_IF_ERROR(EnqueueAttention(l, shape, in));
      LOOM_RETURN_IF_ERROR(
          Linear(attn.data(), layer.attn_output, nullptr, proj.data(), T));

      norm.x = proj.data();
      norm.residual = residual.data();
      norm.weight = static_cast<const float*>(layer.ffn_norm.data());
      LOOM_RETURN_IF_ERROR(kc::LaunchRmsNorm(norm, stream));
      LOOM_RETURN_IF_ERROR(
          Linear(normed.data(), layer.gate_up, nullptr, gate_up.data(), T));
      LOOM_RETURN_IF_ERROR(
          kc::LaunchSiluMul({gate_up.data(), act.data(), dtype, T, ffn}, stream));
      LOOM_RETURN_IF_ERROR(Linear(act.data(), layer.down, nullptr, proj.data(), T));
    }
    if (S == 0) return absl::OkStatus();

    // Final norm and LM head for the sample rows only: their residual and last MLP
    // output, summed by the fused norm.
    kc::GatherRowsParams gather;
    gather.indices = in + shape.sample_rows();
    gather.src_dtype = dtype;
    gather.dst_dtype = dtype;
    gather.num_rows = T;
    gather.row_size = H;
    gather.num_indices = S;
    gather.table = residual.data();
    gather.out = final_residual.data();
    LOOM_RETURN_IF_ERROR(kc::LaunchGatherRows(gather, stream));
    gather.table = proj.data();
    gather.out = final_proj.data();
    LOOM_RETURN_IF_ERROR(kc::LaunchGatherRows(gather, stream));
    kc::RmsNormParams norm;
    norm.x = final_proj.data();
    norm.residual = final_residual.data();
    norm.weight = static_cast<const float*>(output_norm.data());
    norm.out = final_normed.data();
    norm.dtype = dtype;
    norm.eps = eps;
    norm.num_tokens = S;
    norm.hidden = H;
    LOOM_RETURN_IF_ERROR(kc::LaunchRmsNorm(norm, stream));
    return Gemm(final_normed.data(), lm_head.data() != nullptr ? lm_head : embedding, nullptr,
                logits.data(), DataType::kF32, S, config.vocab_size, H);
  }

  // Captures EnqueueForward(shape) into a graph; the stream is out of capture mode on
  // every path.
  absl::StatusOr<cudaGraphExec_t> Capture(const StepShape& shape) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const absl::Status enqueued = EnqueueForward(shape);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (!enqueued.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      return enqueued;
    }
    LOOM_CUDA_RETURN_IF_ERROR(ended);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    LOOM_CUDA_RETURN_IF_ERROR(instantiated);
    return exec;
  }

  // Copies `count` elements of `host` into `buffer` (grown to fit) on the stream.
  template <typename T>
  absl::Status Upload(DeviceBuffer& buffer, const T* host, size_t count) {
    if (count == 0) return absl::OkStatus();
    LOOM_ASSIGN_OR_RETURN(const bool moved, Reserve(buffer, count * sizeof(T)));
    (void)moved;  // not used by any captured graph
    LOOM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(buffer.data(), host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }

  // Enqueues the device sampler over the first rows.params.size() rows of `logits` and
  // the copies of the picked tokens and logprobs into the outputs.
  absl::Status EnqueueSampling(const DeviceSampleRows& rows, std::vector<int32_t>& tokens,
                               std::vector<float>& logprobs) {
    const int64_t num_rows = static_cast<int64_t>(rows.params.size());
    tokens.resize(num_rows);
    logprobs.resize(num_rows);
    if (num_rows == 0) return absl::OkStatus();
    std::vector<kc::SamplingRowParams> params(num_rows);
    for (int64_t i = 0; i < num_rows; ++i) {
      const SamplingParams& p = rows.params[i];
      params[i].temperature = p.temperature;
      params[i].top_k = p.top_k;
      params[i].top_p = p.top_p;
      params[i].min_p = p.min_p;
      params[i].repetition_penalty = p.repetition_penalty;
      params[i].presence_penalty = p.presence_penalty;
      params[i].frequency_penalty = p.frequency_penalty;
      params[i].seed = p.seed;
      params[i].step = static_cast<uint64_t>(rows.positions[i]);
    }
    LOOM_RETURN_IF_ERROR(Upload(sample_params, params.data(), params.size()));
    kc::SampleTokensParams p;
    p.logits = static_cast<const float*>(logits.data());
    p.num_rows = num_rows;
    p.vocab_size = config.vocab_size;
    p.rows = static_cast<const kc::SamplingRowParams*>(sample_params.data());
    if (!rows.penalty_tokens.empty()) {
      LOOM_RETURN_IF_ERROR(
          Upload(penalty_indptr, rows.penalty_indptr.data(), rows.penalty_indptr.size()));
      LOOM_RETURN_IF_ERROR(
          Upload(penalty_tokens, rows.penalty_tokens.data(), rows.penalty_tokens.size()));
      LOOM_RETURN_IF_ERROR(
          Upload(penalty_counts, rows.penalty_counts.data(), rows.penalty_counts.size()));
      p.penalty_indptr = static_cast<const int32_t*>(penalty_indptr.data());
      p.penalty_tokens = static_cast<const int32_t*>(penalty_tokens.data());
      p.penalty_counts = static_cast<const int32_t*>(penalty_counts.data());
      LOOM_ASSIGN_OR_RETURN(const bool moved,
                            Reserve(sample_workspace, kc::SampleTokensWorkspaceBytes(p)));
      (void)moved;
      p.workspace = static_cast<float*>(sample_workspace.data());
      p.workspace_bytes = sample_workspace.bytes();
    }
    LOOM_ASSIGN_OR_RETURN(const bool tokens_moved,
                          Reserve(sampled_tokens, num_rows * sizeof(int32_t)));
    LOOM_ASSIGN_OR_RETURN(const bool logprobs_moved,
                          Reserve(sampled_logprobs, num_rows * sizeof(float)));
    (void)tokens_moved, (void)logprobs_moved;
    p.tokens = static_cast<int32_t*>(sampled_tokens.data());
    p.logprobs = static_cast<float*>(sampled_logprobs.data());
    LOOM_RETURN_IF_ERROR(kc::LaunchSampleTokens(p, stream));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens.data(), sampled_tokens.data(),
                                              num_rows * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logprobs.data(), sampled_logprobs.data(),
                                              num_rows * sizeof(float), cudaMemcpyDeviceToHost,
                                              stream));
    return absl::OkStatus();
  }

  // One step: the forward pass, then either the sample rows' logits copied out or (with
  // `sampling`) their tokens picked on the device and only those copied out.
  absl::Status RunStep(const StepBatch& batch, std::vector<float>& logits_out,
                       const DeviceSampleRows* sampling = nullptr,
                       std::vector<int32_t>* sampled = nullptr,
                       std::vector<float>* sampled_logprob = nullptr) {
    const int64_t n = batch.num_tokens();
    const int64_t num_sampled = static_cast<int64_t>(batch.sample_rows.size());
    int64_t max_context = 1;
    for (int32_t position : batch.positions)
      max_context = std::max<int64_t>(max_context, position + 1);
    int64_t max_query = 1;
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      max_query = std::max<int64_t>(max_query, batch.query_start[s + 1] - batch.query_start[s]);
    }
    // A decode step (one query token per sequence) of up to 256 sequences runs padded to
    // its bucket's shape, graphs on or off, so both give the same bits; with graphs on it
    // replays the bucket's graph. Any other step (a sequence with several query tokens)
    // runs eagerly, its attention in the prefill kernel over the batch as given.
    const bool decode = n == batch.num_seqs();
    const int64_t bucket = decode ? GraphBatchBucket(n) : 0;
    const bool padded = bucket > 0 && num_sampled <= bucket;
    const bool graphed = padded && use_graphs;

    StepBatch expanded;
    if (decode) {
      expanded = ExpandToSingleTokenSequences(batch, block_size);
      if (padded) {
        PadDecodeBatch(expanded, bucket, bucket, static_cast<int32_t>(scratch_block),
                       block_size);
      }
    }
    const StepBatch& step = decode ? expanded : batch;
    StepShape shape;
    shape.num_tokens = step.num_tokens();
    shape.num_seqs = step.num_seqs();
    shape.num_samples = static_cast<int64_t>(step.sample_rows.size());
    shape.num_block_entries = static_cast<int64_t>(step.block_indices.size());
    shape.max_context_len = padded ? ContextBucket(max_context) : max_context;
    shape.max_query_len = max_query;
    shape.prefill = !decode;
    if (sampling != nullptr && static_cast<int64_t>(sampling->params.size()) != num_sampled) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%d sampling rows for %d sample rows", sampling->params.size(), num_sampled));
    }
    LOOM_RETURN_IF_ERROR(EnsureCapacity(shape));
    PackInputs(step, shape);
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(inputs.data(), staging,
                                              shape.input_elements() * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream));
    // From here the copy out of `staging` may still be pending: a step that fails after it
    // (a launch check refusing a shape) waits for the stream before returning, so the next
    // step's PackInputs cannot overwrite `staging` under that copy. If even the wait fails,
    // that device error is what the caller sees (and the runner is marked broken).
    absl::Status status = EnqueueStep(shape, bucket, graphed, sampling, num_sampled,
                                      logits_out, sampled, sampled_logprob);
    if (!status.ok()) {
      const cudaError_t drained = cudaStreamSynchronize(stream);
      if (drained != cudaSuccess) {
        const std::string call =
            absl::StrCat("cudaStreamSynchronize after a failed step (", status.message(), ")");
        return CudaCallStatus(drained, call.c_str());
      }
      return status;
    }
    return kc::SynchronizeStream(stream);
  }

  // The device work of one step after its inputs were copied: the forward pass (a graph
  // replay, a capture or eager launches), then the sampling or the logits copy-out. Waits
  // for nothing; RunStep synchronizes.
  absl::Status EnqueueStep(const StepShape& shape, int64_t bucket,
                           bool graphed, const DeviceSampleRows* sampling, int64_t num_sampled,
                           std::vector<float>& logits_out, std::vector<int32_t>* sampled,
                           std::vector<float>* sampled_logprob) {
    const std::pair<int64_t, int64_t> key{bucket, shape.max_context_len};
    if (graphed && graphs.contains(key)) {
      LOOM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graphs[key], stream));
      ++stats.graph_replays;
    } else if (graphed && warmed.contains(key)) {
      LOOM_ASSIGN_OR_RETURN(cudaGraphExec_t exec, Capture(shape));
      graphs[key] = exec;
      ++stats.graph_captures;
      LOOM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
      ++stats.graph_replays;
    } else {
      LOOM_RETURN_IF_ERROR(EnqueueForward(shape));
      if (graphed) warmed.insert(key);
      ++stats.eager_steps;
    }
    if (sampling != nullptr) return EnqueueSampling(*sampling, *sampled, *sampled_logprob);
    logits_out.resize(num_sampled * config.vocab_size);
    if (num_sampled > 0) {
      LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits_out.data(), logits.data(),
                                                logits_out.size() * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream));
    }
    return absl::OkStatus();
  }
};

CudaForwardPass::~CudaForwardPass() = default;

namespace {

// The options Create and CreateRandom both check before touching the device.
absl::Status ValidateRunnerOptions(const CudaForwardPassOptions& options) {
  const int device_count = kernels::CudaDeviceCount();
  if (device_count == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the CUDA runner needs a CUDA device and found none (%s)",
        kernels::CudaDeviceDescription(0)));
  }
  if (options.device < 0 || options.device >= device_count) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "CUDA device %d does not exist (%d visible)", options.device, device_count));
  }
  if (options.tp_size > 1) {
    return absl::UnimplementedError(
        "tensor parallelism on the CUDA runner is not implemented yet (use the CPU runner)");
  }
  if (options.dtype != DataType::kF16 && options.dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: activation dtype %s unsupported (F16, BF16)",
                        kc::DataTypeName(options.dtype)));
  }
  if (options.kv_dtype != options.dtype) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: KV dtype %s must equal the activation dtype %s (the attention kernels "
        "read queries in the cache's type)",
        kc::DataTypeName(options.kv_dtype), kc::DataTypeName(options.dtype)));
  }
  if (options.block_size < 1 || options.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: block size %d must be in [1, 1024]", options.block_size));
  }
  if (options.num_kv_blocks < 0 ||
      (options.num_kv_blocks == 0 &&
       !(options.kv_memory_fraction > 0 && options.kv_memory_fraction <= 1))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: give num_kv_blocks > 0 or a kv_memory_fraction in (0, 1] (got %d, %g)",
        options.num_kv_blocks, options.kv_memory_fraction));
  }
  if (options.max_num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: max_num_tokens %d must be >= 1", options.max_num_tokens));
  }
  return absl::OkStatus();
}

// The model shapes the CUDA kernels can run.
absl::Status ValidateRunnerConfig(const common::ModelConfig& config) {
  if (config.head_dim != 64 && config.head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: head dim %d unsupported by the attention kernels (64, 128)",
        config.head_dim));
  }
  if (config.hidden_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: hidden size %d above 65536", config.hidden_size));
  }
  return absl::OkStatus();
}

// What ModelConfigFromGguf guarantees for a config that comes from a caller instead.
absl::Status ValidateRandomModelConfig(const common::ModelConfig& c) {
  if (c.vocab_size < 1 || c.context_length < 1 || c.hidden_size < 1 ||
      c.intermediate_size < 1 || c.num_layers < 1 || c.num_heads < 1 || c.num_kv_heads < 1 ||
      c.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: random model sizes must be >= 1 (vocab %d, context %d, hidden %d, ffn %d, "
        "layers %d, heads %d, KV heads %d, head dim %d)",
        c.vocab_size, c.context_length, c.hidden_size, c.intermediate_size, c.num_layers,
        c.num_heads, c.num_kv_heads, c.head_dim));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: %d query heads not a multiple of %d KV heads", c.num_heads,
        c.num_kv_heads));
  }
  if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: rope dimension %d must be even and at most the head dim %d", c.rope_dim,
        c.head_dim));
  }
  if (!(c.rope_theta > 0) || !(c.rms_norm_eps > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: rope theta %g and RMSNorm epsilon %g must be > 0", c.rope_theta,
        c.rms_norm_eps));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaForwardPass>> CudaForwardPass::Create(
    const common::GgufFile& gguf, const CudaForwardPassOptions& options) {
  LOOM_RETURN_IF_ERROR(ValidateRunnerOptions(options));
  LOOM_ASSIGN_OR_RETURN(common::ModelConfig config, common::ModelConfigFromGguf(gguf));
  LOOM_RETURN_IF_ERROR(ValidateRunnerConfig(config));
  if (config.qk_norm) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA runner does not implement QK-norm (per-head RMSNorm of q and k, ",
        config.architecture, "): serve this model with --device cpu"));
  }

  // Weights: loaded like the CPU runner's; INT4 layer matrices are repacked for the W4A16
  // GEMM (options.quantized_weights), every other matrix is dequantized on the host and
  // uploaded once in dtype (the host copies are freed when this function returns).
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelWeights> weights, model::LoadModelWeights(gguf, 0, 1));
  auto state = std::make_unique<State>();
  State& s = *state;
  LOOM_RETURN_IF_ERROR(s.Init(options, weights->config));
  LOOM_ASSIGN_OR_RETURN(s.embedding, UploadMatrix(weights->token_embedding, s.dtype));
  if (weights->output != nullptr) {
    LOOM_ASSIGN_OR_RETURN(s.lm_head, UploadMatrix(*weights->output, s.dtype));
  }
  LOOM_ASSIGN_OR_RETURN(s.output_norm, UploadFloats(weights->output_norm));
  LOOM_ASSIGN_OR_RETURN(s.rope_inv_freq, UploadFloats(weights->rope_inv_freq));
  int64_t quantized_layers = 0;
  for (const model::LayerWeights& layer : weights->layers) {
    State::Layer& device_layer = s.layers.emplace_back();
    LOOM_ASSIGN_OR_RETURN(device_layer.attn_norm, UploadFloats(layer.attn_norm));
    const bool keep = options.quantized_weights;
    LOOM_ASSIGN_OR_RETURN(device_layer.qkv,
                          UploadLinear(layer.qkv, &layer.qkv_bias, s.dtype, keep));
    if (!layer.qkv_bias.empty() && !device_layer.qkv.quantized()) {
      LOOM_ASSIGN_OR_RETURN(device_layer.qkv_bias, UploadFloats(layer.qkv_bias));
    }
    LOOM_ASSIGN_OR_RETURN(device_layer.attn_output,
                          UploadLinear(layer.attn_output, nullptr, s.dtype, keep));
    LOOM_ASSIGN_OR_RETURN(device_layer.ffn_norm, UploadFloats(layer.ffn_norm));
    LOOM_ASSIGN_OR_RETURN(device_layer.gate_up,
                          UploadLinear(layer.gate_up, nullptr, s.dtype, keep));
    LOOM_ASSIGN_OR_RETURN(device_layer.down, UploadLinear(layer.down, nullptr, s.dtype, keep));
    for (const DeviceLinear* linear : {&device_layer.qkv, &device_layer.attn_output,
                                       &device_layer.gate_up, &device_layer.down}) {
      if (linear->quantized()) ++quantized_layers;
    }
  }
  std::string load_log = weights->load_log;
  weights.reset();
  absl::StrAppendFormat(
      &load_log,
      "  %d of %d layer matrices kept INT4 for the W4A16 GEMM, the rest (and the embedding / LM "
      "head) dequantized to %s on the host\n",
      quantized_layers, 4 * static_cast<int64_t>(s.layers.size()), kc::DataTypeName(s.dtype));
  return Finish(std::move(state), options, std::move(load_log));
}

absl::StatusOr<std::unique_ptr<CudaForwardPass>> CudaForwardPass::CreateRandom(
    const common::ModelConfig& config, const CudaForwardPassOptions& options, uint64_t seed) {
  LOOM_RETURN_IF_ERROR(ValidateRunnerOptions(options));
  LOOM_RETURN_IF_ERROR(ValidateRandomModelConfig(config));
  LOOM_RETURN_IF_ERROR(ValidateRunnerConfig(config));
  auto state = std::make_unique<State>();
  State& s = *state;
  LOOM_RETURN_IF_ERROR(s.Init(options, config));
  const common::ModelConfig& c = s.config;

  // Every tensor draws from its own stream: the seed advanced by a large odd constant.
  uint64_t tensor_seed = seed;
  auto random = [&](int64_t count, DataType dtype, float offset,
                    float scale) -> absl::StatusOr<DeviceBuffer> {
    LOOM_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                          DeviceBuffer::Allocate(static_cast<size_t>(count * kc::ElementBytes(dtype))));
    kc::RandomFillParams fill;
    fill.out = buffer.data();
    fill.dtype = dtype;
    fill.count = count;
    fill.seed = tensor_seed += 0x632BE59BD9B4E019ull;
    fill.offset = offset;
    fill.scale = scale;
    LOOM_RETURN_IF_ERROR(kc::LaunchRandomFill(fill, s.stream));
    return buffer;
  };
  auto fan_in_scale = [](int64_t fan_in) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  };
  // A dense [n, k] weight for cuBLAS, uniform in +-1/sqrt(k).
  auto linear = [&](int64_t n, int64_t k) -> absl::StatusOr<DeviceLinear> {
    DeviceLinear result;
    result.n = n;
    result.k = k;
    LOOM_ASSIGN_OR_RETURN(result.dense, random(n * k, s.dtype, 0.0f, fan_in_scale(k)));
    return result;
  };

  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  LOOM_ASSIGN_OR_RETURN(s.embedding, random(c.vocab_size * hidden, s.dtype, 0.0f,
                                            fan_in_scale(hidden)));
  if (!c.tied_embeddings) {
    LOOM_ASSIGN_OR_RETURN(s.lm_head, random(c.vocab_size * hidden, s.dtype, 0.0f,
                                            fan_in_scale(hidden)));
  }
  LOOM_ASSIGN_OR_RETURN(s.output_norm, random(hidden, DataType::kF32, 1.0f, 0.0f));
  LOOM_ASSIGN_OR_RETURN(s.rope_inv_freq, UploadFloats(model::RopeInverseFrequencies(c, {})));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    State::Layer& layer = s.layers.emplace_back();
    LOOM_ASSIGN_OR_RETURN(layer.attn_norm, random(hidden, DataType::kF32, 1.0f, 0.0f));
    LOOM_ASSIGN_OR_RETURN(layer.qkv, linear(s.qkv_dim, hidden));
    if (c.attention_bias) {
      LOOM_ASSIGN_OR_RETURN(layer.qkv_bias,
                            random(s.qkv_dim, DataType::kF32, 0.0f, fan_in_scale(hidden)));
    }
    LOOM_ASSIGN_OR_RETURN(layer.attn_output, linear(hidden, s.q_dim));
    LOOM_ASSIGN_OR_RETURN(layer.ffn_norm, random(hidden, DataType::kF32, 1.0f, 0.0f));
    LOOM_ASSIGN_OR_RETURN(layer.gate_up, linear(2 * ffn, hidden));
    LOOM_ASSIGN_OR_RETURN(layer.down, linear(hidden, ffn));
  }
  std::string load_log = absl::StrFormat(
      "  random weights (seed %d) generated on the device in %s, uniform in +-1/sqrt(fan in), "
      "norms 1\n",
      seed, kc::DataTypeName(s.dtype));
  return Finish(std::move(state), options, std::move(load_log));
}

absl::StatusOr<std::unique_ptr<CudaForwardPass>> CudaForwardPass::Finish(
    std::unique_ptr<State> state, const CudaForwardPassOptions& options, std::string load_log) {
  State& s = *state;
  const common::ModelConfig& c = s.config;
  // The quantized GEMM's split-K workspace: the most any layer asks for at any m.
  size_t workspace_bytes = 0;
  for (const State::Layer& layer : s.layers) {
    for (const DeviceLinear* linear : {&layer.qkv, &layer.attn_output, &layer.gate_up, &layer.down}) {
      if (!linear->quantized()) continue;
      for (int64_t m = 1; m <= kc::kQuantGemmMaxM; m *= 2) {
        workspace_bytes =
            std::max(workspace_bytes, kc::QuantGemmWorkspaceBytes(QuantParams(*linear, s.dtype, m)));
      }
    }
  }
  if (workspace_bytes > 0) {
    LOOM_ASSIGN_OR_RETURN(s.quant_workspace, DeviceBuffer::Allocate(workspace_bytes));
  }
  int64_t weight_bytes = static_cast<int64_t>(s.embedding.bytes() + s.lm_head.bytes());
  for (const State::Layer& layer : s.layers) {
    weight_bytes += static_cast<int64_t>(layer.qkv.bytes() + layer.attn_output.bytes() +
                                         layer.gate_up.bytes() + layer.down.bytes());
  }

  // Activations and workspaces before the KV pool, which takes a share of what is left:
  // max_num_tokens tokens, every decode bucket's sample rows and graph inputs.
  const int64_t max_blocks_per_seq = (c.context_length + s.block_size - 1) / s.block_size;
  StepShape reserve;
  reserve.num_tokens = std::max(options.max_num_tokens, kMaxGraphBatch);
  reserve.num_seqs = reserve.num_tokens;
  reserve.num_samples = kMaxGraphBatch;
  reserve.num_block_entries =
      std::min<int64_t>(kMaxGraphBatch * max_blocks_per_seq, int64_t{1} << 22);
  reserve.max_context_len = ContextBucket(c.context_length);
  LOOM_RETURN_IF_ERROR(s.EnsureCapacity(reserve));
  for (int64_t bucket : kGraphBatchBuckets) {
    LOOM_ASSIGN_OR_RETURN(const bool moved,
                          Reserve(s.attn_workspace,
                                  s.DecodeWorkspaceBytes(bucket, ContextBucket(c.context_length))));
    (void)moved;
  }

  // The KV pool: one extra block (the scratch block graph padding writes to and reads).
  const int64_t block_bytes = KvBytesPerBlock(c, s.block_size, s.kv_dtype);
  const int64_t max_blocks = INT32_MAX / s.block_size - 1;  // slot ids are int32
  int64_t num_blocks = options.num_kv_blocks;
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (num_blocks == 0 && options.gpu_memory_utilization > 0) {
    const double allowed = static_cast<double>(total_bytes) * options.gpu_memory_utilization;
    const double used = static_cast<double>(total_bytes - free_bytes);
    num_blocks = static_cast<int64_t>(std::max(0.0, allowed - used)) / block_bytes - 1;
  } else if (num_blocks == 0) {
    num_blocks =
        static_cast<int64_t>(static_cast<double>(free_bytes) * options.kv_memory_fraction) /
            block_bytes -
        1;
  }
  num_blocks = std::min(num_blocks, max_blocks);
  if (num_blocks < 1) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "CUDA runner: no room for a KV block of %d bytes (%d bytes free on the device)",
        block_bytes, free_bytes));
  }
  s.num_blocks = num_blocks;
  s.scratch_block = num_blocks;
  s.kv_layer_bytes = (num_blocks + 1) * s.block_size * s.kv_dim * kc::ElementBytes(s.kv_dtype);
  LOOM_ASSIGN_OR_RETURN(
      s.kv_pool, DeviceBuffer::Allocate(static_cast<size_t>(2 * c.num_layers * s.kv_layer_bytes)));
  // Zeros, so the scratch block (and any block read before written) holds finite values.
  LOOM_RETURN_IF_ERROR(s.kv_pool.Fill(0));
  // cudaMemset and the uploads ran on the legacy default stream, which the runner's
  // non-blocking stream does not wait for: finish them before the first step.
  LOOM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());

  absl::StrAppendFormat(
      &load_log,
      "  device %d: %s; weights %.1f MiB, KV pool %d blocks x %d tokens (%s, %.1f MiB, "
      "+1 scratch block); CUDA graphs %s\n",
      s.device, kernels::CudaDeviceDescription(s.device),
      static_cast<double>(weight_bytes) / (1 << 20), num_blocks,
      s.block_size, kc::DataTypeName(s.kv_dtype),
      static_cast<double>(num_blocks * block_bytes) / (1 << 20), s.use_graphs ? "on" : "off");

  std::unique_ptr<CudaForwardPass> runner(new CudaForwardPass(std::move(state)));
  runner->config_ = runner->state_->config;
  runner->num_kv_blocks_ = num_blocks;
  runner->block_size_ = options.block_size;
  runner->load_log_ = std::move(load_log);
  return runner;
}

absl::Status CudaForwardPass::Guarded(const StepBatch& batch,
                                      absl::FunctionRef<absl::Status()> run) {
  State& s = *state_;
  if (!s.broken.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA runner stopped after an earlier device error: ", s.broken.message()));
  }
  LOOM_RETURN_IF_ERROR(ValidateStepBatch(batch, config_.vocab_size, config_.context_length,
                                         num_kv_blocks_, block_size_));
  absl::Status status = CudaCallStatus(cudaSetDevice(s.device), "cudaSetDevice");
  if (status.ok()) status = run();
  if (!status.ok() && status.code() != absl::StatusCode::kResourceExhausted &&
      status.code() != absl::StatusCode::kInvalidArgument) {
    s.broken = status;
  }
  return status;
}

absl::Status CudaForwardPass::Step(const StepBatch& batch, std::vector<float>& logits) {
  return Guarded(batch, [&] { return state_->RunStep(batch, logits); });
}

absl::Status CudaForwardPass::StepAndSample(const StepBatch& batch, const DeviceSampleRows& rows,
                                             std::vector<int32_t>& tokens,
                                             std::vector<float>& logprobs) {
  return Guarded(batch, [&]() -> absl::Status {
    if (rows.params.size() != batch.sample_rows.size() ||
        rows.positions.size() != rows.params.size() ||
        rows.penalty_indptr.size() != rows.params.size() + 1 ||
        rows.penalty_tokens.size() != rows.penalty_counts.size() ||
        static_cast<size_t>(rows.penalty_indptr.back()) != rows.penalty_tokens.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "device sampling rows do not match the step's %d sample rows",
          batch.sample_rows.size()));
    }
    std::vector<float> unused;
    return state_->RunStep(batch, unused, &rows, &tokens, &logprobs);
  });
}

CudaForwardPass::Stats CudaForwardPass::stats() const { return state_->stats; }

#endif  // LOOM_HAVE_CUDA

}  // namespace loom::worker
