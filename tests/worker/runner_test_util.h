#pragma once

// Greedy decoding straight on a CpuForwardPass, for tests that compare runners (quantized vs not, one
// rank vs several) token for token.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gguf_file.h"
#include "worker/cpu_forward_pass.h"
#include "worker/step_batch.h"

namespace loom::worker::test_util {

/// A CPU CpuForwardPass over `gguf` with `num_kv_blocks` blocks of `block_size` slots on
/// `num_threads` threads; null (and a test failure) when it cannot be created.
inline std::unique_ptr<CpuForwardPass> MakeCpuRunner(const common::GgufFile& gguf,
                                                  int64_t num_kv_blocks, int64_t block_size,
                                                  int num_threads = 1) {
  CpuForwardPassOptions options;
  options.num_threads = num_threads;
  options.num_kv_blocks = num_kv_blocks;
  options.block_size = block_size;
  absl::StatusOr<std::unique_ptr<CpuForwardPass>> runner = CpuForwardPass::Create(gguf, options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

/// Greedy generation of `steps` tokens after `prompt` as one sequence in blocks 0-3 (of 16 slots):
/// one prefill step, then decodes. Appends the tokens to `tokens` and returns the prefill's logits
/// (its last row) in `first_logits`.
inline absl::Status GreedyDecode(CpuForwardPass& runner, const std::vector<int32_t>& prompt, int steps,
                                 std::vector<int32_t>& tokens, std::vector<float>& first_logits) {
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  std::vector<int32_t> sequence = prompt;
  std::vector<float> logits;
  for (int step = 0; step < steps; ++step) {
    StepBatch batch;
    const int32_t computed = step == 0 ? 0 : static_cast<int32_t>(sequence.size()) - 1;
    const std::vector<int32_t> fresh(sequence.begin() + computed, sequence.end());
    if (absl::Status added = AppendSequence(batch, fresh, computed, blocks, 16, true);
        !added.ok()) {
      return added;
    }
    if (absl::Status ran = runner.Step(batch, logits); !ran.ok()) return ran;
    if (step == 0) first_logits = logits;
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    tokens.push_back(next);
    sequence.push_back(next);
  }
  return absl::OkStatus();
}

}  // namespace loom::worker::test_util
