#include "kernels/cuda/speculative_verify.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace loom::kernels::cuda {

absl::Status CheckSpeculativeVerifyParams(const SpeculativeVerifyParams& p) {
  if (p.num_seqs < 0 || p.num_seqs > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SpeculativeVerify: num_seqs %d must be in [0, 2^31)", p.num_seqs));
  }
  if (p.vocab < 1 || p.vocab > kSpeculativeVerifyMaxVocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SpeculativeVerify: vocab %d must be in [1, %d]", p.vocab, kSpeculativeVerifyMaxVocab));
  }
  if (p.num_seqs == 0) return absl::OkStatus();
  struct Required {
    const void* pointer;
    const char* name;
  };
  for (const Required& field : {Required{p.target_probs, "target_probs"},
                                Required{p.uniforms, "uniforms"},
                                Required{p.row_start, "row_start"},
                                Required{p.row_start_host, "row_start_host"},
                                Required{p.greedy, "greedy"},
                                Required{p.num_accepted, "num_accepted"},
                                Required{p.next_token, "next_token"}}) {
    if (field.pointer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("SpeculativeVerify: %s is null", field.name));
    }
  }
  if (p.row_start_host[0] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SpeculativeVerify: row_start[0] is %d, must be 0", p.row_start_host[0]));
  }
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    // In int64: a decreasing row_start must not wrap.
    const int64_t rows = int64_t{p.row_start_host[s + 1]} - p.row_start_host[s];
    if (rows < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SpeculativeVerify: row_start gives sequence %d %d target rows (needs k + 1 >= 1)", s,
          rows));
    }
  }
  const int64_t num_rows = p.row_start_host[p.num_seqs];
  if (num_rows * p.vocab > (int64_t{1} << 62)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SpeculativeVerify: %d rows of vocab %d overflow the offsets", num_rows, p.vocab));
  }
  if (num_rows > p.num_seqs && p.draft_tokens == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SpeculativeVerify: draft_tokens is null with %d draft rows", num_rows - p.num_seqs));
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchSpeculativeVerify(const SpeculativeVerifyParams& params, cudaStream_t) {
  if (absl::Status status = CheckSpeculativeVerifyParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("SpeculativeVerify: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
