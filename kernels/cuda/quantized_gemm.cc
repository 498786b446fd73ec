#include "kernels/cuda/quantized_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/quantized_gemm_internal.h"

namespace loom::kernels::cuda {
namespace {

using internal::kQuantGemmConfigs;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool Aligned(const void* pointer, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

// Where element (row, col) of a 16-row x 64-column tile of the device layout lives: the lane that
// loads it, the k16 step `step` (0..3) of the tile, and the register (0..3) and half (e) of that
// lane's mma A fragment. See the layout comment in quantized_gemm.cuh: the fragment holds (reg0.lo,
// reg0.hi, reg1.lo, ..., reg3.hi), reg0 = row g, reg1 = row g + 8, reg2 = row g, reg3 = row g + 8,
// and the K permutation puts columns 8t + 4j + {0,1} in reg0/reg1 and 8t + 4j + {2,3} in reg2/reg3
// of k16 step j of each 32-column half.
struct FragmentSlot {
  int lane;
  int step;  // 2 * half + j
  int reg;   // 0..3
  int e;     // 0 or 1: low or high half of the register
};

FragmentSlot SlotOf(int64_t row_in_tile, int64_t col_in_tile) {
  const int r = static_cast<int>(row_in_tile), c = static_cast<int>(col_in_tile);
  const int half = c / 32, c32 = c % 32;
  const int t = c32 / 8, j = (c32 % 8) / 4, h = (c32 % 4) / 2, e = c32 % 2;
  const int g = r % 8, hi = r / 8;
  return {g * 4 + t, 2 * half + j, hi + 2 * h, e};
}

// Byte offset and bit shift of INT4 element (row, col) in the device layout.
void Int4Position(int64_t row, int64_t col, int64_t k, int64_t* byte, int* shift) {
  const FragmentSlot s = SlotOf(row % 16, col % 64);
  const int nibble = s.reg + 4 * s.e;  // word bits 4 * nibble; see DequantInt4
  *byte = ((row / 16) * (k / 64) + col / 64) * 512 + s.lane * 16 + s.step * 4 + nibble / 2;
  *shift = 4 * (nibble % 2);
}

// Byte offset of INT8 element (row, col) in the device layout.
int64_t Int8Position(int64_t row, int64_t col, int64_t k) {
  const FragmentSlot s = SlotOf(row % 16, col % 32);  // half 0 of a 32-column chunk
  const int h = s.reg / 2, hi = s.reg % 2;
  // Word 2j + h of the lane's 16 bytes; bytes (row g: 0, 1), (row g + 8: 2, 3).
  return ((row / 16) * (k / 32) + col / 32) * 512 + s.lane * 16 + (2 * s.step + h) * 4 + 2 * hi +
         s.e;
}

// Index (in F16 units) of the scale (which = 0) or min (which = 1) of (row, group).
int64_t ScaleMinPosition(int64_t row, int64_t group, int64_t num_groups, int which) {
  const int64_t r = row % 16;
  return (((row / 16) * num_groups + group) * 8 + r % 8) * 4 + 2 * which + r / 8;
}

// Every (row, col) of one 16 x 64 INT4 tile (Int4Position within its 512 bytes) and of one
// 16 x 32 INT8 tile (Int8Position), computed once: packing a layer then costs a table
// lookup per weight instead of the fragment arithmetic (4-5 ns a weight: half a minute
// for an 8B model).
struct TileMaps {
  uint16_t int4_byte[16][64];
  uint8_t int4_shift[16][64];
  uint16_t int8_byte[16][32];
};

const TileMaps& Tiles() {
  static const TileMaps* const maps = [] {
    auto* m = new TileMaps();
    for (int r = 0; r < 16; ++r) {
      for (int c = 0; c < 64; ++c) {
        int64_t byte;
        int shift;
        Int4Position(r, c, 64, &byte, &shift);
        m->int4_byte[r][c] = static_cast<uint16_t>(byte);
        m->int4_shift[r][c] = static_cast<uint8_t>(shift);
      }
      for (int c = 0; c < 32; ++c)
        m->int8_byte[r][c] = static_cast<uint16_t>(Int8Position(r, c, 32));
    }
    return m;
  }();
  return *maps;
}

// fn(first, end) over [0, blocks) row blocks of k weights each (16 rows), split across
// threads for a large layer (each block writes its own bytes).
void ForRowBlocks(int64_t blocks, int64_t k, const std::function<void(int64_t, int64_t)>& fn) {
  cpu::ParallelForOnce(blocks, std::max<int64_t>(1, (int64_t{1} << 20) / (16 * k)), fn);
}

absl::Status CheckInt4Shape(int64_t n, int64_t k, int64_t group_size, const char* who) {
  if (n <= 0 || n % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: n %d must be a positive multiple of 16", who, n));
  }
  if (k <= 0 || k % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: k %d must be a positive multiple of 64", who, k));
  }
  if (group_size != 16 && group_size != 32 && group_size != 64 && group_size != 128) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: group_size %d unsupported (16, 32, 64, 128)", who, group_size));
  }
  if (k % group_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: k %d is not a multiple of group_size %d", who, k, group_size));
  }
  return absl::OkStatus();
}

absl::Status CheckInt8Shape(int64_t n, int64_t k, const char* who) {
  return CheckInt4Shape(n, k, 32, who);
}

}  // namespace

std::string_view QuantWeightFormatName(QuantWeightFormat format) {
  return format == QuantWeightFormat::kInt4 ? "INT4" : "INT8";
}

// ------------------------------------------------------------------------------ packing

absl::StatusOr<Int4GpuWeight> PackInt4ForGpu(const uint8_t* q, const uint16_t* scales,
                                             const uint16_t* mins, int64_t n, int64_t k,
                                             int64_t group_size) {
  if (absl::Status status = CheckInt4Shape(n, k, group_size, "PackInt4ForGpu"); !status.ok()) {
    return status;
  }
  if (q == nullptr || scales == nullptr || mins == nullptr) {
    return absl::InvalidArgumentError("PackInt4ForGpu: null q, scales or mins");
  }
  const int64_t num_groups = k / group_size;
  Int4GpuWeight out;
  out.q.assign(n * k / 2, 0);
  out.scale_min.assign(n * num_groups * 2, 0);
  const TileMaps& tiles = Tiles();
  const int64_t col_tiles = k / 64;
  ForRowBlocks(n / 16, k, [&](int64_t first, int64_t end) {
    for (int64_t block = first; block < end; ++block) {
      for (int64_t tile = 0; tile < col_tiles; ++tile) {
        uint8_t* packed = out.q.data() + (block * col_tiles + tile) * 512;
        for (int r = 0; r < 16; ++r) {
          // Two columns a source byte (k is even): the low nibble first.
          const uint8_t* natural = q + ((block * 16 + r) * k + tile * 64) / 2;
          for (int c = 0; c < 64; c += 2) {
            const uint8_t pair = natural[c / 2];
            packed[tiles.int4_byte[r][c]] |=
                static_cast<uint8_t>((pair & 0x0f) << tiles.int4_shift[r][c]);
            packed[tiles.int4_byte[r][c + 1]] |=
                static_cast<uint8_t>((pair >> 4) << tiles.int4_shift[r][c + 1]);
          }
        }
      }
    }
  });
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t group = 0; group < num_groups; ++group) {
      out.scale_min[ScaleMinPosition(row, group, num_groups, 0)] = scales[row * num_groups + group];
      out.scale_min[ScaleMinPosition(row, group, num_groups, 1)] = mins[row * num_groups + group];
    }
  }
  return out;
}

absl::StatusOr<Int4NaturalWeight> UnpackInt4FromGpu(const Int4GpuWeight& packed, int64_t n,
                                                    int64_t k, int64_t group_size) {
  if (absl::Status status = CheckInt4Shape(n, k, group_size, "UnpackInt4FromGpu"); !status.ok()) {
    return status;
  }
  const int64_t num_groups = k / group_size;
  if (static_cast<int64_t>(packed.q.size()) != n * k / 2 ||
      static_cast<int64_t>(packed.scale_min.size()) != n * num_groups * 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("UnpackInt4FromGpu: %d q bytes and %d scale/min values for n %d, k %d",
                        packed.q.size(), packed.scale_min.size(), n, k));
  }
  Int4NaturalWeight out;
  out.q.assign(n * k / 2, 0);
  out.scales.resize(n * num_groups);
  out.mins.resize(n * num_groups);
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t col = 0; col < k; ++col) {
      int64_t byte;
      int shift;
      Int4Position(row, col, k, &byte, &shift);
      const uint8_t value = (packed.q[byte] >> shift) & 0x0f;
      const int64_t natural = row * k + col;
      out.q[natural / 2] |= static_cast<uint8_t>(value << (4 * (natural % 2)));
    }
    for (int64_t group = 0; group < num_groups; ++group) {
      out.scales[row * num_groups + group] =
          packed.scale_min[ScaleMinPosition(row, group, num_groups, 0)];
      out.mins[row * num_groups + group] =
          packed.scale_min[ScaleMinPosition(row, group, num_groups, 1)];
    }
  }
  return out;
}

absl::StatusOr<std::vector<uint8_t>> PackInt8ForGpu(const int8_t* q, int64_t n, int64_t k) {
  if (absl::Status status = CheckInt8Shape(n, k, "PackInt8ForGpu"); !status.ok()) return status;
  if (q == nullptr) return absl::InvalidArgumentError("PackInt8ForGpu: null q");
  std::vector<uint8_t> out(n * k);
  const TileMaps& tiles = Tiles();
  const int64_t col_tiles = k / 32;
  ForRowBlocks(n / 16, k, [&](int64_t first, int64_t end) {
    for (int64_t block = first; block < end; ++block) {
      for (int64_t tile = 0; tile < col_tiles; ++tile) {
        uint8_t* packed = out.data() + (block * col_tiles + tile) * 512;
        for (int r = 0; r < 16; ++r) {
          const int8_t* natural = q + (block * 16 + r) * k + tile * 32;
          for (int c = 0; c < 32; ++c) {
            packed[tiles.int8_byte[r][c]] = static_cast<uint8_t>(natural[c]);
          }
        }
      }
    }
  });
  return out;
}

absl::StatusOr<std::vector<uint16_t>> PackInt8GroupScalesForGpu(const uint16_t* scales, int64_t n,
                                                                int64_t k, int64_t group_size) {
  if (absl::Status status = CheckInt4Shape(n, k, group_size, "PackInt8GroupScalesForGpu");
      !status.ok()) {
    return status;
  }
  if (scales == nullptr) {
    return absl::InvalidArgumentError("PackInt8GroupScalesForGpu: null scales");
  }
  if (group_size == 16) {
    return absl::InvalidArgumentError(
        "PackInt8GroupScalesForGpu: group_size 16 unsupported with F16 scales (32, 64, 128; "
        "16 with F32 scales: PackInt8GroupScalesF32ForGpu)");
  }
  if (group_size == k) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PackInt8GroupScalesForGpu: group_size %d is all of k: the per-channel form (pass the "
        "F16 [n] scales as they are)",
        group_size));
  }
  const int64_t num_groups = k / group_size;
  std::vector<uint16_t> out(n * num_groups * 2, 0);  // mins stay +0
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t group = 0; group < num_groups; ++group) {
      out[ScaleMinPosition(row, group, num_groups, 0)] = scales[row * num_groups + group];
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> PackInt8GroupScalesF32ForGpu(const float* scales,
                                                                const float* mins, int64_t n,
                                                                int64_t k, int64_t group_size) {
  if (absl::Status status = CheckInt4Shape(n, k, group_size, "PackInt8GroupScalesF32ForGpu");
      !status.ok()) {
    return status;
  }
  if (group_size != 16 && group_size != 32) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PackInt8GroupScalesF32ForGpu: group_size %d unsupported (16, 32)", group_size));
  }
  if (scales == nullptr) {
    return absl::InvalidArgumentError("PackInt8GroupScalesF32ForGpu: null scales");
  }
  const int64_t num_groups = k / group_size;
  const int per_lane = mins == nullptr ? 2 : 4;  // (scale g, scale g + 8[, min g, min g + 8])
  std::vector<float> out(n * num_groups * per_lane / 2);
  for (int64_t row = 0; row < n; ++row) {
    const int64_t r = row % 16;
    for (int64_t group = 0; group < num_groups; ++group) {
      const int64_t lane_group = ((row / 16) * num_groups + group) * 8 + r % 8;
      out[lane_group * per_lane + r / 8] = scales[row * num_groups + group];
      if (mins != nullptr) out[lane_group * per_lane + 2 + r / 8] = mins[row * num_groups + group];
    }
  }
  return out;
}

absl::StatusOr<std::vector<int8_t>> UnpackInt8FromGpu(const std::vector<uint8_t>& packed, int64_t n,
                                                      int64_t k) {
  if (absl::Status status = CheckInt8Shape(n, k, "UnpackInt8FromGpu"); !status.ok()) {
    return status;
  }
  if (static_cast<int64_t>(packed.size()) != n * k) {
    return absl::InvalidArgumentError(
        absl::StrFormat("UnpackInt8FromGpu: %d bytes for n %d, k %d", packed.size(), n, k));
  }
  std::vector<int8_t> out(n * k);
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t col = 0; col < k; ++col) {
      out[row * k + col] = static_cast<int8_t>(packed[Int8Position(row, col, k)]);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------ dispatch

QuantGemmTile QuantGemmTileFor(int64_t m, QuantWeightFormat format) {
  const internal::QuantGemmConfig& c = kQuantGemmConfigs[internal::QuantGemmConfigIndex(
      std::max<int64_t>(m, 1), format == QuantWeightFormat::kInt4)];
  return {c.name, c.block_m(), c.block_n(), c.step_k(), c.threads()};
}

int ChooseQuantGemmSplits(int64_t m, int64_t n, int64_t k, int num_sms, QuantWeightFormat format) {
  if (m <= 0 || n <= 0 || k <= 0) return 1;
  return internal::QuantGemmSplitsFor(
      kQuantGemmConfigs[internal::QuantGemmConfigIndex(m, format == QuantWeightFormat::kInt4)], m,
      n, k, num_sms);
}

namespace internal {

int QuantGemmSplitsFor(const QuantGemmConfig& c, int64_t m, int64_t n, int64_t k, int num_sms) {
  if (m <= 0 || n <= 0 || k <= 0) return 1;
  const int64_t blocks = QuantGemmTiles(c, m, n);
  const int64_t target = static_cast<int64_t>(std::max(num_sms, 1)) * c.target_blocks_per_sm;
  // Within a factor of two of the target already: a second kernel and the F32 round trip through
  // the workspace would cost more than the idle multiprocessors.
  if (2 * blocks > target) return 1;
  const int64_t steps = CeilDiv(k, c.step_k());
  const int64_t most = std::min<int64_t>(
      kQuantGemmMaxSplits, std::max<int64_t>(1, steps / internal::kQuantGemmMinStepsPerSplit));
  return static_cast<int>(std::clamp<int64_t>(CeilDiv(target, blocks), 1, most));
}

}  // namespace internal

size_t QuantGemmWorkspaceBytes(const QuantGemmParams& p) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return 0;
  const int splits =
      p.num_splits > 0
          ? p.num_splits
          : ChooseQuantGemmSplits(p.m, p.n, p.k, internal::kQuantGemmMaxSmsForWorkspace, p.format);
  if (splits <= 1) return 0;
  return static_cast<size_t>(splits) * static_cast<size_t>(p.m) * static_cast<size_t>(p.n) *
         sizeof(float);
}

bool QuantGemmGrouped(const QuantGemmParams& p) {
  return p.format == QuantWeightFormat::kInt4 || p.scale_type != QuantScaleType::kF16 ||
         (p.group_size != 0 && p.group_size != p.k);
}

size_t QuantGemmCounterCount(const QuantGemmParams& p) {
  if (QuantGemmWorkspaceBytes(p) == 0) return 0;
  return static_cast<size_t>(internal::QuantGemmTiles(
      kQuantGemmConfigs[internal::QuantGemmConfigIndex(p.m, p.format == QuantWeightFormat::kInt4)],
      p.m, p.n));
}

int64_t internal::QuantGemmTiles(const QuantGemmConfig& c, int64_t m, int64_t n) {
  return CeilDiv(CeilDiv(n, 16), c.row_tiles()) * CeilDiv(m, c.block_m());
}

absl::StatusOr<int> internal::PlanQuantGemmSplits(const QuantGemmParams& p,
                                                  const QuantGemmConfig& c) {
  int splits = p.num_splits;
  if (splits == 0) {
    LOOM_ASSIGN_OR_RETURN(const int num_sms, CurrentDeviceSmCount());
    splits = QuantGemmSplitsFor(c, p.m, p.n, p.k, num_sms);
  }
  if (splits <= 1) return splits;
  const size_t needed = static_cast<size_t>(splits) * p.m * p.n * sizeof(float);
  if (p.workspace == nullptr || p.workspace_bytes < needed) {
    // With num_splits 0: only on a GPU of more than kQuantGemmMaxSmsForWorkspace multiprocessors.
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm (%s): %d splits need a workspace of %d bytes, got %d", c.name,
                        splits, needed, p.workspace_bytes));
  }
  // CheckQuantGemmParams counted for the heuristic's GPU when num_splits is 0: count again for
  // the splits chosen here.
  const int64_t tiles = QuantGemmTiles(c, p.m, p.n);
  if (p.counters != nullptr && static_cast<int64_t>(p.counter_words) < tiles) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm (%s): %d splits need %d counter words, got %d", c.name, splits,
                        tiles, p.counter_words));
  }
  return splits;
}

absl::Status CheckQuantGemmParams(const QuantGemmParams& p) {
  if (p.act_dtype != DataType::kF16 && p.act_dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "QuantGemm: act_dtype %s unsupported (F16, BF16)", DataTypeName(p.act_dtype)));
  }
  if (p.format != QuantWeightFormat::kInt4 && p.format != QuantWeightFormat::kInt8) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm: format %d unsupported", static_cast<int>(p.format)));
  }
  if (p.m < 0 || p.m > kQuantGemmMaxM) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm: m %d must be in [0, %d]", p.m, kQuantGemmMaxM));
  }
  if (p.n <= 0 || p.n % 16 != 0 || p.n > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm: n %d must be a positive multiple of 16 (<= 2^24)", p.n));
  }
  if (p.k <= 0 || p.k % 64 != 0 || p.k > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm: k %d must be a positive multiple of 64, "
                        "the kernel's k step (<= 2^24)",
                        p.k));
  }
  const bool int4 = p.format == QuantWeightFormat::kInt4;
  if (p.scale_type != QuantScaleType::kF16 && p.scale_type != QuantScaleType::kF32 &&
      p.scale_type != QuantScaleType::kF32WithMin) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm: scale_type %d unsupported", static_cast<int>(p.scale_type)));
  }
  if (int4 && p.scale_type != QuantScaleType::kF16) {
    return absl::InvalidArgumentError("QuantGemm: INT4 takes F16 scales and mins only");
  }
  if (p.scale_type != QuantScaleType::kF16) {
    if (p.group_size != 16 && p.group_size != 32) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "QuantGemm: INT8 group_size %d unsupported with F32 scales (groups of 16, 32)",
          p.group_size));
    }
  } else if (QuantGemmGrouped(p)) {
    const bool supported = p.group_size == 32 || p.group_size == 64 || p.group_size == 128 ||
                           (int4 && p.group_size == 16);
    if (!supported) {
      return absl::InvalidArgumentError(
          absl::StrFormat("QuantGemm: %s group_size %d unsupported (groups of %s)",
                          QuantWeightFormatName(p.format), p.group_size,
                          int4 ? "16, 32, 64, 128"
                               : "32, 64, 128; per output channel: 0 or k; 16 with F32 scales"));
    }
  }
  if (QuantGemmGrouped(p)) {
    if (p.k % p.group_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("QuantGemm: k %d is not a multiple of group_size %d", p.k, p.group_size));
    }
  }
  if (p.num_splits < 0 || p.num_splits > kQuantGemmMaxSplits) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm: num_splits %d must be 0 (heuristic) or in [1, %d]",
                        p.num_splits, kQuantGemmMaxSplits));
  }
  if (p.m == 0) return absl::OkStatus();
  if (p.x == nullptr || p.y == nullptr || p.weight == nullptr || p.scales == nullptr) {
    return absl::InvalidArgumentError("QuantGemm: null x, y, weight or scales");
  }
  if (!Aligned(p.x, 16) || !Aligned(p.weight, 16) ||
      (QuantGemmGrouped(p) && !Aligned(p.scales, 16))) {
    return absl::InvalidArgumentError(
        "QuantGemm: x, weight and group-wise scales must be 16-byte aligned");
  }
  if (!Aligned(p.y, p.f32_out ? 4 : 2) || !Aligned(p.bias, p.bias_f32 ? 4 : 2) ||
      !Aligned(p.scales, 2)) {
    return absl::InvalidArgumentError(
        "QuantGemm: y and bias (4-byte aligned when F32), and scales must be 2-byte aligned");
  }
  if (p.counters != nullptr &&
      (!Aligned(p.counters, 4) || p.counter_words < QuantGemmCounterCount(p))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm: %d counter words, %d needed (4-byte aligned)", p.counter_words,
                        QuantGemmCounterCount(p)));
  }
  const size_t needed = QuantGemmWorkspaceBytes(p);
  if (needed > 0 &&
      (p.workspace == nullptr || p.workspace_bytes < needed || !Aligned(p.workspace, 16))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QuantGemm: workspace of %d bytes, %d needed (16-byte aligned)",
                        p.workspace_bytes, needed));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------ FP8

float E4m3ToFloat(uint8_t value) {
  const int sign = value >> 7, exponent = (value >> 3) & 0x0f, mantissa = value & 0x07;
  if (exponent == 0x0f && mantissa == 0x07) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude =
      exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                    : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

uint8_t FloatToE4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double magnitude = std::fabs(static_cast<double>(value));
  if (magnitude >= 448.0) return sign | 0x7e;  // saturate
  // The nearest of the 127 finite non-negative codes, whose values increase with the code:
  // one of the two around it (a binary search; the linear scan made a 16M-weight test take
  // 36 s), ties to the even code.
  uint8_t below = 0, above = 0x7e;  // value(below) <= magnitude < value(above)
  while (above - below > 1) {
    const uint8_t middle = static_cast<uint8_t>((below + above) / 2);
    (E4m3ToFloat(middle) <= magnitude ? below : above) = middle;
  }
  const double below_error = magnitude - E4m3ToFloat(below);
  const double above_error = E4m3ToFloat(above) - magnitude;
  if (above_error < below_error || (above_error == below_error && (above & 1) == 0)) {
    return sign | above;
  }
  return sign | below;
}

absl::Status CheckQuantizeFp8Params(const QuantizeFp8Params& p) {
  if (p.in_dtype != DataType::kF16 && p.in_dtype != DataType::kBF16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "QuantizeFp8: in_dtype %s unsupported (F16, BF16)", DataTypeName(p.in_dtype)));
  }
  if (p.count < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("QuantizeFp8: count %d < 0", p.count));
  }
  if (p.count > 0 && (p.x == nullptr || p.out == nullptr || p.scale == nullptr)) {
    return absl::InvalidArgumentError("QuantizeFp8: null x, out or scale");
  }
  if (!Aligned(p.x, 2) || !Aligned(p.scale, 4)) {
    return absl::InvalidArgumentError("QuantizeFp8: x must be 2-byte, scale 4-byte aligned");
  }
  if (p.row_size < 0 || (p.row_size > 0 && p.count % p.row_size != 0) ||
      (p.row_size > 0 && !p.dynamic_scale) ||
      p.count / std::max<int64_t>(p.row_size, 1) > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "QuantizeFp8: row_size %d must be 0 or divide count %d into < 2^31 rows (dynamic "
        "scales only)",
        p.row_size, p.count));
  }
  return absl::OkStatus();
}

size_t Fp8GemmWorkspaceBytes(const Fp8GemmParams& p) {
  if (p.m <= 0 || p.n <= 0) return 0;
  // An F32 output takes cuBLASLt's sums in place.
  const size_t results = p.out_dtype == DataType::kF32
                             ? 0
                             : static_cast<size_t>(p.m) * static_cast<size_t>(p.n) * sizeof(float);
  return (results + 255) / 256 * 256 + internal::kFp8LtWorkspaceBytes;
}

absl::Status CheckFp8GemmParams(const Fp8GemmParams& p) {
  if (p.out_dtype != DataType::kF16 && p.out_dtype != DataType::kBF16 &&
      p.out_dtype != DataType::kF32) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Fp8Gemm: out_dtype %s unsupported (F16, BF16, F32)", DataTypeName(p.out_dtype)));
  }
  if (p.m < 0 || p.m > 65536) {
    return absl::InvalidArgumentError(absl::StrFormat("Fp8Gemm: m %d must be in [0, 65536]", p.m));
  }
  if (p.n <= 0 || p.n % 16 != 0 || p.n > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Fp8Gemm: n %d must be a positive multiple of 16 (<= 2^24)", p.n));
  }
  if (p.k <= 0 || p.k % 16 != 0 || p.k > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Fp8Gemm: k %d must be a positive multiple of 16 (<= 2^24)", p.k));
  }
  if (p.m == 0) return absl::OkStatus();
  if (p.x == nullptr || p.x_scale == nullptr || p.weight == nullptr || p.w_scale == nullptr ||
      p.y == nullptr) {
    return absl::InvalidArgumentError("Fp8Gemm: null x, x_scale, weight, w_scale or y");
  }
  if (!Aligned(p.x, 16) || !Aligned(p.weight, 16)) {
    return absl::InvalidArgumentError("Fp8Gemm: x and weight must be 16-byte aligned");
  }
  // An F32 y is cuBLASLt's output matrix too: 16-byte aligned.
  const size_t y_align = p.out_dtype == DataType::kF32 ? 16 : 2;
  const size_t bias_align = p.out_dtype == DataType::kF32 ? 4 : 2;
  if (!Aligned(p.y, y_align) || !Aligned(p.bias, bias_align)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Fp8Gemm: y and bias must be %d- and %d-byte aligned", y_align, bias_align));
  }
  const size_t needed = Fp8GemmWorkspaceBytes(p);
  if (p.workspace == nullptr || p.workspace_bytes < needed || !Aligned(p.workspace, 256)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Fp8Gemm: workspace of %d bytes, %d needed (256-byte aligned)", p.workspace_bytes, needed));
  }
  return absl::OkStatus();
}

#if !LOOM_HAVE_CUDA
absl::Status LaunchQuantGemm(const QuantGemmParams& params, cudaStream_t) {
  if (absl::Status status = CheckQuantGemmParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("QuantGemm: Loom was built without CUDA");
}

absl::Status LaunchQuantizeFp8(const QuantizeFp8Params& params, cudaStream_t) {
  if (absl::Status status = CheckQuantizeFp8Params(params); !status.ok()) return status;
  return absl::FailedPreconditionError("QuantizeFp8: Loom was built without CUDA");
}

bool Fp8GemmSupported() { return false; }

absl::Status LaunchFp8Gemm(const Fp8GemmParams& params, cudaStream_t) {
  if (absl::Status status = CheckFp8GemmParams(params); !status.ok()) return status;
  return absl::FailedPreconditionError("Fp8Gemm: Loom was built without CUDA");
}
#endif

}  // namespace loom::kernels::cuda
