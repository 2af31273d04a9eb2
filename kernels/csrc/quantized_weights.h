// The packed quantized weights' values and scales as the quantized linear kernels read
// them (quantized_linear_cpu.cpp on AVX512-VNNI, quantized_linear_amx.cpp on AMX's
// tiles), and the one way both turn a scale group's integer sum into the fp32 sums, so
// that the two give the same bits. AVX-512 code: included where the kernels are built.
#pragma once

#include "tensor_api.h"
#include <immintrin.h>

#include <cstdint>

#include "quantized_format.h"
#include "vector_math.h"

namespace quantized_weights {

using namespace quantized_format;

inline void store16(float* out, __m512 v) { _mm512_storeu_ps(out, v); }
inline void store16(at::BFloat16* out, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), round_to_bf16(v));
}

inline __m512 load_fp16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m128i load16_bytes(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m512 load_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(load16_bytes(p)));
}
inline __m512 load_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16_bytes(p)));
}

// The 16 outputs' weight scale of scale group g of block b, in fp32 (K-quants: the
// super-block's d times the group's small integer scale: exact in fp32; I8: the rows'
// scales, the same for every block, after its 0 bytes of block factors).
template <QType T>
inline __m512 weight_scale(const uint8_t* block_factors, const uint8_t* super_factors, int64_t b,
                           int g) {
  const uint8_t* bf = block_factors + b * block_factor_bytes(T);
  if constexpr (is_k_quant(T)) {
    const __m512 d = load_fp16(super_factors + b / kBlocksPerSuper * super_factor_bytes(T));
    return _mm512_mul_ps(has_6_bit_scales(T) ? load_u8(bf) : load_i8(bf + g * kPanel), d);
  } else if constexpr (T == QType::I8) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(block_factors));
  } else {
    return load_fp16(bf);
  }
}

// The 16 outputs' min of block b: Q4_1's and Q5_1's fp16 m; Q4_K's and Q5_K's -dmin
// times its 6-bit min.
template <QType T>
inline __m512 weight_min(const uint8_t* block_factors, const uint8_t* super_factors, int64_t b) {
  const uint8_t* bf = block_factors + b * block_factor_bytes(T);
  if constexpr (has_6_bit_scales(T)) {
    const __m512 dmin = load_fp16(super_factors + b / kBlocksPerSuper * super_factor_bytes(T) + 32);
    return _mm512_mul_ps(load_u8(bf + kPanel), _mm512_sub_ps(_mm512_setzero_ps(), dmin));
  } else {
    return load_fp16(bf + 32);
  }
}

// Q6_K's 6-bit values of word w (of 4): `low` (the low 4 bits, isolated) or'd with
// the top 2 bits, moved from bits 2w, 2w + 1 of the word of highs to bits 4, 5 (the
// 16-bit shifts move bits across bytes only outside those two, which the mask drops).
inline __m512i q6_values(__m512i low, __m512i highs, int w) {
  const __m512i mask = _mm512_set1_epi8(0x30);
  const __m512i moved = w == 0 ? _mm512_slli_epi16(highs, 4)
                        : w == 1 ? _mm512_slli_epi16(highs, 2)
                        : w == 2 ? highs
                                 : _mm512_srli_epi16(highs, 2);
  return _mm512_ternarylogic_epi32(moved, mask, low, 0xEA);  // (moved & mask) | low
}

// The 5-bit types' values of word w (of 4): `low` and `high` (the low and high nibbles,
// isolated) or'd with their fifth bits, moved from bits w and 4 + w of the word of
// highs to bit 4 (the 16-bit shifts move bits across bytes only into bits the mask
// drops).
inline void q5_values(__m512i& low, __m512i& high, __m512i highs, int w) {
  const __m512i mask = _mm512_set1_epi8(0x10);
  const __m512i for_low = w == 0   ? _mm512_slli_epi16(highs, 4)
                          : w == 1 ? _mm512_slli_epi16(highs, 3)
                          : w == 2 ? _mm512_slli_epi16(highs, 2)
                                   : _mm512_slli_epi16(highs, 1);
  const __m512i for_high = w == 0   ? highs
                           : w == 1 ? _mm512_srli_epi16(highs, 1)
                           : w == 2 ? _mm512_srli_epi16(highs, 2)
                                    : _mm512_srli_epi16(highs, 3);
  low = _mm512_ternarylogic_epi32(for_low, mask, low, 0xEA);  // (for_low & mask) | low
  high = _mm512_ternarylogic_epi32(for_high, mask, high, 0xEA);
}

// acc + sum x d x scale: a scale group's int32 sums (16 outputs of one row) scaled by
// the outputs' weight scales d and the row's activation scale, into its fp32 sums.
inline __m512 add_scaled(__m512 acc, __m512i sum, __m512 d, float scale) {
  return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), d), _mm512_set1_ps(scale), acc);
}

}  // namespace quantized_weights
