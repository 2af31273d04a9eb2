// The quantized linear kernel's activations (quantized_linear_cpu.cpp): x quantized per
// block of 32 values to int8, or to 16 bits as two int8 planes, with the scales, offsets
// and sums its dot products need. AVX-512 code: included where the kernel is built.
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

inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const at::BFloat16* x) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// The largest quantized magnitude: int8's 127, or for wide activations 127 x 257 =
// 32639, the most whose high byte (v + 128) >> 8 stays within int8's -127 .. 127.
template <bool WIDE>
constexpr float kLevels = WIDE ? 32639.f : 127.f;

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

// The activations of rows row0 .. of a.
inline Activations rows_from(const Activations& a, int64_t row0) {
  return Activations{a.values + row0 * a.k,       a.scale + row0 * a.blocks,
                     a.offset + row0 * a.blocks * 2, a.sum + row0 * a.blocks,
                     a.k,                           a.blocks,
                     a.low ? a.low + row0 * a.k : nullptr};
}

}  // namespace quantized_activations
