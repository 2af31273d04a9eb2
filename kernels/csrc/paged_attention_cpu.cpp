// Attention over the paged KV cache on the CPU, one query token per row: a decode, or
// one token of a prefill chunk given the context it sees (kernels/paged_attention_cpu.py).
//
// The torch path would gather every sequence's blocks into a padded copy before a
// batched matmul, moving the whole KV cache through memory three times per layer.
// This kernel reads each key and value row once, straight from its block (asking for
// the next rows ahead of use), and keeps a row's scores in a small buffer; query heads
// that share a KV head (GQA) read the same row. In bf16 both products use AVX512-BF16's
// dot instruction, the value product on probabilities rounded to bf16 (as GPU flash
// attention does). Rows are split across torch's intra-op threads. Scores may be
// soft-capped (Gemma 2) before the softmax.
//
// An int8 cache (kernels/kv_quant.py) holds each (token, KV head) row as head_dim int8
// values followed by an fp16 scale per group of 32 values (per row where head_dim is not
// a multiple of 32). The kernel reads it as it is: each 16 values are converted to fp32
// in registers and multiplied by their group's scale. 17/32 of the bytes of a bf16 row
// come through memory, which is what a long decode waits on. Keys are stored rotated
// (int8_kv_rows.h): the kernel rotates the query to match; store_kv_cpu.cpp writes them.

#include "tensor_api.h"

#include "int8_kv_rows.h"
#include "load_row.h"
#include "parallel_by_work.h"
#include "vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "paged_rows.h"  // and, where AVX-512 is built, <immintrin.h>

using namespace int8_kv_rows;
using namespace paged_rows;

namespace {

// Scores of every query head against the keys at positions first .. first + n - 1:
// scores[h * n + t] = q[h] . k[first + t] (q already scaled), rows read from the blocks.
// The helpers here take a run of num_heads query heads (groups of `group` sharing a KV
// head) whose KV heads start at k_ptr's (or v_ptr's) offset into a cache row of
// token_stride values.
template <typename scalar_t>
void score_keys(const float* q, const scalar_t* k_ptr, const int32_t* table, int64_t first,
                int64_t n, int64_t block_size, int64_t num_heads, int64_t group,
                int64_t token_stride, int64_t head_dim, float* scores, float* row) {
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = first + t;
    load_heads(row_at(k_ptr, table, pos, block_size, token_stride), row, num_heads / group, head_dim);
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* qh = q + h * head_dim;
      const float* kh = row + (h / group) * head_dim;
      float dot = 0.f;
      for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kh[d];
      scores[h * n + t] = dot;
    }
  }
}

// cap * tanh(s / cap) for each of the n scores (Gemma 2's attention logit soft-capping),
// 16 at a time where AVX-512 is built in.
inline void softcap_scores(float* scores, int64_t n, float cap) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 keep = n - i >= 16 ? static_cast<__mmask16>(0xFFFF)
                                       : static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(scores + i, keep, softcap16(_mm512_maskz_loadu_ps(keep, scores + i), cap));
  }
#else
  for (int64_t i = 0; i < n; ++i) scores[i] = cap * std::tanh(scores[i] / cap);
#endif
}

#if defined(__AVX512F__)
// score_keys for head_dim % 16 == 0, 16 keys at a time: one vector accumulator per key,
// reduced together, instead of a horizontal sum per (key, head). In an int8 cache each
// group's sums are reduced apart and multiplied by the 16 keys' scales of that group.
template <typename scalar_t>
void score_keys_avx512(const float* q, const scalar_t* k_ptr, const int32_t* table,
                       int64_t first, int64_t n, int64_t block_size, int64_t num_heads,
                       int64_t group, int64_t token_stride, int64_t head_dim, float* scores) {
  TileRows<scalar_t> tiles(k_ptr, table, first, n, block_size, token_stride);
  const scalar_t* const* rows = tiles.rows;
  const int64_t head_stride = head_dim + scale_elements<scalar_t>(head_dim);
  constexpr bool kInt8 = std::is_same_v<scalar_t, int8_t>;
  const int64_t values_per_scale = kInt8 ? scale_group(head_dim) : head_dim;
  const int64_t groups = head_dim / values_per_scale;
  std::vector<float> scales(kInt8 ? num_heads / group * groups * 16 : 0);
  __m512 acc[16];
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t count = tiles.load(t0);
    const __mmask16 keep = static_cast<__mmask16>((1u << count) - 1);
    if constexpr (kInt8) tile_scales(rows, num_heads / group, head_stride, head_dim, groups, scales.data());
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* qh = q + h * head_dim;
      const int64_t offset = (h / group) * head_stride;
      __m512 total = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
        for (int64_t d = g * values_per_scale; d < (g + 1) * values_per_scale; d += 16) {
          const __m512 qv = _mm512_loadu_ps(qh + d);
          for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(qv, load16(rows[i] + offset + d), acc[i]);
        }
        if constexpr (kInt8) {
          const float* key_scales = scales.data() + ((h / group) * groups + g) * 16;
          total = _mm512_fmadd_ps(sum_each_of_16(acc), _mm512_loadu_ps(key_scales), total);
        } else {
          total = sum_each_of_16(acc);
        }
      }
      _mm512_mask_storeu_ps(scores + h * n + t0, keep, total);
    }
  }
}

#if defined(__AVX512BF16__)
// score_keys for bf16 with head_dim % 32 == 0: AVX512-BF16's dot instruction multiplies
// the bf16 query and key pairs as they are and sums in fp32, so nothing is converted.
// The scale is applied to the sums (the query stays exact in bf16).
inline void score_keys_bf16(const c10::BFloat16* query, float scale, const c10::BFloat16* k_ptr,
                            const int32_t* table, int64_t first, int64_t n, int64_t block_size,
                            int64_t num_heads, int64_t group, int64_t token_stride, int64_t head_dim,
                            float* scores) {
  TileRows<c10::BFloat16> tiles(k_ptr, table, first, n, block_size, token_stride);
  const c10::BFloat16* const* rows = tiles.rows;
  __m512 acc[16];
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t count = tiles.load(t0);
    const __mmask16 keep = static_cast<__mmask16>((1u << count) - 1);
    for (int64_t h = 0; h < num_heads; ++h) {
      const c10::BFloat16* qh = query + h * head_dim;
      const int64_t offset = (h / group) * head_dim;
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 32) {
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(qh + d);
        for (int i = 0; i < 16; ++i) {
          acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(rows[i] + offset + d), qv);
        }
      }
      _mm512_mask_storeu_ps(scores + h * n + t0, keep, _mm512_mul_ps(sum_each_of_16(acc), scale_v));
    }
  }
}
#endif

// body(std::integral_constant<int, HEADS>, h0, offset) for each run of up to 4 heads
// h0 .. h0 + HEADS - 1 that share one KV head (whose dims start at offset): the value
// passes weigh a value row for all of a run's heads at once, with the count a constant
// so that the sums stay in registers.
template <typename Body>
inline void for_each_head_run(int64_t num_heads, int64_t group, int64_t head_stride,
                              const Body& body) {
  for (int64_t h0 = 0, heads = 0; h0 < num_heads; h0 += heads) {
    const int64_t offset = (h0 / group) * head_stride;  // a KV head's row: values (+ scales)
    heads = std::min<int64_t>(4, group - h0 % group);  // never past the KV group
    switch (heads) {
      case 4: body(std::integral_constant<int, 4>{}, h0, offset); break;
      case 3: body(std::integral_constant<int, 3>{}, h0, offset); break;
      case 2: body(std::integral_constant<int, 2>{}, h0, offset); break;
      default: body(std::integral_constant<int, 1>{}, h0, offset); break;
    }
  }
}

#if defined(__AVX512BF16__)
// acc[h0 + j] += sum over the tile's rows of pairs[h0 + j][i / 2] * rows[i] for HEADS
// heads sharing one KV head and 32 * CHUNKS dims, on AVX512-BF16's dot instruction:
// it multiplies pairs of bf16 values, so two value rows are interleaved (one pair of
// keys per lane) and meet a pair of bf16 probabilities. The interleaving is per 128-bit
// lane, so acc holds each 32 dims as [dims 0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, ...];
// unpermute_dims puts them back at the end.
template <int HEADS, int CHUNKS>
inline void weigh_row_pairs(const uint32_t* pairs, int64_t pairs_stride,
                            const c10::BFloat16* const* rows, int64_t count, int64_t h0,
                            int64_t offset, int64_t d0, int64_t head_dim, float* acc) {
  __m512 sum[HEADS][2 * CHUNKS];
  for (int j = 0; j < HEADS; ++j) {
    for (int c = 0; c < 2 * CHUNKS; ++c) sum[j][c] = _mm512_loadu_ps(acc + (h0 + j) * head_dim + d0 + 16 * c);
  }
  for (int64_t i = 0; i < count; i += 2) {
    __m512bh value[2 * CHUNKS];
    for (int c = 0; c < CHUNKS; ++c) {
      const __m512i even = _mm512_loadu_si512(rows[i] + offset + d0 + 32 * c);
      const __m512i odd = _mm512_loadu_si512(rows[i + 1] + offset + d0 + 32 * c);
      value[2 * c] = (__m512bh)_mm512_unpacklo_epi16(even, odd);
      value[2 * c + 1] = (__m512bh)_mm512_unpackhi_epi16(even, odd);
    }
    for (int j = 0; j < HEADS; ++j) {
      const __m512bh weight = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[(h0 + j) * pairs_stride + i / 2]));
      for (int c = 0; c < 2 * CHUNKS; ++c) sum[j][c] = _mm512_dpbf16_ps(sum[j][c], value[c], weight);
    }
  }
  for (int j = 0; j < HEADS; ++j) {
    for (int c = 0; c < 2 * CHUNKS; ++c) _mm512_storeu_ps(acc + (h0 + j) * head_dim + d0 + 16 * c, sum[j][c]);
  }
}

// weigh_row_pairs over every dim of the heads, 64 at a time.
template <int HEADS>
inline void weigh_row_pairs_all_dims(const uint32_t* pairs, int64_t pairs_stride,
                                     const c10::BFloat16* const* rows, int64_t count, int64_t h0,
                                     int64_t offset, int64_t head_dim, float* acc) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += 64) {
    if (head_dim - d0 >= 64) {
      weigh_row_pairs<HEADS, 2>(pairs, pairs_stride, rows, count, h0, offset, d0, head_dim, acc);
    } else {
      weigh_row_pairs<HEADS, 1>(pairs, pairs_stride, rows, count, h0, offset, d0, head_dim, acc);
    }
  }
}

// weigh_values_avx512 for bf16 with head_dim % 32 == 0, from the probabilities rounded
// to bf16 pairs (pairs[h][t / 2]: keys t and t + 1, the second 0 past the last key),
// as GPU flash attention rounds them; the value rows are never converted.
inline void weigh_values_bf16(const uint32_t* pairs, int64_t pairs_stride,
                              const c10::BFloat16* v_ptr, const int32_t* table, int64_t first,
                              int64_t n, int64_t block_size, int64_t num_heads,
                              int64_t group, int64_t token_stride, int64_t head_dim, float* acc) {
  TileRows<c10::BFloat16> tiles(v_ptr, table, first, n, block_size, token_stride);
  const c10::BFloat16* const* rows = tiles.rows;
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t count = tiles.load(t0);
    const uint32_t* p = pairs + t0 / 2;
    for_each_head_run(num_heads, group, head_dim, [&](auto heads, int64_t h0, int64_t offset) {
      weigh_row_pairs_all_dims<decltype(heads)::value>(p, pairs_stride, rows, count, h0, offset,
                                                       head_dim, acc);
    });
  }
}

// Undoes weigh_row_pairs' order of dims within each 32 of a row of head_dim sums.
inline void unpermute_dims(float* row, int64_t head_dim) {
  float permuted[32];
  for (int64_t d0 = 0; d0 < head_dim; d0 += 32) {
    std::memcpy(permuted, row + d0, sizeof(permuted));
    for (int w = 0; w < 16; ++w) {
      row[d0 + 8 * (w / 4) + w % 4] = permuted[w];
      row[d0 + 8 * (w / 4) + 4 + w % 4] = permuted[16 + w];
    }
  }
}
#endif

// acc[h0 + j][d0 ..] += sum over the rows of probs[(h0 + j) * n + i] * rows[i][offset + d0 ..]
// for HEADS heads that share one KV head and 16 * CHUNKS dims: each value chunk is
// converted once for all the heads, and the sums stay in registers across the rows
// (both counts are constants so that the compiler keeps them there).
// In an int8 cache, `scales` holds the rows' scales of this KV head's groups
// (tile_scales' layout from the KV head's first group); a value chunk is multiplied by
// its group's.
template <int HEADS, int CHUNKS, typename scalar_t>
inline void weigh_rows(const float* probs, int64_t n, const scalar_t* const* rows, int64_t count,
                       int64_t h0, int64_t offset, int64_t d0, int64_t head_dim, float* acc,
                       const float* scales) {
  __m512 sum[HEADS][CHUNKS];
  for (int j = 0; j < HEADS; ++j) {
    for (int c = 0; c < CHUNKS; ++c) sum[j][c] = _mm512_loadu_ps(acc + (h0 + j) * head_dim + d0 + 16 * c);
  }
  const float* chunk_scales[CHUNKS];  // each chunk's group's 16 row scales
  if constexpr (std::is_same_v<scalar_t, int8_t>) {
    for (int c = 0; c < CHUNKS; ++c) chunk_scales[c] = scales + (d0 + 16 * c) / scale_group(head_dim) * 16;
  }
  for (int64_t i = 0; i < count; ++i) {
    __m512 value[CHUNKS];
    for (int c = 0; c < CHUNKS; ++c) {
      value[c] = load16(rows[i] + offset + d0 + 16 * c);
      if constexpr (std::is_same_v<scalar_t, int8_t>) {  // 16 values share a group
        value[c] = _mm512_mul_ps(value[c], _mm512_set1_ps(chunk_scales[c][i]));
      }
    }
    for (int j = 0; j < HEADS; ++j) {
      const __m512 weight = _mm512_set1_ps(probs[(h0 + j) * n + i]);
      for (int c = 0; c < CHUNKS; ++c) sum[j][c] = _mm512_fmadd_ps(weight, value[c], sum[j][c]);
    }
  }
  for (int j = 0; j < HEADS; ++j) {
    for (int c = 0; c < CHUNKS; ++c) _mm512_storeu_ps(acc + (h0 + j) * head_dim + d0 + 16 * c, sum[j][c]);
  }
}

// weigh_rows over every dim of the heads, 64 at a time.
template <int HEADS, typename scalar_t>
inline void weigh_rows_all_dims(const float* probs, int64_t n, const scalar_t* const* rows,
                                int64_t count, int64_t h0, int64_t offset, int64_t head_dim,
                                float* acc, const float* scales) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += 64) {
    switch (std::min<int64_t>(4, (head_dim - d0) / 16)) {
      case 4: weigh_rows<HEADS, 4>(probs, n, rows, count, h0, offset, d0, head_dim, acc, scales); break;
      case 3: weigh_rows<HEADS, 3>(probs, n, rows, count, h0, offset, d0, head_dim, acc, scales); break;
      case 2: weigh_rows<HEADS, 2>(probs, n, rows, count, h0, offset, d0, head_dim, acc, scales); break;
      default: weigh_rows<HEADS, 1>(probs, n, rows, count, h0, offset, d0, head_dim, acc, scales); break;
    }
  }
}

// acc[h] += sum over t of probs[h * n + t] * v[first + t] for head_dim % 16 == 0:
// 16 value rows at a time, up to 4 heads of a KV group per pass over them.
template <typename scalar_t>
void weigh_values_avx512(const float* probs, const scalar_t* v_ptr, const int32_t* table,
                         int64_t first, int64_t n, int64_t block_size, int64_t num_heads,
                         int64_t group, int64_t token_stride, int64_t head_dim, float* acc) {
  TileRows<scalar_t> tiles(v_ptr, table, first, n, block_size, token_stride);
  const scalar_t* const* rows = tiles.rows;
  const int64_t head_stride = head_dim + scale_elements<scalar_t>(head_dim);
  constexpr bool kInt8 = std::is_same_v<scalar_t, int8_t>;
  const int64_t groups = kInt8 ? head_dim / scale_group(head_dim) : 0;
  std::vector<float> scales(num_heads / group * groups * 16);
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t count = tiles.load(t0);
    const float* p = probs + t0;
    if constexpr (kInt8) tile_scales(rows, num_heads / group, head_stride, head_dim, groups, scales.data());
    for_each_head_run(num_heads, group, head_stride, [&](auto heads, int64_t h0, int64_t offset) {
      const float* kv_scales = scales.data() + (h0 / group) * groups * 16;
      weigh_rows_all_dims<decltype(heads)::value>(p, n, rows, count, h0, offset, head_dim, acc,
                                                  kv_scales);
    });
  }
}
#endif

// scalar_t: the query's and output's dtype; cache_t: the cache's, the same or int8.
template <typename scalar_t, typename cache_t>
void decode_attention_kernel(
    const at::Tensor& query,         // [num_seqs, num_heads, head_dim]
    const at::Tensor& k_cache,       // [num_blocks, block_size, num_kv_heads, head_dim (+ scales)]
    const at::Tensor& v_cache,       // same
    const at::Tensor& block_tables,  // [num_seqs, max_blocks] int32
    const at::Tensor& context_lens,  // [num_seqs] int32
    at::Tensor& out,                 // [num_seqs, num_heads, head_dim]
    float scale,
    int64_t window,                  // keys older than `window` positions are skipped; 0 = none
    float softcap) {                 // scores soft-capped at this value; 0 = none
  const int64_t num_seqs = query.size(0);
  const int64_t num_heads = query.size(1);
  const int64_t head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1);
  const int64_t num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t max_blocks = block_tables.size(1);
  const int64_t head_stride = head_dim + scale_elements<cache_t>(head_dim);
  const int64_t token_stride = num_kv_heads * head_stride;
  [[maybe_unused]] constexpr bool bf16_cache = std::is_same_v<cache_t, c10::BFloat16>;

  const scalar_t* q_ptr = query.data_ptr<scalar_t>();
  const cache_t* k_ptr = k_cache.data_ptr<cache_t>();
  const cache_t* v_ptr = v_cache.data_ptr<cache_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();

  // The work items: each sequence's query heads, in runs of whole KV groups. With fewer
  // sequences than threads (one user's decode) the threads share a sequence: a long
  // context is split into parts of all its heads, at least twice as many items as
  // threads, each part's softmax partials (its max, sum and weighted values) combined
  // after, as flash-decoding does; a short one is split by its KV heads, whose results
  // are the same whichever item computes them. Parts rather than heads where they can:
  // they share the work evenly (3 KV heads on 2 threads do not), and a token's rows of
  // all KV heads lie together, where an int8 row (68 bytes for 64 values) straddles
  // cache lines that threads reading different heads would each fetch. SmolLM2 at 8k
  // keys on 2 threads: int8 decode steps 15% faster, bf16 ones within the noise.
  const int64_t threads = at::get_num_threads();
  auto keys_of = [&](int64_t seq) -> int64_t {
    return window > 0 ? std::min<int64_t>(lens[seq], window) : lens[seq];
  };
  int64_t kv_per_run = num_kv_heads, parts = 1;
  if (num_seqs < threads) {
    constexpr int64_t kMinKeysPerPart = 512;  // below it, combining costs what splitting saves
    int64_t longest = 0;
    for (int64_t seq = 0; seq < num_seqs; ++seq) longest = std::max(longest, keys_of(seq));
    parts = std::min((2 * threads + num_seqs - 1) / num_seqs, longest / kMinKeysPerPart);
    parts = std::max<int64_t>(1, parts);
    if (parts == 1) {
      const int64_t split = std::min(num_kv_heads, (threads + num_seqs - 1) / num_seqs);
      kv_per_run = (num_kv_heads + split - 1) / split;
    }
  }
  const int64_t runs = (num_kv_heads + kv_per_run - 1) / kv_per_run;  // per sequence
  const int64_t items = num_seqs * runs * parts;
  // A part's keys: [part * n / parts, (part + 1) * n / parts) of its sequence's n.
  auto part_range = [&](int64_t n, int64_t part) -> std::pair<int64_t, int64_t> {
    return {part * n / parts, (part + 1) * n / parts};
  };
  // Each thread takes consecutive items with an equal share of the keys to read (plus a
  // fixed cost per item).
  std::vector<int64_t> work(items);
  for (int64_t item = 0; item < items; ++item) {
    const int64_t kv0 = item / parts % runs * kv_per_run;
    const auto [lo, hi] = part_range(keys_of(item / parts / runs), item % parts);
    work[item] = (hi - lo + 32) * std::min(kv_per_run, num_kv_heads - kv0);
  }
  // With parts > 1 each item's unnormalized sums, maxes and sums, for the combine.
  std::vector<float> part_acc(parts > 1 ? items * kv_per_run * group * head_dim : 0);
  std::vector<float> part_max(parts > 1 ? items * kv_per_run * group : 0);
  std::vector<float> part_sum(part_max.size());
  parallel_for_by_work(work, [&](int64_t begin, int64_t end) {
    std::vector<float> q(num_heads * head_dim), acc(num_heads * head_dim);
    std::vector<float> row(num_kv_heads * head_dim);
    std::vector<float> scores, maxes(num_heads), sums(num_heads);
    std::vector<uint32_t> pairs;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / parts / runs;
      const int64_t kv0 = item / parts % runs * kv_per_run;
      const int64_t heads = std::min(kv_per_run, num_kv_heads - kv0) * group;
      const int64_t len = lens[seq];
      const auto [lo, hi] = part_range(keys_of(seq), item % parts);
      const int64_t n = hi - lo;
      const int64_t first = len - keys_of(seq) + lo;
      const int32_t* table = tables + seq * max_blocks;
      if (n == 0) {  // an empty part (a short sequence beside a long one): no weight
        std::fill_n(part_sum.begin() + item * kv_per_run * group, heads, 0.f);
        continue;
      }
      const scalar_t* q_run = q_ptr + (seq * num_heads + kv0 * group) * head_dim;
      const cache_t* k_run = k_ptr + kv0 * head_stride;
      const cache_t* v_run = v_ptr + kv0 * head_stride;
      load_row(q_run, q.data(), heads * head_dim);
      for (int64_t i = 0; i < heads * head_dim; ++i) q[i] *= scale;
      if constexpr (std::is_same_v<cache_t, int8_t>) {
        if (rotates_keys(head_dim)) rotate_groups(q.data(), heads * head_dim);
      }

      // Pass 1: every head's score against each key row, read once.
      scores.resize(heads * n);
      bool scored = false;
#if defined(__AVX512BF16__)
      if constexpr (bf16_cache) {
        if (head_dim % 32 == 0) {
          score_keys_bf16(q_run, scale, k_run, table, first, n, block_size, heads, group,
                          token_stride, head_dim, scores.data());
          scored = true;
        }
      }
#endif
#if defined(__AVX512F__)
      if constexpr (!std::is_same_v<scalar_t, double>) {
        if (!scored && head_dim % 16 == 0) {
          score_keys_avx512(q.data(), k_run, table, first, n, block_size, heads, group,
                            token_stride, head_dim, scores.data());
          scored = true;
        }
      }
#endif
      if (!scored) {
        score_keys(q.data(), k_run, table, first, n, block_size, heads, group, token_stride,
                   head_dim, scores.data(), row.data());
      }
      if (softcap > 0.f) softcap_scores(scores.data(), heads * n, softcap);
      for (int64_t h = 0; h < heads; ++h) {
        maxes[h] = *std::max_element(scores.begin() + h * n, scores.begin() + (h + 1) * n);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float sum = 0.f;
        float* s = scores.data() + h * n;
        for (int64_t t = 0; t < n; ++t) {
          s[t] = std::exp(s[t] - maxes[h]);
          sum += s[t];
        }
        sums[h] = sum;
      }

      // Pass 2: the probability-weighted sum of the value rows, each read once.
      std::fill(acc.begin(), acc.end(), 0.f);
      bool weighed = false;
#if defined(__AVX512BF16__)
      if constexpr (bf16_cache) {
        if (head_dim % 32 == 0) {
          const int64_t stride = (n + 1) / 2;
          pairs.assign(heads * stride, 0u);  // a zero after an odd last key
          for (int64_t h = 0; h < heads; ++h) {
            // bf16 in order are the pairs: keys t and t + 1 in the low and high halves.
            store_row(scores.data() + h * n, reinterpret_cast<c10::BFloat16*>(pairs.data() + h * stride), n);
          }
          weigh_values_bf16(pairs.data(), stride, v_run, table, first, n, block_size, heads, group,
                            token_stride, head_dim, acc.data());
          for (int64_t h = 0; h < heads; ++h) unpermute_dims(acc.data() + h * head_dim, head_dim);
          weighed = true;
        }
      }
#endif
#if defined(__AVX512F__)
      if constexpr (!std::is_same_v<scalar_t, double>) {
        if (!weighed && head_dim % 16 == 0) {
          weigh_values_avx512(scores.data(), v_run, table, first, n, block_size, heads, group,
                              token_stride, head_dim, acc.data());
          weighed = true;
        }
      }
#endif
      for (int64_t t = 0; t < n && !weighed; ++t) {
        const int64_t pos = first + t;
        load_heads(row_at(v_run, table, pos, block_size, token_stride), row.data(), heads / group, head_dim);
        for (int64_t h = 0; h < heads; ++h) {
          const float p = scores[h * n + t];
          const float* vh = row.data() + (h / group) * head_dim;
          float* a = acc.data() + h * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) a[d] += p * vh[d];
        }
      }
      if (parts > 1) {
        const int64_t at = item * kv_per_run * group;
        std::copy_n(acc.begin(), heads * head_dim, part_acc.begin() + at * head_dim);
        std::copy_n(maxes.begin(), heads, part_max.begin() + at);
        std::copy_n(sums.begin(), heads, part_sum.begin() + at);
        continue;
      }
      scalar_t* o = out_ptr + (seq * num_heads + kv0 * group) * head_dim;
      for (int64_t h = 0; h < heads; ++h) {
        const float inv = 1.f / sums[h];
        for (int64_t d = 0; d < head_dim; ++d) {
          o[h * head_dim + d] = static_cast<scalar_t>(acc[h * head_dim + d] * inv);
        }
      }
    }
  });
  if (parts == 1) return;
  // The combine: each part's sums rescaled to the largest max among the parts.
  at::parallel_for(0, num_seqs * runs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> out_row(head_dim);
    for (int64_t run = begin; run < end; ++run) {
      const int64_t seq = run / runs, kv0 = run % runs * kv_per_run;
      const int64_t heads = std::min(kv_per_run, num_kv_heads - kv0) * group;
      scalar_t* o = out_ptr + (seq * num_heads + kv0 * group) * head_dim;
      for (int64_t h = 0; h < heads; ++h) {
        // (no infinities under -ffast-math: the lowest float, and empty parts skipped)
        float top = std::numeric_limits<float>::lowest();
        for (int64_t part = 0; part < parts; ++part) {
          const int64_t at = (run * parts + part) * kv_per_run * group + h;
          if (part_sum[at] > 0.f) top = std::max(top, part_max[at]);
        }
        float total = 0.f;
        std::fill(out_row.begin(), out_row.end(), 0.f);
        for (int64_t part = 0; part < parts; ++part) {
          const int64_t at = (run * parts + part) * kv_per_run * group + h;
          if (part_sum[at] == 0.f) continue;  // an empty part
          const float weight = std::exp(part_max[at] - top);
          total += weight * part_sum[at];
          const float* a = part_acc.data() + at * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) out_row[d] += weight * a[d];
        }
        for (int64_t d = 0; d < head_dim; ++d) {
          o[h * head_dim + d] = static_cast<scalar_t>(out_row[d] / total);
        }
      }
    }
  });
}

}  // namespace

at::Tensor decode_attention(
    const at::Tensor& query,
    const at::Tensor& k_cache,
    const at::Tensor& v_cache,
    const at::Tensor& block_tables,
    const at::Tensor& context_lens,
    double scale,
    int64_t window,
    double softcap) {
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4, "query [seqs, heads, dim], cache 4-D");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  const bool int8_cache = k_cache.scalar_type() == at::kChar;
  TORCH_CHECK(int8_cache || query.scalar_type() == k_cache.scalar_type(),
              "query and cache dtypes differ (and the cache is not int8)");
  TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type(), "key and value caches' dtypes differ");
  TORCH_CHECK(query.size(1) % k_cache.size(2) == 0, "heads must be a multiple of KV heads");
  TORCH_CHECK(query.size(2) + (int8_cache ? scale_elements<int8_t>(query.size(2)) : 0) ==
                  k_cache.size(3),
              "the cache's rows must be head_dim values (+ their fp16 scales in an int8 cache)");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt,
              "block_tables and context_lens must be int32");
  auto q = query.contiguous();
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = tensors::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention", [&] {
    if (int8_cache) {
      decode_attention_kernel<scalar_t, int8_t>(q, k_cache, v_cache, tables, lens, out,
                                                static_cast<float>(scale), window,
                                                static_cast<float>(softcap));
    } else {
      decode_attention_kernel<scalar_t, scalar_t>(q, k_cache, v_cache, tables, lens, out,
                                                  static_cast<float>(scale), window,
                                                  static_cast<float>(softcap));
    }
  });
  return out;
}
