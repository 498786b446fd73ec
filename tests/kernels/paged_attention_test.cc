#include "kernels/cpu/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "common/sampling_params.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/paged_attention_internal.h"

namespace loom::kernels::cpu {
namespace {

// Tolerance: outputs are convex combinations of V rows; float dot products, exp and
// accumulation against a double reference over the same cache:
// |out - ref| <= 2e-5 * max|V| (+ 1e-6).
constexpr double kTol = 2e-5;

// Every KV element type the kernels take.
constexpr KvDtype kAllDtypes[] = {KvDtype::kF16, KvDtype::kBf16, KvDtype::kF32, KvDtype::kInt8,
                                  KvDtype::kFp8E4m3};

// A K/V pool of `dtype` (with its scales for the 8-bit types) and its view.
struct TestPool {
  std::vector<uint8_t> k, v;
  std::vector<uint16_t> k_scale, v_scale;
  KvLayerView view;
  TestPool(KvDtype dtype, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
           int64_t head_dim, uint8_t k_fill = 0, uint8_t v_fill = 0) {
    const int64_t heads = num_blocks * block_size * kv_heads;
    k.assign(heads * head_dim * KvElementBytes(dtype), k_fill);
    v.assign(k.size(), v_fill);
    if (IsQuantizedKv(dtype)) {
      k_scale.assign(heads, 0);
      v_scale.assign(heads, 0);
    }
    view = {k.data(),
            v.data(),
            dtype,
            num_blocks,
            block_size,
            kv_heads,
            head_dim,
            k_scale.empty() ? nullptr : k_scale.data(),
            v_scale.empty() ? nullptr : v_scale.data()};
  }
};

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
  // A tensor-parallel slice (PagedAttentionParams::group / head0 / kv_head0): with
  // slice_heads > 0 the cache holds KV heads [kv_head0, kv_head0 + num_kv_heads) of a model
  // with `group` query heads per KV head, and the call runs query heads
  // [head0, head0 + slice_heads).
  int64_t slice_heads = 0;
  int64_t head0 = 0;
  int64_t kv_head0 = 0;
  int64_t window = 0;  // sliding window (PagedAttentionParams::window)
  float softcap = 0.0f;  // PagedAttentionParams::softcap
  bool sinks = false;    // random PagedAttentionParams::sinks, one far above every score
  ActivationPrecision activations = ActivationPrecision::kF32;
};

// --activations bf16 against the reference with the same BF16 rounding (q, K, V and each weight
// exp(s - running max)): the kernel's float weight and the reference's double one can round to
// the two sides of a BF16 step where they straddle it (a few elements in 10^4 move by more than
// 1e-4), which moves an output by up to 2^-8 of that weight times its V: measured at most
// 2.3e-3 on these cases (|V| up to ~4), where the rounded and the float reference differ by
// 1.7e-2 to 2.3e-2.
constexpr double kTolBf16 = 1.5e-3;

// A fixed cache holding several sequences' K/V and queries, run as steps of any
// composition: Run({{seq, begin, end}, ...}) puts the query tokens at positions
// [begin, end) of each listed sequence (context_len = end) in one step and returns each
// item's output.
class StepHarness {
 public:
  struct Item {
    int32_t seq, begin, end;
  };
  StepHarness(KvDtype dtype, int64_t block_size, int64_t kv_heads, int64_t group, int64_t head_dim,
              const std::vector<int32_t>& lengths, uint32_t seed, int64_t window = 0,
              ActivationPrecision activations = ActivationPrecision::kF32)
      : d_(head_dim), num_heads_(kv_heads * group), window_(window), activations_(activations) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t kv_row = kv_heads * d_;
    int64_t pool_blocks = 1;
    for (int32_t len : lengths) pool_blocks += (len + block_size - 1) / block_size;
    std::vector<int32_t> order(pool_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    size_t next = 0;
    pool_ = std::make_unique<TestPool>(dtype, pool_blocks, block_size, kv_heads, d_);
    cache_ = pool_->view;
    for (int32_t len : lengths) {
      blocks_.emplace_back();
      for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b) {
        blocks_.back().push_back(order[next++]);
      }
      std::vector<float> k(len * kv_row), v(len * kv_row);
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      std::vector<int32_t> slots(len);
      for (int32_t pos = 0; pos < len; ++pos) {
        slots[pos] = blocks_.back()[pos / block_size] * static_cast<int32_t>(block_size) +
                     pos % static_cast<int32_t>(block_size);
      }
      EXPECT_TRUE(WriteKv(cache_, k.data(), v.data(), slots.data(), len).ok());
      queries_.emplace_back(len * num_heads_ * d_);
      for (float& x : queries_.back()) x = normal(rng) * 2.0f;
    }
  }

  std::vector<std::vector<float>> Run(const std::vector<Item>& items, int threads) const {
    std::vector<int32_t> query_start = {0}, context_len, indptr = {0}, indices;
    std::vector<float> q;
    const int64_t row = num_heads_ * d_;
    for (const Item& item : items) {
      query_start.push_back(query_start.back() + item.end - item.begin);
      context_len.push_back(item.end);
      const std::vector<int32_t>& blocks = blocks_[item.seq];
      indices.insert(indices.end(), blocks.begin(), blocks.end());
      indptr.push_back(static_cast<int32_t>(indices.size()));
      const std::vector<float>& all = queries_[item.seq];
      q.insert(q.end(), all.begin() + item.begin * row, all.begin() + item.end * row);
    }
    std::vector<float> out(q.size(), std::nanf(""));
    PagedAttentionParams p;
    p.q = q.data();
    p.out = out.data();
    p.cache = cache_;
    p.query_start = query_start.data();
    p.context_len = context_len.data();
    p.block_indptr = indptr.data();
    p.block_indices = indices.data();
    p.num_seqs = static_cast<int64_t>(items.size());
    p.num_heads = num_heads_;
    p.scale = 1.0f / std::sqrt(static_cast<float>(d_));
    p.window = window_;
    p.activations = activations_;
    ThreadPool pool(threads);
    EXPECT_TRUE(PagedAttention(p, pool).ok());
    std::vector<std::vector<float>> outputs;
    for (size_t i = 0; i < items.size(); ++i) {
      outputs.emplace_back(out.begin() + query_start[i] * row, out.begin() + query_start[i + 1] * row);
    }
    return outputs;
  }

  // Sequence `seq`'s tokens run as the given consecutive pieces [begin, end), a step each:
  // their outputs, concatenated.
  std::vector<float> RunPieces(int32_t seq, const std::vector<std::pair<int32_t, int32_t>>& pieces,
                               int threads = 2) const {
    std::vector<float> out;
    for (const auto& [begin, end] : pieces) {
      const std::vector<float> piece = Run({{seq, begin, end}}, threads)[0];
      out.insert(out.end(), piece.begin(), piece.end());
    }
    return out;
  }

  // A speculative verify step of 1 + kMaxSpeculativeTokens tokens of `seq` from position
  // `from`, and the same tokens decoded one a step beside `beside`: {verify, decoded}.
  std::pair<std::vector<float>, std::vector<float>> VerifyAndDecode(int32_t seq, int32_t from,
                                                                    Item beside) const {
    const int32_t verify_len = 1 + common::kMaxSpeculativeTokens;
    std::vector<float> decoded;
    for (int32_t pos = from; pos < from + verify_len; ++pos) {
      const std::vector<float> one = Run({beside, {seq, pos, pos + 1}}, 2)[1];
      decoded.insert(decoded.end(), one.begin(), one.end());
    }
    return {Run({{seq, from, from + verify_len}}, 2)[0], decoded};
  }

 private:
  int64_t d_, num_heads_, window_;
  ActivationPrecision activations_;
  std::unique_ptr<TestPool> pool_;
  KvLayerView cache_;
  std::vector<std::vector<int32_t>> blocks_;
  std::vector<std::vector<float>> queries_;
};

class PagedAttentionTest : public testing::TestWithParam<bool> {  // param: SIMD enabled
 protected:
  void SetUp() override { internal::SetAttentionSimdForTesting(GetParam()); }
  void TearDown() override {
    internal::SetAttentionSimdForTesting(true);
    internal::SetTileModeForTesting(internal::TileMode::kAuto);
    internal::SetMultiRowTasksForTesting(true);
  }
};

void RunCase(const Case& c, uint32_t seed, int num_threads = 2) {
  SCOPED_TRACE(testing::Message() << "dtype " << KvDtypeName(c.dtype) << " block " << c.block_size
                                  << " kv_heads " << c.num_kv_heads << " group " << c.group
                                  << " head_dim " << c.head_dim << " seqs " << c.seqs.size()
                                  << " slice_heads " << c.slice_heads << " head0 " << c.head0
                                  << " window " << c.window << " threads " << num_threads
                                  << " activations " << ActivationPrecisionName(c.activations));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t d = c.head_dim, kv_row = c.num_kv_heads * d;
  const int64_t num_heads = c.slice_heads > 0 ? c.slice_heads : c.num_kv_heads * c.group;
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

  // A pool of NaNs (F16, BF16, F32 and E4M3 codes 0x7f; NaN scales for the 8-bit types), as a
  // reused pool may hold, then every sequence's tokens written through WriteKv: a slot no
  // query attends (block tails, spare blocks) must not reach an output, not even with a
  // weight of 0.
  const int64_t pool_elems = pool_blocks * c.block_size * kv_row;
  TestPool test_pool(c.dtype, pool_blocks, c.block_size, c.num_kv_heads, d);
  const KvLayerView cache = test_pool.view;
  const size_t elem_bytes = KvElementBytes(c.dtype);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < pool_elems; ++i) {
    for (std::vector<uint8_t>* pool : {&test_pool.k, &test_pool.v}) {
      uint8_t* dst = pool->data() + i * elem_bytes;
      if (c.dtype == KvDtype::kF16 || c.dtype == KvDtype::kBf16) {
        const uint16_t h = c.dtype == KvDtype::kF16 ? 0x7e00 : 0x7fc0;
        std::memcpy(dst, &h, 2);
      } else if (c.dtype == KvDtype::kF32) {
        std::memcpy(dst, &nan, 4);
      } else {
        *dst = 0x7f;
      }
    }
  }
  for (std::vector<uint16_t>* scales : {&test_pool.k_scale, &test_pool.v_scale}) {
    std::fill(scales->begin(), scales->end(), uint16_t{0x7fc0});  // BF16 NaN
  }
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
      EXPECT_EQ(reinterpret_cast<const uint16_t*>(test_pool.k.data())[index],
                FloatToHalf(k[pos * kv_row + i]));
    } else if (c.dtype == KvDtype::kBf16) {
      EXPECT_EQ(reinterpret_cast<const uint16_t*>(test_pool.k.data())[index],
                FloatToBf16(k[pos * kv_row + i]));
    } else if (c.dtype == KvDtype::kF32) {
      EXPECT_EQ(reinterpret_cast<const float*>(test_pool.v.data())[index], v[pos * kv_row + i]);
    } else {
      // The last head's row, rotated where the cache rotates (RotatesKv).
      std::vector<float> x(v.begin() + pos * kv_row + kv_row - d, v.begin() + (pos + 1) * kv_row);
      if (RotatesKv(c.dtype, d)) RotateKvRow(x.data(), d);
      const float scale = Bf16ToFloat(test_pool.v_scale[index / d]);
      EXPECT_NEAR(DequantizeKv(c.dtype, test_pool.v.data(), index, scale), x[d - 1],
                  c.dtype == KvDtype::kInt8 ? scale / 2 : std::fabs(x[d - 1]) / 16 + scale / 1024);
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
  if (c.slice_heads > 0) {
    p.group = c.group;
    p.head0 = c.head0;
    p.kv_head0 = c.kv_head0;
  }
  p.window = c.window;
  p.softcap = c.softcap;
  // Sinks around the scores' scale (|q.k| / sqrt(d) reaches several units), the last head's
  // far above them: that head's output is nearly 0.
  std::vector<float> sinks(static_cast<size_t>(num_heads));
  for (float& sink : sinks) sink = std::uniform_real_distribution<float>(-2.0f, 3.0f)(rng);
  sinks.back() = 12.0f;
  if (c.sinks) p.sinks = sinks.data();
  p.activations = c.activations;
  ThreadPool pool(num_threads);
  ASSERT_TRUE(PagedAttention(p, pool).ok());
  PagedAttentionParams ref = p;
  ref.out = want.data();
  ASSERT_TRUE(PagedAttentionReference(ref).ok());
  if (c.softcap > 0.0f) {
    // The cap must bend these scores (|q.k| / sqrt(d) reaches several units): uncapped
    // attention differs by far more than the tolerance.
    std::vector<float> uncapped(q.size());
    ref.out = uncapped.data();
    ref.softcap = 0.0f;
    ASSERT_TRUE(PagedAttentionReference(ref).ok());
    double largest = 0.0;
    for (size_t i = 0; i < out.size(); ++i)
      largest = std::max(largest, double{std::fabs(uncapped[i] - want[i])});
    EXPECT_GT(largest, 100 * kTol);
  }
  if (c.sinks) {
    // The sinks must matter as much: without them the weights sum to 1.
    std::vector<float> sinkless(q.size());
    ref.out = sinkless.data();
    ref.sinks = nullptr;
    ASSERT_TRUE(PagedAttentionReference(ref).ok());
    double largest = 0.0;
    for (size_t i = 0; i < out.size(); ++i)
      largest = std::max(largest, double{std::fabs(sinkless[i] - want[i])});
    EXPECT_GT(largest, 100 * kTol);
  }
  const bool bf16 = internal::RunsAmxBf16Tiles(p);
  const double tol = (bf16 ? kTolBf16 : kTol) * 4.0 + 1e-6;  // max|V| ~ 4
  if (bf16) {
    // The rounding is there: the float reference is further away than float arithmetic goes.
    std::vector<float> exact(q.size());
    ref.out = exact.data();
    ref.activations = ActivationPrecision::kF32;
    ref.sinks = p.sinks;
    ASSERT_TRUE(PagedAttentionReference(ref).ok());
    double largest = 0.0;
    for (size_t i = 0; i < out.size(); ++i)
      largest = std::max(largest, double{std::fabs(exact[i] - want[i])});
    EXPECT_GT(largest, tol);
  }
  int bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!(std::fabs(out[i] - want[i]) <= tol) && bad++ < 5) {
      ADD_FAILURE() << "out[" << i << "] = " << out[i] << ", reference " << want[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(PagedAttentionTest, MatchesReferenceForDecodePrefillAndChunkedPrefill) {
  const std::vector<Sequence> mixed = {{1, 1}, {37, 1}, {16, 16}, {50, 7}, {129, 1}};
  uint32_t seed = 1;
  for (KvDtype dtype : kAllDtypes) {
    RunCase({dtype, 16, 3, 3, 64, mixed}, ++seed);     // SmolLM2-135M: 9 heads, 3 KV heads
    RunCase({dtype, 5, 2, 1, 80, mixed}, ++seed);      // odd block size, tail lanes, MHA
    RunCase({dtype, 16, 1, 4, 128, {{300, 300}}}, ++seed);  // one long prefill, MQA
    RunCase({dtype, 32, 2, 7, 32, {{700, 1}, {3, 2}}}, ++seed);
  }
}

// GQA ratios 1, 3, 4, 8 and MQA (6 and 9 query heads on one KV head, more than one task
// holds), head dims with register-resident rows (64, 96, 128; 72 with a masked tail) and
// the generic path (8, 200, 1024), decode batches and a prefill beside a chunked prefill.
TEST_P(PagedAttentionTest, MatchesReferenceOverGqaRatiosAndHeadDims) {
  const std::vector<Sequence> decode = {{1, 1}, {16, 1}, {33, 1}, {100, 1}, {64, 1}};
  const std::vector<Sequence> prefill = {{40, 40}, {70, 9}};
  uint32_t seed = 100;
  for (KvDtype dtype : kAllDtypes) {
    for (int64_t head_dim : {64, 128, 72, 96, 8, 200}) {
      for (const auto& [kv_heads, group] : std::vector<std::pair<int64_t, int64_t>>{
               {2, 1}, {3, 3}, {2, 4}, {2, 8}, {1, 6}, {1, 9}}) {
        RunCase({dtype, 16, kv_heads, group, head_dim, decode}, ++seed);
        RunCase({dtype, 16, kv_heads, group, head_dim, prefill}, ++seed);
      }
    }
    RunCase({dtype, 7, 1, 8, 1024, {{45, 1}, {20, 3}}}, ++seed);  // largest head dim, MQA
    RunCase({dtype, 32, 2, 4, 128, {{1000, 1}}}, ++seed);         // long decode, many chunks
  }
}

// Few tokens (single-sequence decode) cut each KV head's query heads into shorter runs to
// spread them over threads; any thread count must give the same answer.
TEST_P(PagedAttentionTest, MatchesReferenceForSingleSequenceDecodeOnAnyThreadCount) {
  uint32_t seed = 200;
  for (int threads : {1, 2, 3, 8}) {
    for (KvDtype dtype : kAllDtypes) {
      RunCase({dtype, 16, 3, 3, 64, {{300, 1}}}, ++seed, threads);   // SmolLM2-135M
      RunCase({dtype, 16, 1, 9, 64, {{77, 1}}}, ++seed, threads);    // MQA, 9 heads
      RunCase({dtype, 16, 2, 8, 128, {{129, 1}}}, ++seed, threads);  // GQA 8
    }
  }
}

// Tensor-parallel slices whose query heads start or end inside a KV head's group.
TEST_P(PagedAttentionTest, MatchesReferenceForTensorParallelSlices) {
  const std::vector<Sequence> seqs = {{50, 1}, {19, 19}, {33, 4}};
  uint32_t seed = 300;
  for (KvDtype dtype : kAllDtypes) {
    // Model: 12 query heads over 4 KV heads (group 3).
    RunCase({dtype, 16, 2, 3, 64, seqs, /*slice_heads=*/4, /*head0=*/4, /*kv_head0=*/1}, ++seed);
    RunCase({dtype, 16, 3, 3, 64, seqs, /*slice_heads=*/6, /*head0=*/5, /*kv_head0=*/1}, ++seed);
    // Model: 32 query heads over 4 KV heads (group 8); a slice of 5 from head 14.
    RunCase({dtype, 16, 2, 8, 128, seqs, /*slice_heads=*/5, /*head0=*/14, /*kv_head0=*/1}, ++seed);
    // A slice inside one group: every query head reads the cache's only KV head.
    RunCase({dtype, 16, 1, 8, 80, seqs, /*slice_heads=*/3, /*head0=*/17, /*kv_head0=*/2}, ++seed);
  }
}

// Long prompts: whole prefills and prefill chunks late in contexts up to 3000 tokens (the
// FlashAttention-style tiles where the ISA has them: head dims 64, 128 and 80 on AVX-512,
// also 40 on AVX2; 40 takes the per-token tasks on AVX-512), beside decodes and short
// chunks (one-row and few-row tiles), MHA, GQA and MQA, block sizes 16 and 32.
// Under the default TileMode and with tiles forced on (AVX-512's tiles included).
TEST_P(PagedAttentionTest, MatchesReferenceForLongPrefillsAndChunks) {
  uint32_t seed = 400;
  for (internal::TileMode mode : {internal::TileMode::kAuto, internal::TileMode::kOn})
    for (KvDtype dtype : kAllDtypes) {
      internal::SetTileModeForTesting(mode);
      for (int64_t block_size : {16, 32}) {
        // The 8-bit types and BF16 at one block size (the reference's time; block edges are
        // the same code, and BF16 is F16's with another load).
        if ((IsQuantizedKv(dtype) || dtype == KvDtype::kBf16) && block_size == 16) continue;
        // SmolLM2-135M's shape: 9 heads on 3 KV heads, head dim 64.
        RunCase({dtype, block_size, 3, 3, 64, {{400, 400}, {1, 1}, {3000, 21}, {77, 3}}}, ++seed);
        // Llama-3-8B's group of 8, head dim 128: a chunk at the end of a long context.
        RunCase({dtype, block_size, 1, 8, 128, {{2999, 20}, {40, 1}, {129, 129}}}, ++seed);
        // MQA (6 heads on one KV head), odd head dims, and every tile remainder.
        RunCase({dtype, block_size, 1, 6, 80, {{300, 300}, {1000, 5}, {4, 4}}}, ++seed);
        RunCase({dtype, block_size, 2, 1, 40, {{257, 257}, {1500, 33}, {9, 1}}}, ++seed);
      }
    }
}

// A token's result does not depend on the batch around its sequence, on how its prompt
// is cut into prefill chunks (a prefix-cache hit leaves any remainder), or on the thread
// count: bit for bit. A speculative verify step gives each token the bits plain decode
// gives it.
// Under the default TileMode and with tiles forced on (AVX-512's tiles included).
TEST_P(PagedAttentionTest, PrefillIsBatchChunkAndThreadInvariant) {
  for (internal::TileMode mode : {internal::TileMode::kAuto, internal::TileMode::kOn})
    for (KvDtype dtype : kAllDtypes) {
      for (const auto& [kv_heads, group, head_dim] :
           std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {3, 3, 64}, {1, 8, 128}, {2, 1, 72}}) {
        if (dtype == KvDtype::kBf16 && head_dim != 64) continue;  // F16's code, another load
        SCOPED_TRACE(testing::Message()
                     << "dtype " << KvDtypeName(dtype) << " kv_heads " << kv_heads << " group "
                     << group << " head_dim " << head_dim << " tiles forced "
                     << (mode == internal::TileMode::kOn));
        internal::SetTileModeForTesting(mode);
        StepHarness harness(dtype, 16, kv_heads, group, head_dim, {320, 90, 300}, 11);
        const std::vector<float> alone = harness.Run({{0, 0, 320}}, 2)[0];
        // In a batch with a decode and another prefill, on 1 and 3 threads.
        for (int threads : {1, 3}) {
          const auto batch = harness.Run({{1, 89, 90}, {0, 0, 320}, {2, 0, 300}}, threads);
          EXPECT_EQ(batch[1], alone) << threads << " threads";
        }
        // Chunked: 18 + 106 + 65 + 131 tokens, and 33 + 287 beside a decode.
        EXPECT_EQ(harness.RunPieces(0, {{0, 18}, {18, 124}, {124, 189}, {189, 320}}), alone);
        std::vector<float> other = harness.Run({{0, 0, 33}}, 2)[0];
        const auto rest = harness.Run({{1, 89, 90}, {0, 33, 320}}, 2)[1];
        other.insert(other.end(), rest.begin(), rest.end());
        EXPECT_EQ(other, alone);
        // Pieces of 1, 2 and 3 tokens (decode-sized steps) among longer ones.
        EXPECT_EQ(harness.RunPieces(0, {{0, 1}, {1, 3}, {3, 6}, {6, 318}, {318, 319}, {319, 320}}),
                  alone);
        // A verify step of 1 + kMaxSpeculativeTokens tokens against decoding them one by one.
        const auto [verify, decoded] = harness.VerifyAndDecode(0, 200, {2, 299, 300});
        EXPECT_EQ(verify, decoded);
        // The tiles did run: with the tiles off, the per-token kernel rounds differently.
        const bool tiles_expected =
            GetParam() && (internal::IsaSupported(internal::MatmulIsaChoice::kAvx512)
                               ? mode == internal::TileMode::kOn && head_dim % 16 == 0
                               : internal::IsaSupported(internal::MatmulIsaChoice::kAvx2));
        internal::SetTileModeForTesting(internal::TileMode::kOff);
        const std::vector<float> per_token = harness.Run({{0, 0, 320}}, 2)[0];
        internal::SetTileModeForTesting(mode);
        EXPECT_EQ(per_token != alone, tiles_expected);
      }
    }
}

// AVX-512's per-token kernel gives a task several consecutive tokens (TaskRows): each
// token's bits are those of a task of its own, on the register path (head dims 64, 128, 72)
// and the generic one (200), for prefills that start at 0 and mid-sequence (a chunk).
TEST_P(PagedAttentionTest, MultiRowTasksGiveTheBitsOfOneRowTasks) {
  internal::SetTileModeForTesting(internal::TileMode::kOff);
  for (KvDtype dtype : kAllDtypes) {
    for (const auto& [kv_heads, group, head_dim] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {3, 3, 64}, {1, 8, 128}, {2, 1, 72}, {1, 2, 200}}) {
      SCOPED_TRACE(testing::Message() << "dtype " << KvDtypeName(dtype) << " kv_heads " << kv_heads
                                      << " group " << group << " head_dim " << head_dim);
      StepHarness harness(dtype, 16, kv_heads, group, head_dim, {300, 90, 77}, 5);
      const std::vector<StepHarness::Item> step = {{0, 0, 300}, {1, 89, 90}, {2, 29, 77}};
      internal::SetMultiRowTasksForTesting(false);
      const auto one_row = harness.Run(step, 2);
      internal::SetMultiRowTasksForTesting(true);
      for (int threads : {1, 3}) EXPECT_EQ(harness.Run(step, threads), one_row) << threads;
    }
  }
}

// Sliding windows (each query attends to its last `window` positions): windows of 1, 17,
// 64 and 100 tokens against prompts longer than them, decodes far past the window, chunks
// whose window edge falls inside a block, a window longer than the context (no effect),
// the register and generic head dims, MHA, GQA and MQA; per-token and tiled kernels, every
// KV type.
TEST_P(PagedAttentionTest, SlidingWindowMatchesReference) {
  uint32_t seed = 600;
  const std::vector<Sequence> seqs = {{300, 300}, {77, 1}, {1000, 5}, {40, 40}, {129, 20}};
  for (internal::TileMode mode : {internal::TileMode::kAuto, internal::TileMode::kOn}) {
    internal::SetTileModeForTesting(mode);
    for (KvDtype dtype : kAllDtypes) {
      for (int64_t window : {1, 17, 64, 100, 5000}) {
        Case c{dtype, 16, 3, 3, 64, seqs};
        c.window = window;
        RunCase(c, ++seed);
      }
      Case gqa{dtype, 32, 1, 8, 128, {{500, 100}, {65, 1}}};
      gqa.window = 48;
      RunCase(gqa, ++seed);
      Case tail{dtype, 5, 2, 1, 72, {{90, 90}, {33, 2}}};
      tail.window = 31;
      RunCase(tail, ++seed);
      Case generic{dtype, 16, 1, 6, 200, {{70, 70}, {50, 1}}};
      generic.window = 20;
      RunCase(generic, ++seed);
    }
  }
}

// Soft-capped scores (Gemma 2: cap * tanh(score / cap)) on the per-token scalar kernel,
// whatever the ISA and tile mode: decode, prefill and chunks, with and without a window,
// every KV type, against the reference (which also checks that the cap matters here).
TEST_P(PagedAttentionTest, SoftCappedScoresMatchReference) {
  uint32_t seed = 900;
  for (internal::TileMode mode : {internal::TileMode::kAuto, internal::TileMode::kOn}) {
    internal::SetTileModeForTesting(mode);
    for (KvDtype dtype : kAllDtypes) {
      for (float cap : {0.5f, 3.0f}) {
        Case c{dtype, 16, 2, 3, 64, {{120, 120}, {77, 1}, {200, 9}}};
        c.softcap = cap;
        RunCase(c, ++seed);
        c.window = 32;
        RunCase(c, ++seed);
      }
    }
  }
}

// Attention sinks (gpt-oss: a logit per query head in each softmax's denominator) on every
// kernel: per-token and tiled, decode, prefill and chunks, with a window and soft-capping,
// GQA, a tensor-parallel slice, every KV type, against the reference (which also checks
// that the sinks matter here).
TEST_P(PagedAttentionTest, SinksMatchReference) {
  uint32_t seed = 1200;
  for (internal::TileMode mode : {internal::TileMode::kAuto, internal::TileMode::kOn}) {
    internal::SetTileModeForTesting(mode);
    for (KvDtype dtype : kAllDtypes) {
      Case c{dtype, 16, 2, 4, 64, {{130, 130}, {77, 1}, {300, 9}}};
      c.sinks = true;
      RunCase(c, ++seed);
      c.window = 32;
      RunCase(c, ++seed);
      c.softcap = 3.0f;
      RunCase(c, ++seed);
      Case slice{dtype,         16, 2, 8, 128, {{50, 1}, {19, 19}}, /*slice_heads=*/5, /*head0=*/14,
                 /*kv_head0=*/1};
      slice.sinks = true;
      RunCase(slice, ++seed);
      Case generic{dtype, 16, 1, 6, 200, {{70, 70}, {50, 1}}};
      generic.sinks = true;
      RunCase(generic, ++seed);
    }
  }
}

// With a sliding window a token's result is still the same bits whatever its batch, chunk
// split (chunks that start inside and past the window of their first token) or tile.
TEST_P(PagedAttentionTest, SlidingWindowIsBatchAndChunkInvariant) {
  for (internal::TileMode mode : {internal::TileMode::kAuto, internal::TileMode::kOn}) {
    for (KvDtype dtype : {KvDtype::kF16, KvDtype::kInt8}) {
      for (const auto& [kv_heads, group, head_dim] :
           std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {3, 3, 64}, {1, 8, 128}, {2, 1, 72}}) {
        SCOPED_TRACE(testing::Message() << KvDtypeName(dtype) << " head_dim " << head_dim
                                        << " tiles forced " << (mode == internal::TileMode::kOn));
        internal::SetTileModeForTesting(mode);
        StepHarness harness(dtype, 16, kv_heads, group, head_dim, {320, 90}, 13, /*window=*/70);
        const std::vector<float> alone = harness.Run({{0, 0, 320}}, 2)[0];
        EXPECT_EQ(harness.Run({{1, 89, 90}, {0, 0, 320}}, 3)[1], alone);
        EXPECT_EQ(harness.RunPieces(0, {{0, 50}, {50, 71}, {71, 200}, {200, 201}, {201, 320}}),
                  alone);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, PagedAttentionTest, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "Simd" : "Scalar";
                         });

// --activations bf16: the AMX-BF16 tiles (paged_attention_amx.cc), where the CPU has them.
class PagedAttentionBf16Test : public testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status status = ActivationPrecisionStatus(ActivationPrecision::kBf16); !status.ok()) {
      GTEST_SKIP() << status;
    }
  }
};

// Against the reference with the same rounding (which also checks that the rounding shows):
// decode, prefill and chunks; MHA, GQA, MQA and a tensor-parallel slice; head dims of one
// (16), two (64) and several (128) product steps and one that pads its last (80); F16 and F32
// KV, and BF16 KV whose K tiles load from the pool (head dims a multiple of 32 in blocks of 16
// or 32) or are copied (the others); sliding windows and sinks. RunCase's pool starts as NaNs,
// which the tiles read straight from a BF16 pool past a sequence's end must not reach an output.
TEST_F(PagedAttentionBf16Test, MatchesTheBf16Reference) {
  const std::vector<Sequence> mixed = {{1, 1}, {37, 1}, {16, 16}, {50, 7}, {129, 1}, {300, 45}};
  uint32_t seed = 2000;
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kF32, KvDtype::kBf16}) {
    std::vector<Case> cases = {
        {dtype, 16, 3, 3, 64, mixed},                  // SmolLM2-135M: 9 heads, 3 KV heads
        {dtype, 5, 2, 1, 80, mixed},                   // odd block size, a padded step, MHA
        {dtype, 16, 1, 4, 128, {{300, 300}, {9, 2}}},  // a long prefill, MQA
        {dtype, 32, 2, 7, 16, {{700, 1}, {3, 2}, {90, 90}}},
        {dtype,
         16,
         2,
         8,
         128,
         {{50, 1}, {19, 19}},
         /*slice_heads=*/5,
         /*head0=*/14,
         /*kv_head0=*/1},
    };
    for (Case c : cases) {
      c.activations = ActivationPrecision::kBf16;
      RunCase(c, ++seed);
      c.window = 17;
      RunCase(c, ++seed);
      c.window = 0;
      c.sinks = true;
      RunCase(c, ++seed, /*num_threads=*/3);
    }
  }
}

// Where the tiles do not run (8-bit KV, capped scores, a head dim not a multiple of 16) the
// arithmetic stays float: held to the float reference's tolerance.
TEST_F(PagedAttentionBf16Test, OtherCachesAndCappedScoresStayFloat) {
  uint32_t seed = 2100;
  const std::vector<Sequence> seqs = {{120, 120}, {77, 1}, {200, 9}};
  for (KvDtype dtype : {KvDtype::kInt8, KvDtype::kFp8E4m3}) {
    Case c{dtype, 16, 2, 3, 64, seqs};
    c.activations = ActivationPrecision::kBf16;
    RunCase(c, ++seed);
  }
  Case capped{KvDtype::kF16, 16, 2, 3, 64, seqs};
  capped.activations = ActivationPrecision::kBf16;
  capped.softcap = 3.0f;
  RunCase(capped, ++seed);
  Case odd{KvDtype::kF16, 16, 2, 3, 72, seqs};
  odd.activations = ActivationPrecision::kBf16;
  RunCase(odd, ++seed);
}

// A token's result does not depend on its batch, its chunk split, its tile (decode-sized
// pieces among long ones), a speculative verify or the thread count, bit for bit, with and
// without a sliding window; and the AMX tiles did run (their bits differ from float's).
TEST_F(PagedAttentionBf16Test, IsBatchChunkAndThreadInvariant) {
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kF32, KvDtype::kBf16}) {
    for (const auto& [kv_heads, group, head_dim, window] :
         std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {3, 3, 64, 0}, {1, 8, 128, 0}, {2, 1, 80, 0}, {2, 5, 16, 0}, {3, 3, 64, 70}}) {
      SCOPED_TRACE(testing::Message()
                   << "dtype " << KvDtypeName(dtype) << " kv_heads " << kv_heads << " group "
                   << group << " head_dim " << head_dim << " window " << window);
      StepHarness harness(dtype, 16, kv_heads, group, head_dim, {320, 90, 300}, 17, window,
                          ActivationPrecision::kBf16);
      const std::vector<float> alone = harness.Run({{0, 0, 320}}, 2)[0];
      for (int threads : {1, 3}) {
        const auto batch = harness.Run({{1, 89, 90}, {0, 0, 320}, {2, 0, 300}}, threads);
        EXPECT_EQ(batch[1], alone) << threads << " threads";
      }
      EXPECT_EQ(
          harness.RunPieces(
              0,
              {{0, 1}, {1, 3}, {3, 18}, {18, 71}, {71, 189}, {189, 318}, {318, 319}, {319, 320}}),
          alone);
      const auto [verify, decoded] = harness.VerifyAndDecode(0, 200, {2, 299, 300});
      EXPECT_EQ(verify, decoded);
      StepHarness float_harness(dtype, 16, kv_heads, group, head_dim, {320, 90, 300}, 17, window);
      EXPECT_NE(float_harness.Run({{0, 0, 320}}, 2)[0], alone);
    }
  }
}

// Floats that stress FloatToHalf: every tie between two adjacent halves (normal and
// subnormal) and the floats just either side of it, the overflow and underflow edges, and
// random bit patterns (NaNs, infinities, float subnormals and everything else).
std::vector<float> HalfConversionInputs() {
  std::vector<float> values;
  for (uint16_t h = 0; h < 0x7c00; ++h) {
    const float low = internal::HalfToFloat(h);
    const float high = internal::HalfToFloat(static_cast<uint16_t>(h + 1));  // 0x7c00: Inf
    const float tie = h == 0x7bff ? 65520.0f : (low + high) / 2;  // exact in float
    for (float x : {low, tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e30f)}) {
      values.push_back(x);
      values.push_back(-x);
    }
  }
  for (float x : {0.0f, 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e30f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  0x1.0p-24f, 0x1.0p-25f, 0x1.000002p-25f, 0x1.7ffffep-25f, 0x1.8p-24f,
                  0x1.0p-14f, 0x1.ffcp-15f, 0x1.ffep-15f, 0x1.fffffep-15f}) {
    values.push_back(x);
    values.push_back(-x);
  }
  std::mt19937 rng(17);
  for (int i = 0; i < 1 << 20; ++i) {
    const uint32_t bits = rng();
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    values.push_back(x);
  }
  std::uniform_real_distribution<float> exponent(-30.0f, 17.0f);
  for (int i = 0; i < 1 << 18; ++i) {  // magnitudes around the half range, both signs
    values.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  }
  return values;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// AVX-512 and AVX2 (F16C) conversions, each where the CPU has it.
TEST(WriteKvTest, SimdHalfConversionIsBitIdenticalToFloatToHalf) {
  const std::vector<float> values = HalfConversionInputs();
  int checked = 0;
  for (const auto& [isa, convert] :
       std::vector<std::pair<internal::MatmulIsaChoice, void (*)(const float*, int64_t, uint16_t*)>>{
           {internal::MatmulIsaChoice::kAvx512, internal::FloatToHalfAvx512},
           {internal::MatmulIsaChoice::kAvx2, internal::FloatToHalfAvx2}}) {
    if (!internal::IsaSupported(isa)) continue;
    ++checked;
    SCOPED_TRACE(isa == internal::MatmulIsaChoice::kAvx512 ? "AVX-512" : "AVX2");
    std::vector<uint16_t> got(values.size());
    // Uneven pieces so that every tail length of the vector loop is taken.
    for (size_t begin = 0, piece = 1; begin < values.size(); begin += piece, piece = piece % 37 + 1) {
      const size_t count = std::min(piece, values.size() - begin);
      convert(values.data() + begin, static_cast<int64_t>(count), got.data() + begin);
    }
    int bad = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t want = FloatToHalf(values[i]);
      const bool same = std::isnan(values[i])
                            ? IsHalfNan(got[i]) && (got[i] & 0x8000u) == (want & 0x8000u)
                            : got[i] == want;
      if (!same && bad++ < 5) {
        ADD_FAILURE() << "FloatToHalf(" << values[i] << " = 0x" << std::hex
                      << std::bit_cast<uint32_t>(values[i]) << ") = 0x" << want << ", SIMD 0x"
                      << got[i];
      }
    }
    EXPECT_EQ(bad, 0);
  }
  if (checked == 0) GTEST_SKIP() << "neither AVX-512 nor AVX2 on this CPU";
}

// BF16 KV's AVX2 conversion gives FloatToBf16's bits: ties either way, float subnormals
// (flushed to signed zero), values that round up to infinity, NaNs (quieted, sign kept) and
// random bit patterns, in pieces of every tail length.
TEST(WriteKvTest, SimdBf16ConversionIsBitIdenticalToFloatToBf16) {
  if (!internal::IsaSupported(internal::MatmulIsaChoice::kAvx2)) GTEST_SKIP() << "no AVX2";
  std::vector<float> values;
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f817fffu, 0x7f7fffffu,
                        0x7f7f8000u, 0x7f7f7fffu, 0x00000001u, 0x007fffffu, 0x00800000u,
                        0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fbfffffu, 0u}) {
    for (uint32_t sign : {0u, 0x80000000u}) values.push_back(std::bit_cast<float>(bits | sign));
  }
  std::mt19937 rng(37);
  for (int i = 0; i < 1 << 20; ++i)
    values.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  std::vector<uint16_t> got(values.size());
  for (size_t begin = 0, piece = 1; begin < values.size(); begin += piece, piece = piece % 37 + 1) {
    const size_t count = std::min(piece, values.size() - begin);
    internal::FloatToBf16Avx2(values.data() + begin, static_cast<int64_t>(count),
                              got.data() + begin);
  }
  int bad = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t want = FloatToBf16(values[i]);
    if (got[i] != want && bad++ < 5) {
      ADD_FAILURE() << "FloatToBf16(0x" << std::hex << std::bit_cast<uint32_t>(values[i])
                    << ") = 0x" << want << ", AVX2 0x" << got[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

// The AVX2 rotation of 8-bit KV rows and queries (RotatesKv) gives RotateKvRow's bits.
TEST(WriteKvTest, SimdRotationIsBitIdenticalToRotateKvRow) {
  if (!internal::IsaSupported(internal::MatmulIsaChoice::kAvx2)) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {8, 16, 64, 128, 1024}) {
    std::vector<float> rows(3 * n);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = normal(rng) * (i % 7 == 0 ? 50.0f : 1.0f);
    std::vector<float> want = rows;
    for (int r = 0; r < 3; ++r) RotateKvRow(want.data() + r * n, n);
    internal::RotateRowsAvx2(rows.data(), 3, n);
    EXPECT_EQ(rows, want) << n;
  }
}

// The AVX2 quantizer of 8-bit KV rows gives QuantizeKvRow's codes and scale: rows of
// every magnitude (E4M3 subnormals, saturation), NaNs, infinities, zeros and ties.
TEST(WriteKvTest, SimdQuantizationIsBitIdenticalToQuantizeKvRow) {
  if (!internal::IsaSupported(internal::MatmulIsaChoice::kAvx2)) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-40.0f, 40.0f);
  for (KvDtype dtype : {KvDtype::kInt8, KvDtype::kFp8E4m3}) {
    int bad = 0;
    for (int r = 0; r < 20000; ++r) {
      const int64_t n = 8 * (1 + r % 16);
      std::vector<float> x(n);
      const float magnitude = std::exp2(exponent(rng));
      for (float& value : x) value = normal(rng) * magnitude;
      if (r % 5 == 0) x[r % n] = 0.0f;
      if (r % 7 == 0) x[(r / 7) % n] *= 1e-6f;  // E4M3 subnormals
      if (r % 11 == 0) x[(r / 11) % n] = std::nanf("");
      if (r % 13 == 0) x[(r / 13) % n] = std::round(x[0]) + 0.5f;  // ties in int8 space
      if (r % 17 == 0) x[(r / 17) % n] = r % 2 ? INFINITY : -INFINITY;
      if (r % 19 == 0) std::fill(x.begin(), x.end(), 0.0f);
      std::vector<uint8_t> want(n), got(n);
      uint16_t want_scale = 1, got_scale = 2;
      QuantizeKvRow(dtype, x.data(), n, want.data(), &want_scale);
      internal::QuantizeKvRowAvx2(dtype, x.data(), n, got.data(), &got_scale);
      if ((want != got || want_scale != got_scale) && bad++ < 3) {
        ADD_FAILURE() << KvDtypeName(dtype) << " row " << r << ": scale " << want_scale
                      << " vs SIMD " << got_scale;
      }
    }
    EXPECT_EQ(bad, 0) << KvDtypeName(dtype);
  }
}

TEST(WriteKvTest, SimdAndScalarPathsStoreTheSameCache) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (KvDtype dtype : kAllDtypes) {
    for (int64_t head_dim : {64, 80, 7}) {
      const int64_t num_blocks = 6, block_size = 16, kv_heads = 3, row = kv_heads * head_dim;
      const int64_t num_tokens = 37;
      std::vector<float> k(num_tokens * row), v(num_tokens * row);
      for (size_t i = 0; i < k.size(); ++i) {
        // Magnitudes from half subnormals to past the half range.
        k[i] = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(i % 48) - 30));
        v[i] = normal(rng) * 1000.0f;
      }
      std::vector<int32_t> slots(num_tokens);
      for (int64_t t = 0; t < num_tokens; ++t) {
        slots[t] = static_cast<int32_t>((t * 7 + 3) % (num_blocks * block_size));
      }
      std::vector<std::unique_ptr<TestPool>> pools;  // [scalar, simd]
      for (int simd = 0; simd < 2; ++simd) {
        internal::SetAttentionSimdForTesting(simd == 1);
        pools.push_back(std::make_unique<TestPool>(dtype, num_blocks, block_size, kv_heads,
                                                   head_dim, 0xab, 0xcd));
        ASSERT_TRUE(WriteKv(pools.back()->view, k.data(), v.data(), slots.data(), num_tokens).ok());
      }
      internal::SetAttentionSimdForTesting(true);
      SCOPED_TRACE(testing::Message() << KvDtypeName(dtype) << ", head_dim " << head_dim);
      EXPECT_EQ(pools[0]->k, pools[1]->k);
      EXPECT_EQ(pools[0]->v, pools[1]->v);
      EXPECT_EQ(pools[0]->k_scale, pools[1]->k_scale);
      EXPECT_EQ(pools[0]->v_scale, pools[1]->v_scale);
      // And the scalar path stores FloatToHalf / FloatToBf16 / the float itself / the row's codes.
      const int64_t t = num_tokens - 1, i = row - 1;
      const int64_t index = static_cast<int64_t>(slots[t]) * row + i;
      if (dtype == KvDtype::kF16) {
        EXPECT_EQ(reinterpret_cast<const uint16_t*>(pools[0]->k.data())[index],
                  FloatToHalf(k[t * row + i]));
      } else if (dtype == KvDtype::kBf16) {
        EXPECT_EQ(reinterpret_cast<const uint16_t*>(pools[0]->k.data())[index],
                  FloatToBf16(k[t * row + i]));
      } else if (dtype == KvDtype::kF32) {
        EXPECT_EQ(reinterpret_cast<const float*>(pools[0]->v.data())[index], v[t * row + i]);
      } else {
        std::vector<uint8_t> codes(head_dim);
        uint16_t scale;
        std::vector<float> x(v.begin() + t * row + (kv_heads - 1) * head_dim,
                             v.begin() + (t + 1) * row);
        if (RotatesKv(dtype, head_dim)) RotateKvRow(x.data(), head_dim);
        QuantizeKvRow(dtype, x.data(), head_dim, codes.data(), &scale);
        EXPECT_EQ(pools[0]->v[index], codes[head_dim - 1]);
        EXPECT_EQ(pools[0]->v_scale[index / head_dim], scale);
      }
    }
  }
}

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
  for (float cap : {-1.0f, std::nanf("")}) {
    p.softcap = cap;
    EXPECT_EQ(PagedAttention(p, pool).code(), absl::StatusCode::kInvalidArgument) << cap;
  }
  p.softcap = 0.0f;
  const int32_t too_long[] = {33};  // two blocks of 16 cannot hold 33 tokens
  p.context_len = too_long;
  EXPECT_EQ(PagedAttention(p, pool).code(), absl::StatusCode::kInvalidArgument);
  p.context_len = context_len;
  p.num_heads = 3;  // not a multiple of 2 KV heads
  p.cache.num_kv_heads = 2;
  EXPECT_EQ(PagedAttention(p, pool).code(), absl::StatusCode::kInvalidArgument);
  // An 8-bit cache without its scales.
  p.num_heads = 1;
  p.cache.num_kv_heads = 1;
  p.cache.dtype = KvDtype::kInt8;
  EXPECT_EQ(PagedAttention(p, pool).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteKv(p.cache, row.data(), row.data(), &good_slot, 1).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::kernels::cpu
