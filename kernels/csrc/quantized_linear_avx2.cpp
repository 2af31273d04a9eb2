// The quantized linear kernel on AVX2 (with FMA and F16C), for the CPUs without
// AVX512-VNNI (AMD's before Zen 4, Intel's client cores): what quantized_linear_cpu.cpp
// does there, on the same panels (quantized_pack_cpu.cpp) and the same quantized
// activations, to the same integer sums, scaled into fp32 in the same order.
//
// AVX2 has no VPDPBUSD. VPMADDUBSW multiplies 32 unsigned weight bytes by 32 signed
// activation bytes and adds adjacent products into 16 int16 lanes (saturating), and
// VPMADDWD by ones adds those pairs into 8 int32 lanes: one output each, its 4 values of
// a word (the panels' order). A pair of products stays within int16 where the weights
// are at most 63 (Q6_K's 6 bits: 2 x 63 x 128 = 16128), so two words' pairs (the low
// and the high nibbles) are added in int16 before one VPMADDWD; 4-bit values' pairs,
// the whole block's four words of them. On a first-generation EPYC (Zen: 256-bit
// integer multiplies as two halves on one port) the multiplies bound these tiles, and
// a quarter fewer of them made SmolLM2's Q4_1 projections 1.15-1.18x as fast at 16 to
// 512 rows. Q8_0's and I8's bytes
// (0 .. 255 as packed) would saturate: int8 activations multiply the signed value
// (byte ^ 0x80) by llama.cpp's sign trick, |w| times x with w's sign (the product then
// needs no offset), and 16-bit activations, whose low bytes reach -128 where the trick
// overflows, multiply the unsigned byte's two nibbles one at a time.
//
// A ymm register holds half a panel (8 outputs). Tiles: 1-2 rows of both halves (a lone
// row's weights read once), or up to 4 rows (wide activations: 3) of one half, each
// half's pass finding the panel's bytes in cache after the first.

#include "tensor_api.h"

#include "quantized_format.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && \
    !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
#define QUANTIZED_LINEAR_AVX2_BUILT 1
#include "quantized_linear_avx2.h"  // with <immintrin.h>
#endif

#if defined(QUANTIZED_LINEAR_AVX2_BUILT)
namespace quantized_linear_avx2 {

using namespace quantized_format;
using quantized_activations::Activations;

namespace {

constexpr int64_t kHalf = kPanel / 2;  // outputs per ymm register

inline __m256 load_fp16(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load_u8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 load_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline void store8(float* out, __m256 v) { _mm256_storeu_ps(out, v); }
// Rounded to nearest even by integer arithmetic, as the VNNI kernel rounds without
// AVX512-BF16 (vector_math.h's round_to_bf16).
inline void store8(at::BFloat16* out, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m128i halves =
      _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), halves);
}

// Half h's 8 outputs' weight scale of scale group g of block b (quantized_weights.h's
// weight_scale, 8 lanes).
template <QType T>
inline __m256 weight_scale(const uint8_t* block_factors, const uint8_t* super_factors, int64_t b,
                           int g, int h) {
  const uint8_t* bf = block_factors + b * block_factor_bytes(T);
  if constexpr (is_k_quant(T)) {
    const __m256 d =
        load_fp16(super_factors + b / kBlocksPerSuper * super_factor_bytes(T) + h * 2 * kHalf);
    return _mm256_mul_ps(
        has_6_bit_scales(T) ? load_u8(bf + h * kHalf) : load_i8(bf + g * kPanel + h * kHalf), d);
  } else if constexpr (T == QType::I8) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(block_factors) + h * kHalf);
  } else {
    return load_fp16(bf + h * 2 * kHalf);
  }
}

// Half h's 8 outputs' min of block b (quantized_weights.h's weight_min).
template <QType T>
inline __m256 weight_min(const uint8_t* block_factors, const uint8_t* super_factors, int64_t b,
                         int h) {
  const uint8_t* bf = block_factors + b * block_factor_bytes(T);
  if constexpr (has_6_bit_scales(T)) {
    const __m256 dmin = load_fp16(super_factors + b / kBlocksPerSuper * super_factor_bytes(T) +
                                  32 + h * 2 * kHalf);
    return _mm256_mul_ps(load_u8(bf + kPanel + h * kHalf),
                         _mm256_sub_ps(_mm256_setzero_ps(), dmin));
  } else {
    return load_fp16(bf + 32 + h * 2 * kHalf);
  }
}

inline __m256i bits_to(__m256i from, __m256i mask, __m256i into) {
  return _mm256_or_si256(_mm256_and_si256(from, mask), into);
}

// Q6_K's 6-bit values of word w (quantized_weights.h's q6_values).
inline __m256i q6_values(__m256i low, __m256i highs, int w) {
  const __m256i moved = w == 0   ? _mm256_slli_epi16(highs, 4)
                        : w == 1 ? _mm256_slli_epi16(highs, 2)
                        : w == 2 ? highs
                                 : _mm256_srli_epi16(highs, 2);
  return bits_to(moved, _mm256_set1_epi8(0x30), low);
}

// The 5-bit types' values of word w (quantized_weights.h's q5_values).
inline void q5_values(__m256i& low, __m256i& high, __m256i highs, int w) {
  const __m256i mask = _mm256_set1_epi8(0x10);
  low = bits_to(_mm256_slli_epi16(highs, 4 - w), mask, low);
  high = bits_to(_mm256_srli_epi16(highs, w), mask, high);
}

inline __m256i word(const int32_t* x, int64_t at) { return _mm256_set1_epi32(x[at]); }

// sum + two weight words (values <= 63) times their activation words.
inline __m256i dot_pair(__m256i sum, __m256i w1, __m256i x1, __m256i w2, __m256i x2) {
  const __m256i pairs =
      _mm256_add_epi16(_mm256_maddubs_epi16(w1, x1), _mm256_maddubs_epi16(w2, x2));
  return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// sum + an 8-bit weight word (unsigned bytes) times an activation word: its low
// nibbles', then 16 x its high nibbles' products.
inline __m256i dot_bytes(__m256i sum, __m256i low, __m256i high, __m256i x) {
  sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(low, x),
                                                _mm256_set1_epi16(1)));
  return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(high, x),
                                                 _mm256_set1_epi16(16)));
}

// ROWS rows of the activations from row0 times HALVES half panels from half h0 of the
// panel -> ROWS x (8 x HALVES) outputs, as the VNNI kernel's multiply_tile: per scale
// group the int32 dot products, then scaled into the fp32 sums. `ahead` (or null):
// panel bytes to ask for meanwhile.
template <QType T, bool WIDE, int ROWS, int HALVES, typename out_t>
void multiply_tile(const Activations& a, int64_t row0, const uint8_t* panel, int64_t panel_bytes,
                   int h0, const char* ahead, const float* bias, out_t* out,
                   int64_t out_stride) {
  const int64_t blocks = a.blocks;
  const quantized_activations::TileRows<ROWS> rows(a, row0);
  const auto& [x, x_low, x_scale, x_offset, x_sum] = rows;
  __m256 acc[ROWS][HALVES];
  for (int r = 0; r < ROWS; ++r) {
    for (int j = 0; j < HALVES; ++j) {
      acc[r][j] = bias ? _mm256_loadu_ps(bias + (h0 + j) * kHalf) : _mm256_setzero_ps();
    }
  }
  const uint8_t* block_factors = panel + blocks * value_bytes(T);
  const uint8_t* super_factors = block_factors + blocks * block_factor_bytes(T);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // Int8 activations times Q8_0's or I8's signed values need no offset (the sign trick).
  constexpr bool kSigned = is_8_bit(T) && !WIDE;
  const int64_t ahead_bytes = (panel_bytes + blocks - 1) / blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    if (ahead) {
      for (int64_t at = b * ahead_bytes & ~int64_t{63}; at < (b + 1) * ahead_bytes; at += 64) {
        _mm_prefetch(ahead + at, _MM_HINT_T0);
      }
    }
    const uint8_t* w = panel + b * value_bytes(T);
    for (int g = 0; g < groups(T); ++g) {
      // WIDE: the offset goes into the low bytes' sums, which are not multiplied by 256.
      __m256i isum[ROWS][HALVES], low_sum[ROWS][HALVES];
      for (int r = 0; r < ROWS; ++r) {
        for (int j = 0; j < HALVES; ++j) {
          const __m256i offset = _mm256_set1_epi32(kSigned ? 0 : x_offset[r][2 * b + g]);
          isum[r][j] = WIDE ? _mm256_setzero_si256() : offset;
          if constexpr (WIDE) low_sum[r][j] = offset;
        }
      }
      // Word i of half j: 32 bytes, 4 values of each of its 8 outputs.
      auto load = [&](int64_t at, int j) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + at + (h0 + j) * 32));
      };
      if constexpr (is_8_bit(T)) {
        for (int i = 0; i < 8; ++i) {
          for (int j = 0; j < HALVES; ++j) {
            const __m256i wv = load(i * 64, j);
            if constexpr (kSigned) {
              const __m256i signed_w = _mm256_xor_si256(wv, _mm256_set1_epi8(-128));
              const __m256i magnitude = _mm256_abs_epi8(signed_w);
              for (int r = 0; r < ROWS; ++r) {
                const __m256i xs = _mm256_sign_epi8(word(x[r], b * 8 + i), signed_w);
                isum[r][j] = _mm256_add_epi32(
                    isum[r][j],
                    _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, xs), _mm256_set1_epi16(1)));
              }
            } else {
              const __m256i lo = _mm256_and_si256(wv, low4);
              const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), low4);
              for (int r = 0; r < ROWS; ++r) {
                isum[r][j] = dot_bytes(isum[r][j], lo, hi, word(x[r], b * 8 + i));
                low_sum[r][j] = dot_bytes(low_sum[r][j], lo, hi, word(x_low[r], b * 8 + i));
              }
            }
          }
        }
      } else if constexpr (T == QType::Q6_K) {
        // Group g: the low (g = 0) or high nibbles of the 4 words, values 16g + 4i ..
        for (int j = 0; j < HALVES; ++j) {
          const __m256i highs = load(256 + g * 64, j);
          __m256i wv[4];
          for (int i = 0; i < 4; ++i) {
            const __m256i nibbles = load(i * 64, j);
            const __m256i low = g == 0 ? _mm256_and_si256(nibbles, low4)
                                       : _mm256_and_si256(_mm256_srli_epi16(nibbles, 4), low4);
            wv[i] = q6_values(low, highs, i);
          }
          for (int r = 0; r < ROWS; ++r) {
            for (int i = 0; i < 4; i += 2) {
              const int64_t at = b * 8 + 4 * g + i;
              isum[r][j] =
                  dot_pair(isum[r][j], wv[i], word(x[r], at), wv[i + 1], word(x[r], at + 1));
              if constexpr (WIDE) {
                low_sum[r][j] = dot_pair(low_sum[r][j], wv[i], word(x_low[r], at), wv[i + 1],
                                         word(x_low[r], at + 1));
              }
            }
          }
        }
      } else if constexpr (!is_5_bit(T) && !WIDE) {
        // 4-bit values: a word pair's products are at most 2 x (2 x 15 x 127) = 7620, so
        // the block's four word pairs add up in int16 (<= 30480) and one VPMADDWD widens
        // them: 9 multiplies per 256 products instead of 12, where they are the bound.
        for (int j = 0; j < HALVES; ++j) {
          __m256i pairs[ROWS];
          for (int i = 0; i < 4; ++i) {  // word i: values 4i .. 4i + 3 low, 16 + 4i .. high
            const __m256i wv = load(i * 64, j);
            const __m256i lo = _mm256_and_si256(wv, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), low4);
            for (int r = 0; r < ROWS; ++r) {
              const __m256i both =
                  _mm256_add_epi16(_mm256_maddubs_epi16(lo, word(x[r], b * 8 + i)),
                                   _mm256_maddubs_epi16(hi, word(x[r], b * 8 + 4 + i)));
              pairs[r] = i == 0 ? both : _mm256_add_epi16(pairs[r], both);
            }
          }
          for (int r = 0; r < ROWS; ++r) {
            isum[r][j] = _mm256_add_epi32(isum[r][j],
                                          _mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1)));
          }
        }
      } else {
        for (int j = 0; j < HALVES; ++j) {
          __m256i highs;  // the 5-bit types' fifth bits, after the 4 words
          if constexpr (is_5_bit(T)) highs = load(256, j);
          for (int i = 0; i < 4; ++i) {  // word i: values 4i .. 4i + 3 low, 16 + 4i .. high
            const __m256i wv = load(i * 64, j);
            __m256i lo = _mm256_and_si256(wv, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), low4);
            if constexpr (is_5_bit(T)) q5_values(lo, hi, highs, i);
            for (int r = 0; r < ROWS; ++r) {
              isum[r][j] = dot_pair(isum[r][j], lo, word(x[r], b * 8 + i), hi,
                                    word(x[r], b * 8 + 4 + i));
              if constexpr (WIDE) {
                low_sum[r][j] = dot_pair(low_sum[r][j], lo, word(x_low[r], b * 8 + i), hi,
                                         word(x_low[r], b * 8 + 4 + i));
              }
            }
          }
        }
      }
      for (int j = 0; j < HALVES; ++j) {
        const __m256 d = weight_scale<T>(block_factors, super_factors, b, g, h0 + j);
        for (int r = 0; r < ROWS; ++r) {
          __m256i sum = isum[r][j];
          if constexpr (WIDE) {
            sum = _mm256_add_epi32(_mm256_slli_epi32(sum, 8), low_sum[r][j]);
          }
          acc[r][j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), d),
                                      _mm256_set1_ps(x_scale[r][b]), acc[r][j]);
        }
      }
    }
    if constexpr (has_min(T)) {
      for (int j = 0; j < HALVES; ++j) {
        const __m256 m = weight_min<T>(block_factors, super_factors, b, h0 + j);
        for (int r = 0; r < ROWS; ++r) {
          acc[r][j] = _mm256_fmadd_ps(m, _mm256_set1_ps(x_sum[r][b]), acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int j = 0; j < HALVES; ++j) store8(out + r * out_stride + (h0 + j) * kHalf, acc[r][j]);
  }
}

// Rows per tile of one half panel: its int32 and fp32 sums (wide activations: two int32
// sums a row) and the weight words in 16 registers.
template <bool WIDE>
constexpr int kTileRows = WIDE ? 3 : 4;

// `rows` (1 .. kTileRows) rows from row0 times one panel: 1-2 rows both halves at once,
// more each half in turn.
template <QType T, bool WIDE, typename out_t, int ROWS = kTileRows<WIDE>>
void multiply_rows(int64_t rows, const Activations& a, int64_t row0, const uint8_t* panel,
                   int64_t panel_bytes, const char* ahead, const float* bias, out_t* out,
                   int64_t out_stride) {
  if constexpr (ROWS > 1) {
    if (rows < ROWS) {
      multiply_rows<T, WIDE, out_t, ROWS - 1>(rows, a, row0, panel, panel_bytes, ahead, bias, out,
                                              out_stride);
      return;
    }
  }
  if constexpr (ROWS <= 2) {
    multiply_tile<T, WIDE, ROWS, 2>(a, row0, panel, panel_bytes, 0, ahead, bias, out,
                                    out_stride);
  } else {
    multiply_tile<T, WIDE, ROWS, 1>(a, row0, panel, panel_bytes, 0, ahead, bias, out,
                                    out_stride);
    multiply_tile<T, WIDE, ROWS, 1>(a, row0, panel, panel_bytes, 1, nullptr, bias, out,
                                    out_stride);
  }
}

// Panels begin .. end - 1 for all rows, each panel's rows spread evenly over the fewest
// tiles, each panel asking for the one after next (as the VNNI kernel's panels do).
template <QType T, bool WIDE, typename out_t>
void multiply_panels(const Activations& a, int64_t rows, const uint8_t* packed, int64_t begin,
                     int64_t end, int64_t panel_bytes, const float* bias, out_t* out,
                     int64_t n) {
  constexpr int64_t kRows = kTileRows<WIDE>;
  const int64_t tiles = (rows + kRows - 1) / kRows;
  for (int64_t p = begin; p < end; ++p) {
    const uint8_t* panel = packed + p * panel_bytes;
    const char* ahead =
        p + 3 <= end ? reinterpret_cast<const char*>(packed + (p + 2) * panel_bytes) : nullptr;
    for (int64_t t = 0, r0 = 0; t < tiles; ++t) {
      const int64_t count = rows / tiles + (t < rows % tiles ? 1 : 0);
      multiply_rows<T, WIDE>(count, a, r0, panel, panel_bytes, r0 == 0 ? ahead : nullptr,
                             bias ? bias + p * kPanel : nullptr, out + r0 * n + p * kPanel, n);
      r0 += count;
    }
  }
}

}  // namespace

template <typename out_t>
void multiply_range(QType t, bool wide, const Activations& a, int64_t rows,
                    const uint8_t* packed, int64_t begin, int64_t end, int64_t panel_bytes,
                    const float* bias, out_t* out, int64_t n) {
  with_qtype(t, [&](auto type) {
    constexpr QType T = decltype(type)::value;
    if (wide) {
      multiply_panels<T, true>(a, rows, packed, begin, end, panel_bytes, bias, out, n);
    } else {
      multiply_panels<T, false>(a, rows, packed, begin, end, panel_bytes, bias, out, n);
    }
  });
}

template void multiply_range<float>(QType, bool, const Activations&, int64_t, const uint8_t*,
                                    int64_t, int64_t, int64_t, const float*, float*, int64_t);
template void multiply_range<at::BFloat16>(QType, bool, const Activations&, int64_t,
                                           const uint8_t*, int64_t, int64_t, int64_t,
                                           const float*, at::BFloat16*, int64_t);

}  // namespace quantized_linear_avx2
#endif
