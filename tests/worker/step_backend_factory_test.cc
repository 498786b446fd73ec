#include "worker/step_backend_factory.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/formats/gguf_file.h"
#include "tests/common/gguf_test_util.h"

namespace loom::worker {
namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_1 = 3, kBF16 = 30;  // ggml type ids

// A GGUF holding one [32, 32] matrix of `matrix_type` and one 32-vector of `vector_type`.
std::unique_ptr<common::GgufFile> Checkpoint(uint32_t matrix_type, uint32_t vector_type,
                                             const std::string& architecture = "llama") {
  common::testing::GgufImageBuilder builder;
  builder.KvString("general.architecture", architecture)
      .Tensor("blk.0.attn_q.weight", {32, 32}, matrix_type)
      .Tensor("blk.0.attn_norm.weight", {32}, vector_type);
  absl::StatusOr<std::unique_ptr<common::GgufFile>> gguf =
      common::GgufFile::FromBytes(builder.Build());
  EXPECT_TRUE(gguf.ok()) << gguf.status();
  return gguf.ok() ? std::move(*gguf) : nullptr;
}

// BF16 checkpoints run in BF16 on CUDA (in F16 their activations can pass 65504 and become
// inf); everything else in F16, as vLLM's --dtype auto.
TEST(CudaComputeDtypeTest, Bf16CheckpointsComputeInBf16) {
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kBF16, kF32)), kernels::cuda::DataType::kBF16);
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kBF16, kBF16)), kernels::cuda::DataType::kBF16);
}

// Gemma 2 and 3 activations pass F16's range (inf, then NaN in the residual stream): BF16
// whatever the weights are stored in.
TEST(CudaComputeDtypeTest, GemmaComputesInBf16) {
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kQ4_1, kF32, "gemma3")), kernels::cuda::DataType::kBF16);
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kF16, kF32, "gemma2")), kernels::cuda::DataType::kBF16);
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kF16, kF32, "qwen3")), kernels::cuda::DataType::kF16);
}

// A CUDA pool of a BF16 model holds BF16 rows where the CPU's holds F16 of the same size:
// registered as such, no replica moves KV between the two.
TEST(KvPoolDtypeNameTest, ACudaPoolOfABf16ModelIsBf16) {
  using kernels::cpu::KvDtype;
  EXPECT_EQ(KvPoolDtypeName("cuda", KvDtype::kF16, *Checkpoint(kBF16, kF32)), "bf16");
  EXPECT_EQ(KvPoolDtypeName("cpu", KvDtype::kF16, *Checkpoint(kBF16, kF32)), "f16");
  EXPECT_EQ(KvPoolDtypeName("cuda", KvDtype::kF16, *Checkpoint(kF16, kF32)), "f16");
  EXPECT_EQ(KvPoolDtypeName("cuda", KvDtype::kInt8, *Checkpoint(kBF16, kF32)), "int8");
  EXPECT_EQ(KvPoolDtypeName("cpu", KvDtype::kBf16, *Checkpoint(kF16, kF32)), "bf16");
}

// vLLM's `auto` KV type is the compute type's: BF16 on the CPU under --activations bf16, F16
// otherwise (CUDA keeps a BF16 model's F16-named pool in BF16 itself); a type given stays.
TEST(ResolveKvDtypeTest, AutoFollowsTheComputeTypeAndAGivenTypeStays) {
  using kernels::cpu::ActivationPrecision;
  using kernels::cpu::KvDtype;
  EXPECT_EQ(ResolveKvDtype(KvDtype::kF16, true, "cpu", ActivationPrecision::kBf16), KvDtype::kBf16);
  EXPECT_EQ(ResolveKvDtype(KvDtype::kF16, true, "cpu", ActivationPrecision::kF32), KvDtype::kF16);
  EXPECT_EQ(ResolveKvDtype(KvDtype::kF16, true, "cpu", ActivationPrecision::kInt8), KvDtype::kF16);
  EXPECT_EQ(ResolveKvDtype(KvDtype::kF16, true, "cuda", ActivationPrecision::kBf16), KvDtype::kF16);
  EXPECT_EQ(ResolveKvDtype(KvDtype::kF16, false, "cpu", ActivationPrecision::kBf16), KvDtype::kF16);
  EXPECT_EQ(ResolveKvDtype(KvDtype::kInt8, false, "cpu", ActivationPrecision::kBf16),
            KvDtype::kInt8);
  EXPECT_EQ(ResolveKvDtype(KvDtype::kBf16, false, "cpu", ActivationPrecision::kF32),
            KvDtype::kBf16);
}

// --kv-dtype bf16 on CUDA: the pool a BF16 model has anyway; an F16 model's is refused by
// name (the CUDA KV cache takes the compute type).
TEST(CudaForwardPassOptionsOfTest, Bf16KvNeedsABf16Model) {
  StepBackendOptions options;
  options.kv_dtype = kernels::cpu::KvDtype::kBf16;
  absl::StatusOr<CudaForwardPassOptions> bf16 =
      CudaForwardPassOptionsOf(options, *Checkpoint(kBF16, kF32));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->kv_dtype, kernels::cuda::DataType::kBF16);
  EXPECT_EQ(bf16->kv_quant, kernels::cuda::KvQuant::kNone);
  absl::StatusOr<CudaForwardPassOptions> f16 =
      CudaForwardPassOptionsOf(options, *Checkpoint(kF16, kF32));
  ASSERT_FALSE(f16.ok());
  EXPECT_EQ(f16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f16.status().message().find("--kv-dtype bf16"), std::string::npos) << f16.status();
}

TEST(CudaComputeDtypeTest, F16F32AndQuantizedCheckpointsComputeInF16) {
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kF16, kF32)), kernels::cuda::DataType::kF16);
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kF32, kF32)), kernels::cuda::DataType::kF16);
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kQ4_1, kF32)), kernels::cuda::DataType::kF16);
  // A BF16 norm vector alone does not make the matrices' activations BF16.
  EXPECT_EQ(CudaComputeDtype(*Checkpoint(kQ4_1, kBF16)), kernels::cuda::DataType::kF16);
}

// --quantization fp8 needs FP8 tensor cores: the CPU refuses it by name, before loading.
TEST(CreateStepBackendTest, Fp8WeightsOnTheCpuAreRefusedWithTheReason) {
  StepBackendOptions options;
  options.device = "cpu";
  options.fp8_weights = true;
  const auto checkpoint = Checkpoint(kF16, kF32);
  absl::StatusOr<std::unique_ptr<StepBackend>> backend =
      CreateStepBackend(options, *checkpoint, common::ModelConfig(), nullptr);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("--quantization fp8"), std::string::npos)
      << backend.status();
  EXPECT_NE(backend.status().message().find("int8 or int4"), std::string::npos) << backend.status();
}

}  // namespace
}  // namespace loom::worker
