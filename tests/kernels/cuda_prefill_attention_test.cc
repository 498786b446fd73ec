#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/prefill_attention_candidates.h"
#include "tests/kernels/cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing_util::AllClose;

// ---------------------------------------------------------------- checks (no GPU needed)

PagedPrefillParams ValidParams(void* some_device_pointer) {
  PagedPrefillParams p;
  auto* pointer = static_cast<int32_t*>(some_device_pointer);
  p.q = p.out = pointer;
  p.q_dtype = DataType::kBF16;
  p.out_dtype = DataType::kF32;
  p.cache = {pointer, pointer, DataType::kBF16, 8, 16, 2, 128};
  p.query_start = p.context_len = p.block_indptr = p.block_indices = pointer;
  p.num_seqs = 2;
  p.num_heads = 8;
  p.scale = 0.088f;
  p.max_query_len = 100;
  return p;
}

TEST(CudaPagedPrefillTest, RejectsUnsupportedShapesBeforeLaunch) {
  alignas(16) int32_t storage[64] = {};
  ASSERT_TRUE(CheckPagedPrefillParams(ValidParams(storage)).ok())
      << CheckPagedPrefillParams(ValidParams(storage));
  auto expect_invalid = [&](PagedPrefillParams p, const std::string& fragment) {
    const absl::Status status = CheckPagedPrefillParams(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_NE(status.message().find(fragment), std::string::npos) << status;
    // The launch checks first, so this holds with or without a GPU.
    EXPECT_EQ(LaunchPagedPrefill(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
  };
  PagedPrefillParams p = ValidParams(storage);
  p.cache.head_dim = 96;
  expect_invalid(p, "head_dim 96");
  p = ValidParams(storage);
  p.cache.dtype = DataType::kF32;
  expect_invalid(p, "dtype F32");
  p = ValidParams(storage);
  p.q_dtype = DataType::kF32;  // the tensor cores take the cache's dtype only
  expect_invalid(p, "q dtype F32");
  p = ValidParams(storage);
  p.out_dtype = DataType::kF16;  // neither F32 nor the cache's BF16
  expect_invalid(p, "out dtype F16");
  p = ValidParams(storage);
  p.num_heads = 7;
  expect_invalid(p, "num_heads 7");
  p = ValidParams(storage);
  p.cache.num_blocks = int64_t{1} << 27;  // x 16 slots x 2 KV heads = 2^32 cache rows
  expect_invalid(p, "2^32 cache rows");
  p.cache.num_blocks = (int64_t{1} << 27) - 1;
  EXPECT_TRUE(CheckPagedPrefillParams(p).ok()) << CheckPagedPrefillParams(p);
  p = ValidParams(storage);
  p.num_seqs = 70000;
  expect_invalid(p, "num_seqs 70000");
  p = ValidParams(storage);
  p.max_query_len = 0;
  expect_invalid(p, "max_query_len 0");
  p = ValidParams(storage);
  p.scale = NAN;
  expect_invalid(p, "scale");
  p = ValidParams(storage);
  p.q_stride = 8 * 128 + 4;  // rows would not start 16-byte aligned
  expect_invalid(p, "q_stride 1028");
  p.q_stride = 100;  // shorter than a row
  expect_invalid(p, "q_stride 100");
  p = ValidParams(storage);
  p.cache.v = reinterpret_cast<char*>(storage) + 2;
  expect_invalid(p, "K/V pools must be 16-byte aligned");
  p = ValidParams(storage);
  p.q = reinterpret_cast<char*>(storage) + 8;
  expect_invalid(p, "q must be 16-byte aligned");
  p = ValidParams(storage);
  p.block_indices = nullptr;
  expect_invalid(p, "null");
  p = ValidParams(storage);
  p.cache.num_blocks = 0;
  expect_invalid(p, "num_blocks 0");
  p = ValidParams(storage);
  p.window = -3;
  expect_invalid(p, "window -3");
  p = ValidParams(storage);
  p.softcap = -1.0f;
  expect_invalid(p, "softcap -1");
  p.softcap = INFINITY;
  expect_invalid(p, "softcap inf");
  // A fused QKV row (q_stride a multiple of 8, longer than the q row) is fine, and an
  // empty batch needs no pointers.
  p = ValidParams(storage);
  p.q_stride = (8 + 2 * 2) * 128;
  EXPECT_TRUE(CheckPagedPrefillParams(p).ok());
  p.num_seqs = 0;
  p.q = p.out = nullptr;
  EXPECT_TRUE(CheckPagedPrefillParams(p).ok());
}

// ---------------------------------------------------------------- GPU

struct SeqShape {
  int32_t q_len;
  int32_t context_len;  // >= q_len; more: a cached prefix or earlier chunks
};

struct PrefillCase {
  int64_t num_kv_heads, group, head_dim, block_size;
  std::vector<SeqShape> seqs;
  int64_t extra_q_heads = 0;  // q rows padded as in a fused QKV buffer (q_stride)
  bool small_grid = false;    // max_query_len hint of 1: blocks loop over their tiles
  int candidate = -1;         // >= 0: that tiling of the tuning space, output in the cache dtype
  // > 0: the device pool holds this many blocks before the reference's (which the table's
  // entries then name shifted by as many): offsets past 2^31 elements.
  int64_t pool_offset_blocks = 0;
};

// Attention sinks for `num_heads` query heads: random in [-2, 3] (comparable to the scores,
// |q.k| / sqrt(d) reaches ~3), every third head 8 (the sink dominates the softmax) and,
// with more than one head, the last 100 (exp(100) overflows float: the kernel must keep
// the output at its limit, ~0, not NaN).
std::vector<float> RandomSinks(int64_t num_heads, uint32_t seed) {
  std::vector<float> sinks = testing_util::RandomFloats(num_heads, seed, -2, 3);
  for (int64_t h = 1; h < num_heads; h += 3) sinks[h] = 8.0f;
  if (num_heads > 1) sinks[num_heads - 1] = 100.0f;
  return sinks;
}

// Builds a batch (shuffled pool blocks with a spare entry per table; every slot no sequence
// attends NaN, PoisonUnattended), runs the reference once and the kernel for both output
// dtypes. With `sinks`, random attention sinks per
// query head (RandomSinks). The reference is
// cpu::PagedAttentionReference (double) over an F32 view of the exact cache values and
// the queries rounded to the cache dtype. With a window, the device table names blocks
// outside the pool for every block wholly before the sequence's first query's window (as
// freed ones): reading one would make that sequence's outputs NaN.
void RunPrefillCase(const PrefillCase& c, DataType dtype, uint32_t seed, int64_t window = 0,
                    float softcap = 0.0f, bool sinks = false) {
  SCOPED_TRACE(testing::Message() << "window=" << window << " softcap=" << softcap
                                  << " sinks=" << sinks);
  SCOPED_TRACE(testing::Message() << "dtype=" << DataTypeName(dtype)
                                  << " kv_heads=" << c.num_kv_heads << " group=" << c.group
                                  << " head_dim=" << c.head_dim << " block=" << c.block_size
                                  << " seqs=" << c.seqs.size() << " small_grid=" << c.small_grid
                                  << " candidate=" << c.candidate);
  const int64_t num_seqs = static_cast<int64_t>(c.seqs.size());
  const int64_t num_heads = c.num_kv_heads * c.group, d = c.head_dim;
  std::vector<int32_t> query_start{0}, context_lens, indptr{0}, indices;
  int64_t total_blocks = 0;
  int32_t max_q = 1;
  for (const SeqShape& s : c.seqs) {
    query_start.push_back(query_start.back() + s.q_len);
    context_lens.push_back(s.context_len);
    total_blocks += (s.context_len + c.block_size - 1) / c.block_size + 1;
    max_q = std::max(max_q, s.q_len);
  }
  const int64_t num_tokens = query_start.back();
  const int64_t num_blocks = total_blocks + 3;
  std::vector<int32_t> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  size_t next = 0;
  for (const SeqShape& s : c.seqs) {
    const int64_t needed = (s.context_len + c.block_size - 1) / c.block_size + 1;  // one spare
    for (int64_t b = 0; b < needed; ++b) indices.push_back(order[next++]);
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  const int64_t pool = num_blocks * c.block_size * c.num_kv_heads * d;
  testing_util::HostCache cache = testing_util::RandomCache(dtype, pool, seed + 1);
  testing_util::PoisonUnattended(
      dtype, c.num_kv_heads * d,
      testing_util::AttendedSlots(num_blocks, c.block_size, context_lens, indptr, indices), cache);
  // Queries up to +-2 make the softmax peaked enough that a lost or extra token shows.
  const int64_t q_row = num_heads * d;
  const int64_t q_stride = (num_heads + c.extra_q_heads) * d;
  std::vector<float> q_strided = testing_util::RoundTo(
      dtype, testing_util::RandomFloats(num_tokens * q_stride, seed + 3, -2, 2));
  std::vector<float> q(num_tokens * q_row);  // the reference's dense copy
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::copy(q_strided.begin() + t * q_stride, q_strided.begin() + t * q_stride + q_row,
              q.begin() + t * q_row);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::vector<float> head_sinks =
      sinks ? RandomSinks(num_heads, seed + 5) : std::vector<float>();

  std::vector<float> expected(q.size());
  cpu::PagedAttentionParams ref;
  ref.q = q.data();
  ref.out = expected.data();
  ref.cache = {cache.k.data(),
               cache.v.data(),
               cpu::KvDtype::kF32,
               num_blocks,
               c.block_size,
               c.num_kv_heads,
               d};
  ref.query_start = query_start.data();
  ref.context_len = context_lens.data();
  ref.block_indptr = indptr.data();
  ref.block_indices = indices.data();
  ref.num_seqs = num_seqs;
  ref.num_heads = num_heads;
  ref.scale = scale;
  ref.window = window;
  ref.softcap = softcap;
  ref.sinks = head_sinks.empty() ? nullptr : head_sinks.data();
  ASSERT_TRUE(cpu::PagedAttentionReference(ref).ok());

  const int64_t device_blocks = num_blocks + c.pool_offset_blocks;
  std::vector<int32_t> device_indices = indices;
  for (int32_t& block : device_indices) block += static_cast<int32_t>(c.pool_offset_blocks);
  for (size_t s = 0; window > 0 && s < c.seqs.size(); ++s) {
    const int64_t first_query = c.seqs[s].context_len - c.seqs[s].q_len;
    const int64_t window_start = std::max<int64_t>(0, first_query - window + 1);
    for (int64_t b = 0; (b + 1) * c.block_size <= window_start; ++b) {
      device_indices[static_cast<size_t>(indptr[s] + b)] =
          static_cast<int32_t>(device_blocks + 1000);
    }
  }
  const size_t offset_bytes = static_cast<size_t>(c.pool_offset_blocks) *
                              (cache.k_bytes.size() / static_cast<size_t>(num_blocks));
  absl::StatusOr<DeviceBuffer> k_pool = DeviceBuffer::Allocate(offset_bytes + cache.k_bytes.size());
  absl::StatusOr<DeviceBuffer> v_pool = k_pool.ok() ? DeviceBuffer::Allocate(k_pool->bytes())
                                                    : absl::StatusOr<DeviceBuffer>(k_pool.status());
  if (c.pool_offset_blocks > 0 && (!k_pool.ok() || !v_pool.ok())) {
    GTEST_SKIP() << "the device cannot hold two pools of " << offset_bytes + cache.k_bytes.size()
                 << " bytes: " << (k_pool.ok() ? v_pool.status() : k_pool.status());
  }
  ASSERT_TRUE(k_pool.ok() && v_pool.ok()) << k_pool.status() << " " << v_pool.status();
  DeviceBuffer d_k = std::move(*k_pool), d_v = std::move(*v_pool);
  ASSERT_TRUE(d_k.CopyFromHost(cache.k_bytes.data(), cache.k_bytes.size(), offset_bytes).ok());
  ASSERT_TRUE(d_v.CopyFromHost(cache.v_bytes.data(), cache.v_bytes.size(), offset_bytes).ok());
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q, testing_util::Upload(dtype, q_strided));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_query_start, testing_util::UploadRaw(query_start));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_len, testing_util::UploadRaw(context_lens));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indptr, testing_util::UploadRaw(indptr));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indices, testing_util::UploadRaw(device_indices));
  DeviceBuffer d_sinks;
  if (!head_sinks.empty()) {
    LOOM_ASSERT_OK_AND_ASSIGN(d_sinks, testing_util::UploadRaw(head_sinks));
  }
  for (DataType out_dtype : {DataType::kF32, dtype}) {
    if (c.candidate >= 0 && out_dtype == DataType::kF32) continue;  // compiled for dtype only
    SCOPED_TRACE(testing::Message() << "out=" << DataTypeName(out_dtype));
    // One poisoned token row past the end catches writes out of bounds.
    LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out,
                              testing_util::Poisoned(out_dtype, (num_tokens + 1) * q_row));
    PagedPrefillParams p;
    p.q = d_q.data();
    p.out = d_out.data();
    p.q_dtype = dtype;
    p.out_dtype = out_dtype;
    p.cache = {d_k.data(), d_v.data(), dtype, device_blocks, c.block_size, c.num_kv_heads, d};
    p.query_start = static_cast<const int32_t*>(d_query_start.data());
    p.context_len = static_cast<const int32_t*>(d_len.data());
    p.block_indptr = static_cast<const int32_t*>(d_indptr.data());
    p.block_indices = static_cast<const int32_t*>(d_indices.data());
    p.num_seqs = num_seqs;
    p.num_heads = num_heads;
    p.q_stride = c.extra_q_heads > 0 ? q_stride : 0;
    p.scale = scale;
    p.window = window;
    p.softcap = softcap;
    p.sinks = static_cast<const float*>(d_sinks.data());
    p.max_query_len = c.small_grid ? 1 : max_q;
    const absl::Status launched = c.candidate >= 0
                                      ? LaunchPagedPrefillCandidate(p, c.candidate, nullptr)
                                      : LaunchPagedPrefill(p, nullptr);
    ASSERT_TRUE(launched.ok()) << launched;
    const absl::Status synced = SynchronizeStream(nullptr);
    ASSERT_TRUE(synced.ok()) << synced;
    LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                              testing_util::Download(d_out, out_dtype, (num_tokens + 1) * q_row));
    for (int64_t i = num_tokens * q_row; i < (num_tokens + 1) * q_row; ++i) {
      ASSERT_TRUE(std::isnan(out[i])) << "write past the output at " << i;
    }
    out.resize(num_tokens * q_row);
    // Outputs are convex combinations of V in [-1, 1]. The probabilities are rounded to
    // the cache dtype for the P V product (and summed as rounded), which moves an output
    // by at most 2 units of that rounding (2^-8 BF16, 2^-11 F16); then one rounding of
    // the output to out_dtype.
    const double atol = dtype == DataType::kBF16 ? 8e-3 : 1e-3;
    const double rtol =
        out_dtype == DataType::kF32 ? 1e-5 : testing_util::RoundingTolerance(out_dtype) / 2;
    EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), atol, rtol));
  }
}

// Query lengths {1, 7, 64, 200}, whole prompts (context == query) next to chunked prefill
// and cached prefixes (context > query), several sequences per batch.
std::vector<SeqShape> MixedBatch() {
  return {{1, 1}, {7, 7}, {64, 64}, {200, 200}, {7, 300}, {64, 130}, {200, 517}, {1, 1000}};
}

TEST(CudaPagedPrefillTest, MatchesCpuReferenceAcrossShapes) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<PrefillCase> cases = {
      // MHA (group 1): 64 rows = 64 tokens.
      {2, 1, 64, 16, MixedBatch()},
      {2, 1, 128, 5, MixedBatch()},
      // GQA 4 and 8 (MQA-like: one KV head): a block's rows span 16 or 8 tokens.
      {2, 4, 64, 32, MixedBatch()},
      {2, 4, 128, 16, MixedBatch()},
      {1, 8, 64, 1, MixedBatch()},
      {1, 8, 128, 16, MixedBatch()},
      // A group that does not divide 64: tiles start mid-token.
      {2, 3, 128, 16, {{1, 1}, {7, 40}, {64, 64}, {200, 333}}},
      // q rows inside a fused QKV buffer.
      {2, 4, 128, 16, {{7, 7}, {64, 100}, {200, 200}}, /*extra_q_heads=*/4},
      // A max_query_len hint below the truth: blocks loop over the remaining tiles.
      {2, 4, 64, 16, {{200, 250}, {64, 64}, {1, 9}}, 0, /*small_grid=*/true},
      // Head dim 256 (Gemma 2 and 3): 32-token KV tiles.
      {2, 4, 256, 16, MixedBatch()},
      {1, 1, 256, 16, {{1, 1}, {7, 40}, {64, 64}, {100, 170}}},
      // A sequence with no query tokens in the batch (its blocks return at once).
      {2, 4, 128, 16, {{7, 40}, {0, 30}, {33, 90}}},
  };
  uint32_t seed = 100;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (const PrefillCase& c : cases) {
      RunPrefillCase(c, dtype, seed += 11);
      if (HasFatalFailure()) return;
    }
  }
}

// A sequence whose blocks sit past 2^31 elements of the pool (a served layer pool passes that:
// Llama-3-8B's 8 KV heads x 128 dims are 1,024 elements a slot), read through 32-bit cache
// rows times the head dim in 64 bits: a 32-bit product would read the wrong rows. Skipped where
// the device cannot hold two 4.3 GB pools.
TEST(CudaPagedPrefillTest, BlocksPastTwoToTheThirtyOneElementsMatchTheReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  PrefillCase c{1, 4, 128, 16, {{40, 700}, {64, 1000}}};
  c.pool_offset_blocks = (int64_t{1} << 31) / (16 * 128) + 128;
  RunPrefillCase(c, DataType::kF16, 4242);
}

// Mistral's and Gemma's local layers: windows of 1 token, shorter than a block, a KV tile
// or a query tile, and longer than every context; chunked prefill across the window's edge
// (context > query); Gemma 2's soft-capped scores, alone and with a window.
TEST(CudaPagedPrefillTest, WindowsReadOnlyTheirPositionsAndSoftCapMatchesTheReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  // The CPU reference (double) dominates the time: few cases, each window where it cuts.
  const std::vector<PrefillCase> cases = {
      {2, 4, 128, 16, MixedBatch()},
      {1, 8, 64, 5, MixedBatch()},
      {2, 3, 128, 16, {{1, 1}, {7, 40}, {64, 64}, {200, 333}}},
      {2, 4, 64, 16, {{200, 250}, {64, 64}, {1, 9}}, 0, /*small_grid=*/true},
      {2, 2, 256, 16, {{1, 1}, {7, 40}, {64, 64}, {100, 170}}},
  };
  uint32_t seed = 900;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      // Windows of 1 token, shorter than a block, than a KV tile, and than a query tile.
      const int64_t window = i % 2 == 0 ? 13 : (i == 1 ? 1 : 100);
      RunPrefillCase(cases[i], dtype, seed += 11, window);
      RunPrefillCase(cases[i], dtype, seed += 11, 0, i % 2 == 0 ? 1.5f : 50.0f);
      RunPrefillCase(cases[i], dtype, seed += 11, 129, 2.0f);
      if (HasFatalFailure()) return;
    }
  }
}

// gpt-oss's attention sinks, joined to each row's denominator in the epilogue: MHA and
// GQA (a block's rows mix heads with different sinks), every head dim, chunked prefill,
// blocks that loop over their tiles, and with a window and soft-capping.
TEST(CudaPagedPrefillTest, SinksJoinEachRowsDenominator) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<PrefillCase> cases = {
      {2, 1, 64, 16, MixedBatch()},
      {2, 4, 128, 16, MixedBatch()},
      {1, 8, 64, 5, MixedBatch()},
      {2, 3, 128, 16, {{1, 1}, {7, 40}, {64, 64}, {200, 333}}},
      {2, 4, 64, 16, {{200, 250}, {64, 64}, {1, 9}}, 0, /*small_grid=*/true},
      {2, 4, 256, 16, {{1, 1}, {7, 40}, {64, 64}, {100, 170}}},
  };
  uint32_t seed = 1300;
  for (DataType dtype : {DataType::kF16, DataType::kBF16}) {
    for (const PrefillCase& c : cases) {
      RunPrefillCase(c, dtype, seed += 11, 0, 0.0f, /*sinks=*/true);
      RunPrefillCase(c, dtype, seed += 11, 13, 2.0f, /*sinks=*/true);
      if (HasFatalFailure()) return;
    }
  }
}

// Every tiling of the tuning space (prefill_attention_candidates.h: BF16, head dim 128) against
// the reference: MHA and GQA 3, 4 and 8 (tiles starting mid-token), blocks of 5 tokens, chunked
// prefill and cached prefixes, blocks looping over their tiles, a prompt across many KV
// tiles, a window with soft-capping, and sinks.
TEST(CudaPagedPrefillTest, EveryCandidateMatchesReference) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 2100;
  for (int index = 0; index < PagedPrefillCandidateCount(); ++index) {
    SCOPED_TRACE(PagedPrefillCandidateName(index));
    std::vector<PrefillCase> cases = {
        {2, 4, 128, 16, MixedBatch()},
        {2, 1, 128, 5, MixedBatch()},
        {1, 8, 128, 16, {{1, 1}, {64, 64}, {200, 517}}},
        {2, 3, 128, 16, {{1, 1}, {7, 40}, {64, 64}, {200, 333}}},
        {2, 4, 128, 16, {{200, 250}, {64, 64}, {1, 9}}, 0, /*small_grid=*/true},
        {1, 4, 128, 16, {{300, 700}}},
    };
    for (PrefillCase& c : cases) {
      c.candidate = index;
      RunPrefillCase(c, DataType::kBF16, seed += 11);
      if (HasFatalFailure()) return;
    }
    RunPrefillCase(cases[0], DataType::kBF16, seed += 11, /*window=*/13, /*softcap=*/2.0f);
    RunPrefillCase(cases[3], DataType::kBF16, seed += 11, 0, 0.0f, /*sinks=*/true);
    if (HasFatalFailure()) return;
  }
}

// The space takes only what it is compiled for, and says so before any launch.
TEST(CudaPagedPrefillTest, CandidatesRefuseShapesOutsideTheSpace) {
  alignas(16) int32_t storage[64] = {};
  PagedPrefillParams p = ValidParams(storage);
  p.cache.dtype = p.q_dtype = p.out_dtype = DataType::kBF16;
  ASSERT_GE(PagedPrefillCandidateCount(), 2);
  EXPECT_EQ(PagedPrefillCandidateName(0), "w4_m2_n32");  // the dispatched tiling
  for (int index : {-1, PagedPrefillCandidateCount()}) {
    const absl::Status status = LaunchPagedPrefillCandidate(p, index, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << index;
  }
  PagedPrefillParams f16 = p;
  f16.cache.dtype = f16.q_dtype = f16.out_dtype = DataType::kF16;
  PagedPrefillParams f32_out = p;
  f32_out.out_dtype = DataType::kF32;
  PagedPrefillParams eight_bit = p;
  eight_bit.cache.quant = KvQuant::kInt8;
  for (const PagedPrefillParams& params : {f16, f32_out}) {
    const absl::Status status = LaunchPagedPrefillCandidate(params, 0, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("BF16 cache and output only"), std::string::npos) << status;
  }
  EXPECT_FALSE(LaunchPagedPrefillCandidate(eight_bit, 0, nullptr).ok());
}

TEST(CudaPagedPrefillTest, RejectsMisalignedSinks) {
  alignas(16) int32_t storage[64] = {};
  PagedPrefillParams p = ValidParams(storage);
  p.sinks = reinterpret_cast<const float*>(storage);
  EXPECT_TRUE(CheckPagedPrefillParams(p).ok());
  p.sinks = reinterpret_cast<const float*>(reinterpret_cast<const char*>(storage) + 2);
  EXPECT_NE(CheckPagedPrefillParams(p).message().find("sinks must be 4-byte aligned"),
            std::string::npos);
}

TEST(CudaPagedPrefillTest, LongPromptAcrossManyKvTiles) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  // 1,000 tokens after a 400-token cached prefix: 22 KV tiles for the last rows.
  RunPrefillCase({1, 4, 128, 16, {{1000, 1400}}}, DataType::kBF16, 7);
}

// A table that is too short or names a block outside the pool, or a context shorter than
// the query, makes that sequence's outputs NaN (never a read outside the pool, never a
// plausible wrong value); the other sequences are unaffected.
TEST(CudaPagedPrefillTest, BadBlockTableYieldsNanForThatSequenceOnly) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t num_blocks = 8, block_size = 16, kv_heads = 1, group = 2, d = 64;
  const int64_t pool = num_blocks * block_size * kv_heads * d;
  testing_util::HostCache cache = testing_util::RandomCache(DataType::kF16, pool, 5);
  // Sequence 0 is fine; 1 names block 8 (outside); 2 has two blocks for 40 tokens;
  // 3 has a context of 3 for 5 query tokens.
  std::vector<int32_t> query_start{0, 20, 40, 60, 65};
  std::vector<int32_t> context_lens{40, 40, 40, 3};
  std::vector<int32_t> indptr{0, 3, 6, 8, 9};
  std::vector<int32_t> indices{0, 1, 2, 3, 8, 4, 5, 6, 7};
  const int64_t num_tokens = query_start.back();
  const int64_t row = group * d;
  std::vector<float> q = testing_util::RandomFloats(num_tokens * row, 6);
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k, testing_util::UploadRaw(cache.k_bytes));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_v, testing_util::UploadRaw(cache.v_bytes));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q, testing_util::Upload(DataType::kF16, q));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out,
                            testing_util::Poisoned(DataType::kF32, num_tokens * row));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_query_start, testing_util::UploadRaw(query_start));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_len, testing_util::UploadRaw(context_lens));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indptr, testing_util::UploadRaw(indptr));
  LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indices, testing_util::UploadRaw(indices));
  PagedPrefillParams p;
  p.q = d_q.data();
  p.out = d_out.data();
  p.q_dtype = DataType::kF16;
  p.out_dtype = DataType::kF32;
  p.cache = {d_k.data(), d_v.data(), DataType::kF16, num_blocks, block_size, kv_heads, d};
  p.query_start = static_cast<const int32_t*>(d_query_start.data());
  p.context_len = static_cast<const int32_t*>(d_len.data());
  p.block_indptr = static_cast<const int32_t*>(d_indptr.data());
  p.block_indices = static_cast<const int32_t*>(d_indices.data());
  p.num_seqs = 4;
  p.num_heads = group;
  p.scale = 0.125f;
  p.max_query_len = 20;
  ASSERT_TRUE(LaunchPagedPrefill(p, nullptr).ok());
  ASSERT_TRUE(SynchronizeStream(nullptr).ok());
  LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                            testing_util::Download(d_out, DataType::kF32, num_tokens * row));
  for (int64_t i = 0; i < 20 * row; ++i) ASSERT_FALSE(std::isnan(out[i])) << i;
  // Sequence 1's last query tokens read block 8; sequence 2's read past its table; every
  // token of sequence 3 has no valid position.
  for (int64_t t : {39, 59, 60, 64}) {
    for (int64_t i = t * row; i < (t + 1) * row; ++i) ASSERT_TRUE(std::isnan(out[i])) << t;
  }
}

// 8-bit caches (int8, fp8) on both compute dtypes: the codes and scales cpu::WriteKv stored
// (NaN codes and scales in the slots no sequence attends), dequantized into the tiles; the query
// rotated into the compute dtype by LaunchRotateHeads, the output rotated back in place (what
// CudaDevice does). Against cpu::PagedAttentionReference over the same codes with the unrounded
// query: besides the tolerance of F16/BF16 caches, the rotated query and the dequantized K/V are
// rounded to the compute dtype once each.
TEST(CudaPagedPrefillTest, EightBitCachesMatchTheReferenceOverTheSameCodes) {
  LOOM_SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int64_t num_kv_heads, group, head_dim;
    std::vector<std::pair<int32_t, int32_t>> seqs;  // (query tokens, context tokens)
    int64_t block = 16;
    int64_t window = 0;
  };
  // Blocks of 5 (not dividing a KV tile) with a window: the 8-bit loader's per-row scales.
  const std::vector<Case> cases = {{2, 4, 128, {{40, 40}, {17, 100}}},
                                   {3, 3, 64, {{130, 200}, {1, 65}}},
                                   {1, 2, 256, {{33, 90}}},
                                   {1, 4, 128, {{130, 130}, {20, 300}}, 5, 100}};
  uint32_t seed = 950;
  for (cpu::KvDtype dtype : {cpu::KvDtype::kInt8, cpu::KvDtype::kFp8E4m3}) {
    for (DataType compute : {DataType::kF16, DataType::kBF16}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(testing::Message() << cpu::KvDtypeName(dtype) << " " << DataTypeName(compute)
                                        << " head_dim=" << c.head_dim << " block=" << c.block
                                        << " window=" << c.window);
        const int64_t num_seqs = static_cast<int64_t>(c.seqs.size());
        const int64_t num_heads = c.num_kv_heads * c.group, d = c.head_dim;
        std::vector<int32_t> query_start = {0}, context_lens, indptr = {0}, indices;
        int32_t max_q = 0;
        for (const auto& [q_len, context] : c.seqs) {
          query_start.push_back(query_start.back() + q_len);
          context_lens.push_back(context);
          max_q = std::max(max_q, q_len);
          for (int64_t b = 0; b < (context + c.block - 1) / c.block; ++b) {
            indices.push_back(static_cast<int32_t>(indices.size()));
          }
          indptr.push_back(static_cast<int32_t>(indices.size()));
        }
        std::reverse(indices.begin(), indices.end());
        const int64_t num_blocks = static_cast<int64_t>(indices.size());
        const int64_t num_tokens = query_start.back();
        testing_util::EightBitCache cache;
        ASSERT_TRUE(testing_util::MakeEightBitCache(dtype, num_blocks, c.block, c.num_kv_heads, d,
                                                    seed += 3, cache)
                        .ok());
        ASSERT_TRUE(
            testing_util::PoisonUnattended(
                testing_util::AttendedSlots(num_blocks, c.block, context_lens, indptr, indices),
                cache)
                .ok());
        const std::vector<float> q =
            testing_util::RandomFloats(num_tokens * num_heads * d, seed + 2, -2, 2);
        LOOM_ASSERT_OK_AND_ASSIGN(
            std::vector<float> expected,
            testing_util::EightBitReference(cache, q, query_start, context_lens, indptr, indices,
                                            num_heads,
                                            {.window = c.window, .softcap = 0.0f, .sinks = {}}));

        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q, testing_util::UploadRaw(q));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q_rotated,
                                  testing_util::Poisoned(compute, q.size()));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out,
                                  testing_util::Poisoned(DataType::kF32, q.size()));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_query_start, testing_util::UploadRaw(query_start));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_len, testing_util::UploadRaw(context_lens));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indptr, testing_util::UploadRaw(indptr));
        LOOM_ASSERT_OK_AND_ASSIGN(DeviceBuffer d_indices, testing_util::UploadRaw(indices));
        ASSERT_TRUE(testing_util::RotateRows(d_q.data(), d_q_rotated.data(), compute,
                                             num_tokens * num_heads, d)
                        .ok());
        PagedPrefillParams p;
        p.q = d_q_rotated.data();
        p.out = d_out.data();
        p.q_dtype = compute;
        p.out_dtype = DataType::kF32;
        p.cache = cache.View(compute);
        p.query_start = static_cast<const int32_t*>(d_query_start.data());
        p.context_len = static_cast<const int32_t*>(d_len.data());
        p.block_indptr = static_cast<const int32_t*>(d_indptr.data());
        p.block_indices = static_cast<const int32_t*>(d_indices.data());
        p.num_seqs = num_seqs;
        p.num_heads = num_heads;
        p.scale = 1.0f / std::sqrt(static_cast<float>(d));
        p.max_query_len = max_q;
        p.window = c.window;
        const absl::Status launched = LaunchPagedPrefill(p, nullptr);
        ASSERT_TRUE(launched.ok()) << launched;
        ASSERT_TRUE(testing_util::RotateRows(d_out.data(), d_out.data(), DataType::kF32,
                                             num_tokens * num_heads, d)
                        .ok());
        ASSERT_TRUE(SynchronizeStream(nullptr).ok());
        LOOM_ASSERT_OK_AND_ASSIGN(std::vector<float> out,
                                  testing_util::Download(d_out, DataType::kF32, q.size()));
        // The F16/BF16 caches' bound (probabilities rounded for P V), 3x for the rounded
        // query and K/V.
        const double atol = compute == DataType::kBF16 ? 2.4e-2 : 3e-3;
        EXPECT_TRUE(AllClose(out, testing_util::ToDouble(expected), atol, 1e-5));
      }
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
