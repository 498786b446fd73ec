#pragma once

// CPU forward passes for tests, and greedy generation through the serving engine for tests that
// compare forward passes (quantized vs not, one rank vs several) token for token.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/local_engine.h"
#include "common/formats/gguf_file.h"
#include "common/tokenizer/tokenizer.h"
#include "worker/cpu_forward_pass.h"
#include "worker/model_step_backend.h"

namespace loom::worker::test_util {

/// A CPU CpuForwardPass over `gguf` with `num_kv_blocks` blocks of `block_size` slots on
/// `num_threads` threads; null (and a test failure) when it cannot be created.
inline std::unique_ptr<CpuForwardPass> MakeCpuForwardPass(
    const common::GgufFile& gguf, int64_t num_kv_blocks, int64_t block_size, int num_threads = 1,
    kernels::cpu::KvDtype kv_dtype = kernels::cpu::KvDtype::kF16) {
  CpuForwardPassOptions options;
  options.num_threads = num_threads;
  options.num_kv_blocks = num_kv_blocks;
  options.block_size = block_size;
  options.kv_dtype = kv_dtype;
  absl::StatusOr<std::unique_ptr<CpuForwardPass>> forward_pass =
      CpuForwardPass::Create(gguf, options);
  EXPECT_TRUE(forward_pass.ok()) << forward_pass.status();
  return forward_pass.ok() ? *std::move(forward_pass) : nullptr;
}

/// What the serving engine (cli/local_engine: scheduler, block manager, step executor)
/// makes of one prompt on a forward pass: the greedy tokens and, in this order, the
/// log-probability of every prompt token after the first (prompt scoring) and of each
/// generated token.
struct EngineTrace {
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
};

/// Generates `steps` greedy tokens after `prompt` (EOS ignored) through a LocalEngine over
/// `forward pass` (moved into a ModelStepBackend), for tests that compare forward passes (quantized
/// vs not, one rank vs several): every rank of a tensor-parallel group runs its own
/// engine, whose identical plans keep the ranks in step.
inline absl::StatusOr<EngineTrace> GreedyThroughEngine(std::unique_ptr<CpuForwardPass> forward_pass,
                                                       const common::Tokenizer& tokenizer,
                                                       const std::vector<int32_t>& prompt,
                                                       int steps) {
  ModelStepBackend backend(std::move(forward_pass));
  cli::LocalEngine engine(backend, tokenizer);
  cli::EngineRequest request;
  request.prompt_ids = prompt;
  request.sampling.temperature = 0.0f;
  request.sampling.num_logprobs = 0;
  request.max_tokens = steps;
  request.ignore_eos = true;
  request.score_prompt_from = 1;
  absl::StatusOr<std::vector<cli::EngineResult>> results = engine.Generate({request});
  if (!results.ok()) return results.status();
  EngineTrace trace;
  const cli::EngineResult& result = (*results)[0];
  trace.tokens = result.token_ids();
  trace.logprobs = result.prompt_logprobs;
  for (const loom::v1::SequenceOutput& output : result.outputs) {
    trace.logprobs.push_back(output.logprob());
  }
  return trace;
}

}  // namespace loom::worker::test_util
