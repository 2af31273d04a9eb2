// Attention of up to 16 fp32 queries with small heads (8 to 32 dims), one query a lane,
// shared by the prefill kernel (prefill_attention_cpu.cpp, causal over the cache) and
// the encoders' (encoder_attention_cpu.cpp, every token of a segment sees all of it).
//
// At such sizes a query's softmax step over a tile of keys held across the lanes (its
// maximum and sum reduced across the lanes, a scalar exp for its rescale) costs more
// than its products. With the queries across the lanes instead, a key's scores are one
// vector (head_dim FMAs, the key's values broadcast), the running maxima and sums are
// kept lane by lane, and one vector exp rescales all 16 queries. Keys and values are
// read in rows, 8 keys at a time.
#pragma once

#include <cstdint>

// Keys a step of QueryLanesF32 reads: their scores stay in registers. Outside the class
// for the checks that every build compiles, with AVX-512 or without.
inline constexpr int64_t kLaneKeys = 8;

#if defined(__AVX512F__)
#include <immintrin.h>

#include "query_tile.h"
#include "vector_math.h"

template <int HEAD_DIM>
class QueryLanesF32 {
 public:
  // Queries 0 .. count - 1 (count <= 16), `stride` floats apart.
  QueryLanesF32(const float* query, int64_t stride, int64_t count) : count_(count) {
    for (int64_t d = 0; d < HEAD_DIM; ++d) {
      for (int64_t i = 0; i < kQueryTile; ++i) lanes_[d][i] = i < count ? query[i * stride + d] : 0.f;
    }
    used_ = count >= kQueryTile ? static_cast<__mmask16>(0xFFFF)
                                : static_cast<__mmask16>((1u << count) - 1);
    max_ = _mm512_set1_ps(kMaskedScore);
    sum_ = _mm512_setzero_ps();
    for (int d = 0; d < HEAD_DIM; ++d) acc_[d] = _mm512_setzero_ps();
  }

  // Lane i sees the keys below first_seen + i (each query a position further on);
  // lanes past `count` see none.
  __m512i causal_reach(int64_t first_seen) const {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_maskz_add_epi32(used_, lane,
                                  _mm512_set1_epi32(static_cast<int32_t>(first_seen)));
  }

  // Every lane in use sees the keys below `keys`.
  __m512i full_reach(int64_t keys) const {
    return _mm512_maskz_mov_epi32(used_, _mm512_set1_epi32(static_cast<int32_t>(keys)));
  }

  // Keys 0 .. keys_read - 1 (a multiple of kLaneKeys, rows `row_stride` floats apart, values
  // likewise), each lane taking those below its `reach`.
  void attend(const float* keys, const float* values, int64_t row_stride, int64_t keys_read,
              __m512i reach, float scale, float softcap) {
    const __m512 scale_v = _mm512_set1_ps(scale);
    // Keys below every lane's reach need no mask (lanes past `count` are never written).
    const int64_t all_see = _mm512_mask_reduce_min_epi32(used_, reach);
    for (int64_t k0 = 0; k0 < keys_read; k0 += kLaneKeys) {
      const float* k = keys + k0 * row_stride;
      const float* v = values + k0 * row_stride;
      __m512 p[kLaneKeys];
      for (int j = 0; j < kLaneKeys; ++j) p[j] = _mm512_setzero_ps();
      for (int d = 0; d < HEAD_DIM; ++d) {
        const __m512 q = _mm512_load_ps(lanes_[d]);
        for (int j = 0; j < kLaneKeys; ++j) {
          p[j] = _mm512_fmadd_ps(q, _mm512_set1_ps(k[j * row_stride + d]), p[j]);
        }
      }
      __mmask16 seen[kLaneKeys];
      __m512 step_max = _mm512_set1_ps(kMaskedScore);
      const bool masked = k0 + kLaneKeys > all_see;
      for (int j = 0; j < kLaneKeys; ++j) {
        seen[j] = masked ? _mm512_cmpgt_epi32_mask(
                               reach, _mm512_set1_epi32(static_cast<int32_t>(k0 + j)))
                         : static_cast<__mmask16>(0xFFFF);
        __m512 scores = _mm512_mul_ps(p[j], scale_v);
        if (softcap > 0.f) scores = softcap16(scores, softcap);
        p[j] = _mm512_mask_mov_ps(_mm512_set1_ps(kMaskedScore), seen[j], scores);
        step_max = _mm512_max_ps(step_max, p[j]);
      }
      const __m512 new_max = _mm512_max_ps(max_, step_max);
      const __m512 rescale = exp16(_mm512_sub_ps(max_, new_max));
      max_ = new_max;
      __m512 step_sum = _mm512_setzero_ps();
      for (int j = 0; j < kLaneKeys; ++j) {
        p[j] = _mm512_maskz_mov_ps(seen[j], exp16(_mm512_sub_ps(p[j], new_max)));
        step_sum = _mm512_add_ps(step_sum, p[j]);
      }
      sum_ = _mm512_fmadd_ps(sum_, rescale, step_sum);
      for (int d = 0; d < HEAD_DIM; ++d) {
        __m512 a = _mm512_mul_ps(acc_[d], rescale);
        for (int j = 0; j < kLaneKeys; ++j) {
          a = _mm512_fmadd_ps(p[j], _mm512_set1_ps(v[j * row_stride + d]), a);
        }
        acc_[d] = a;
      }
    }
  }

  // Each query's value sums over its weights' sum, as rows `stride` floats apart.
  void write(float* out, int64_t stride) {
    const __m512 inverse = _mm512_div_ps(
        _mm512_set1_ps(1.f), _mm512_mask_mov_ps(_mm512_set1_ps(1.f), used_, sum_));
    for (int d = 0; d < HEAD_DIM; ++d) _mm512_store_ps(lanes_[d], _mm512_mul_ps(acc_[d], inverse));
    for (int64_t i = 0; i < count_; ++i) {
      for (int64_t d = 0; d < HEAD_DIM; ++d) out[i * stride + d] = lanes_[d][i];
    }
  }

 private:
  alignas(64) float lanes_[HEAD_DIM][kQueryTile];  // the queries' dims, then the outputs'
  __m512 max_, sum_, acc_[HEAD_DIM];
  __mmask16 used_;
  int64_t count_;
};

#endif
