#include "common/formats/kquant_block.h"

#include <cstring>

namespace loom::common {
namespace {

float LoadHalf(const uint8_t* bytes) {
  uint16_t half;
  std::memcpy(&half, bytes, sizeof(half));
  return HalfToFloat(half);
}

// The 12 packed bytes of Q4_K/Q5_K hold 8 six-bit scales and 8 six-bit mins.
void UnpackScaleMin(const uint8_t* scales, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = scales[j] & 0x3f;
    mn[j] = scales[4 + j] & 0x3f;
    sc[4 + j] = (scales[8 + j] & 0x0f) | ((scales[j] >> 2) & 0x30);
    mn[4 + j] = (scales[8 + j] >> 4) | ((scales[4 + j] >> 2) & 0x30);
  }
}

// Q2_K (84 bytes): 16 bytes of 4-bit scale (low) and min (high) per sub-block of 16, 64
// bytes of 2-bit q, f16 d, f16 dmin. Element 128 h + 32 j + l takes bits 2 j of
// qs[32 h + l]; x = (d * sc) * q - (dmin * m).
void DecodeQ2K(const uint8_t* src, KQuantBlock& out) {
  const uint8_t* scales = src;
  const uint8_t* qs = src + 16;
  const float d = LoadHalf(src + 80), dmin = LoadHalf(src + 82);
  out.sub_block = 16;
  for (int s = 0; s < 16; ++s) {
    out.scale[s] = d * static_cast<float>(scales[s] & 0x0f);
    out.min[s] = -(dmin * static_cast<float>(scales[s] >> 4));
  }
  for (int i = 0; i < kKQuantBlockSize; ++i) {
    const int h = i / 128, j = (i % 128) / 32, l = i % 32;
    out.q[i] = static_cast<int8_t>((qs[32 * h + l] >> (2 * j)) & 3);
  }
}

// Q3_K (110 bytes): 32 bytes of high-bit masks, 64 bytes of 2-bit low parts, 12 bytes of
// 16 six-bit scales (stored + 32), f16 d. Element 128 h + 32 j + l: low bits 2 j of
// qs[32 h + l], minus 4 unless bit 4 h + j of hmask[l] is set; x = (d * (sc - 32)) * q.
void DecodeQ3K(const uint8_t* src, KQuantBlock& out) {
  const uint8_t* hmask = src;
  const uint8_t* qs = src + 32;
  const uint8_t* scales = src + 96;
  const float d = LoadHalf(src + 108);
  out.sub_block = 16;
  for (int s = 0; s < 16; ++s) {
    const int low = (scales[s % 8] >> (4 * (s / 8))) & 0x0f;
    const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 0x03;
    out.scale[s] = d * static_cast<float>((low | (high << 4)) - 32);
    out.min[s] = -0.0f;
  }
  for (int i = 0; i < kKQuantBlockSize; ++i) {
    const int h = i / 128, j = (i % 128) / 32, l = i % 32;
    const int low = (qs[32 * h + l] >> (2 * j)) & 3;
    const bool high = (hmask[l] >> (4 * h + j)) & 1;
    out.q[i] = static_cast<int8_t>(low - (high ? 0 : 4));
  }
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles;
// sub-block s (32 elements) is nibble s % 2 of bytes 32 (s / 2) ..; x = (d * sc) * q -
// (dmin * m). Q5_K (176 bytes) adds 32 bytes of fifth bits before the nibbles (bit s of
// byte i for element i of sub-block s).
void DecodeQ45K(const uint8_t* src, bool five_bits, KQuantBlock& out) {
  const float d = LoadHalf(src), dmin = LoadHalf(src + 2);
  uint8_t sc[8], mn[8];
  UnpackScaleMin(src + 4, sc, mn);
  const uint8_t* qh = src + 16;
  const uint8_t* qs = src + (five_bits ? 48 : 16);
  out.sub_block = 32;
  for (int s = 0; s < 8; ++s) {
    out.scale[s] = d * static_cast<float>(sc[s]);
    out.min[s] = -(dmin * static_cast<float>(mn[s]));
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    for (int i = 0; i < 32; ++i) {
      int value = (q[i] >> shift) & 0x0f;
      if (five_bits) value |= ((qh[i] >> s) & 1) << 4;
      out.q[32 * s + i] = static_cast<int8_t>(value);
    }
  }
}

// Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales,
// f16 d. Half h (128 elements) takes element r from nibble r / 64 of ql[64 h + r % 64]
// and bits 2 (r / 32) of qh[32 h + r % 32]; x = (d * scale) * (q - 32).
void DecodeQ6K(const uint8_t* src, KQuantBlock& out) {
  const uint8_t* ql = src;
  const uint8_t* qh = src + 128;
  const uint8_t* scales = src + 192;
  const float d = LoadHalf(src + 208);
  out.sub_block = 16;
  for (int s = 0; s < 16; ++s) {
    out.scale[s] = d * static_cast<float>(static_cast<int8_t>(scales[s]));
    out.min[s] = -0.0f;
  }
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 128; ++r) {
      const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
      out.q[128 * h + r] = static_cast<int8_t>((low | (high << 4)) - 32);
    }
  }
}

}  // namespace

bool IsKQuant(GgmlType type) {
  return type == GgmlType::kQ2_K || type == GgmlType::kQ3_K || type == GgmlType::kQ4_K ||
         type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
}

void DecodeKQuantBlock(GgmlType type, const uint8_t* block, KQuantBlock& out) {
  switch (type) {
    case GgmlType::kQ2_K:
      return DecodeQ2K(block, out);
    case GgmlType::kQ3_K:
      return DecodeQ3K(block, out);
    case GgmlType::kQ4_K:
      return DecodeQ45K(block, false, out);
    case GgmlType::kQ5_K:
      return DecodeQ45K(block, true, out);
    case GgmlType::kQ6_K:
      return DecodeQ6K(block, out);
    default:
      out.sub_block = 0;
      return;
  }
}

}  // namespace loom::common
