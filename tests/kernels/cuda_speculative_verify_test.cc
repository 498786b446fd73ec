#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/speculative_verify.h"
#include "kernels/cuda/speculative_verify.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::UploadRaw;

// ---------------------------------------------------------------- random batches

struct Batch {
  int64_t num_seqs = 0;
  int64_t vocab = 0;
  std::vector<int32_t> row_start;      // [num_seqs + 1]
  std::vector<uint8_t> greedy;         // [num_seqs]
  std::vector<float> target;           // [num_rows, vocab]
  std::vector<float> draft;            // [num_rows - num_seqs, vocab] (empty: one-hot)
  std::vector<int32_t> draft_tokens;   // [num_rows - num_seqs]
  std::vector<float> uniforms;         // [num_rows]
  std::vector<float> sample_uniforms;  // [num_rows] (empty: none)
};

// A float uniform in [0, 1) (24 random bits, so never 1).
float Uniform(std::mt19937_64& rng) { return static_cast<float>(rng() >> 40) * 0x1p-24f; }

std::vector<float> Softmax(const std::vector<double>& logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  std::vector<double> w(logits.size());
  for (size_t v = 0; v < w.size(); ++v) total += (w[v] = std::exp(logits[v] - max));
  std::vector<float> p(w.size());
  for (size_t v = 0; v < w.size(); ++v) p[v] = static_cast<float>(w[v] / total);
  return p;
}

int32_t ArgmaxOf(const std::vector<float>& p) {
  return static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
}

int32_t SampleOf(std::mt19937_64& rng, const std::vector<float>& p) {
  std::discrete_distribution<int32_t> draw(p.begin(), p.end());
  return draw(rng);
}

// Draft and target rows from related random logits (the target is the draft's logits plus
// noise, so drafts are often accepted); some rows peaked, some greedy rows with exact ties.
Batch RandomBatch(int64_t num_seqs, int64_t vocab, bool with_draft_probs,
                  bool with_sample_uniforms, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Batch b;
  b.num_seqs = num_seqs;
  b.vocab = vocab;
  b.row_start.push_back(0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t k = static_cast<int32_t>(rng() % 9);  // 0..8, ragged
    b.row_start.push_back(b.row_start.back() + k + 1);
    b.greedy.push_back(rng() % 3 == 0 ? 1 : 0);
    const double scale = std::vector<double>{1.0, 3.0, 10.0}[rng() % 3];  // 10: peaked
    for (int32_t i = 0; i <= k; ++i) {
      std::vector<double> draft_logits(vocab), target_logits(vocab);
      for (int64_t v = 0; v < vocab; ++v) {
        draft_logits[v] = scale * normal(rng);
        target_logits[v] = draft_logits[v] + 0.5 * scale * normal(rng);
      }
      std::vector<float> p = Softmax(target_logits);
      if (b.greedy[s] && rng() % 4 == 0) {  // an exact tie for the argmax
        const int32_t best = ArgmaxOf(p);
        p[rng() % vocab] = p[best];
      }
      b.target.insert(b.target.end(), p.begin(), p.end());
      if (i == k) break;  // the bonus row has no draft
      const std::vector<float> q = Softmax(draft_logits);
      if (with_draft_probs) b.draft.insert(b.draft.end(), q.begin(), q.end());
      int32_t token;
      if (b.greedy[s]) {
        token = rng() % 5 != 0 ? ArgmaxOf(p) : static_cast<int32_t>(rng() % vocab);
      } else if (with_draft_probs) {
        token = SampleOf(rng, q);
      } else {
        token = rng() % 4 != 0 ? SampleOf(rng, p) : static_cast<int32_t>(rng() % vocab);
      }
      b.draft_tokens.push_back(token);
    }
  }
  const int64_t num_rows = b.row_start.back();
  for (int64_t r = 0; r < num_rows; ++r) b.uniforms.push_back(Uniform(rng));
  if (with_sample_uniforms) {
    for (int64_t r = 0; r < num_rows; ++r) b.sample_uniforms.push_back(Uniform(rng));
  }
  return b;
}

struct Result {
  std::vector<int32_t> num_accepted, next_token;
};

Result RunCpu(const Batch& b) {
  Result r;
  r.num_accepted.assign(b.num_seqs, -2);
  r.next_token.assign(b.num_seqs, -2);
  cpu::SpeculativeVerifyParams p;
  p.target_probs = b.target.data();
  p.draft_probs = b.draft.empty() ? nullptr : b.draft.data();
  p.draft_tokens = b.draft_tokens.data();
  p.uniforms = b.uniforms.data();
  p.sample_uniforms = b.sample_uniforms.empty() ? nullptr : b.sample_uniforms.data();
  p.row_start = b.row_start.data();
  p.greedy = b.greedy.data();
  p.num_seqs = b.num_seqs;
  p.vocab = b.vocab;
  p.num_accepted = r.num_accepted.data();
  p.next_token = r.next_token.data();
  EXPECT_TRUE(cpu::SpeculativeVerify(p).ok());
  return r;
}

// How close (relative to the distribution's total) the CPU's draw for sequence s came to
// either CDF boundary of the token it drew; infinity when no draw decided the token
// (greedy). Recomputes the CPU's weights and sequential double sums.
double DrawMargin(const Batch& b, int64_t s, int32_t accepted, int32_t next) {
  if (b.greedy[s]) return INFINITY;
  const int32_t first_row = b.row_start[s];
  const int32_t k = b.row_start[s + 1] - first_row - 1;
  const int64_t vocab = b.vocab;
  const float* target = b.target.data() + (first_row + accepted) * vocab;
  std::vector<double> weights(vocab);
  double u;
  if (accepted < k) {
    const int64_t draft_row = first_row - s + accepted;
    const float* draft = b.draft.empty() ? nullptr : b.draft.data() + draft_row * vocab;
    const int32_t x = b.draft_tokens[draft_row];
    double total = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double q = draft != nullptr ? draft[v] : (v == x ? 1.0 : 0.0);
      total += (weights[v] = std::max(0.0, static_cast<double>(target[v]) - q));
    }
    if (total <= 0) {
      for (int64_t v = 0; v < vocab; ++v) weights[v] = target[v];
    }
    u = b.sample_uniforms.empty() ? b.uniforms[first_row + k]
                                  : b.sample_uniforms[first_row + accepted];
  } else {
    for (int64_t v = 0; v < vocab; ++v) weights[v] = target[v];
    u = b.sample_uniforms.empty() ? b.uniforms[first_row + k] : b.sample_uniforms[first_row + k];
  }
  double total = 0;
  for (double w : weights) total += w;
  double before = 0;
  for (int32_t v = 0; v < next; ++v) before += weights[v];
  const double draw = u * total;
  return std::min(std::abs(draw - before), std::abs(before + weights[next] - draw)) / total;
}

struct DeviceBatch {
  DeviceBuffer target, draft, draft_tokens, uniforms, sample_uniforms, row_start, greedy;
  DeviceBuffer num_accepted, next_token;
};

// ---------------------------------------------------------------- host-side validation

class SpeculativeVerifyParamsTest : public ::testing::Test {
 protected:
  // Host buffers stand in for device ones: validation never dereferences device pointers.
  SpeculativeVerifyParams Valid() {
    SpeculativeVerifyParams p;
    p.target_probs = floats_.data();
    p.draft_probs = floats_.data();
    p.draft_tokens = ints_.data();
    p.uniforms = floats_.data();
    p.sample_uniforms = nullptr;
    p.row_start = row_start_.data();
    p.row_start_host = row_start_.data();
    p.greedy = flags_.data();
    p.num_seqs = 2;
    p.vocab = 7;
    p.num_accepted = outputs_.data();
    p.next_token = outputs_.data();
    return p;
  }

  static void ExpectRejected(const SpeculativeVerifyParams& p, const std::string& field) {
    const absl::Status status = CheckSpeculativeVerifyParams(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(std::string(status.message()).find(field), std::string::npos) << status;
    // The launch answers the same, before any CUDA call (no device needed).
    EXPECT_EQ(LaunchSpeculativeVerify(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  }

  std::vector<float> floats_ = std::vector<float>(64, 0.25f);
  std::vector<int32_t> ints_ = std::vector<int32_t>(8, 1);
  std::vector<int32_t> row_start_ = {0, 3, 4};
  std::vector<uint8_t> flags_ = {1, 0};
  std::vector<int32_t> outputs_ = std::vector<int32_t>(8, 0);
};

TEST_F(SpeculativeVerifyParamsTest, AcceptsConsistentParams) {
  EXPECT_TRUE(CheckSpeculativeVerifyParams(Valid()).ok());
  SpeculativeVerifyParams p = Valid();
  p.draft_probs = nullptr;  // one-hot proposals
  EXPECT_TRUE(CheckSpeculativeVerifyParams(p).ok());
  p = Valid();
  p.num_seqs = 0;
  p.target_probs = nullptr;  // an empty batch needs no buffers
  EXPECT_TRUE(CheckSpeculativeVerifyParams(p).ok());
}

TEST_F(SpeculativeVerifyParamsTest, RejectsNullPointersNamingTheField) {
  SpeculativeVerifyParams p = Valid();
  p.target_probs = nullptr;
  ExpectRejected(p, "target_probs");
  p = Valid();
  p.uniforms = nullptr;
  ExpectRejected(p, "uniforms");
  p = Valid();
  p.row_start = nullptr;
  ExpectRejected(p, "row_start");
  p = Valid();
  p.row_start_host = nullptr;
  ExpectRejected(p, "row_start_host");
  p = Valid();
  p.greedy = nullptr;
  ExpectRejected(p, "greedy");
  p = Valid();
  p.num_accepted = nullptr;
  ExpectRejected(p, "num_accepted");
  p = Valid();
  p.next_token = nullptr;
  ExpectRejected(p, "next_token");
  p = Valid();
  p.draft_tokens = nullptr;  // sequence 0 has 2 drafts
  ExpectRejected(p, "draft_tokens");
}

TEST_F(SpeculativeVerifyParamsTest, AllowsNullDraftTokensWithoutDrafts) {
  row_start_ = {0, 1, 2};
  SpeculativeVerifyParams p = Valid();
  p.draft_tokens = nullptr;
  p.draft_probs = nullptr;
  EXPECT_TRUE(CheckSpeculativeVerifyParams(p).ok());
}

TEST_F(SpeculativeVerifyParamsTest, RejectsInconsistentRowStart) {
  row_start_ = {1, 3, 4};
  ExpectRejected(Valid(), "row_start[0]");
  row_start_ = {0, 3, 3};  // sequence 1 has no bonus row
  ExpectRejected(Valid(), "sequence 1");
  row_start_ = {0, 3, 2};  // decreasing
  ExpectRejected(Valid(), "sequence 1");
}

TEST_F(SpeculativeVerifyParamsTest, RejectsVocabAndBatchOutOfRange) {
  SpeculativeVerifyParams p = Valid();
  p.vocab = 0;
  ExpectRejected(p, "vocab");
  p.vocab = -3;
  ExpectRejected(p, "vocab");
  p.vocab = kSpeculativeVerifyMaxVocab + 1;
  ExpectRejected(p, "vocab");
  p = Valid();
  p.num_seqs = -1;
  ExpectRejected(p, "num_seqs");
  p.num_seqs = int64_t{1} << 31;
  ExpectRejected(p, "num_seqs");
}

// ---------------------------------------------------------------- against the CPU

absl::StatusOr<Result> RunGpu(const Batch& b) {
  DeviceBatch d;
  auto upload = [](auto& values, DeviceBuffer& out) -> absl::Status {
    absl::StatusOr<DeviceBuffer> buffer = UploadRaw(values);
    if (!buffer.ok()) return buffer.status();
    out = std::move(*buffer);
    return absl::OkStatus();
  };
  LOOM_RETURN_IF_ERROR(upload(b.target, d.target));
  LOOM_RETURN_IF_ERROR(upload(b.draft, d.draft));
  LOOM_RETURN_IF_ERROR(upload(b.draft_tokens, d.draft_tokens));
  LOOM_RETURN_IF_ERROR(upload(b.uniforms, d.uniforms));
  LOOM_RETURN_IF_ERROR(upload(b.sample_uniforms, d.sample_uniforms));
  LOOM_RETURN_IF_ERROR(upload(b.row_start, d.row_start));
  LOOM_RETURN_IF_ERROR(upload(b.greedy, d.greedy));
  const std::vector<int32_t> poison(b.num_seqs, -7);
  LOOM_RETURN_IF_ERROR(upload(poison, d.num_accepted));
  LOOM_RETURN_IF_ERROR(upload(poison, d.next_token));
  SpeculativeVerifyParams p;
  p.target_probs = static_cast<const float*>(d.target.data());
  p.draft_probs = b.draft.empty() ? nullptr : static_cast<const float*>(d.draft.data());
  p.draft_tokens = static_cast<const int32_t*>(d.draft_tokens.data());
  p.uniforms = static_cast<const float*>(d.uniforms.data());
  p.sample_uniforms =
      b.sample_uniforms.empty() ? nullptr : static_cast<const float*>(d.sample_uniforms.data());
  p.row_start = static_cast<const int32_t*>(d.row_start.data());
  p.row_start_host = b.row_start.data();
  p.greedy = static_cast<const uint8_t*>(d.greedy.data());
  p.num_seqs = b.num_seqs;
  p.vocab = b.vocab;
  p.num_accepted = static_cast<int32_t*>(d.num_accepted.data());
  p.next_token = static_cast<int32_t*>(d.next_token.data());
  LOOM_RETURN_IF_ERROR(LaunchSpeculativeVerify(p, nullptr));
  Result r;
  r.num_accepted.resize(b.num_seqs);
  r.next_token.resize(b.num_seqs);
  LOOM_RETURN_IF_ERROR(
      d.num_accepted.CopyToHost(r.num_accepted.data(), b.num_seqs * sizeof(int32_t)));
  LOOM_RETURN_IF_ERROR(d.next_token.CopyToHost(r.next_token.data(), b.num_seqs * sizeof(int32_t)));
  return r;
}

// A draw whose uniform lies within this fraction of the total of a CDF boundary may go
// either way: the GPU's double sums associate differently (error ~ vocab * 2^-53).
constexpr double kBoundaryEpsilon = 1e-9;

TEST(CudaSpeculativeVerifyTest, MatchesCpuReferenceOverSweep) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  int64_t compared = 0, draws = 0, near_boundary = 0, accepted_total = 0;
  uint64_t seed = 1;
  for (int64_t vocab : {7, 1000, 50000}) {
    for (int64_t num_seqs : {1, 3, 17, 64}) {
      for (bool with_draft_probs : {false, true}) {
        for (bool with_sample_uniforms : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "vocab " << vocab << " num_seqs " << num_seqs << " draft_probs "
                       << with_draft_probs << " sample_uniforms " << with_sample_uniforms);
          const Batch b =
              RandomBatch(num_seqs, vocab, with_draft_probs, with_sample_uniforms, seed++);
          const Result cpu = RunCpu(b);
          LOOM_ASSERT_OK_AND_ASSIGN(const Result gpu, RunGpu(b));
          for (int64_t s = 0; s < num_seqs; ++s) {
            const int32_t k = b.row_start[s + 1] - b.row_start[s] - 1;
            ASSERT_GE(gpu.num_accepted[s], 0) << "sequence " << s;
            ASSERT_LE(gpu.num_accepted[s], k) << "sequence " << s;
            ASSERT_GE(gpu.next_token[s], 0) << "sequence " << s;
            ASSERT_LT(gpu.next_token[s], vocab) << "sequence " << s;
            // Acceptance decisions are exact (the same double products as the CPU).
            EXPECT_EQ(gpu.num_accepted[s], cpu.num_accepted[s]) << "sequence " << s;
            accepted_total += cpu.num_accepted[s];
            const double margin = DrawMargin(b, s, cpu.num_accepted[s], cpu.next_token[s]);
            if (std::isfinite(margin)) ++draws;
            if (margin < kBoundaryEpsilon) {
              ++near_boundary;
              continue;
            }
            EXPECT_EQ(gpu.next_token[s], cpu.next_token[s])
                << "sequence " << s << " greedy " << int{b.greedy[s]} << " k " << k
                << " margin " << margin;
            ++compared;
          }
        }
      }
    }
  }
  std::cout << "compared " << compared << " sequences (" << draws << " sampled draws, "
            << accepted_total << " accepted drafts); " << near_boundary
            << " draws within " << kBoundaryEpsilon << " of a CDF boundary skipped\n";
  EXPECT_GT(accepted_total, 0);  // the sweep exercises acceptance chains
  EXPECT_LE(near_boundary, 1 + draws / 1000);
}

TEST(CudaSpeculativeVerifyTest, IsDeterministicAcrossLaunches) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const Batch b = RandomBatch(64, 50000, true, false, 4242);
  LOOM_ASSERT_OK_AND_ASSIGN(const Result first, RunGpu(b));
  for (int run = 0; run < 3; ++run) {
    LOOM_ASSERT_OK_AND_ASSIGN(const Result again, RunGpu(b));
    EXPECT_EQ(again.num_accepted, first.num_accepted);
    EXPECT_EQ(again.next_token, first.next_token);
  }
}

TEST(CudaSpeculativeVerifyTest, MarksSequenceWithDraftTokenOutsideVocab) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  // A batch whose sequence 1 has a draft; corrupt it, the others are untouched.
  Batch b;
  for (uint64_t seed = 77; b.num_seqs == 0 || b.row_start[2] - b.row_start[1] < 2; ++seed) {
    b = RandomBatch(3, 1000, false, false, seed);
  }
  const Result cpu_clean = RunCpu(b);
  b.draft_tokens[b.row_start[1] - 1] = 1000;
  LOOM_ASSERT_OK_AND_ASSIGN(const Result gpu, RunGpu(b));
  EXPECT_EQ(gpu.num_accepted[1], -1);
  EXPECT_EQ(gpu.next_token[1], -1);
  EXPECT_EQ(gpu.num_accepted[0], cpu_clean.num_accepted[0]);
  EXPECT_EQ(gpu.num_accepted[2], cpu_clean.num_accepted[2]);
}

}  // namespace
}  // namespace loom::kernels::cuda
