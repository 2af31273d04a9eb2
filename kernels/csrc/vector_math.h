// Math on 16 fp32 lanes of AVX-512, shared by the CPU kernels.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

constexpr float kLog2E = 1.4426950408889634f;

// 2^t for each lane, to ~1e-7 relative: an integer power (applied by scalef, which
// gives 0 for very negative t) times 2 to a fraction in [-0.5, 0.5] (a degree-6
// polynomial).
inline __m512 exp2_16(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// e^x for each lane: 2^(x log2 e), x kept above -87 (e^-87 is below fp32's normals).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  return exp2_16(_mm512_mul_ps(x, _mm512_set1_ps(kLog2E)));
}

// tanh(x) for each lane, within 6 ulp: Eigen's rational approximation (odd degree-13
// over even degree-6 polynomials in x), with x clamped where tanh is 1 in fp32 and
// passed through where it is x. Polynomials rather than e^2x: no cancellation near 0.
inline __m512 tanh16(__m512 x) {
  const __m512 limit = _mm512_set1_ps(7.90531110763549805f);
  const __m512 c = _mm512_min_ps(_mm512_max_ps(x, _mm512_sub_ps(_mm512_setzero_ps(), limit)), limit);
  const __m512 c2 = _mm512_mul_ps(c, c);
  __m512 p = _mm512_set1_ps(-2.76076847742355e-16f);
  p = _mm512_fmadd_ps(p, c2, _mm512_set1_ps(2.00018790482477e-13f));
  p = _mm512_fmadd_ps(p, c2, _mm512_set1_ps(-8.60467152213735e-11f));
  p = _mm512_fmadd_ps(p, c2, _mm512_set1_ps(5.12229709037114e-08f));
  p = _mm512_fmadd_ps(p, c2, _mm512_set1_ps(1.48572235717979e-05f));
  p = _mm512_fmadd_ps(p, c2, _mm512_set1_ps(6.37261928875436e-04f));
  p = _mm512_fmadd_ps(p, c2, _mm512_set1_ps(4.89352455891786e-03f));
  __m512 q = _mm512_set1_ps(1.19825839466702e-06f);
  q = _mm512_fmadd_ps(q, c2, _mm512_set1_ps(1.18534705686654e-04f));
  q = _mm512_fmadd_ps(q, c2, _mm512_set1_ps(2.26843463243900e-03f));
  q = _mm512_fmadd_ps(q, c2, _mm512_set1_ps(4.89352518554385e-03f));
  const __m512 tanh = _mm512_div_ps(_mm512_mul_ps(p, c), q);
  const __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(4e-4f), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(tanh, tiny, x);
}

// Soft-capping (Gemma 2's attention logits): cap * tanh(x / cap), with the division
// transformers does.
inline __m512 softcap16(__m512 x, float cap) {
  const __m512 cap_v = _mm512_set1_ps(cap);
  return _mm512_mul_ps(tanh16(_mm512_div_ps(x, cap_v)), cap_v);
}

// silu(gate) * up = gate * up / (1 + e^-gate); e^-gate is kept finite (below e^87),
// where the product is 0 to fp32 precision anyway.
inline __m512 silu_mul16(__m512 gate, __m512 up) {
  const __m512 e = exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), gate), _mm512_set1_ps(87.f)));
  return _mm512_div_ps(_mm512_mul_ps(gate, up), _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

#if defined(__AVX512BW__)
// 16 bf16 values widened to fp32 (bf16 is fp32's top half).
inline __m512 load_bf16_16(const void* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// 16 fp32 lanes rounded to bf16 (to nearest even), as 16 words.
inline __m256i round_to_bf16(__m512 values) {
#if defined(__AVX512BF16__)
  return (__m256i)_mm512_cvtneps_pbh(values);
#else
  // bits + 0x7FFF + (bit 16), the top half: load_row.h's bf16_bits, 16 lanes at once
  const __m512i bits = _mm512_castps_si512(values);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
#endif
}

#if !defined(__AVX512BF16__)
// 16 lanes of bf16 pairs widened to fp32 (bf16 is fp32's top half): each lane's first
// value (shifted up), and its second (the low half masked off).
inline __m512 first_of_pairs(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}
inline __m512 second_of_pairs(__m512i pairs) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, high));
}
#endif

// acc + a[2l] * b[2l] + a[2l + 1] * b[2l + 1] in each lane l, a and b 32 bf16 values:
// VDPBF16PS, or where the CPU lacks it, each value widened to fp32 and two FMAs.
inline __m512 dot_bf16_pairs(__m512 acc, __m512i a, __m512i b) {
#if defined(__AVX512BF16__)
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
#else
  const __m512 first = _mm512_fmadd_ps(first_of_pairs(a), first_of_pairs(b), acc);
  return _mm512_fmadd_ps(second_of_pairs(a), second_of_pairs(b), first);
#endif
}

// Products of bf16 pairs in the tiled kernels: 16 lanes of pairs (a panel row's weights,
// a tile's keys or values) times one pair broadcast to every lane (a row of x, a query,
// two probabilities), summed in fp32. AVX512-BF16's dot instruction takes both as bf16
// pairs. Where a CPU lacks it, the lanes' pairs are widened to fp32 once per load and the
// broadcast pair is given in fp32, so that a product costs two FMAs and no conversions
// (widening both operands per product, as dot_bf16_pairs does, cost prefill a fifth).
#if defined(__AVX512BF16__)
using ScalarPair = uint32_t;  // two bf16 values in one word

struct LanePairs {
  __m512i pairs;
  LanePairs() = default;
  explicit LanePairs(const void* p) : pairs(_mm512_loadu_si512(p)) {}
  __m512 dot(__m512 acc, ScalarPair x) const {
    const __m512i broadcast = _mm512_set1_epi32(static_cast<int>(x));
    return _mm512_dpbf16_ps(acc, (__m512bh)pairs, (__m512bh)broadcast);
  }
};

// 16 fp32 values as 8 pairs for LanePairs::dot: rounded to bf16 (to nearest even).
inline void store_pairs(ScalarPair* out, __m512 values) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), round_to_bf16(values));
}
#else
struct ScalarPair {
  float even, odd;
};

struct LanePairs {
  __m512 even, odd;  // the first and the second value of each lane's pair
  LanePairs() = default;
  explicit LanePairs(const void* p) {
    const __m512i pairs = _mm512_loadu_si512(p);
    even = first_of_pairs(pairs);
    odd = second_of_pairs(pairs);
  }
  __m512 dot(__m512 acc, const ScalarPair& x) const {
    const __m512 first = _mm512_fmadd_ps(even, _mm512_set1_ps(x.even), acc);
    return _mm512_fmadd_ps(odd, _mm512_set1_ps(x.odd), first);
  }
};

// 16 fp32 values as 8 pairs for LanePairs::dot: kept in fp32, as the FMAs take them.
inline void store_pairs(ScalarPair* out, __m512 values) {
  _mm512_storeu_ps(reinterpret_cast<float*>(out), values);
}
#endif
#endif  // __AVX512BW__
#endif
