#include "worker/step_backend_factory.h"

#include <string_view>
#include <utility>
#include <vector>

#include "common/formats/hf_quantization.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "worker/cpu_forward_pass.h"
#include "worker/cuda_forward_pass.h"
#include "worker/model_step_backend.h"
#include "worker/noop_backend.h"

namespace loom::worker {

kernels::cuda::DataType CudaComputeDtype(const common::GgufFile& gguf) {
  // Gemma's activations pass F16's range whatever its weights are stored in (as for
  // Transformers, BF16 is its dtype).
  if (absl::StatusOr<std::string_view> architecture = gguf.GetString("general.architecture");
      architecture.ok() && architecture->substr(0, 5) == "gemma") {
    return kernels::cuda::DataType::kBF16;
  }
  for (const common::GgufTensorInfo& tensor : gguf.tensors()) {
    if (tensor.type == common::GgmlType::kBF16 && tensor.shape.size() >= 2) {
      return kernels::cuda::DataType::kBF16;
    }
  }
  return kernels::cuda::DataType::kF16;
}

kernels::cpu::KvDtype ResolveKvDtype(kernels::cpu::KvDtype kv_dtype, bool kv_dtype_auto,
                                     std::string_view device,
                                     kernels::cpu::ActivationPrecision activations) {
  if (!kv_dtype_auto) return kv_dtype;
  return device == "cpu" && activations == kernels::cpu::ActivationPrecision::kBf16
             ? kernels::cpu::KvDtype::kBf16
             : kernels::cpu::KvDtype::kF16;
}

std::string KvPoolDtypeName(std::string_view backend_name, kernels::cpu::KvDtype kv_dtype,
                            const common::GgufFile& gguf) {
  if (backend_name == "cuda" && kv_dtype == kernels::cpu::KvDtype::kF16 &&
      CudaComputeDtype(gguf) == kernels::cuda::DataType::kBF16) {
    return "bf16";
  }
  return kernels::cpu::KvDtypeName(kv_dtype);
}

namespace {

// Tensor and pipeline parallelism: the same fields on both forward passes' options.
template <typename PassOptions>
void SetParallelism(const StepBackendOptions& options, PassOptions& pass) {
  pass.tp_rank = options.tp_rank;
  pass.tp_size = options.tp_size;
  pass.communicator = options.communicator;
  pass.pp_stage = options.pp_stage;
  pass.pp_size = options.pp_size;
  pass.pp_layers = options.pp_layers;
  pass.link = options.link;
}

}  // namespace

CpuForwardPassOptions CpuForwardPassOptionsOf(const StepBackendOptions& options) {
  CpuForwardPassOptions pass_options;
  pass_options.num_threads = options.num_threads;
  pass_options.num_kv_blocks = options.num_kv_blocks;
  pass_options.block_size = options.block_size;
  pass_options.kv_dtype = options.kv_dtype;
  pass_options.share_kv_pool = options.share_kv_pool;
  pass_options.activations = options.activations;
  SetParallelism(options, pass_options);
  pass_options.thread_pool = options.thread_pool;
  pass_options.progress = options.progress;
  return pass_options;
}

absl::StatusOr<CudaForwardPassOptions> CudaForwardPassOptionsOf(const StepBackendOptions& options,
                                                                const common::GgufFile& gguf) {
  CudaForwardPassOptions cuda_options;
  cuda_options.num_kv_blocks = options.num_kv_blocks;
  cuda_options.kv_memory_fraction = options.kv_memory_fraction;
  cuda_options.gpu_memory_utilization = options.gpu_memory_utilization;
  cuda_options.block_size = options.block_size;
  cuda_options.cuda_graphs = options.cuda_graphs;
  cuda_options.max_num_tokens = options.max_num_tokens;
  cuda_options.device = options.gpu_index;
  SetParallelism(options, cuda_options);
  cuda_options.dtype = CudaComputeDtype(gguf);
  cuda_options.kv_dtype = cuda_options.dtype;
  switch (options.kv_dtype) {
    case kernels::cpu::KvDtype::kInt8:
      cuda_options.kv_quant = kernels::cuda::KvQuant::kInt8;
      break;
    case kernels::cpu::KvDtype::kFp8E4m3:
      cuda_options.kv_quant = kernels::cuda::KvQuant::kFp8E4m3;
      break;
    case kernels::cpu::KvDtype::kF32:
      return absl::InvalidArgumentError(
          "--kv-dtype f32 is CPU-only (the CUDA kernels read f16, int8 or fp8_e4m3 KV)");
    case kernels::cpu::KvDtype::kBf16:
      if (cuda_options.dtype != kernels::cuda::DataType::kBF16) {
        return absl::InvalidArgumentError(
            "--kv-dtype bf16 on CUDA needs a BF16 model: the CUDA KV cache takes the model's "
            "compute type (bf16 for BF16 weights, f16 otherwise); use --kv-dtype f16 or "
            "--device cpu");
      }
      break;
    default:
      break;
  }
  cuda_options.fp8_weights = options.fp8_weights;
  cuda_options.fp8_checkpoint = options.fp8_checkpoints && common::HasFp8RowScales(gguf);
  cuda_options.draft_kv_bytes_per_block = options.draft_kv_bytes_per_block;
  cuda_options.draft_device_bytes = options.draft_device_bytes;
  cuda_options.startup_lock_held = options.startup_lock_held;
  return cuda_options;
}

absl::StatusOr<std::unique_ptr<StepBackend>> CreateStepBackend(const StepBackendOptions& options,
                                                               const common::GgufFile& gguf,
                                                               const common::ModelConfig& config,
                                                               std::string* load_log) {
  if (options.kind == "noop") {
    // It steps past the model's end-of-generation ids, so sequences run to their limit.
    absl::StatusOr<std::unique_ptr<common::Tokenizer>> tokenizer =
        common::Tokenizer::FromGguf(gguf);
    std::vector<int32_t> end_ids;
    if (tokenizer.ok()) end_ids = (*tokenizer)->EndOfGenerationIds();
    return std::make_unique<NoopBackend>(config, options.num_kv_blocks, options.block_size,
                                         std::move(end_ids));
  }
  if (options.kind != "model") {
    return absl::InvalidArgumentError("unknown step backend '" + options.kind + "' (model or noop)");
  }
  if (options.device == "cuda") {
    LOOM_ASSIGN_OR_RETURN(const CudaForwardPassOptions cuda_options,
                          CudaForwardPassOptionsOf(options, gguf));
    absl::StatusOr<std::unique_ptr<CudaForwardPass>> forward_pass =
        CudaForwardPass::Create(gguf, cuda_options);
    if (!forward_pass.ok()) return forward_pass.status();
    if (load_log != nullptr) *load_log = (*forward_pass)->load_log();
    return std::make_unique<ModelStepBackend>(*std::move(forward_pass), "cuda");
  }
  if (options.device != "cpu") {
    return absl::InvalidArgumentError("unknown device '" + options.device + "' (cpu or cuda)");
  }
  if (options.fp8_weights) {
    return absl::InvalidArgumentError(
        "--quantization fp8 runs on CUDA devices with FP8 tensor cores (compute capability "
        "8.9 or newer); the CPU has no FP8 GEMM: use int8 or int4, or --device cuda");
  }
  absl::StatusOr<std::unique_ptr<CpuForwardPass>> forward_pass =
      CpuForwardPass::Create(gguf, CpuForwardPassOptionsOf(options));
  if (!forward_pass.ok()) return forward_pass.status();
  if (load_log != nullptr) *load_log = (*forward_pass)->weights().load_log;
  return std::make_unique<ModelStepBackend>(*std::move(forward_pass), "cpu");
}

}  // namespace loom::worker
