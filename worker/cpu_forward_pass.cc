#include "worker/cpu_forward_pass.h"

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/weights.h"

namespace loom::worker {

absl::StatusOr<std::unique_ptr<CpuForwardPass>> CpuForwardPass::Create(
    const common::GgufFile& gguf, const CpuForwardPassOptions& options) {
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError("the model runner needs at least one thread");
  }
  if (options.tp_size > 1 &&
      (options.communicator == nullptr || options.communicator->world_size() != options.tp_size ||
       options.communicator->rank() != options.tp_rank)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor parallel rank %d of %d needs a communicator of that rank and size",
        options.tp_rank, options.tp_size));
  }
  LOOM_RETURN_IF_ERROR(PipelineLink::CheckStage(options.link, options.pp_stage, options.pp_size));
  // Q5_0 as INT8 or INT5, the faster form of the same values for these kernels
  // (bench/results/cpu_kernels_{avx2,avx512}_{gemv,gemm}.json, 2 threads): INT8 for float
  // activations on AVX2 (GEMV 15.4 against INT5's 12.4 G weights/s) and for int8 ones on
  // AVX-512 (VNNI takes INT8 bytes as they are: prefill GEMM ~1.3x INT5's, GEMV even);
  // INT5 for float activations on AVX-512 (GEMV 18.4 against 16.5) and int8 ones on AVX2
  // (GEMV 18.7 against 13.9), prefill even.
  const bool avx512 = kernels::cpu::ActiveCpuIsa() >= kernels::cpu::CpuIsa::kAvx512;
  const bool int8_activations = options.activations == kernels::cpu::ActivationPrecision::kInt8;
  kernels::cpu::PackOptions pack;
  pack.q5_0_as_int8 = avx512 == int8_activations;
  // bf16 activations multiply F16/F32 weights as BF16: held so, the AMX kernel reads them as
  // they are (kernels/cpu/weights.h).
  pack.floats_as_bf16 = options.activations == kernels::cpu::ActivationPrecision::kBf16;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelWeights> weights,
                        model::LoadModelWeights(gguf,
                                                {options.tp_rank, options.tp_size, options.pp_stage,
                                                 options.pp_size, options.pp_layers},
                                                pack));
  model::CpuDeviceOptions device_options;
  device_options.thread_pool = options.thread_pool;
  device_options.num_threads = options.num_threads;
  device_options.kv_dtype = options.kv_dtype;
  device_options.share_kv_pool = options.share_kv_pool;
  device_options.activations = options.activations;
  device_options.communicator = options.tp_size > 1 ? options.communicator : nullptr;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<model::CpuDevice> device,
                        model::CpuDevice::Create(device_options));
  std::unique_ptr<CpuForwardPass> forward_pass(new CpuForwardPass());
  forward_pass->device_ = device.get();
  model::LlamaGraphOptions graph_options;
  graph_options.num_kv_blocks = options.num_kv_blocks;
  graph_options.block_size = options.block_size;
  {
    CpuForwardPass* pass = forward_pass.get();
    graph_options.on_half_layer = [pass, progress = options.progress] {
      if (progress != nullptr) progress->Advance();
      if (pass->half_layer_observer_) pass->half_layer_observer_();
    };
  }
  if (options.pp_size > 1) {
    CpuForwardPass* pass = forward_pass.get();
    pass->link_ = options.link;
    auto floats = [](model::Tensor t) {
      return absl::MakeSpan(static_cast<float*>(t.data), static_cast<size_t>(t.numel()));
    };
    graph_options.receive = [pass, floats](model::Tensor residual, model::Tensor proj) {
      pass->received_ = true;
      return pass->link_->Receive(pass->step_id_, floats(residual), floats(proj));
    };
    graph_options.send = [pass, floats](model::Tensor residual, model::Tensor proj) {
      pass->sent_ = true;
      return pass->link_->Send(pass->step_id_, floats(residual), floats(proj));
    };
  }
  LOOM_ASSIGN_OR_RETURN(
      forward_pass->graph_,
      model::LlamaGraph::Create(std::move(weights), std::move(device), graph_options));
  return forward_pass;
}

absl::Status CpuForwardPass::Step(const StepBatch& batch, std::vector<float>& logits) {
  return TrackedStep(batch, logits, nullptr);
}

absl::Status CpuForwardPass::StepWithHidden(const StepBatch& batch, std::vector<float>& logits,
                                            std::vector<float>& hidden) {
  return TrackedStep(batch, logits, &hidden);
}

absl::Status CpuForwardPass::TrackedStep(const StepBatch& batch, std::vector<float>& logits,
                                         std::vector<float>* hidden) {
  step_id_ = batch.step_id;
  received_ = sent_ = false;
  absl::Status status = RunStep(batch, logits, hidden);
  if (!status.ok()) FinishFailedStep(batch.step_id, status);
  return status;
}

void CpuForwardPass::SkipStep(uint64_t step_id, const absl::Status& why) {
  received_ = sent_ = false;
  FinishFailedStep(step_id, why);
}

void CpuForwardPass::FinishFailedStep(uint64_t step_id, const absl::Status& why) {
  if (link_ == nullptr) return;
  // Errors here leave the link broken; the next step reports them.
  if (link_->has_previous() && !received_) (void)link_->Discard(step_id);
  if (link_->has_next() && !sent_) (void)link_->SendFailure(step_id, why);
}

absl::Status CpuForwardPass::RunStep(const StepBatch& batch, std::vector<float>& logits,
                                     std::vector<float>* hidden) {
  const common::ModelConfig& c = graph_->config();
  LOOM_RETURN_IF_ERROR(ValidateStepBatch(batch, c.vocab_size, c.context_length,
                                         num_kv_blocks(), block_size()));
  LOOM_ASSIGN_OR_RETURN(
      model::StepTensors step,
      device_->UploadStep(batch.token_ids, batch.positions, batch.slots, batch.query_start,
                          batch.context_len, batch.block_indptr, batch.block_indices,
                          batch.sample_rows));
  const int64_t rows = returns_logits() ? step.num_sample_rows : 0;
  logits.resize(rows * c.vocab_size);
  // The CPU device writes the logits straight into the caller's vector.
  const model::Tensor logits_tensor = model::Tensor::Of(
      logits.data(), model::DType::kF32, model::DeviceType::kCpu, {rows, c.vocab_size});
  if (hidden == nullptr) return graph_->Forward(step, logits_tensor);
  hidden->resize(rows * c.hidden_size);
  return graph_->Forward(step, logits_tensor,
                         model::Tensor::Of(hidden->data(), model::DType::kF32,
                                           model::DeviceType::kCpu, {rows, c.hidden_size}));
}

}  // namespace loom::worker
