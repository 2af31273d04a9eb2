// The quantized linear kernel's activations (quantized_linear_cpu.cpp): x quantized per
// block of 32 values to int8, or to 16 bits as two int8 planes, with the scales, offsets
// and sums its dot products need. AVX-512 code where the CPU has AVX512-BW, else AVX2
// code that gives the same integers: included where the kernel is built.
#pragma once

#include "tensor_api.h"
#include <immintrin.h>

#include <cstdint>

#include "quantized_format.h"

namespace quantized_activations {

using namespace quantized_format;

constexpr int64_t kQuantizeGrain = 16;  // activation rows per task

// The activations quantized per block of 32: int8 values and, per row and block, the
// fp32 scale, per half block the int32 added to a scale group's int sum before
// scaling (minus the weights' offset times the values' sum: one group per block but
// Q6_K's two, the second then 0), and for the types with mins, scale times the
// values' sum. Wide (16-bit) activations are each 256 x a high int8 plus a low one,
// both multiplied by the same weight bytes (see quantize_row).
struct Activations {
  const int8_t* values;   // [M, K]: the int8 values, or the wide values' high bytes
  const float* scale;     // [M, blocks]
  const int32_t* offset;  // [M, blocks, 2]
  const float* sum;       // [M, blocks]
  int64_t k, blocks;
  const int8_t* low;      // [M, K]: the wide values' low bytes (null for int8)
};

// The largest quantized magnitude: int8's 127, or for wide activations 127 x 257 =
// 32639, the most whose high byte (v + 128) >> 8 stays within int8's -127 .. 127.
template <bool WIDE>
constexpr float kLevels = WIDE ? 32639.f : 127.f;

#if defined(__AVX512BW__)
inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const at::BFloat16* x) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Stores 16 quantized values: as int8, or (WIDE) as their high bytes h = (v + 128) >> 8
// in `q` and low bytes v - 256 h (-128 .. 127) in `low`.
template <bool WIDE>
inline void store_values(__m512i v, int8_t* q, int8_t* low) {
  if constexpr (WIDE) {
    const __m512i high = _mm512_srai_epi32(_mm512_add_epi32(v, _mm512_set1_epi32(128)), 8);
    const __m512i rest = _mm512_sub_epi32(v, _mm512_slli_epi32(high, 8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(high));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low), _mm512_cvtepi32_epi8(rest));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(v));
  }
}

// One row: v = round-half-even(x * (L / amax)) per block, scale amax / L, L = kLevels.
// L / amax is one IEEE division (the intrinsic, which -ffast-math does not turn into
// a reciprocal), so that kernels/linear_quantized.py's reference (quantize_activations)
// rounds to the same integers. Wide values' sums stay within int32: 32 x 32639 x 128
// (Q8_0's offset) is 2^27.
template <bool WIDE, typename scalar_t>
void quantize_row(const scalar_t* x, int64_t blocks, QType t, int8_t* q, int8_t* low,
                  float* scale, int32_t* offset, float* sum) {
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const int32_t c = -value_offset(t);
  const float levels = kLevels<WIDE>;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 lo = load16(x + b * kBlock), hi = load16(x + b * kBlock + 16);
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_and_ps(lo, magnitude), _mm512_and_ps(hi, magnitude)));
    const float inv =
        amax > 0.f ? _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(levels), _mm_set_ss(amax))) : 0.f;
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(inv)));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(inv)));
    int8_t* low_b = WIDE ? low + b * kBlock : nullptr;
    store_values<WIDE>(qlo, q + b * kBlock, low_b);
    store_values<WIDE>(qhi, q + b * kBlock + 16, WIDE ? low_b + 16 : nullptr);
    const int32_t s_lo = _mm512_reduce_add_epi32(qlo), s_hi = _mm512_reduce_add_epi32(qhi);
    scale[b] = _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(amax), _mm_set_ss(levels)));
    offset[2 * b] = groups(t) == 2 ? c * s_lo : c * (s_lo + s_hi);
    offset[2 * b + 1] = groups(t) == 2 ? c * s_hi : 0;
    sum[b] = scale[b] * static_cast<float>(s_lo + s_hi);
  }
}

#else
// AVX2: 8 lanes at a time.
inline __m256 load8(const float* x) { return _mm256_loadu_ps(x); }
inline __m256 load8(const at::BFloat16* x) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float reduce_max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t reduce_add8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// 8 int32 values within int8's range, stored as 8 bytes (the packs saturate nothing).
inline void store8_bytes(__m256i v, int8_t* out) {
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packs_epi16(words, words));
}

// As the AVX-512 store_values, 8 values.
template <bool WIDE>
inline void store_values(__m256i v, int8_t* q, int8_t* low) {
  if constexpr (WIDE) {
    const __m256i high = _mm256_srai_epi32(_mm256_add_epi32(v, _mm256_set1_epi32(128)), 8);
    store8_bytes(high, q);
    store8_bytes(_mm256_sub_epi32(v, _mm256_slli_epi32(high, 8)), low);
  } else {
    store8_bytes(v, q);
  }
}

// As the AVX-512 quantize_row: the same division and rounding, so the same integers.
template <bool WIDE, typename scalar_t>
void quantize_row(const scalar_t* x, int64_t blocks, QType t, int8_t* q, int8_t* low,
                  float* scale, int32_t* offset, float* sum) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const int32_t c = -value_offset(t);
  const float levels = kLevels<WIDE>;
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = load8(x + b * kBlock + 8 * i);
    const float amax = reduce_max8(
        _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], magnitude), _mm256_and_ps(v[1], magnitude)),
                      _mm256_max_ps(_mm256_and_ps(v[2], magnitude), _mm256_and_ps(v[3], magnitude))));
    const float inv =
        amax > 0.f ? _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(levels), _mm_set_ss(amax))) : 0.f;
    __m256i qv[4];
    for (int i = 0; i < 4; ++i) {
      qv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
      store_values<WIDE>(qv[i], q + b * kBlock + 8 * i, WIDE ? low + b * kBlock + 8 * i : nullptr);
    }
    const int32_t s_lo = reduce_add8(_mm256_add_epi32(qv[0], qv[1]));
    const int32_t s_hi = reduce_add8(_mm256_add_epi32(qv[2], qv[3]));
    scale[b] = _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(amax), _mm_set_ss(levels)));
    offset[2 * b] = groups(t) == 2 ? c * s_lo : c * (s_lo + s_hi);
    offset[2 * b + 1] = groups(t) == 2 ? c * s_hi : 0;
    sum[b] = scale[b] * static_cast<float>(s_lo + s_hi);
  }
}
#endif

// x [rows, K] quantized row by row (quantize_row) into one buffer, which `buffer` holds:
// values [rows, K] int8 (wide: their high bytes, then their low bytes [rows, K]), then per
// block the scales, 2 offsets and sums, 4 bytes each (K % 32 == 0: all aligned).
template <typename scalar_t>
Activations quantize_activations(const scalar_t* x, int64_t rows, int64_t k, QType t, bool wide,
                                 at::Tensor& buffer) {
  const int64_t blocks = k / kBlock, value_planes = wide ? 2 : 1;
  buffer = tensors::empty({value_planes * rows * k + 4 * 4 * rows * blocks}, at::kByte);
  int8_t* q = reinterpret_cast<int8_t*>(buffer.data_ptr<uint8_t>());
  int8_t* low = wide ? q + rows * k : nullptr;
  float* scale = reinterpret_cast<float*>(q + value_planes * rows * k);
  int32_t* offsets = reinterpret_cast<int32_t*>(scale + rows * blocks);
  float* sums = reinterpret_cast<float*>(offsets + 2 * rows * blocks);
  at::parallel_for(0, rows, kQuantizeGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (wide) {
        quantize_row<true>(x + r * k, blocks, t, q + r * k, low + r * k, scale + r * blocks,
                           offsets + 2 * r * blocks, sums + r * blocks);
      } else {
        quantize_row<false>(x + r * k, blocks, t, q + r * k, nullptr, scale + r * blocks,
                            offsets + 2 * r * blocks, sums + r * blocks);
      }
    }
  });
  return Activations{q, scale, offsets, sums, k, blocks, low};
}

// A tile's ROWS rows from row0 of a: their values as words of 4 int8 values (wide: the
// high bytes', and in x_low the low bytes'; else null), scales, offsets and sums.
template <int ROWS>
struct TileRows {
  const int32_t* x[ROWS];
  const int32_t* x_low[ROWS];
  const float* x_scale[ROWS];
  const int32_t* x_offset[ROWS];
  const float* x_sum[ROWS];
  TileRows(const Activations& a, int64_t row0) {
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row0 + r;
      x[r] = reinterpret_cast<const int32_t*>(a.values + row * a.k);
      x_low[r] = a.low ? reinterpret_cast<const int32_t*>(a.low + row * a.k) : nullptr;
      x_scale[r] = a.scale + row * a.blocks;
      x_offset[r] = a.offset + row * a.blocks * 2;
      x_sum[r] = a.sum + row * a.blocks;
    }
  }
};

// The activations of rows row0 .. of a.
inline Activations rows_from(const Activations& a, int64_t row0) {
  return Activations{a.values + row0 * a.k,       a.scale + row0 * a.blocks,
                     a.offset + row0 * a.blocks * 2, a.sum + row0 * a.blocks,
                     a.k,                           a.blocks,
                     a.low ? a.low + row0 * a.k : nullptr};
}

}  // namespace quantized_activations
