#pragma once

// Internal to kernels/cpu's AVX-512 translation units (matmul_f32act_gemm_avx512.cc and
// matmul_bf16act_amx.cc, both compiled with at least -mavx512f -mavx512bw -mavx512vl -mfma
// -mf16c): decoders that turn the packed INT4/INT5/INT8 row blocks (matmul_internal.h) into
// 16 rows' weights of one column as floats, scale * q + min, the very floats DequantizeRows
// gives. The names sit in an unnamed namespace on purpose: each including file compiles them
// with its own target flags, and separate copies keep the linker from picking one file's
// code (say, the AMX file's) for the other's callers.

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

// Calls f(std::integral_constant<int, j>) for j = 0 .. N-1, unrolled at compile time (the
// shift counts must be immediates).
template <typename F, int... kJ>
inline void Unrolled(F&& f, std::integer_sequence<int, kJ...>) {
  (f(std::integral_constant<int, kJ>{}), ...);
}

inline __m512 LoadHalf16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// INT4: a 64-byte line holds 8 columns of 16 rows; column j sits at bits
// 8 * (j % 4) + 4 * (j / 4) of every row's dword. vpermps reads only bits 3:0 of each
// index, so a shift and one permute of {0, ..., 15} give q as a float, and one FMA
// scale * q + min the weight.
//
// Every decoder: LoadLine(block's data, line) gives a line's packed bits (Line),
// Column<kCol>(line, group) column kCol of it as 16 floats, Prefetch(block's data, line)
// asks for a line of a later block.
struct Int4Decoder {
  static constexpr int kColsPerLine = 8;
  __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  explicit Int4Decoder(const PackedWeight& /*w*/) {}
  struct Group {
    __m512 scale, min;
  };
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const int64_t index = (block * (w.cols / w.group_size) + g) * kRowBlock;
    return {LoadHalf16(w.scales.data() + index), LoadHalf16(w.mins.data() + index)};
  }
  using Line = __m512i;
  Line LoadLine(const uint8_t* block, int64_t line) const {
    return _mm512_loadu_si512(block + line * 64);
  }
  void Prefetch(const uint8_t* block, int64_t line) const {
    _mm_prefetch(reinterpret_cast<const char*>(block + line * 64), _MM_HINT_T1);
  }
  template <int kCol>
  __m512 Column(__m512i bytes, const Group& group) const {
    constexpr int kShift = 8 * (kCol % 4) + 4 * (kCol / 4);
    const __m512i index = kShift == 0 ? bytes : _mm512_srli_epi32(bytes, kShift);
    return _mm512_fmadd_ps(_mm512_permutexvar_ps(index, values), group.scale, group.min);
  }
};

// INT5: the line's nibbles with their fifth bits (matmul_internal.h) become two registers
// of one q per byte, columns 0-3 and 4-7 (bits 7:5 of each byte are don't-care); shifted,
// column j's byte indexes {0, ..., 31} with one two-table permute (vpermt2ps reads bits
// 4:0), and one FMA gives scale * q + min.
struct Int5Decoder : Int4Decoder {
  __m512 upper_values =
      _mm512_setr_ps(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  __m512i low_nibbles = _mm512_set1_epi8(0x0f);
  int64_t high_offset;  // of the fifth bits in a block's data
  explicit Int5Decoder(const PackedWeight& w)
      : Int4Decoder(w), high_offset(Int5HighOffset(w.cols, 0, 0)) {}
  struct Line {
    __m512i columns[2];  // columns 0-3, 4-7: q in byte j of every row's dword
  };
  Line LoadLine(const uint8_t* block, int64_t line) const {
    const __m512i bytes = _mm512_loadu_si512(block + line * 64);
    const __m512i high = _mm512_srl_epi32(_mm512_loadu_si512(block + high_offset + (line / 4) * 64),
                                          _mm_cvtsi32_si128(2 * (line % 4)));
    // Bits 3:0 from the nibbles, 7:4 from the shifted fifth bits (C ? A : B, imm 0xe4).
    return {{_mm512_ternarylogic_epi32(bytes, _mm512_slli_epi32(high, 4), low_nibbles, 0xe4),
             _mm512_ternarylogic_epi32(_mm512_srli_epi32(bytes, 4), _mm512_slli_epi32(high, 3),
                                       low_nibbles, 0xe4)}};
  }
  void Prefetch(const uint8_t* block, int64_t line) const {
    Int4Decoder::Prefetch(block, line);
    if (line % 4 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(block + high_offset + (line / 4) * 64),
                   _MM_HINT_T1);
    }
  }
  template <int kCol>
  __m512 Column(const Line& line, const Group& group) const {
    constexpr int kShift = 8 * (kCol % 4);
    const __m512i bytes = line.columns[kCol / 4];
    const __m512i index = kShift == 0 ? bytes : _mm512_srli_epi32(bytes, kShift);
    return _mm512_fmadd_ps(_mm512_permutex2var_ps(values, index, upper_values), group.scale,
                           group.min);
  }
};

// INT8: a line holds 4 columns of 16 rows as q + 128, column j in byte j of each dword.
// XOR 0x80 gives q as int8; moved to bits 31:24 (zeros below: one shift for column 0,
// one AND for column 3, one byte shuffle otherwise) it converts exactly to q * 2^24, and
// the group scale carries the 2^-24.
struct Int8Decoder {
  static constexpr int kColsPerLine = 4;
  explicit Int8Decoder(const PackedWeight& /*w*/) {}
  __m512i top_byte = _mm512_set1_epi32(static_cast<int>(0xff000000u));
  // vpshufb controls (indices within each 16-byte lane) moving byte j of every dword to
  // its byte 3, zeroing the others (0x80).
  __m512i byte1_to_top = ByteToTop(1);
  __m512i byte2_to_top = ByteToTop(2);
  static __m512i ByteToTop(int j) {
    uint32_t control[16];
    for (int dword = 0; dword < 16; ++dword) {
      control[dword] = (4u * (dword % 4) + j) << 24 | 0x808080u;
    }
    return _mm512_loadu_si512(control);
  }
  struct Group {
    __m512 scale;
  };
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const int64_t index = (block * (w.cols / w.group_size) + g) * kRowBlock;
    return {_mm512_mul_ps(LoadHalf16(w.scales.data() + index), _mm512_set1_ps(1.0f / 16777216.0f))};
  }
  using Line = __m512i;
  Line LoadLine(const uint8_t* block, int64_t line) const {
    return _mm512_xor_si512(_mm512_loadu_si512(block + line * 64),
                            _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  void Prefetch(const uint8_t* block, int64_t line) const {
    _mm_prefetch(reinterpret_cast<const char*>(block + line * 64), _MM_HINT_T1);
  }
  // Column kCol as q * 2^24, exactly.
  template <int kCol>
  __m512 Shifted(__m512i bytes) const {
    __m512i field;
    if constexpr (kCol == 0) {
      field = _mm512_slli_epi32(bytes, 24);
    } else if constexpr (kCol == 1) {
      field = _mm512_shuffle_epi8(bytes, byte1_to_top);
    } else if constexpr (kCol == 2) {
      field = _mm512_shuffle_epi8(bytes, byte2_to_top);
    } else {
      field = _mm512_and_si512(bytes, top_byte);
    }
    return _mm512_cvtepi32_ps(field);
  }
  template <int kCol>
  __m512 Column(__m512i bytes, const Group& group) const {
    return _mm512_mul_ps(Shifted<kCol>(bytes), group.scale);
  }
};

// F32-scaled weights (K-quants, weights.h): the same columns with F32 scales and mins, the
// weight one rounding of q * scale + min (INT8 too: Q5_K has mins, the others -0).
inline int64_t GroupOffset(const PackedWeight& w, int64_t block, int64_t g) {
  return (block * (w.cols / w.group_size) + g) * kRowBlock;
}
struct Int4F32Decoder : Int4Decoder {
  using Int4Decoder::Int4Decoder;
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const int64_t index = GroupOffset(w, block, g);
    return {_mm512_loadu_ps(w.scales_f32.data() + index),
            _mm512_loadu_ps(w.mins_f32.data() + index)};
  }
};
struct Int8F32Decoder : Int8Decoder {
  using Int8Decoder::Int8Decoder;
  struct Group {
    __m512 scale, min;
  };
  static Group LoadGroup(const PackedWeight& w, int64_t block, int64_t g) {
    const int64_t index = GroupOffset(w, block, g);
    return {_mm512_mul_ps(_mm512_loadu_ps(w.scales_f32.data() + index),
                          _mm512_set1_ps(1.0f / 16777216.0f)),
            _mm512_loadu_ps(w.mins_f32.data() + index)};
  }
  template <int kCol>
  __m512 Column(__m512i bytes, const Group& group) const {
    return _mm512_fmadd_ps(Shifted<kCol>(bytes), group.scale, group.min);
  }
};

}  // namespace
}  // namespace loom::kernels::cpu::internal
