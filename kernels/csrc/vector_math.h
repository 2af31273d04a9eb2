// Math on 16 fp32 lanes of AVX-512, shared by the CPU kernels.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

// e^x for each lane, to ~1e-7 relative: 2^(x log2 e) split into an integer power
// (applied by scalef) and a fraction in [-0.5, 0.5] (a degree-6 polynomial).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f));
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

// silu(gate) * up = gate * up / (1 + e^-gate); e^-gate is kept finite (below e^87),
// where the product is 0 to fp32 precision anyway.
inline __m512 silu_mul16(__m512 gate, __m512 up) {
  const __m512 e = exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), gate), _mm512_set1_ps(87.f)));
  return _mm512_div_ps(_mm512_mul_ps(gate, up), _mm512_add_ps(_mm512_set1_ps(1.f), e));
}
#endif
