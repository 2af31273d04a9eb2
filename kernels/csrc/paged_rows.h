// How the attention kernels (paged_attention_cpu.cpp) read the paged KV cache: a
// position's row through its block table; and, where AVX-512 is built, 16 values of a row
// as fp32 whatever the cache holds, 16 sums reduced at once, and the rows of consecutive
// positions walked block by block and asked for ahead of use, 16 at a time.
#pragma once

#include "tensor_api.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace paged_rows {

// The cache row of the token at position `pos` of a sequence whose block table is `table`.
template <typename scalar_t>
inline const scalar_t* row_at(const scalar_t* cache, const int32_t* table, int64_t pos,
                              int64_t block_size, int64_t token_stride) {
  return cache +
         (static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size) * token_stride;
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Lane i of the result is the sum of the 16 lanes of v[i]: a transposing reduction,
// about 2 instructions per vector instead of a full horizontal sum each.
inline __m512 sum_each_of_16(const __m512* v) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane sums of 4 vectors
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Add up the four 128-bit lanes: quads[k] becomes lane k of the result.
  const __m512 lo = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 hi = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Pointers to the cache rows of consecutive positions, one after the other: a division
// only where a block starts, instead of one per row (it cost more than the row's math).
template <typename scalar_t>
struct RowWalker {
  const scalar_t* cache;
  const int32_t* table;
  int64_t block_size, token_stride, block, offset;

  RowWalker(const scalar_t* cache, const int32_t* table, int64_t pos, int64_t block_size,
            int64_t token_stride)
      : cache(cache), table(table), block_size(block_size), token_stride(token_stride),
        block(pos / block_size), offset(pos % block_size) {}

  const scalar_t* next() {
    const scalar_t* row =
        cache + (static_cast<int64_t>(table[block]) * block_size + offset) * token_stride;
    if (++offset == block_size) {
      offset = 0;
      ++block;
    }
    return row;
  }
};

// Asks for a row ahead of its use: the blocks of a sequence lie anywhere in the cache,
// so the hardware prefetcher cannot follow them, and waiting on each row doubled the
// kernel's time.
template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t token_stride) {
  const char* bytes = reinterpret_cast<const char*>(row);
  const int64_t size = token_stride * static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t offset = 0; offset < size; offset += 64) _mm_prefetch(bytes + offset, _MM_HINT_T1);
}

// The rows of a pass over n positions, 16 at a time, with the next 16 asked for ahead
// of use. Past the last position the last row repeats (computed, then masked out or
// given no weight).
template <typename scalar_t>
struct TileRows {
  RowWalker<scalar_t> current, ahead;
  int64_t n, token_stride, fetched = 0;
  const scalar_t* rows[16];

  TileRows(const scalar_t* cache, const int32_t* table, int64_t first, int64_t n,
           int64_t block_size, int64_t token_stride)
      : current(cache, table, first, block_size, token_stride),
        ahead(cache, table, first, block_size, token_stride), n(n), token_stride(token_stride) {
    prefetch_until(16);
  }

  void prefetch_until(int64_t end) {
    for (end = std::min(end, n); fetched < end; ++fetched) prefetch_row(ahead.next(), token_stride);
  }

  // Fills rows with positions t0 .. t0 + 15 (t0 a multiple of 16, in order); returns
  // how many are real.
  int64_t load(int64_t t0) {
    prefetch_until(t0 + 32);
    const int64_t count = std::min<int64_t>(16, n - t0);
    for (int64_t i = 0; i < count; ++i) rows[i] = current.next();
    for (int64_t i = count; i < 16; ++i) rows[i] = rows[count - 1];
    return count;
  }
};

// The fp16 scales of a tile's 16 int8 rows as fp32, per KV head and group:
// scales[(kv_head * groups + g) * 16 + i] for row i (one conversion per scale per tile,
// not one per use).
inline void tile_scales(const int8_t* const* rows, int64_t kv_heads, int64_t head_stride,
                        int64_t head_dim, int64_t groups, float* scales) {
  for (int64_t kv = 0; kv < kv_heads; ++kv) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int i = 0; i < 16; ++i) {
        uint16_t bits;
        std::memcpy(&bits, rows[i] + kv * head_stride + head_dim + 2 * g, sizeof(bits));
        scales[(kv * groups + g) * 16 + i] = _cvtsh_ss(bits);
      }
    }
  }
}

#endif

}  // namespace paged_rows
