#include "worker/cuda_forward_pass.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda_device.h"
#include "model/kv_cache_budget.h"
#include "model/kv_layout.h"
#include "worker/device_startup_lock.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "common/formats/model_config.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/quantized_gemm.h"
#include "model/cuda_device.h"
#include "model/cuda_graph_cache.h"
#include "model/cuda_model_checks.h"
#include "model/cuda_status.h"
#include "model/llama_graph.h"
#include "model/model_weights.h"
#include "model/tensor_parallel.h"
#include "worker/cuda_step_sampler.h"
#endif

namespace loom::worker {

namespace kc = kernels::cuda;

namespace {

// The KV pool's element bytes, scale bytes (per token and KV head) and name.
int64_t KvElementBytes(kc::DataType kv_dtype, kc::KvQuant kv_quant) {
  return kv_quant == kc::KvQuant::kNone ? kc::ElementBytes(kv_dtype) : 1;
}
int64_t KvScaleBytes(kc::KvQuant kv_quant) { return kv_quant == kc::KvQuant::kNone ? 0 : 2; }
std::string KvDtypeName(kc::DataType kv_dtype, kc::KvQuant kv_quant) {
  switch (kv_quant) {
    case kc::KvQuant::kInt8:
      return "int8";
    case kc::KvQuant::kFp8E4m3:
      return "fp8_e4m3";
    default:
      return std::string(kc::DataTypeName(kv_dtype));
  }
}

}  // namespace

int64_t CudaForwardPass::KvBytesPerBlock(const common::ModelConfig& config, int64_t block_size,
                                         kc::DataType kv_dtype, kc::KvQuant kv_quant) {
  return model::KvBytesPerBlock(config, block_size, KvElementBytes(kv_dtype, kv_quant),
                                KvScaleBytes(kv_quant));
}

CudaForwardPass::CudaForwardPass(std::unique_ptr<State> state) : state_(std::move(state)) {}

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

bool CudaForwardPass::returns_logits() const { return true; }
void CudaForwardPass::SkipStep(uint64_t, const absl::Status&) {}

absl::Status CudaForwardPass::StepAndSample(const StepBatch&, const DeviceSampleRows&,
                                            std::vector<int32_t>&, std::vector<float>&,
                                            std::vector<float>&) {
  return absl::FailedPreconditionError("the CUDA runner is unavailable: built without CUDA");
}

CudaForwardPass::Stats CudaForwardPass::stats() const { return {}; }
const model::KvCache* CudaForwardPass::kv_pool() const { return nullptr; }
int64_t CudaForwardPass::device_bytes() const { return 0; }
std::unique_ptr<DeviceStartupLock> CudaForwardPass::AcquireStartupLock(int) { return nullptr; }
absl::Status CudaForwardPass::ResizeKvPool(int64_t) {
  return absl::FailedPreconditionError("Loom was built without CUDA");
}

#else  // LOOM_HAVE_CUDA

namespace {

using kc::DataType;

// Decode-step buckets and their graphs: model/cuda_graph_cache.
using model::ContextBucket;
using model::GraphBatchBucket;
using model::kMaxGraphBatch;

using model::CudaStatus;

}  // namespace

struct CudaForwardPass::State {
  int device_index = 0;
  bool use_graphs = true;
  common::ModelConfig config;
  int64_t num_blocks = 0;     // blocks the coordinator may name
  int64_t scratch_block = 0;  // == num_blocks: one more block, target of graph padding
  int64_t block_size = 0;
  // Device memory free when this forward pass began (context created, nothing of its own yet):
  // what it has taken since is its own use, whatever other processes on the GPU hold. Other
  // workers on the GPU wait meanwhile (startup_lock, released once the KV pool is in).
  size_t free_at_start = 0;
  std::unique_ptr<DeviceStartupLock> startup_lock;
  int64_t device_bytes = 0;  // what it took, measured once the KV pool was in

  std::unique_ptr<model::LlamaGraph> graph;  // the model on the device
  model::CudaDevice* device = nullptr;       // graph's; every launch goes to its stream
  // [logits_rows, vocab] F32: the sample rows' logits. From device->Allocate, so growing
  // it changes the device's memory generation (graphs write it).
  std::unique_ptr<model::Buffer> logits;
  int64_t logits_rows = 0;
  // Device sampling (StepAndSample), its buffers grown as steps need (no graph reads them).
  CudaStepSampler step_sampler;

  // Decode graphs by (batch bucket, context bucket) on `device`, and how steps ran;
  // created by Finish (CudaForwardPassOptions::debug_fail_graph_captures goes to it).
  std::unique_ptr<model::CudaGraphCache> graph_cache;
  absl::Status broken;  // the first device error; every later step fails with it

  // Pipeline parallelism (CudaForwardPassOptions::link): the step being run, whether it
  // took its predecessor's message and passed one on, and the host copies of the
  // residual stream the link moves.
  PipelineLink* link = nullptr;
  uint64_t step_id = 0;
  bool received = false, sent = false;
  std::vector<float> stage_residual, stage_proj;

  // The graph's receive: the predecessor's pair into host memory, then onto the device.
  absl::Status ReceiveStage(model::Tensor residual, model::Tensor proj) {
    received = true;
    const size_t count = static_cast<size_t>(residual.numel());
    stage_residual.resize(count);
    stage_proj.resize(count);
    LOOM_RETURN_IF_ERROR(
        link->Receive(step_id, absl::MakeSpan(stage_residual), absl::MakeSpan(stage_proj)));
    // From pageable memory: the copy has read the host buffer when the call returns.
    LOOM_CUDA_CALL(cudaMemcpyAsync(residual.data, stage_residual.data(), count * sizeof(float),
                                   cudaMemcpyHostToDevice, device->stream()));
    LOOM_CUDA_CALL(cudaMemcpyAsync(proj.data, stage_proj.data(), count * sizeof(float),
                                   cudaMemcpyHostToDevice, device->stream()));
    return absl::OkStatus();
  }

  // The graph's send: the stage's pair to the host once its layers ran, then to the next.
  absl::Status SendStage(model::Tensor residual, model::Tensor proj) {
    sent = true;
    const size_t count = static_cast<size_t>(residual.numel());
    stage_residual.resize(count);
    stage_proj.resize(count);
    LOOM_CUDA_CALL(cudaMemcpyAsync(stage_residual.data(), residual.data, count * sizeof(float),
                                   cudaMemcpyDeviceToHost, device->stream()));
    LOOM_CUDA_CALL(cudaMemcpyAsync(stage_proj.data(), proj.data, count * sizeof(float),
                                   cudaMemcpyDeviceToHost, device->stream()));
    LOOM_RETURN_IF_ERROR(device->Synchronize());
    return link->Send(step_id, stage_residual, stage_proj);
  }

  // A step that failed (or will not run) here: the stages stay aligned, as on the CPU.
  void FinishFailedStep(uint64_t id, const absl::Status& why) {
    if (link == nullptr) return;
    if (link->has_previous() && !received) (void)link->Discard(id);
    if (link->has_next() && !sent) (void)link->SendFailure(id, why);
  }

  ~State() {
    cudaSetDevice(device_index);
    graph_cache.reset();  // its graphs before the device whose stream they ran on
    logits.reset();
    graph.reset();
    cudaGetLastError();  // nothing to report from a destructor
  }

  absl::Status EnsureLogits(int64_t rows) {
    if (rows <= logits_rows && logits != nullptr) return absl::OkStatus();
    const int64_t grown = std::max(rows, logits_rows + logits_rows / 2);
    logits.reset();
    logits_rows = 0;
    LOOM_ASSIGN_OR_RETURN(
        logits, device->Allocate(grown * config.vocab_size * static_cast<int64_t>(sizeof(float))));
    logits_rows = grown;
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
    if (sampling != nullptr && static_cast<int64_t>(sampling->params.size()) != num_sampled) {
      return absl::InvalidArgumentError(absl::StrFormat("%d sampling rows for %d sample rows",
                                                        sampling->params.size(), num_sampled));
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
    // Uploaded before any capture or replay: the graph reads the step's arrays at the
    // addresses the device's step buffer has for this bucket.
    LOOM_ASSIGN_OR_RETURN(model::StepTensors tensors,
                          device->UploadStep(step.token_ids, step.positions, step.slots,
                                             step.query_start, step.context_len, step.block_indptr,
                                             step.block_indices, step.sample_rows));
    // A padded step's context bound is its bucket's (the decode kernel's split count, baked
    // into a graph, follows it; eager padded steps use it too, for the same bits).
    if (padded) tensors.max_context_len = ContextBucket(tensors.max_context_len);
    const int64_t rows = tensors.num_sample_rows;
    LOOM_RETURN_IF_ERROR(EnsureLogits(std::max<int64_t>(rows, 1)));
    const model::Tensor out = model::Tensor::Of(
        logits->data(), model::DType::kF32, model::DeviceType::kCuda, {rows, config.vocab_size});
    // Replayed from the key's graph, captured (the key's second step) or enqueued eagerly.
    absl::Status status = graph_cache->Run([&] { return graph->Forward(tensors, out); }, graphed,
                                           {bucket, tensors.max_context_len});
    if (status.ok()) {
      if (!graph->shard().last_stage()) {
        logits_out.clear();  // the residual stream went on to the next stage
      } else if (sampling != nullptr) {
        status =
            step_sampler.Enqueue(*sampling, static_cast<const float*>(logits->data()),
                                 config.vocab_size, device->stream(), *sampled, *sampled_logprob);
        // The rows the host samples: their raw logits (the sampler penalized a copy).
        const size_t vocab = static_cast<size_t>(config.vocab_size);
        logits_out.resize(sampling->logits_rows.size() * vocab);
        for (size_t i = 0; i < sampling->logits_rows.size() && status.ok(); ++i) {
          status = CudaStatus(
              cudaMemcpyAsync(logits_out.data() + i * vocab,
                              static_cast<const float*>(logits->data()) +
                                  static_cast<size_t>(sampling->logits_rows[i]) * vocab,
                              vocab * sizeof(float), cudaMemcpyDeviceToHost, device->stream()),
              "cudaMemcpyAsync of a host-sampled row's logits");
        }
      } else {
        logits_out.resize(num_sampled * config.vocab_size);
        if (num_sampled > 0) {
          status = CudaStatus(
              cudaMemcpyAsync(logits_out.data(), logits->data(), logits_out.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, device->stream()),
              "cudaMemcpyAsync of the logits");
        }
      }
    }
    // Every path waits for the stream before returning: the step's host inputs and
    // outputs are then free to reuse. A failed wait is the error the caller sees (and the
    // forward pass is marked broken).
    const absl::Status drained = device->Synchronize();
    if (!drained.ok()) {
      return status.ok()
                 ? drained
                 : absl::InternalError(absl::StrCat(
                       drained.message(), " (after a failed step: ", status.message(), ")"));
    }
    if (status.ok() && sampling != nullptr && graph->shard().last_stage()) {
      status = step_sampler.Finish(*sampling, *sampled);
    }
    return status;
  }
};

CudaForwardPass::~CudaForwardPass() = default;

namespace {

// The options Create and CreateRandom both check before touching the device.
absl::Status ValidateForwardPassOptions(const CudaForwardPassOptions& options) {
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
  if (options.tp_size < 1 || options.tp_rank < 0 || options.tp_rank >= options.tp_size ||
      (options.tp_size > 1 && options.communicator == nullptr) ||
      (options.communicator != nullptr && (options.communicator->world_size() != options.tp_size ||
                                           options.communicator->rank() != options.tp_rank))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor parallel rank %d of %d needs a communicator of that rank and size",
                        options.tp_rank, options.tp_size));
  }
  LOOM_RETURN_IF_ERROR(PipelineLink::CheckStage(options.link, options.pp_stage, options.pp_size));
  if (options.dtype != DataType::kF16 && options.dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: activation dtype %s unsupported (F16, BF16)",
                        kc::DataTypeName(options.dtype)));
  }
  if (options.kv_dtype != options.dtype) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: KV dtype %s must equal the weight dtype %s",
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
  if (options.draft_kv_bytes_per_block < 0 || options.draft_device_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: a draft model's KV block bytes %d and device bytes %d must be >= 0",
        options.draft_kv_bytes_per_block, options.draft_device_bytes));
  }
  if (options.gpu_memory_utilization < 0 || options.gpu_memory_utilization > 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: gpu_memory_utilization %g must be in (0, 1] (0: unset)",
                        options.gpu_memory_utilization));
  }
  if (options.max_num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: max_num_tokens %d must be >= 1", options.max_num_tokens));
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

// The device by PCI bus id (the same GPU whatever CUDA_VISIBLE_DEVICES numbers it), else
// its index.
std::string DeviceKey(int device) {
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) == cudaSuccess) return bus_id;
  cudaGetLastError();
  return std::to_string(device);
}

// Selects the device (creating its context) and returns the memory free on it then.
absl::StatusOr<size_t> SelectDevice(const CudaForwardPassOptions& options) {
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaFree(nullptr), "cudaFree (context creation)"));
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  return free_bytes;
}

absl::StatusOr<std::unique_ptr<model::CudaDevice>> MakeDevice(
    const CudaForwardPassOptions& options) {
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  model::CudaDeviceOptions device_options;
  device_options.dtype = options.dtype;
  device_options.kv_dtype = options.kv_dtype;
  device_options.kv_quant = options.kv_quant;
  device_options.keep_quantized = options.quantized_weights;
  device_options.fp8_weights = options.fp8_weights;
  // An FP8 checkpoint's layers on the FP8 GEMM where this device has FP8 tensor cores.
  device_options.fp8_checkpoint = options.fp8_checkpoint && kc::Fp8GemmSupported();
  device_options.communicator = options.communicator;
  return model::CudaDevice::Create(device_options);
}

}  // namespace

std::unique_ptr<DeviceStartupLock> CudaForwardPass::AcquireStartupLock(int device) {
  return DeviceStartupLock::Acquire(DeviceKey(device));
}

absl::StatusOr<std::unique_ptr<CudaForwardPass>> CudaForwardPass::Create(
    const common::GgufFile& gguf, const CudaForwardPassOptions& options) {
  LOOM_RETURN_IF_ERROR(ValidateForwardPassOptions(options));
  LOOM_ASSIGN_OR_RETURN(common::ModelConfig config, common::ModelConfigFromGguf(gguf));
  LOOM_RETURN_IF_ERROR(model::ValidateCudaModelConfig(config));
  LOOM_RETURN_IF_ERROR(model::ValidateCudaShard(config, options.tp_rank, options.tp_size));
  std::unique_ptr<DeviceStartupLock> startup_lock =
      options.startup_lock_held ? nullptr : AcquireStartupLock(options.device);
  LOOM_ASSIGN_OR_RETURN(const size_t free_at_start, SelectDevice(options));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<model::CudaDevice> device, MakeDevice(options));
  model::CudaDevice* cuda = device.get();
  model::LlamaGraphOptions graph_options;
  graph_options.defer_kv_cache = true;  // sized from the memory left once weights are in
  graph_options.block_size = options.block_size;
  auto state = std::make_unique<State>();
  state->device_index = options.device;
  state->free_at_start = free_at_start;
  state->startup_lock = std::move(startup_lock);
  if (options.pp_size > 1) {
    State* s = state.get();
    s->link = options.link;
    graph_options.receive = [s](model::Tensor residual, model::Tensor proj) {
      return s->ReceiveStage(residual, proj);
    };
    graph_options.send = [s](model::Tensor residual, model::Tensor proj) {
      return s->SendStage(residual, proj);
    };
  }
  // Weights: this rank's slice, read like the CPU forward pass's and uploaded layer by
  // layer, each host layer freed once it is on the device (the host never holds the whole
  // model: a BF16 checkpoint is F32 there). The device keeps INT4/INT5/INT8 layer matrices
  // quantized for the W4A16/W8A16 GEMM (options.quantized_weights; CudaDevice::UploadLinear
  // says which) and dequantizes every other one to dtype.
  std::string load_log;
  LOOM_ASSIGN_OR_RETURN(state->graph, model::LlamaGraph::CreateFromFile(
                                          gguf,
                                          {options.tp_rank, options.tp_size, options.pp_stage,
                                           options.pp_size, options.pp_layers},
                                          std::move(device), graph_options, &load_log));
  const int64_t num_layers = state->graph->shard().num_layers;
  state->device = cuda;
  if (options.fp8_weights) {
    absl::StrAppendFormat(&load_log,
                          "  layer matrices quantized to FP8 E4M3 (a scale per output channel) "
                          "for the FP8 GEMM; the embedding / LM head and routers as %s\n",
                          kc::DataTypeName(options.dtype));
  } else if (cuda->fp8_linears() > 0) {
    absl::StrAppendFormat(&load_log,
                          "  %d of %d layer matrices as the FP8 checkpoint stores them (its E4M3 "
                          "codes and scales) for the FP8 GEMM, the rest (and the embedding / LM "
                          "head) as %s\n",
                          cuda->fp8_linears(), 4 * num_layers, kc::DataTypeName(options.dtype));
  } else {
    absl::StrAppendFormat(
        &load_log,
        "  %d of %d layer matrices kept INT4/INT8 for the W4A16/W8A16 GEMM, the rest (and the "
        "embedding%s) dequantized to %s on the host\n",
        cuda->quantized_linears(), 4 * num_layers,
        cuda->lm_head_quantized() ? "; the LM head kept INT8/INT4" : " / LM head",
        kc::DataTypeName(options.dtype));
  }
  return Finish(std::move(state), options, std::move(load_log));
}

absl::StatusOr<std::unique_ptr<CudaForwardPass>> CudaForwardPass::CreateRandom(
    const common::ModelConfig& config, const CudaForwardPassOptions& options, uint64_t seed) {
  LOOM_RETURN_IF_ERROR(ValidateForwardPassOptions(options));
  LOOM_RETURN_IF_ERROR(ValidateRandomModelConfig(config));
  LOOM_RETURN_IF_ERROR(model::ValidateCudaModelConfig(config));
  if (options.tp_size > 1 || options.pp_size > 1) {
    return absl::InvalidArgumentError("CUDA runner: random models run on one rank only");
  }
  std::unique_ptr<DeviceStartupLock> startup_lock =
      options.startup_lock_held ? nullptr : AcquireStartupLock(options.device);
  LOOM_ASSIGN_OR_RETURN(const size_t free_at_start, SelectDevice(options));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<model::CudaDevice> device, MakeDevice(options));
  model::CudaDevice* cuda = device.get();
  model::LlamaGraphOptions graph_options;
  graph_options.defer_kv_cache = true;
  graph_options.block_size = options.block_size;
  auto state = std::make_unique<State>();
  state->device_index = options.device;
  state->free_at_start = free_at_start;
  state->startup_lock = std::move(startup_lock);
  LOOM_ASSIGN_OR_RETURN(state->graph, model::LlamaGraph::CreateRandom(config, std::move(device),
                                                                      graph_options, seed));
  state->device = cuda;
  std::string load_log = absl::StrFormat(
      "  random weights (seed %d) generated on the device in %s, uniform in +-1/sqrt(fan in), "
      "norms 1\n",
      seed, kc::DataTypeName(options.dtype));
  return Finish(std::move(state), options, std::move(load_log));
}

absl::StatusOr<std::unique_ptr<CudaForwardPass>> CudaForwardPass::Finish(
    std::unique_ptr<State> state, const CudaForwardPassOptions& options, std::string load_log) {
  State& s = *state;
  model::LlamaGraph& graph = *s.graph;
  model::CudaDevice& device = *s.device;
  s.config = graph.config();
  s.block_size = options.block_size;
  // A tensor-parallel group's collectives must be enqueued on the stream (NCCL) for a CUDA
  // graph to capture them; host-staged ones (gloo) synchronize, so graphs are off then, as
  // on pipeline stages and with mixture-of-experts layers (routed on the host).
  const bool moe = graph.config().num_experts > 0;
  s.use_graphs = options.cuda_graphs && options.pp_size == 1 && !moe &&
                 (device.world_size() == 1 || device.collectives_on_stream());
  s.graph_cache =
      std::make_unique<model::CudaGraphCache>(s.device, options.debug_fail_graph_captures);
  const common::ModelConfig& c = s.config;
  const common::ModelConfig local = model::LocalConfig(c, graph.shard());
  // Weights are uploaded and generated on the device's stream; wait for every stream
  // anyway before the first step (nothing else may still touch the new memory).
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));

  // Activations, workspaces and the step buffer before the KV pool, which takes a share of
  // what is left: max_num_tokens tokens, every decode bucket's rows and block tables.
  const int64_t max_tokens = std::max(options.max_num_tokens, kMaxGraphBatch);
  const int64_t max_blocks_per_seq = (c.context_length + s.block_size - 1) / s.block_size;
  const int64_t block_entries =
      std::min<int64_t>(kMaxGraphBatch * max_blocks_per_seq, int64_t{1} << 22);
  LOOM_RETURN_IF_ERROR(graph.Reserve(max_tokens, kMaxGraphBatch));
  model::CudaDevice::Capacity capacity;
  capacity.tokens = max_tokens;
  capacity.sample_rows = kMaxGraphBatch;
  capacity.width = c.hidden_size;
  capacity.step_elements = model::CudaDevice::StepElements(max_tokens, block_entries);
  // Every decode batch a step can hold, eager ones past the graphs' largest too: with few
  // KV heads per rank a batch above it may want more context splits' partials than any
  // graph batch, and growing the workspace then would drop every captured graph.
  capacity.decode_seqs = max_tokens;
  capacity.max_context_len = ContextBucket(c.context_length);
  capacity.num_heads = graph.shard().num_heads;
  capacity.num_kv_heads = graph.shard().num_kv_heads;
  capacity.head_dim = c.head_dim;
  capacity.gather_columns = c.vocab_size;
  LOOM_RETURN_IF_ERROR(device.Reserve(capacity));
  LOOM_RETURN_IF_ERROR(s.EnsureLogits(kMaxGraphBatch));

  // The KV pool: one extra block (the scratch block graph padding writes to and reads).
  const model::KvBlockSpec block = model::KvBlockOf(
      local, s.block_size, KvElementBytes(options.kv_dtype, options.kv_quant),
      KvDtypeName(options.kv_dtype, options.kv_quant), KvScaleBytes(options.kv_quant));
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  model::DeviceKvBudget budget;
  budget.num_blocks = options.num_kv_blocks;
  budget.free_fraction = options.kv_memory_fraction;
  budget.memory_utilization = options.gpu_memory_utilization;
  budget.companion_block_bytes = options.draft_kv_bytes_per_block;
  budget.companion_bytes = options.draft_device_bytes;
  const absl::StatusOr<int64_t> sized = model::DeviceKvBlocks(
      budget,
      {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes),
       static_cast<int64_t>(s.free_at_start)},
      block);
  if (!sized.ok()) {
    return absl::Status(sized.status().code(),
                        absl::StrCat("CUDA runner: ", sized.status().message()));
  }
  const int64_t num_blocks = *sized;
  s.num_blocks = num_blocks;
  s.scratch_block = num_blocks;
  LOOM_RETURN_IF_ERROR(graph.CreateKvCache(num_blocks + 1));  // zeroed on the stream
  LOOM_RETURN_IF_ERROR(device.Synchronize());
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  s.device_bytes =
      static_cast<int64_t>(s.free_at_start > free_bytes ? s.free_at_start - free_bytes : 0);
  s.startup_lock.reset();  // the next worker on this GPU may measure now

  absl::StrAppendFormat(
      &load_log,
      "  device %d: %s; model graph on the CUDA device (tensor parallel rank %d of %d); "
      "weights %.1f MiB, KV pool %d blocks x %d tokens (%s, %.1f MiB, +1 scratch block); "
      "CUDA graphs %s\n",
      options.device, kernels::CudaDeviceDescription(options.device), graph.shard().rank,
      graph.shard().size, static_cast<double>(device.weight_bytes()) / (1 << 20), num_blocks,
      s.block_size, block.dtype_name, static_cast<double>(num_blocks * block.bytes) / (1 << 20),
      s.use_graphs           ? "on"
      : !options.cuda_graphs ? "off"
      : options.pp_size > 1  ? "off (pipeline stage)"
      : moe                  ? "off (mixture of experts: routed on the host)"
                             : "off (tensor parallel)");

  std::unique_ptr<CudaForwardPass> forward_pass(new CudaForwardPass(std::move(state)));
  forward_pass->config_ = forward_pass->state_->config;
  forward_pass->num_kv_blocks_ = num_blocks;
  forward_pass->block_size_ = options.block_size;
  forward_pass->load_log_ = std::move(load_log);
  return forward_pass;
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
  absl::Status status = CudaStatus(cudaSetDevice(s.device_index), "cudaSetDevice");
  // A non-sticky error left by a call outside the step (a library's query, an unregister)
  // must not be blamed on the step's first kernel launch; a real fault is sticky and the
  // step's synchronization still reports it.
  (void)cudaGetLastError();
  if (status.ok()) status = run();
  // Out of memory and refused inputs enqueue nothing harmful; a pipeline neighbour's
  // failure or timeout (Aborted, from the link) leaves this stage's GPU as it was: the
  // next step may run. Anything else is a device error, and the runner stops.
  if (!status.ok() && status.code() != absl::StatusCode::kResourceExhausted &&
      status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kAborted) {
    s.broken = status;
  }
  return status;
}

absl::Status CudaForwardPass::Step(const StepBatch& batch, std::vector<float>& logits) {
  State& s = *state_;
  s.step_id = batch.step_id;
  s.received = s.sent = false;
  const absl::Status status = Guarded(batch, [&] { return s.RunStep(batch, logits); });
  if (!status.ok()) s.FinishFailedStep(batch.step_id, status);
  return status;
}

bool CudaForwardPass::returns_logits() const { return state_->graph->shard().last_stage(); }

void CudaForwardPass::SkipStep(uint64_t step_id, const absl::Status& why) {
  state_->received = state_->sent = false;
  state_->FinishFailedStep(step_id, why);
}

absl::Status CudaForwardPass::StepAndSample(const StepBatch& batch, const DeviceSampleRows& rows,
                                            std::vector<int32_t>& tokens,
                                            std::vector<float>& logprobs,
                                            std::vector<float>& logits) {
  State& s = *state_;
  s.step_id = batch.step_id;
  s.received = s.sent = false;
  const absl::Status status = Guarded(batch, [&]() -> absl::Status {
    LOOM_RETURN_IF_ERROR(ValidateDeviceSampleRows(batch, rows));
    // What the verify kernel would answer with -1 (breaking the runner): refused here.
    const int64_t vocab = s.config.vocab_size;
    for (const DeviceSampleRows::DraftVerify& v : rows.verifies) {
      const bool in_vocab = std::all_of(v.drafts.begin(), v.drafts.end(),
                                        [&](int32_t t) { return t >= 0 && t < vocab; });
      if (!in_vocab || v.draft_probs.size() != v.drafts.size() * static_cast<size_t>(vocab)) {
        return absl::InvalidArgumentError(
            "a draft verification's drafts are outside the vocabulary or its distributions "
            "are not [drafts, vocab]");
      }
    }
    return s.RunStep(batch, logits, &rows, &tokens, &logprobs);
  });
  if (!status.ok()) s.FinishFailedStep(batch.step_id, status);
  return status;
}

const model::KvCache* CudaForwardPass::kv_pool() const {
  return num_kv_blocks_ == 0 ? nullptr : &state_->graph->kv_cache();  // none after a failed resize
}

int64_t CudaForwardPass::device_bytes() const { return state_->device_bytes; }

absl::Status CudaForwardPass::ResizeKvPool(int64_t num_blocks) {
  State& s = *state_;
  const model::CudaGraphStats& steps = s.graph_cache->stats();
  if (steps.eager_steps + steps.graph_replays > 0) {
    return absl::FailedPreconditionError("CUDA runner: the KV pool is resized before any step");
  }
  if (num_blocks < 1 || num_blocks >= model::MaxKvBlocks(block_size_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: a KV pool of %d blocks of %d tokens", num_blocks, block_size_));
  }
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(s.device_index), "cudaSetDevice"));
  // The old pool goes first, so the new one can take its memory. A failure leaves no pool:
  // the caller (a worker starting) gives up.
  num_kv_blocks_ = 0;
  LOOM_RETURN_IF_ERROR(s.graph->ReplaceKvCache(num_blocks + 1));  // zeroed on the stream
  LOOM_RETURN_IF_ERROR(s.device->Synchronize());
  num_kv_blocks_ = num_blocks;
  s.num_blocks = num_blocks;
  s.scratch_block = num_blocks;
  return absl::OkStatus();
}

CudaForwardPass::Stats CudaForwardPass::stats() const {
  const model::CudaGraphStats& graphs = state_->graph_cache->stats();
  Stats stats;
  stats.eager_steps = graphs.eager_steps;
  stats.graph_captures = graphs.graph_captures;
  stats.graph_replays = graphs.graph_replays;
  stats.graph_capture_failures = graphs.graph_capture_failures;
  if (state_->link != nullptr) stats.pipeline_wait_seconds = state_->link->wait_seconds();
  return stats;
}

#endif  // LOOM_HAVE_CUDA

}  // namespace loom::worker
