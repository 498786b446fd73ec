#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_candidates.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::AllClose;

// ---------------------------------------------------------------- checks (no GPU needed)

PagedDecodeParams ValidParams(void* some_device_pointer) {
  PagedDecodeParams p;
  auto* pointer = static_cast<int32_t*>(some_device_pointer);
  p.q = p.out = pointer;
  p.q_dtype = DataType::kF16;
  p.cache = {pointer, pointer, DataType::kF16, 8, 16, 2, 128};
  p.context_len = p.block_indptr = p.block_indices = pointer;
  p.num_seqs = 1;
  p.num_heads = 8;
  p.scale = 0.088f;
  p.max_context_len = 100;  // < kPagedDecodeMinPartition: one split, no workspace
  return p;
}

// The tensor-core candidate reads the query two elements at a time: rows that break that
// alignment (an odd q_stride, a base off by one element) are refused before any launch, for
// the dispatched kernel to take.
TEST(CudaPagedDecodeTest, TensorCoreCandidateRefusesQueryRowsItCannotReadInPairs) {
  alignas(16) int32_t storage[64] = {};
  const int mma = PagedDecodeCandidateCount() - 1;
  PagedDecodeParams p = ValidParams(storage);
  p.q_stride = p.num_heads * p.cache.head_dim + 1;
  EXPECT_EQ(LaunchPagedDecodeCandidate(p, mma, nullptr).code(), absl::StatusCode::kUnimplemented);
  p = ValidParams(storage);
  p.q = reinterpret_cast<const char*>(storage) + 2;  // F16: one element off
  EXPECT_EQ(LaunchPagedDecodeCandidate(p, mma, nullptr).code(), absl::StatusCode::kUnimplemented);
  p.q_dtype = DataType::kF32;
  p.q = storage + 1;  // F32: one element off, 4 bytes past an 8-byte boundary
  EXPECT_EQ(LaunchPagedDecodeCandidate(p, mma, nullptr).code(), absl::StatusCode::kUnimplemented);
}

TEST(CudaPagedDecodeTest, RejectsUnsupportedShapesBeforeLaunch) {
  alignas(16) int32_t storage[64] = {};
  ASSERT_TRUE(CheckPagedDecodeParams(ValidParams(storage)).ok())
      << CheckPagedDecodeParams(ValidParams(storage));
  auto expect_invalid = [&](PagedDecodeParams p, const std::string& fragment) {
    const absl::Status status = CheckPagedDecodeParams(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_NE(status.message().find(fragment), std::string::npos) << status;
    EXPECT_EQ(LaunchPagedDecode(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  };
  PagedDecodeParams p = ValidParams(storage);
  p.cache.head_dim = 96;
  expect_invalid(p, "head_dim 96");
  p = ValidParams(storage);
  p.cache.dtype = DataType::kF32;
  expect_invalid(p, "dtype F32");
  p = ValidParams(storage);
  p.q_dtype = DataType::kBF16;  // neither F32 nor the cache's F16
  expect_invalid(p, "q dtype BF16");
  p = ValidParams(storage);
  p.out_low = storage;
  p.out_low_dtype = DataType::kF32;  // the second output is for a GEMM: F16 or BF16
  expect_invalid(p, "out_low dtype F32");
  p = ValidParams(storage);
  p.num_heads = 7;
  expect_invalid(p, "num_heads 7");
  p = ValidParams(storage);
  p.cache.num_blocks = int64_t{1} << 27;  // x 16 slots x 2 KV heads = 2^32 cache rows
  expect_invalid(p, "2^32 cache rows");
  p.cache.num_blocks = (int64_t{1} << 27) - 1;
  EXPECT_TRUE(CheckPagedDecodeParams(p).ok()) << CheckPagedDecodeParams(p);
  p = ValidParams(storage);
  p.num_splits = kPagedDecodeMaxSplits + 1;
  expect_invalid(p, "num_splits 65");
  p = ValidParams(storage);
  p.max_context_len = 0;
  expect_invalid(p, "max_context_len 0");
  p = ValidParams(storage);
  p.scale = INFINITY;
  expect_invalid(p, "scale");
  p = ValidParams(storage);
  p.cache.k = reinterpret_cast<char*>(storage) + 2;
  expect_invalid(p, "aligned");
  p = ValidParams(storage);
  p.max_context_len = 5000;  // splits possible: the workspace is required
  expect_invalid(p, "workspace of 0 bytes");
  p.workspace = storage;
  p.workspace_bytes = PagedDecodeWorkspaceBytes(p);
  EXPECT_TRUE(CheckPagedDecodeParams(p).ok());
  EXPECT_EQ(p.workspace_bytes, 1u * 8 * 20 * (128 + 2) * sizeof(float));  // 20 = ceil(5000 / 256)
  // A batch that makes two waves on any GPU on its own never splits, whatever its context:
  // no workspace.
  p.num_seqs = 2048;
  p.max_context_len = 32768;
  EXPECT_EQ(PagedDecodeWorkspaceBytes(p), 0u);
  // Forced splits are provisioned as asked.
  p.num_splits = 3;
  EXPECT_EQ(PagedDecodeWorkspaceBytes(p), 2048u * 8 * 3 * (128 + 2) * sizeof(float));
}

TEST(CudaPagedDecodeTest, SplitHeuristicFillsTheGpuWithoutShortPartitions) {
  // Short contexts never split.
  EXPECT_EQ(ChoosePagedDecodeSplits(8, 200, 132, 2), 1);
  // Batch 1, 8 KV heads, 32k context: one whole wave of 132 SMs holding 2 (3) blocks each,
  // never a wave and a few blocks (50 splits: 400 blocks on 396 slots, two waves).
  EXPECT_EQ(ChoosePagedDecodeSplits(8, 32768, 132, 2), 33);
  EXPECT_EQ(ChoosePagedDecodeSplits(8, 32768, 132, 3), 49);
  // Residency is clamped to [1, 4].
  EXPECT_EQ(ChoosePagedDecodeSplits(8, 32768, 132, 0), 16);
  EXPECT_EQ(ChoosePagedDecodeSplits(8, 32768, 132, 9), 64);
  // Batch 32 x 8 KV heads = 256 blocks on 396 slots: 1 or 2 splits leave a third of the
  // slots idle, 3 splits make two nearly full waves of 1,366-token partitions.
  EXPECT_EQ(ChoosePagedDecodeSplits(256, 4096, 132, 3), 3);
  // Two waves of blocks already: no split.
  EXPECT_EQ(ChoosePagedDecodeSplits(792, 4096, 132, 3), 1);
  EXPECT_EQ(ChoosePagedDecodeSplits(2048, 4096, 132, 3), 1);
  // Limited by the minimum partition: 1000 tokens -> at most 4 splits.
  EXPECT_EQ(ChoosePagedDecodeSplits(1, 1000, 132, 3), 4);
  // And by the cap.
  EXPECT_EQ(ChoosePagedDecodeSplits(1, 1 << 20, 132, 3), kPagedDecodeMaxSplits);
  // The workspace sized for the largest GPU covers every GPU's choice.
  for (int64_t blocks : {1, 8, 32, 96, 256, 700, 2048}) {
    for (int64_t length : {300, 4096, 32768, 1 << 20}) {
      PagedDecodeParams p;
      p.num_seqs = blocks;
      p.num_heads = 1;
      p.cache.num_kv_heads = 1;
      p.cache.head_dim = 128;
      p.max_context_len = length;
      const size_t bound = PagedDecodeWorkspaceBytes(p);
      for (int sms : {1, 16, 78, 108, 132, 170, 256}) {
        for (int resident = 1; resident <= 4; ++resident) {
          p.num_splits = ChoosePagedDecodeSplits(blocks, length, sms, resident);
          EXPECT_LE(PagedDecodeWorkspaceBytes(p), bound)
              << blocks << " blocks, " << length << " tokens, " << sms << " x " << resident;
          p.num_splits = 0;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- GPU

struct DecodeCase {
  int64_t num_kv_heads, group, head_dim, block_size;
  std::vector<int32_t> context_lens;
  int num_splits;      // 0: heuristic
  int candidate = -1;  // >= 0: LaunchPagedDecodeCandidate with this tiling
  double abs_tolerance = 5e-5;
  // The bound passed as max_context_len; 0: the longest context. Below it, a sequence is
  // still attended in full (its last split runs longer).
  int64_t max_context_len = 0;
};

// One decode check: the same K/V twice, as floats for cpu::PagedAttentionReference
// (double) addressed through `host_indices`, and on the device addressed through
// `device_indices` (the same blocks, possibly elsewhere in a larger pool).
struct DecodeCheck {
  DataType kv = DataType::kF16, q_type = DataType::kF16;
  int64_t num_kv_heads = 1, group = 1, head_dim = 64, block_size = 16;
  int num_splits = 0;  // 0: heuristic
  int candidate = -1;  // >= 0: LaunchPagedDecodeCandidate with this tiling
  double abs_tolerance = 5e-5;
  int64_t window = 0;  // sliding window; 0: none
  float softcap = 0.0f;
  std::vector<float> sinks;  // [num_heads] attention sinks; empty: none
  int64_t max_context_len = 0;  // 0: the longest context
  std::vector<int32_t> context_lens, indptr;
  std::vector<float> q;  // [num_seqs, num_heads * head_dim], already rounded to q_type
  const testing_util::HostCache* host_cache = nullptr;
  int64_t host_num_blocks = 0;
  std::vector<int32_t> host_indices;
  const void* device_k = nullptr;
  const void* device_v = nullptr;
  int64_t device_num_blocks = 0;
  std::vector<int32_t> device_indices;
};

void ExpectDecodeMatchesReference(const DecodeCheck& c) {
  const int64_t num_seqs = static_cast<int64_t>(c.context_lens.size());
  const int64_t num_heads = c.num_kv_heads * c.group, d = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<int32_t> query_start(num_seqs + 1);
  std::iota(query_start.begin(), query_start.end(), 0);
  std::vector<float> expected(c.q.size());
  cpu::PagedAttentionParams ref;
  ref.q = c.q.data();
  ref.out = expected.data();
  ref.cache = {const_cast<float*>(c.host_cache->k.data()),
               const_cast<float*>(c.host_cache->v.data()), cpu::KvDtype::kF32,
               c.host_num_blocks,      c.block_size,          c.num_kv_heads,
               d};
  ref.query_start = query_start.data();
  ref.context_len = c.context_lens.data();
  ref.block_indptr = c.indptr.data();
  ref.block_indices = c.host_indices.data();
  ref.num_seqs = num_seqs;
  ref.num_heads = num_heads;
  ref.scale = scale;
  ref.window = c.window;
  ref.softcap = c.softcap;
  ref.sinks = c.sinks.empty() ? nullptr : c.sinks.data();
  ASSERT_TRUE(cpu::PagedAttentionReference(ref).ok());

  DeviceBuffer d_sinks;
  if (!c.sinks.empty()) {
    LOOM_ASSERT_OK_AND_ASSIGN(d_sinks, testing_util::UploadRaw(c.sinks));
  }
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q, testing_util::Upload(c.q_type, c.q));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, testing_util::Poisoned(c.q_type, c.q.size()));
  // The second output in the cache's type (the output projection's input).
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_low, testing_util::Poisoned(c.kv, c.q.size()));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_len, testing_util::UploadRaw(c.context_lens));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indptr, testing_util::UploadRaw(c.indptr));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indices, testing_util::UploadRaw(c.device_indices));
  PagedDecodeParams p;
  p.q = d_q.data();
  p.out = d_out.data();
  p.out_low = d_low.data();
  p.out_low_dtype = c.kv;
  p.q_dtype = c.q_type;
  p.cache = {const_cast<void*>(c.device_k), const_cast<void*>(c.device_v), c.kv,
             c.device_num_blocks, c.block_size, c.num_kv_heads, d};
  p.context_len = static_cast<const int32_t*>(d_len.data());
  p.block_indptr = static_cast<const int32_t*>(d_indptr.data());
  p.block_indices = static_cast<const int32_t*>(d_indices.data());
  p.num_seqs = num_seqs;
  p.num_heads = num_heads;
  p.scale = scale;
  p.window = c.window;
  p.softcap = c.softcap;
  p.sinks = static_cast<const float*>(d_sinks.data());
  p.max_context_len = c.max_context_len > 0
                          ? c.max_context_len
                          : *std::max_element(c.context_lens.begin(), c.context_lens.end());
  p.num_splits = c.num_splits;
  DeviceBuffer workspace;
  if (const size_t bytes = PagedDecodeWorkspaceBytes(p); bytes > 0) {
    LOOM_ASSERT_OK_AND_ASSIGN(workspace, DeviceBuffer::Allocate(bytes));
    ASSERT_TRUE(workspace.Fill(0xff).ok());  // stale partials must not leak into the result
    p.workspace = workspace.data();
    p.workspace_bytes = bytes;
  }
  const absl::Status launched = c.candidate >= 0
                                    ? LaunchPagedDecodeCandidate(p, c.candidate, nullptr)
                                    : LaunchPagedDecode(p, nullptr);
  ASSERT_TRUE(launched.ok()) << launched;
  const absl::Status synced = SynchronizeStream(nullptr);
  ASSERT_TRUE(synced.ok()) << synced;
  LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                            testing_util::Download(d_out, c.q_type, c.q.size()));
  // Float scores/exp/accumulation vs double over the same values: 5e-5 absolute (outputs are
  // convex combinations of V in [-1, 1]); plus one rounding of the output to q's type.
  EXPECT_TRUE(
      AllClose(out, testing_util::ToDouble(expected), c.abs_tolerance,
               c.q_type == DataType::kF32 ? 1e-5 : testing_util::RoundingTolerance(c.q_type) / 2));
  // out_low holds out's values rounded once to its type (out's own when q's type is the cache's).
  LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> low,
                            testing_util::Download(d_low, c.kv, c.q.size()));
  EXPECT_TRUE(AllClose(low, testing_util::ToDouble(testing_util::RoundTo(c.kv, out)), 0.0, 0.0));
}

// Attention sinks for `num_heads` query heads: random in [-2, 3] (comparable to the scores,
// |q.k| / sqrt(d) reaches ~3), every third head 8 (the sink dominates the softmax) and,
// with more than one head, the last 100 (exp(100) overflows float: the kernels must keep
// the output at its limit, ~0, not NaN).
std::vector<float> RandomSinks(int64_t num_heads, uint32_t seed) {
  std::vector<float> sinks = testing_util::RandomFloats(num_heads, seed, -2, 3);
  for (int64_t h = 1; h < num_heads; h += 3) sinks[h] = 8.0f;
  if (num_heads > 1) sinks[num_heads - 1] = 100.0f;
  return sinks;
}

// One decode step over a pool of shuffled blocks, with spare table entries past the needed
// ones; every slot no sequence attends holds NaN (PoisonUnattended). With a window, the device
// table names blocks outside the pool for every block wholly before the window (as freed ones,
// whose ids the worker may still hold): reading one would make that sequence's output NaN. With
// `sinks`, random attention sinks per query head (RandomSinks).
void RunDecodeCase(const DecodeCase& c, DataType kv, DataType q_type, uint32_t seed,
                   int64_t window = 0, float softcap = 0.0f, bool sinks = false) {
  SCOPED_TRACE(testing::Message() << "window=" << window << " softcap=" << softcap
                                  << " sinks=" << sinks);
  SCOPED_TRACE(testing::Message() << "kv=" << DataTypeName(kv) << " q=" << DataTypeName(q_type)
                                  << " kv_heads=" << c.num_kv_heads << " group=" << c.group
                                  << " head_dim=" << c.head_dim << " block=" << c.block_size
                                  << " splits=" << c.num_splits << " seqs=" << c.context_lens.size()
                                  << " ctx[0]=" << c.context_lens[0]);
  DecodeCheck check;
  check.kv = kv;
  check.q_type = q_type;
  check.num_kv_heads = c.num_kv_heads;
  check.group = c.group;
  check.head_dim = c.head_dim;
  check.block_size = c.block_size;
  check.num_splits = c.num_splits;
  check.candidate = c.candidate;
  check.abs_tolerance = c.abs_tolerance;
  check.max_context_len = c.max_context_len;
  check.window = window;
  check.softcap = softcap;
  if (sinks) check.sinks = RandomSinks(c.num_kv_heads * c.group, seed + 5);
  check.context_lens = c.context_lens;
  check.indptr = {0};
  int64_t total_blocks = 0;
  for (int32_t len : c.context_lens) total_blocks += (len + c.block_size - 1) / c.block_size + 1;
  const int64_t num_blocks = total_blocks + 3;
  std::vector<int32_t> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  size_t next = 0;
  for (int32_t len : c.context_lens) {
    const int64_t needed = (len + c.block_size - 1) / c.block_size + 1;  // one spare block
    for (int64_t b = 0; b < needed; ++b) check.host_indices.push_back(order[next++]);
    check.indptr.push_back(static_cast<int32_t>(check.host_indices.size()));
  }
  check.device_indices = check.host_indices;
  for (size_t s = 0; window > 0 && s < c.context_lens.size(); ++s) {
    const int64_t window_start = std::max<int64_t>(0, c.context_lens[s] - window);
    for (int64_t b = 0; (b + 1) * c.block_size <= window_start; ++b) {
      check.device_indices[static_cast<size_t>(check.indptr[s] + b)] =
          static_cast<int32_t>(num_blocks + 1000);
    }
  }
  const int64_t pool = num_blocks * c.block_size * c.num_kv_heads * c.head_dim;
  testing_util::HostCache cache = testing_util::RandomCache(kv, pool, seed + 1);
  testing_util::PoisonUnattended(
      kv, c.num_kv_heads * c.head_dim,
      testing_util::AttendedSlots(num_blocks, c.block_size, c.context_lens, check.indptr,
                                  check.host_indices),
      cache);
  check.host_cache = &cache;
  check.host_num_blocks = check.device_num_blocks = num_blocks;
  // Queries up to +-2 make the softmax peaked enough that a lost token shows.
  const int64_t num_heads = c.num_kv_heads * c.group;
  check.q = testing_util::RoundTo(
      q_type, testing_util::RandomFloats(static_cast<int64_t>(c.context_lens.size()) *
                                             num_heads * c.head_dim,
                                         seed + 3, -2, 2));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k, testing_util::UploadRaw(cache.k_bytes));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_v, testing_util::UploadRaw(cache.v_bytes));
  check.device_k = d_k.data();
  check.device_v = d_v.data();
  ExpectDecodeMatchesReference(check);
}

TEST(CudaPagedDecodeTest, MatchesCpuReferenceAcrossShapesAndSplits) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<DecodeCase> cases = {
      // MHA, one token, tiny blocks.
      {4, 1, 64, 1, {1, 2, 3}, 1},
      // GQA 2, 4, 8 with odd contexts crossing 128-token tiles and blocks of 16.
      {2, 2, 128, 16, {1, 17, 129, 300}, 0},
      {8, 4, 128, 16, {1000, 5, 257}, 3},
      {1, 8, 64, 16, {2049, 1, 64}, 5},
      // Ratios that are not powers of two, and above 8 (two head chunks).
      {2, 3, 128, 16, {511, 513}, 2},
      {1, 7, 64, 32, {700}, 4},
      {1, 12, 128, 16, {333, 1024}, 0},
      {2, 16, 64, 8, {95, 4100}, 7},
      // More splits than a short sequence has tokens: empty partitions.
      {2, 4, 128, 16, {3, 4096}, 16},
      // Long context, heuristic splitting (batch 1).
      {8, 4, 128, 16, {32768}, 0},
      // Many sequences, odd block size.
      {4, 2, 128, 5, std::vector<int32_t>(37, 77), 0},
      // Every <head dim, heads per block> instantiation the models use: SmolLM2's shape
      // (head dim 64, 3 KV heads, 3 query heads each: <64, 4>), <64, 2>, and MHA at head
      // dim 128 (<128, 1>).
      {3, 3, 64, 16, {1, 200, 1025}, 0},
      {2, 2, 64, 16, {33, 300}, 2},
      {4, 1, 128, 16, {1, 130, 700}, 0},
      // Head dim 256 (Gemma 2 and 3: 32 lanes a token), GQA 4 and 8 with splits.
      {2, 4, 256, 16, {1, 129, 1030}, 0},
      {1, 8, 256, 16, {700, 3}, 3},
  };
  uint32_t seed = 10;
  for (DataType kv : {DataType::kF16, DataType::kBF16}) {
    for (DataType q_type : {DataType::kF32, kv}) {
      for (const DecodeCase& c : cases) {
        const int32_t longest = *std::max_element(c.context_lens.begin(), c.context_lens.end());
        if (testing_util::SmallGpuTestSize() && longest > 2048) continue;
        RunDecodeCase(c, kv, q_type, seed += 7);
      }
    }
  }
}

// Blocks longer than a tile (16 tokens at head dim 256, 32 at 128: a tile's rows move to the
// next block by the offset's carry, not by whole blocks a tile), and a max_context_len below
// a sequence's context (a stale bound: that sequence is still attended in full, its last split
// running longer), with heuristic and forced splits.
TEST(CudaPagedDecodeTest, LongBlocksAndStaleContextBoundsMatchTheReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<DecodeCase> cases = {
      {2, 4, 256, 32, {1, 40, 700}, 0},
      {2, 4, 256, 64, {63, 65, 1030}, 3},
      {2, 4, 128, 64, {1, 100, 1000}, 0},
      {1, 8, 64, 128, {5, 300}, 2},
      {2, 4, 128, 16, {900, 30}, 0, -1, 5e-5, 300},
      {2, 4, 128, 16, {900, 30}, 4, -1, 5e-5, 300},
      {1, 8, 64, 16, {2049, 7}, 0, -1, 5e-5, 64},
  };
  uint32_t seed = 1100;
  for (DataType kv : {DataType::kF16, DataType::kBF16}) {
    for (const DecodeCase& c : cases) {
      RunDecodeCase(c, kv, DataType::kF32, seed += 7);
      if (HasFatalFailure()) return;
    }
  }
}

// Mistral's and Gemma's local layers: windows shorter and longer than the context, not
// multiples of the block or tile, with forced and heuristic splits (the splits cut the
// window, not the context); Gemma 2's soft-capped scores, alone and with a window.
TEST(CudaPagedDecodeTest, WindowsReadOnlyTheirPositionsAndSoftCapMatchesTheReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<DecodeCase> cases = {
      {2, 4, 128, 16, {1, 17, 129, 300, 1000}, 0},
      {8, 2, 128, 16, {4096, 33}, 3},
      {1, 8, 64, 16, {2049, 700}, 5},
      {3, 3, 64, 16, {1, 200, 1025}, 0},
      {2, 2, 64, 5, {77, 500}, 2},
      {2, 2, 256, 16, {300, 40}, 0},
  };
  uint32_t seed = 500;
  for (DataType kv : {DataType::kF16, DataType::kBF16}) {
    for (const DecodeCase& c : cases) {
      for (int64_t window : {1, 31, 100, 256, 4000}) {
        RunDecodeCase(c, kv, DataType::kF32, seed += 7, window);
      }
      RunDecodeCase(c, kv, kv, seed += 7, 0, 1.5f);  // caps scores (|q.k| reaches ~3)
      RunDecodeCase(c, kv, DataType::kF32, seed += 7, 0, 50.0f);
      RunDecodeCase(c, kv, DataType::kF32, seed += 7, 129, 2.0f);
    }
  }
}

// gpt-oss's attention sinks: one split (added in the block's epilogue), forced and
// heuristic splits (added once, in the reduction: per split it would count num_splits
// times), empty partitions, GQA ratios up to 16 (two head chunks), every head dim, and
// with a window and soft-capping.
TEST(CudaPagedDecodeTest, SinksJoinTheDenominatorOnceAcrossSplits) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<DecodeCase> cases = {
      {4, 1, 64, 1, {1, 2, 3}, 1},
      {2, 4, 128, 16, {1, 17, 129, 300}, 1},
      {8, 4, 128, 16, {1000, 5, 257}, 3},
      {1, 8, 64, 16, {2049, 1, 64}, 5},
      {2, 16, 64, 8, {95, 4100}, 7},
      // More splits than the short sequence has tokens: empty partitions.
      {2, 4, 128, 16, {3, 4096}, 16},
      {2, 2, 256, 16, {300, 1030}, 0},
      // Long context, heuristic splitting (batch 1): many splits.
      {4, 8, 128, 16, {20000}, 0},
  };
  uint32_t seed = 700;
  for (DataType kv : {DataType::kF16, DataType::kBF16}) {
    for (const DecodeCase& c : cases) {
      const int32_t longest = *std::max_element(c.context_lens.begin(), c.context_lens.end());
      if (testing_util::SmallGpuTestSize() && longest > 4100) continue;
      RunDecodeCase(c, kv, DataType::kF32, seed += 7, 0, 0.0f, /*sinks=*/true);
      RunDecodeCase(c, kv, kv, seed += 7, 0, 0.0f, /*sinks=*/true);
      RunDecodeCase(c, kv, DataType::kF32, seed += 7, 100, 2.0f, /*sinks=*/true);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaPagedDecodeTest, RejectsMisalignedSinks) {
  alignas(16) int32_t storage[64] = {};
  PagedDecodeParams p = ValidParams(storage);
  p.sinks = reinterpret_cast<const float*>(storage);
  EXPECT_TRUE(CheckPagedDecodeParams(p).ok());
  p.sinks = reinterpret_cast<const float*>(reinterpret_cast<const char*>(storage) + 2);
  EXPECT_NE(CheckPagedDecodeParams(p).message().find("sinks must be 4-byte aligned"),
            std::string::npos);
}

TEST(CudaPagedDecodeTest, RejectsBadWindowsAndSoftCaps) {
  alignas(16) int32_t storage[64] = {};
  PagedDecodeParams p = ValidParams(storage);
  p.window = -1;
  EXPECT_NE(CheckPagedDecodeParams(p).message().find("window -1"), std::string::npos);
  p = ValidParams(storage);
  p.softcap = -2.0f;
  EXPECT_NE(CheckPagedDecodeParams(p).message().find("softcap -2"), std::string::npos);
  p.softcap = NAN;
  EXPECT_EQ(CheckPagedDecodeParams(p).code(), absl::StatusCode::kInvalidArgument);
  // A window shorter than the context cuts the splits (and the workspace) to the window.
  p = ValidParams(storage);
  p.max_context_len = 5000;
  p.window = 300;
  EXPECT_EQ(PagedDecodeAttendedLength(p), 300);
  EXPECT_EQ(PagedDecodeWorkspaceBytes(p), 1u * 8 * 2 * (128 + 2) * sizeof(float));  // 2 splits
  p.window = 8000;
  EXPECT_EQ(PagedDecodeAttendedLength(p), 5000);
}

// A KV pool of more than 2^31 elements per K and V (a large model's real pool): slot and
// element offsets past int32 must address the right bytes. The sequences' blocks sit at the
// top of the pool; the CPU reference reads a compact copy of just those blocks. Skipped,
// with the reason, where the device cannot hold the pool.
TEST(CudaPagedDecodeTest, PoolOverTwoToThe31ElementsAddressesTheTopBlocks) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  DecodeCheck check;
  check.num_kv_heads = 8;
  check.group = 4;
  check.head_dim = 128;
  check.num_splits = 1;
  const int64_t block_elements = check.block_size * check.num_kv_heads * check.head_dim;
  // The two sequences below take 44 + 63 blocks at the top of the pool: enough blocks
  // above 2^31 elements that even the first of them starts past it (with +64 it did not:
  // caught on an H100, 2026-11-26).
  const int64_t num_blocks = (int64_t{1} << 31) / block_elements + 128;
  const int64_t pool_bytes = num_blocks * block_elements * 2;  // F16: 4.3 GB each for K and V
  absl::StatusOr<DeviceBuffer> k_pool = DeviceBuffer::Allocate(pool_bytes);
  absl::StatusOr<DeviceBuffer> v_pool = k_pool.ok() ? DeviceBuffer::Allocate(pool_bytes)
                                                    : absl::StatusOr<DeviceBuffer>(k_pool.status());
  if (!k_pool.ok() || !v_pool.ok()) {
    GTEST_SKIP() << "the device cannot hold two pools of " << pool_bytes << " bytes: "
                 << (k_pool.ok() ? v_pool.status() : k_pool.status());
  }
  // The reference's compact pool holds blocks 0..n-1; on the device block b lives at
  // num_blocks - n + b, the last blocks of the pool.
  check.context_lens = {700, 1000};
  check.indptr = {0};
  for (int32_t len : check.context_lens) {
    for (int64_t b = 0; b < (len + check.block_size - 1) / check.block_size; ++b) {
      check.host_indices.push_back(static_cast<int32_t>(check.host_indices.size()));
    }
    check.indptr.push_back(static_cast<int32_t>(check.host_indices.size()));
  }
  check.host_num_blocks = static_cast<int64_t>(check.host_indices.size());
  const int64_t first_block = num_blocks - check.host_num_blocks;
  ASSERT_GT(first_block * block_elements, int64_t{1} << 31);
  for (int32_t b : check.host_indices) {
    check.device_indices.push_back(static_cast<int32_t>(first_block + b));
  }
  const testing_util::HostCache cache =
      testing_util::RandomCache(DataType::kF16, check.host_num_blocks * block_elements, 31);
  const int64_t offset_bytes = first_block * block_elements * 2;
  ASSERT_TRUE(k_pool->CopyFromHost(cache.k_bytes.data(), cache.k_bytes.size(), offset_bytes).ok());
  ASSERT_TRUE(v_pool->CopyFromHost(cache.v_bytes.data(), cache.v_bytes.size(), offset_bytes).ok());
  check.host_cache = &cache;
  check.device_k = k_pool->data();
  check.device_v = v_pool->data();
  check.device_num_blocks = num_blocks;
  check.q = testing_util::RoundTo(
      DataType::kF16,
      testing_util::RandomFloats(2 * check.num_kv_heads * check.group * check.head_dim, 32, -2,
                                 2));
  ExpectDecodeMatchesReference(check);
}

// A table that is too short, or names a block outside the pool (past its end or negative),
// makes that sequence's output NaN (never a read outside the pool, never a plausible wrong
// value); the other sequences are unaffected. The dispatched kernel at head dims 64 and 128,
// and the tensor-core candidate.
TEST(CudaPagedDecodeTest, BadBlockTableYieldsNanForThatSequenceOnly) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  struct Kernel {
    int64_t head_dim;
    int candidate;  // -1: LaunchPagedDecode
  };
  const int mma = PagedDecodeCandidateCount() - 1;
  for (const auto& [d, candidate] : {Kernel{64, -1}, Kernel{128, -1}, Kernel{128, mma}}) {
    for (int splits : {1, 3}) {
      SCOPED_TRACE(testing::Message()
                   << "head_dim=" << d << " candidate=" << candidate << " splits=" << splits);
      const int64_t num_blocks = 8, block_size = 16, kv_heads = 1, group = 2;
      const int64_t pool = num_blocks * block_size * kv_heads * d;
      testing_util::HostCache cache = testing_util::RandomCache(DataType::kF16, pool, 5);
      std::vector<int32_t> context_lens{40, 40, 40, 40};
      // Sequence 0 is fine, 1 names block 8 (outside), 2 has two blocks for 40 tokens, 3
      // names block -1.
      std::vector<int32_t> indptr{0, 3, 6, 8, 11};
      std::vector<int32_t> indices{0, 1, 2, 3, 8, 4, 5, 6, 7, -1, 7};
      std::vector<float> q = testing_util::RandomFloats(4 * group * d, 6);
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k, testing_util::UploadRaw(cache.k_bytes));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_v, testing_util::UploadRaw(cache.v_bytes));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q, testing_util::Upload(DataType::kF32, q));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out,
                                testing_util::Poisoned(DataType::kF32, q.size()));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_len, testing_util::UploadRaw(context_lens));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indptr, testing_util::UploadRaw(indptr));
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indices, testing_util::UploadRaw(indices));
      PagedDecodeParams p;
      p.q = d_q.data();
      p.out = d_out.data();
      p.q_dtype = DataType::kF32;
      p.cache = {d_k.data(), d_v.data(), DataType::kF16, num_blocks, block_size, kv_heads, d};
      p.context_len = static_cast<const int32_t*>(d_len.data());
      p.block_indptr = static_cast<const int32_t*>(d_indptr.data());
      p.block_indices = static_cast<const int32_t*>(d_indices.data());
      p.num_seqs = 4;
      p.num_heads = group;
      p.scale = 0.125f;
      p.max_context_len = 40;
      p.num_splits = splits;
      LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer workspace,
                                DeviceBuffer::Allocate(PagedDecodeWorkspaceBytes(p) + 4));
      p.workspace = workspace.data();
      p.workspace_bytes = workspace.bytes();
      const absl::Status launched = candidate >= 0
                                        ? LaunchPagedDecodeCandidate(p, candidate, nullptr)
                                        : LaunchPagedDecode(p, nullptr);
      ASSERT_TRUE(launched.ok()) << launched;
      ASSERT_TRUE(SynchronizeStream(nullptr).ok());
      LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                testing_util::Download(d_out, DataType::kF32, q.size()));
      const int64_t row = group * d;
      for (int64_t i = 0; i < row; ++i) ASSERT_FALSE(std::isnan(out[i])) << i;
      for (int64_t i = row; i < 4 * row; ++i) ASSERT_TRUE(std::isnan(out[i])) << i;
    }
  }
}

// Decode attention over an 8-bit cache, as CudaDevice runs it: the query rotated by
// LaunchRotateHeads, the output rotated back in place. One query row per sequence.
absl::StatusOr<std::vector<float>> DecodeEightBit(
    const testing_util::EightBitCache& cache, const std::vector<float>& q,
    const std::vector<int32_t>& context_lens, const std::vector<int32_t>& indptr,
    const std::vector<int32_t>& indices, int64_t num_heads, int num_splits, int candidate = -1,
    const testing_util::AttentionExtras& extras = {}) {
  const int64_t num_seqs = static_cast<int64_t>(context_lens.size()), d = cache.cpu.head_dim;
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer d_q, testing_util::UploadRaw(q));
  DeviceBuffer d_sinks;
  if (!extras.sinks.empty()) {
    LOOM_ASSIGN_OR_RETURN(d_sinks, testing_util::UploadRaw(extras.sinks));
  }
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer d_out, testing_util::Poisoned(DataType::kF32, q.size()));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer d_len, testing_util::UploadRaw(context_lens));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer d_indptr, testing_util::UploadRaw(indptr));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer d_indices, testing_util::UploadRaw(indices));
  LOOM_RETURN_IF_ERROR(
      testing_util::RotateRows(d_q.data(), d_q.data(), DataType::kF32, num_seqs * num_heads, d));
  PagedDecodeParams p;
  p.q = d_q.data();
  p.out = d_out.data();
  p.q_dtype = DataType::kF32;
  p.cache = cache.View(DataType::kF16);
  p.context_len = static_cast<const int32_t*>(d_len.data());
  p.block_indptr = static_cast<const int32_t*>(d_indptr.data());
  p.block_indices = static_cast<const int32_t*>(d_indices.data());
  p.num_seqs = num_seqs;
  p.num_heads = num_heads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.window = extras.window;
  p.softcap = extras.softcap;
  p.sinks = static_cast<const float*>(d_sinks.data());
  p.max_context_len = *std::max_element(context_lens.begin(), context_lens.end());
  p.num_splits = num_splits;
  DeviceBuffer workspace;
  if (const size_t bytes = PagedDecodeWorkspaceBytes(p); bytes > 0) {
    LOOM_ASSIGN_OR_RETURN(workspace, DeviceBuffer::Allocate(bytes));
    p.workspace = workspace.data();
    p.workspace_bytes = bytes;
  }
  LOOM_RETURN_IF_ERROR(candidate >= 0 ? LaunchPagedDecodeCandidate(p, candidate, nullptr)
                                      : LaunchPagedDecode(p, nullptr));
  LOOM_RETURN_IF_ERROR(testing_util::RotateRows(d_out.data(), d_out.data(), DataType::kF32,
                                                num_seqs * num_heads, d));
  LOOM_RETURN_IF_ERROR(SynchronizeStream(nullptr));
  return testing_util::Download(d_out, DataType::kF32, q.size());
}

// 8-bit caches (int8, fp8): the codes and scales cpu::WriteKv stored, read by the kernel as
// they are, NaN codes and scales in the slots no sequence attends. Against
// cpu::PagedAttentionReference over the same codes (it rotates the same way): only float
// summation order differs. Plain, then with a window and soft-capping (Gemma 2's local layers
// over an 8-bit cache: the K scale applies before the cap), then with sinks.
TEST(CudaPagedDecodeTest, EightBitCachesMatchTheReferenceOverTheSameCodes) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int64_t num_kv_heads, group, head_dim;
    std::vector<int32_t> context_lens;
    int num_splits;
  };
  const std::vector<Case> cases = {{2, 4, 128, {1, 17, 300}, 0},
                                   {3, 3, 64, {200, 1025}, 3},
                                   {1, 8, 64, {2049}, 0},
                                   {1, 4, 256, {90, 513}, 2}};
  constexpr int64_t kBlock = 16;
  uint32_t seed = 900;
  for (cpu::KvDtype dtype : {cpu::KvDtype::kInt8, cpu::KvDtype::kFp8E4m3}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(testing::Message() << cpu::KvDtypeName(dtype) << " head_dim=" << c.head_dim
                                      << " group=" << c.group << " splits=" << c.num_splits);
      const int64_t num_seqs = static_cast<int64_t>(c.context_lens.size());
      const int64_t num_heads = c.num_kv_heads * c.group, d = c.head_dim;
      std::vector<int32_t> indptr = {0}, indices;
      for (int32_t len : c.context_lens) {
        for (int64_t b = 0; b < (len + kBlock - 1) / kBlock; ++b) {
          indices.push_back(static_cast<int32_t>(indices.size()));
        }
        indptr.push_back(static_cast<int32_t>(indices.size()));
      }
      std::reverse(indices.begin(), indices.end());  // blocks out of order
      const int64_t num_blocks = static_cast<int64_t>(indices.size());
      testing_util::EightBitCache cache;
      ASSERT_TRUE(testing_util::MakeEightBitCache(dtype, num_blocks, kBlock, c.num_kv_heads, d,
                                                  seed += 3, cache)
                      .ok());
      ASSERT_TRUE(
          testing_util::PoisonUnattended(
              testing_util::AttendedSlots(num_blocks, kBlock, c.context_lens, indptr, indices),
              cache)
              .ok());
      const std::vector<float> q =
          testing_util::RandomFloats(num_seqs * num_heads * d, seed + 2, -2, 2);
      std::vector<int32_t> query_start(num_seqs + 1);
      std::iota(query_start.begin(), query_start.end(), 0);
      for (const testing_util::AttentionExtras& extras :
           {testing_util::AttentionExtras{},
            testing_util::AttentionExtras{.window = 100, .softcap = 2.0f, .sinks = {}},
            testing_util::AttentionExtras{
                .window = 0, .softcap = 0.0f, .sinks = RandomSinks(num_heads, seed + 4)}}) {
        SCOPED_TRACE(testing::Message() << "window=" << extras.window << " softcap="
                                        << extras.softcap << " sinks=" << !extras.sinks.empty());
        LOOM_ASSERT_OK_AND_ASSIGN(
            std::vector<float> expected,
            testing_util::EightBitReference(cache, q, query_start, c.context_lens, indptr, indices,
                                            num_heads, extras));
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                  DecodeEightBit(cache, q, c.context_lens, indptr, indices,
                                                 num_heads, c.num_splits, -1, extras));
        EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), 1e-4, 1e-4));
      }
    }
  }
}

// The tensor-core candidate on one small batch (a context shorter than a tile, one crossing
// two, 24-token blocks, two splits, a group filling the tile's 16 rows): quick enough for
// quick.sh's kernels step and for sweep.sh to run under compute-sanitizer's racecheck (its
// 3-stage ring, its ring of tile rows, the ring reused for the warps' merge).
TEST(CudaPagedDecodeTest, TensorCoreCandidateOnASmallBatch) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const int mma = PagedDecodeCandidateCount() - 1;
  uint32_t seed = 1900;
  for (const int64_t group : {4, 16}) {
    DecodeCase c{2, group, 128, 24, {3, 129}, 2, mma, 4e-3};
    RunDecodeCase(c, DataType::kF16, DataType::kF32, seed += 7);
    c.abs_tolerance = 2e-2;
    RunDecodeCase(c, DataType::kBF16, DataType::kF32, seed += 7);
    if (HasFatalFailure()) return;
  }
}

// Every member of the tuning space (paged_attention_candidates.h) against the reference, F16
// and INT8 caches where it takes them: contexts shorter than one tile, crossing tiles and
// blocks (of 16, 8 and 24 tokens: 24 does not divide a 64-token tile, so a tile's rows change
// block mid-tile at a moving offset), forced splits with empty partitions, the heuristic's
// splits, group tiles 4 and 8, a window and soft-capping. The tensor-core member rounds P to the
// K/V type: 2e-3 in F16 and 1e-2 in BF16 (its 8-bit mantissa) instead of 5e-5 (a misplaced fragment
// moves outputs by tenths); it runs BF16 caches too, and F32 queries (rounded to the K/V type in
// the kernel: 4e-3 and 2e-2).
TEST(CudaPagedDecodeTest, EveryCandidateMatchesReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1300;
  for (int index = 0; index < PagedDecodeCandidateCount(); ++index) {
    SCOPED_TRACE(PagedDecodeCandidateName(index));
    const bool mma = PagedDecodeCandidateName(index).substr(0, 3) == "mma";
    for (DecodeCase c : std::vector<DecodeCase>{{8, 4, 128, 16, {1, 17, 129, 1000}, 0},
                                                {2, 4, 128, 16, {3, 2100}, 16},
                                                {1, 8, 128, 16, {700, 3}, 3},
                                                {2, 6, 128, 8, {65, 640}, 2},
                                                {2, 4, 128, 24, {100, 777}, 0},
                                                // Groups filling the upper half of the
                                                // tensor-core tile's 16 rows.
                                                {1, 16, 128, 16, {700, 3}, 3},
                                                {2, 12, 128, 24, {100, 777}, 0},
                                                // Blocks of 1 and of 128 (two tiles).
                                                {1, 4, 128, 1, {5, 70}, 2},
                                                {2, 4, 128, 128, {1, 300}, 0},
                                                // A stale max_context_len.
                                                {2, 4, 128, 16, {900, 30}, 4, -1, 0, 300}}) {
      c.candidate = index;
      c.abs_tolerance = mma ? 2e-3 : 5e-5;
      RunDecodeCase(c, DataType::kF16, DataType::kF16, seed += 7);
      if (HasFatalFailure()) return;
      if (mma) {
        c.abs_tolerance = 1e-2;
        RunDecodeCase(c, DataType::kBF16, DataType::kBF16, seed += 7);
        if (HasFatalFailure()) return;
        // The model path's F32 query, rounded to the K/V type in the kernel (once more than the
        // reference rounds it).
        c.abs_tolerance = 4e-3;
        RunDecodeCase(c, DataType::kF16, DataType::kF32, seed += 7);
        if (HasFatalFailure()) return;
        c.abs_tolerance = 2e-2;
        RunDecodeCase(c, DataType::kBF16, DataType::kF32, seed += 7);
        if (HasFatalFailure()) return;
      }
    }
    DecodeCase windowed{4, 4, 128, 16, {1500, 90}, 0, index, mma ? 2e-3 : 5e-5};
    RunDecodeCase(windowed, DataType::kF16, DataType::kF16, seed += 7, /*window=*/300,
                  /*softcap=*/30.0f);
    if (HasFatalFailure()) return;
    if (mma) {
      // Sinks: added once, in base e (the kernel's maxima are base 2), with one split and
      // across splits, with an F32 query and a window.
      for (DecodeCase c : std::vector<DecodeCase>{{2, 4, 128, 16, {1, 17, 129, 300}, 1},
                                                  {2, 4, 128, 16, {3, 2100}, 5}}) {
        c.candidate = index;
        c.abs_tolerance = 2e-3;
        RunDecodeCase(c, DataType::kF16, DataType::kF16, seed += 7, 0, 0.0f, /*sinks=*/true);
        c.abs_tolerance = 2e-2;
        RunDecodeCase(c, DataType::kBF16, DataType::kF32, seed += 7, 100, 2.0f, /*sinks=*/true);
        if (HasFatalFailure()) return;
      }
      continue;  // F16 and BF16 only
    }
    constexpr int64_t kBlock = 16, kKvHeads = 2, kGroup = 4, kDim = 128;
    const std::vector<int32_t> context_lens = {5, 300, 1030};
    std::vector<int32_t> indptr = {0}, indices;
    for (int32_t len : context_lens) {
      for (int64_t b = 0; b < (len + kBlock - 1) / kBlock; ++b) {
        indices.push_back(static_cast<int32_t>(indices.size()));
      }
      indptr.push_back(static_cast<int32_t>(indices.size()));
    }
    std::reverse(indices.begin(), indices.end());
    testing_util::EightBitCache cache;
    ASSERT_TRUE(testing_util::MakeEightBitCache(cpu::KvDtype::kInt8,
                                                static_cast<int64_t>(indices.size()), kBlock,
                                                kKvHeads, kDim, seed += 3, cache)
                    .ok());
    ASSERT_TRUE(testing_util::PoisonUnattended(
                    testing_util::AttendedSlots(static_cast<int64_t>(indices.size()), kBlock,
                                                context_lens, indptr, indices),
                    cache)
                    .ok());
    const int64_t num_heads = kKvHeads * kGroup;
    const std::vector<float> q = testing_util::RandomFloats(
        static_cast<int64_t>(context_lens.size()) * num_heads * kDim, seed + 2, -2, 2);
    std::vector<int32_t> query_start(context_lens.size() + 1);
    std::iota(query_start.begin(), query_start.end(), 0);
    LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> expected,
                              testing_util::EightBitReference(cache, q, query_start, context_lens,
                                                              indptr, indices, num_heads));
    for (int splits : {0, 3}) {
      LOOM_ASSERT_OK_AND_ASSIGN(
          std::vector<float> out,
          DecodeEightBit(cache, q, context_lens, indptr, indices, num_heads, splits, index));
      EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), 1e-4, 1e-4)) << splits;
    }
  }
}

// A NaN element written to an fp8 cache is stored as E4M3's NaN code; decoded, it is NaN on
// the GPU as in the CPU table (shifted into F16 it read as a finite 1.875 * 2^-8, so the GPU
// answered a number where the CPU answers NaN).
TEST(CudaPagedDecodeTest, AnFp8NanCodeDecodesToNanAsOnTheCpu) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  constexpr int64_t kBlock = 16, kKvHeads = 2, kGroup = 2, kHeadDim = 64;
  const std::vector<int32_t> context_lens = {20, 20};
  const std::vector<int32_t> indptr = {0, 2, 4}, indices = {0, 1, 2, 3};
  testing_util::EightBitCache cache;
  // Slot 5 of sequence 0, KV head 1: its rotated V row is NaN, so are its codes.
  const int64_t nan_at = 5 * kKvHeads * kHeadDim + kHeadDim + 3;
  ASSERT_TRUE(testing_util::MakeEightBitCache(cpu::KvDtype::kFp8E4m3, 4, kBlock, kKvHeads, kHeadDim,
                                              77, cache, nan_at)
                  .ok());
  const int64_t num_heads = kKvHeads * kGroup;
  const std::vector<float> q = testing_util::RandomFloats(2 * num_heads * kHeadDim, 78, -2, 2);
  LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> expected,
                            testing_util::EightBitReference(cache, q, {0, 1, 2}, context_lens,
                                                            indptr, indices, num_heads));
  LOOM_ASSERT_OK_AND_ASSIGN(
      std::vector<float> out,
      DecodeEightBit(cache, q, context_lens, indptr, indices, num_heads, /*num_splits=*/1));
  int64_t nans = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(std::isnan(out[i]), std::isnan(expected[i])) << i;
    if (std::isnan(expected[i])) {
      ++nans;
    } else {
      EXPECT_NEAR(out[i], expected[i], 1e-4 + 1e-4 * std::abs(expected[i])) << i;
    }
  }
  // Sequence 0's two query heads of KV head 1, whole rows; nothing of sequence 1.
  EXPECT_EQ(nans, kGroup * kHeadDim);
}

}  // namespace
}  // namespace loom::kernels::cuda
