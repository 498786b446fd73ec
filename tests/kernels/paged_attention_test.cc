#include "kernels/cpu/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/paged_attention_internal.h"

namespace loom::kernels::cpu {
namespace {

// Tolerance: outputs are convex combinations of V rows; float dot products, exp and
// accumulation against a double reference over the same cache:
// |out - ref| <= 2e-5 * max|V| (+ 1e-6).
constexpr double kTol = 2e-5;

struct Sequence {
  int32_t context_len;
  int32_t query_len;
};

struct Case {
  KvDtype dtype;
  int64_t block_size;
  int64_t num_kv_heads;
  int64_t group;  // query heads per KV head
  int64_t head_dim;
  std::vector<Sequence> seqs;
};

class PagedAttentionTest : public testing::TestWithParam<bool> {  // param: SIMD enabled
 protected:
  void SetUp() override { internal::SetAttentionSimdForTesting(GetParam()); }
  void TearDown() override { internal::SetAttentionSimdForTesting(true); }
};

void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "dtype " << (c.dtype == KvDtype::kF16 ? "F16" : "F32")
                                  << " block " << c.block_size << " kv_heads " << c.num_kv_heads
                                  << " group " << c.group << " head_dim " << c.head_dim);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t d = c.head_dim, kv_row = c.num_kv_heads * d;
  const int64_t num_heads = c.num_kv_heads * c.group;
  // Block tables: each sequence takes ceil(ctx / bs) + 1 blocks from a shuffled pool.
  std::vector<int32_t> query_start = {0}, context_len, block_indptr = {0}, block_indices;
  int64_t total_blocks = 0;
  for (const Sequence& s : c.seqs) total_blocks += (s.context_len + c.block_size - 1) / c.block_size + 1;
  const int64_t pool_blocks = total_blocks + 3;
  std::vector<int32_t> free_blocks(pool_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  size_t next_free = 0;
  for (const Sequence& s : c.seqs) {
    query_start.push_back(query_start.back() + s.query_len);
    context_len.push_back(s.context_len);
    const int64_t blocks = (s.context_len + c.block_size - 1) / c.block_size + 1;
    for (int64_t b = 0; b < blocks; ++b) block_indices.push_back(free_blocks[next_free++]);
    block_indptr.push_back(static_cast<int32_t>(block_indices.size()));
  }
  const int64_t num_tokens = query_start.back();

  // A pool full of unrelated values, then every sequence's tokens written through WriteKv.
  const int64_t pool_elems = pool_blocks * c.block_size * kv_row;
  const size_t elem_bytes = c.dtype == KvDtype::kF16 ? 2 : 4;
  std::vector<uint8_t> k_pool(pool_elems * elem_bytes), v_pool(pool_elems * elem_bytes);
  for (int64_t i = 0; i < pool_elems; ++i) {
    const float kv[2] = {normal(rng) * 30, normal(rng) * 30};
    for (int which = 0; which < 2; ++which) {
      uint8_t* dst = (which == 0 ? k_pool : v_pool).data() + i * elem_bytes;
      if (c.dtype == KvDtype::kF16) {
        const uint16_t h = FloatToHalf(kv[which]);
        std::memcpy(dst, &h, 2);
      } else {
        std::memcpy(dst, &kv[which], 4);
      }
    }
  }
  KvLayerView cache{k_pool.data(), v_pool.data(), c.dtype, pool_blocks, c.block_size,
                    c.num_kv_heads, d};
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const int64_t ctx = c.seqs[s].context_len;
    std::vector<float> k(ctx * kv_row), v(ctx * kv_row);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    std::vector<int32_t> slots(ctx);
    for (int64_t pos = 0; pos < ctx; ++pos) {
      slots[pos] = block_indices[block_indptr[s] + pos / c.block_size] * c.block_size + pos % c.block_size;
    }
    ASSERT_TRUE(WriteKv(cache, k.data(), v.data(), slots.data(), ctx).ok());
    // Spot-check what WriteKv stored.
    const int64_t pos = ctx - 1, i = kv_row - 1;
    const int64_t index = static_cast<int64_t>(slots[pos]) * kv_row + i;
    if (c.dtype == KvDtype::kF16) {
      EXPECT_EQ(reinterpret_cast<const uint16_t*>(k_pool.data())[index], FloatToHalf(k[pos * kv_row + i]));
    } else {
      EXPECT_EQ(reinterpret_cast<const float*>(v_pool.data())[index], v[pos * kv_row + i]);
    }
  }

  std::vector<float> q(num_tokens * num_heads * d);
  for (float& x : q) x = normal(rng) * 2.0f;
  std::vector<float> out(q.size(), std::nanf("")), want(q.size());
  PagedAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.cache = cache;
  p.query_start = query_start.data();
  p.context_len = context_len.data();
  p.block_indptr = block_indptr.data();
  p.block_indices = block_indices.data();
  p.num_seqs = static_cast<int64_t>(c.seqs.size());
  p.num_heads = num_heads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  ThreadPool pool(2);
  ASSERT_TRUE(PagedAttention(p, pool).ok());
  PagedAttentionParams ref = p;
  ref.out = want.data();
  ASSERT_TRUE(PagedAttentionReference(ref).ok());
  int bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!(std::fabs(out[i] - want[i]) <= kTol * 4.0 + 1e-6) && bad++ < 5) {  // max|V| ~ 4
      ADD_FAILURE() << "out[" << i << "] = " << out[i] << ", reference " << want[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(PagedAttentionTest, MatchesReferenceForDecodePrefillAndChunkedPrefill) {
  const std::vector<Sequence> mixed = {{1, 1}, {37, 1}, {16, 16}, {50, 7}, {129, 1}};
  uint32_t seed = 1;
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kF32}) {
    RunCase({dtype, 16, 3, 3, 64, mixed}, ++seed);     // SmolLM2-135M: 9 heads, 3 KV heads
    RunCase({dtype, 5, 2, 1, 80, mixed}, ++seed);      // odd block size, tail lanes, MHA
    RunCase({dtype, 16, 1, 4, 128, {{300, 300}}}, ++seed);  // one long prefill, MQA
    RunCase({dtype, 32, 2, 7, 32, {{700, 1}, {3, 2}}}, ++seed);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, PagedAttentionTest, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "Simd" : "Scalar";
                         });

TEST(PagedAttentionValidationTest, RejectsBadSlotsBlocksAndShapes) {
  std::vector<uint16_t> k(4 * 16 * 64, 0x3c00), v(k.size(), 0x3c00);
  KvLayerView cache{k.data(), v.data(), KvDtype::kF16, 4, 16, 1, 64};
  std::vector<float> row(64, 1.0f);
  const int32_t bad_slot = 64;
  EXPECT_EQ(WriteKv(cache, row.data(), row.data(), &bad_slot, 1).code(),
            absl::StatusCode::kInvalidArgument);
  const int32_t good_slot = 63;
  EXPECT_TRUE(WriteKv(cache, row.data(), row.data(), &good_slot, 1).ok());

  std::vector<float> q(64, 1.0f), out(64);
  const int32_t query_start[] = {0, 1}, context_len[] = {20}, indptr[] = {0, 2};
  int32_t blocks[] = {1, 4};  // 4 is outside the pool
  PagedAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.cache = cache;
  p.query_start = query_start;
  p.context_len = context_len;
  p.block_indptr = indptr;
  p.block_indices = blocks;
  p.num_seqs = 1;
  p.num_heads = 1;
  p.scale = 0.125f;
  ThreadPool pool(1);
  EXPECT_EQ(PagedAttention(p, pool).code(), absl::StatusCode::kInvalidArgument);
  blocks[1] = 2;
  EXPECT_TRUE(PagedAttention(p, pool).ok());
  const int32_t too_long[] = {33};  // two blocks of 16 cannot hold 33 tokens
  p.context_len = too_long;
  EXPECT_EQ(PagedAttention(p, pool).code(), absl::StatusCode::kInvalidArgument);
  p.context_len = context_len;
  p.num_heads = 3;  // not a multiple of 2 KV heads
  p.cache.num_kv_heads = 2;
  EXPECT_EQ(PagedAttention(p, pool).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::kernels::cpu
