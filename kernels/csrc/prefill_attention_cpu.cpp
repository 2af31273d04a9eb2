// Causal attention of prefill chunks over the paged KV cache on the CPU, in bf16 and
// fp32.
//
// A chunk's query tokens all read the same keys and values, so here they are read in
// tiles of 16 tokens against tiles of 16 keys, as matrix products (bf16: on pairs, by
// vector_math.h's LanePairs: AVX512-BF16's dot instruction, or FMAs; fp32: by FMAs),
// with an online softmax (flash attention): the decode kernel, one token at a time,
// re-reads every key per token and reduces each dot product across lanes (at fp32's
// small head sizes, 16 or 32, that reduction is most of its work). Two passes, each
// split among torch's threads by its work:
// 1. per (chunk, KV head), the keys are laid out with a tile's 16 keys across the
//    lanes (in bf16 a pair of dims per lane, as the instruction multiplies pairs), and
//    the values with pairs of keys per lane (fp32: a key's values in a row);
// 2. per (chunk, head, 16 query tokens), the attention over those tiles. Units this
//    small keep both threads busy when a step holds a single long chunk.
// fp32 heads of 16 or 32 dims take a tile's queries across the lanes instead
// (query_lanes_f32.h: at those sizes the per-query softmax steps cost more than the
// products), the keys then laid out in rows.
// The probabilities are rounded to bf16 for the value product, as GPU flash attention
// does, where the dot instruction takes them; the FMAs take them in fp32 (rounded, they
// cost SmolLM2 +1% perplexity there). Scores may be soft-capped (Gemma 2) before the
// softmax.

#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "load_row.h"
#include "parallel_by_work.h"
#include "prefill_attention_amx.h"
#include "query_lanes_f32.h"
#include "query_tile.h"
#include "vector_math.h"

bool prefill_attention_available() {
#if defined(__AVX512BW__)
  return true;
#else
  return false;
#endif
}

#if defined(__AVX512BW__)
namespace {

constexpr int64_t kTile = kQueryTile;
constexpr float kMasked = kMaskedScore;
// fp32 heads of up to this many dims take their tiles' queries across the lanes
// (attend_query_lanes_f32).
constexpr int64_t kLanesMaxHeadDim = 32;

// Online softmax, one query's step over a tile of 16 keys: its scores (`dots` scaled,
// soft-capped where softcap > 0) against the `visible` keys of the tile it sees, its
// running maximum and weight sum updated. Returns its probabilities there (0 where it
// does not see a key; all 0 for visible <= 0, a query past the tile's end or before
// its keys) and sets `rescale`, what its value sums so far are multiplied by.
inline __m512 tile_probabilities(__m512 dots, __m512 scale_v, float softcap, int64_t visible,
                                 float& max, float& sum, float& rescale) {
  if (visible <= 0) {
    rescale = 1.f;
    return _mm512_setzero_ps();
  }
  const __mmask16 keep = visible >= kTile ? static_cast<__mmask16>(0xFFFF)
                                          : static_cast<__mmask16>((1u << visible) - 1);
  __m512 scores = _mm512_mul_ps(dots, scale_v);
  if (softcap > 0.f) scores = softcap16(scores, softcap);
  scores = _mm512_mask_mov_ps(_mm512_set1_ps(kMasked), keep, scores);
  const float new_max = std::max(max, _mm512_reduce_max_ps(scores));
  rescale = std::exp(max - new_max);  // 0 on the first tile
  max = new_max;
  const __m512 probs =
      _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(scores, _mm512_set1_ps(new_max))));
  sum = sum * rescale + _mm512_reduce_add_ps(probs);
  return probs;
}

// The value sums of QUERIES queries (rows of `acc`, CHUNKS * 16 values each) into
// registers, each multiplied by its rescale; and back.
template <int QUERIES, int CHUNKS>
inline void load_rescaled_sums(const float* acc, const float* rescale,
                               __m512 (&sum)[QUERIES][CHUNKS]) {
  for (int j = 0; j < QUERIES; ++j) {
    const __m512 r = _mm512_set1_ps(rescale[j]);
    for (int c = 0; c < CHUNKS; ++c) {
      sum[j][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + j * CHUNKS * 16 + 16 * c), r);
    }
  }
}

template <int QUERIES, int CHUNKS>
inline void store_sums(const __m512 (&sum)[QUERIES][CHUNKS], float* acc) {
  for (int j = 0; j < QUERIES; ++j) {
    for (int c = 0; c < CHUNKS; ++c) _mm512_storeu_ps(acc + j * CHUNKS * 16 + 16 * c, sum[j][c]);
  }
}

// One sequence's keys and values for one KV head, re-laid out for the products.
struct KvTiles {
  // keys[tile][dim pair][key]: a tile's 16 keys across the lanes, a pair of dims each.
  std::vector<uint32_t> keys;
  // values[tile][key pair][dim][2]: pairs of keys per lane, one dim per lane.
  std::vector<uint16_t> values;

  void build(const uint16_t* k_cache, const uint16_t* v_cache, const int32_t* table,
             int64_t context, int64_t block_size, int64_t token_stride, int64_t offset,
             int64_t head_dim) {
    // A multiple of four: the AMX kernel takes 64 keys at a time (zeros past the context).
    const int64_t tiles = (context + 4 * kTile - 1) / (4 * kTile) * 4;
    const int64_t pairs = head_dim / 2;
    keys.assign(tiles * pairs * kTile, 0);
    values.assign(tiles * kTile * head_dim, 0);  // zeros past the context: 0 * 0, not NaN
    for (int64_t pos = 0; pos < context; ++pos) {
      const int64_t slot =
          static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
      const uint32_t* k =
          reinterpret_cast<const uint32_t*>(k_cache + slot * token_stride + offset);
      const uint16_t* v = v_cache + slot * token_stride + offset;
      const int64_t tile = pos / kTile, lane = pos % kTile;
      uint32_t* kt = keys.data() + tile * pairs * kTile + lane;
      for (int64_t p = 0; p < pairs; ++p) kt[p * kTile] = k[p];
      uint16_t* vt = values.data() + (tile * (kTile / 2) + lane / 2) * head_dim * 2 + lane % 2;
      for (int64_t d = 0; d < head_dim; ++d) vt[2 * d] = v[d];
    }
  }
};

// Attention of query tokens first .. first + count - 1 (count <= 16) of a chunk whose
// last token sits at position context - 1, over the tiles; writes their output rows.
// CHUNKS = head_dim / 16, a constant so that the value sums stay in registers. softcap:
// the scores' soft-capping value, 0 for none.
template <int CHUNKS>
void attend_query_tile(const uint16_t* query, int64_t query_stride, int64_t first,
                       int64_t count, int64_t chunk_len, int64_t context, const KvTiles& kv,
                       float scale, float softcap, float* acc, at::BFloat16* out,
                       int64_t out_stride) {
  constexpr int64_t head_dim = CHUNKS * 16, pairs = head_dim / 2;
  // Queries whose value sums are updated together: independent chains of dot
  // instructions, within the 32 vector registers.
  constexpr int kQueries = CHUNKS <= 4 ? 4 : 2;
  QueryTile state(acc, head_dim);
  float* maxes = state.maxes;
  float* sums = state.sums;
  const int64_t first_pos = context - chunk_len + first;
  const int64_t last_pos = first_pos + count - 1;
  const __m512 scale_v = _mm512_set1_ps(scale);
  // The tile's query rows as pairs, `q_stride` pairs apart: the bf16 rows where they
  // are, or widened to fp32 here.
#if defined(__AVX512BF16__)
  const ScalarPair* queries = reinterpret_cast<const ScalarPair*>(query + first * query_stride);
  const int64_t q_stride = query_stride / 2;
#else
  ScalarPair widened[kTile * pairs];
  for (int64_t i = 0; i < count; ++i) {
    load_row(reinterpret_cast<const at::BFloat16*>(query + (first + i) * query_stride),
             reinterpret_cast<float*>(widened + i * pairs), head_dim);
  }
  const ScalarPair* queries = widened;
  const int64_t q_stride = pairs;
#endif
  for (int64_t tile = 0; tile * kTile <= last_pos; ++tile) {
    const uint32_t* kt = kv.keys.data() + tile * pairs * kTile;
    const uint16_t* vt = kv.values.data() + tile * kTile * head_dim;
    for (int64_t i0 = 0; i0 < count; i0 += 4) {
      // Scores of 4 query tokens against the tile's 16 keys: 8 independent chains.
      const ScalarPair* q[4];
      for (int j = 0; j < 4; ++j) q[j] = queries + std::min<int64_t>(i0 + j, count - 1) * q_stride;
      __m512 even[4], odd[4];
      for (int j = 0; j < 4; ++j) even[j] = odd[j] = _mm512_setzero_ps();
      for (int64_t p = 0; p < pairs; p += 2) {
        const LanePairs k0(kt + p * kTile), k1(kt + (p + 1) * kTile);
        for (int j = 0; j < 4; ++j) {
          even[j] = k0.dot(even[j], q[j][p]);
          odd[j] = k1.dot(odd[j], q[j][p + 1]);
        }
      }
      float rescale[4];
      ScalarPair prob_pairs[4][kTile / 2];
      for (int j = 0; j < 4; ++j) {
        const int64_t i = i0 + j;
        const int64_t visible = i0 + j < count ? first_pos + i - tile * kTile + 1 : 0;
        const __m512 dots = _mm512_add_ps(even[j], odd[j]);
        store_pairs(prob_pairs[j], tile_probabilities(dots, scale_v, softcap, visible, maxes[i],
                                                      sums[i], rescale[j]));
      }
      // Value sums: each pair of keys' value chunk is loaded once for kQueries queries.
      for (int j0 = 0; j0 < 4; j0 += kQueries) {
        __m512 sum[kQueries][CHUNKS];
        load_rescaled_sums(acc + (i0 + j0) * head_dim, rescale + j0, sum);
        for (int64_t kp = 0; kp < kTile / 2; ++kp) {
          LanePairs value[CHUNKS];
          for (int c = 0; c < CHUNKS; ++c) value[c] = LanePairs(vt + (kp * head_dim + 16 * c) * 2);
          for (int j = 0; j < kQueries; ++j) {
            const ScalarPair& weight = prob_pairs[j0 + j][kp];
            for (int c = 0; c < CHUNKS; ++c) {
              sum[j][c] = value[c].dot(sum[j][c], weight);
            }
          }
        }
        store_sums(sum, acc + (i0 + j0) * head_dim);
      }
    }
  }
  state.write(first, count, out, out_stride);
}

// KvTiles' fp32 counterpart: values[tile][key][dim], a key's values in a row; keys as
// the kernel reading them takes them: keys[tile][dim][key], a tile's 16 keys across the
// lanes (attend_query_tile_f32), or in rows as the values (attend_query_lanes_f32).
// Zeros past the context.
struct KvTilesF32 {
  std::vector<float> keys;
  std::vector<float> values;

  void build(const float* k_cache, const float* v_cache, const int32_t* table, int64_t context,
             int64_t block_size, int64_t token_stride, int64_t offset, int64_t head_dim) {
    const int64_t tiles = (context + kTile - 1) / kTile;
    const bool key_rows = head_dim <= kLanesMaxHeadDim;
    keys.assign(tiles * head_dim * kTile, 0.f);
    values.assign(tiles * kTile * head_dim, 0.f);
    for (int64_t pos = 0; pos < context; ++pos) {
      const int64_t slot =
          static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
      const float* k = k_cache + slot * token_stride + offset;
      if (key_rows) {
        std::memcpy(keys.data() + pos * head_dim, k, head_dim * sizeof(float));
      } else {
        float* kt = keys.data() + (pos / kTile) * head_dim * kTile + pos % kTile;
        for (int64_t d = 0; d < head_dim; ++d) kt[d * kTile] = k[d];
      }
      std::memcpy(values.data() + pos * head_dim, v_cache + slot * token_stride + offset,
                  head_dim * sizeof(float));
    }
  }
};

// attend_query_tile in fp32: a query's scores against a tile's 16 keys are head_dim
// FMAs of its values (broadcast) with the keys' lanes, in two chains of alternate dims;
// the value sums take each probability (broadcast) times its key's value row.
template <int CHUNKS>
void attend_query_tile_f32(const float* query, int64_t query_stride, int64_t first,
                           int64_t count, int64_t chunk_len, int64_t context,
                           const KvTilesF32& kv, float scale, float softcap, float* acc,
                           float* out, int64_t out_stride) {
  constexpr int64_t head_dim = CHUNKS * 16;
  constexpr int kQueries = CHUNKS <= 4 ? 4 : 2;  // value sums within the 32 registers
  QueryTile state(acc, head_dim);
  const int64_t first_pos = context - chunk_len + first;
  const int64_t last_pos = first_pos + count - 1;
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t tile = 0; tile * kTile <= last_pos; ++tile) {
    const float* kt = kv.keys.data() + tile * head_dim * kTile;
    const float* vt = kv.values.data() + tile * kTile * head_dim;
    for (int64_t i0 = 0; i0 < count; i0 += 4) {
      const float* q[4];
      for (int j = 0; j < 4; ++j) {
        q[j] = query + (first + std::min<int64_t>(i0 + j, count - 1)) * query_stride;
      }
      __m512 even[4], odd[4];
      for (int j = 0; j < 4; ++j) even[j] = odd[j] = _mm512_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 2) {
        const __m512 k0 = _mm512_loadu_ps(kt + d * kTile);
        const __m512 k1 = _mm512_loadu_ps(kt + (d + 1) * kTile);
        for (int j = 0; j < 4; ++j) {
          even[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][d]), k0, even[j]);
          odd[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][d + 1]), k1, odd[j]);
        }
      }
      float rescale[4];
      alignas(64) float probs[4][kTile];
      for (int j = 0; j < 4; ++j) {
        const int64_t i = i0 + j;
        const int64_t visible = i < count ? first_pos + i - tile * kTile + 1 : 0;
        const __m512 dots = _mm512_add_ps(even[j], odd[j]);
        _mm512_store_ps(probs[j], tile_probabilities(dots, scale_v, softcap, visible,
                                                     state.maxes[i], state.sums[i], rescale[j]));
      }
      for (int j0 = 0; j0 < 4; j0 += kQueries) {
        __m512 sum[kQueries][CHUNKS];
        load_rescaled_sums(acc + (i0 + j0) * head_dim, rescale + j0, sum);
        for (int64_t k = 0; k < kTile; ++k) {
          __m512 value[CHUNKS];
          for (int c = 0; c < CHUNKS; ++c) value[c] = _mm512_loadu_ps(vt + k * head_dim + 16 * c);
          for (int j = 0; j < kQueries; ++j) {
            const __m512 weight = _mm512_set1_ps(probs[j0 + j][k]);
            for (int c = 0; c < CHUNKS; ++c) sum[j][c] = _mm512_fmadd_ps(weight, value[c], sum[j][c]);
          }
        }
        store_sums(sum, acc + (i0 + j0) * head_dim);
      }
    }
  }
  state.write(first, count, out, out_stride);
}

// attend_query_tile_f32 for heads of 16 or 32 dims: the tile's queries across the
// lanes (query_lanes_f32.h), the keys in rows.
template <int HEAD_DIM>
void attend_query_lanes_f32(const float* query, int64_t query_stride, int64_t first,
                            int64_t count, int64_t chunk_len, int64_t context,
                            const KvTilesF32& kv, float scale, float softcap, float* /*acc*/,
                            float* out, int64_t out_stride) {
  QueryLanesF32<HEAD_DIM> lanes(query + first * query_stride, query_stride, count);
  // Query i sits at position first_pos + i and sees the keys up to it; the tiles hold
  // zeros past the context to a tile's end, so the keys read are whole steps.
  const int64_t first_pos = context - chunk_len + first;
  const int64_t keys_read = (first_pos + count + kLaneKeys - 1) / kLaneKeys * kLaneKeys;
  lanes.attend(kv.keys.data(), kv.values.data(), HEAD_DIM, keys_read,
               lanes.causal_reach(first_pos + 1), scale, softcap);
  lanes.write(out + first * out_stride, out_stride);
}

// prefill_attention for one dtype: bf16 (KvTiles, on AMX's tiles where the CPU has
// them) or fp32 (KvTilesF32).
template <typename scalar_t>
void prefill_attention_of(const at::Tensor& query, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& block_tables,
                          const at::Tensor& context_lens, const at::Tensor& chunk_starts,
                          const at::Tensor& chunk_lens, float scale, float softcap,
                          at::Tensor& out) {
  constexpr bool kFp32 = std::is_same_v<scalar_t, float>;
  using Tiles = std::conditional_t<kFp32, KvTilesF32, KvTiles>;
  using Element = std::conditional_t<kFp32, float, uint16_t>;  // the tiles' build reads
  const auto tables_c = block_tables.contiguous();
  const auto lens_c = context_lens.contiguous();
  const auto starts_c = chunk_starts.contiguous();
  const auto chunk_lens_c = chunk_lens.contiguous();
  const int32_t* tables = tables_c.data_ptr<int32_t>();
  const int32_t* lens = lens_c.data_ptr<int32_t>();
  const int32_t* starts = starts_c.data_ptr<int32_t>();
  const int32_t* query_lens = chunk_lens_c.data_ptr<int32_t>();
  const int64_t num_seqs = context_lens.size(0), max_blocks = block_tables.size(1);
  const int64_t num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, token_stride = num_kv_heads * head_dim;
  const Element* q_ptr = reinterpret_cast<const Element*>(query.data_ptr<scalar_t>());
  const Element* k_ptr = reinterpret_cast<const Element*>(k_cache.data_ptr<scalar_t>());
  const Element* v_ptr = reinterpret_cast<const Element*>(v_cache.data_ptr<scalar_t>());
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const int64_t q_token_stride = query.stride(0);

  // Pass 1: each (chunk, KV head)'s tiles, built once for all its query heads.
  // Kept from call to call (per calling thread): fresh buffers of this size would come
  // from mmap, and page faults cost as much as the pass. A reference, so that the
  // lambdas below, run by other threads, see the calling thread's buffers.
  const int64_t num_units = num_seqs * num_kv_heads;
  thread_local std::vector<Tiles> kv_buffers;
  std::vector<Tiles>& kv = kv_buffers;
  if (static_cast<int64_t>(kv.size()) < num_units) kv.resize(num_units);
  std::vector<int64_t> build_work(num_units);
  for (int64_t u = 0; u < num_units; ++u) build_work[u] = lens[u / num_kv_heads] + 16;
  parallel_for_by_work(build_work, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t seq = u / num_kv_heads, kv_head = u % num_kv_heads;
      kv[u].build(k_ptr, v_ptr, tables + seq * max_blocks, lens[seq], block_size, token_stride,
                  kv_head * head_dim, head_dim);
    }
  });

  // Pass 2: (chunk, head, 16 query tokens) items; work = queries x keys they read.
  struct Item {
    int64_t seq, head, first;
  };
  std::vector<Item> items;
  std::vector<int64_t> work;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t chunk_len = query_lens[seq], cached = lens[seq] - chunk_len;
    for (int64_t first = 0; first < chunk_len; first += kTile) {
      const int64_t count = std::min<int64_t>(kTile, chunk_len - first);
      for (int64_t h = 0; h < num_heads; ++h) {
        items.push_back({seq, h, first});
        work.push_back(count * (cached + first + count) + 64);
      }
    }
  }
  const bool on_tiles = !kFp32 && prefill_attention_amx_ready();  // AMX's, where there
  auto attend = [&](const Item& item, float* acc) {
    const int64_t chunk_len = query_lens[item.seq];
    const int64_t count = std::min<int64_t>(kTile, chunk_len - item.first);
    const Element* query_rows = q_ptr + starts[item.seq] * q_token_stride + item.head * head_dim;
    scalar_t* out_rows = out_ptr + (starts[item.seq] * num_heads + item.head) * head_dim;
    const Tiles& tiles = kv[item.seq * num_kv_heads + item.head / group];
    auto run = [&](auto tile_fn) {
      tile_fn(query_rows, q_token_stride, item.first, count, chunk_len, lens[item.seq], tiles,
              scale, softcap, acc, out_rows, num_heads * head_dim);
    };
    if constexpr (kFp32) {
      // Small heads across the lanes (KvTilesF32 laid their keys in rows for them)
      if (head_dim <= kLanesMaxHeadDim) {
        head_dim == 16 ? run(attend_query_lanes_f32<16>) : run(attend_query_lanes_f32<32>);
        return;
      }
      switch (head_dim / 16) {
        case 3: run(attend_query_tile_f32<3>); break;
        case 4: run(attend_query_tile_f32<4>); break;
        case 5: run(attend_query_tile_f32<5>); break;
        case 6: run(attend_query_tile_f32<6>); break;
        case 7: run(attend_query_tile_f32<7>); break;
        default: run(attend_query_tile_f32<8>); break;
      }
    } else if (on_tiles) {
      attend_query_tile_amx(query_rows, q_token_stride, item.first, count, chunk_len,
                            lens[item.seq], tiles.keys.data(), tiles.values.data(), head_dim,
                            scale, softcap, acc, out_rows, num_heads * head_dim);
    } else {
      switch (head_dim / 16) {
        case 2: run(attend_query_tile<2>); break;
        case 4: run(attend_query_tile<4>); break;
        case 6: run(attend_query_tile<6>); break;
        default: run(attend_query_tile<8>); break;
      }
    }
  };
  parallel_for_by_work(work, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(kTile * head_dim);
    for (int64_t i = begin; i < end; ++i) attend(items[i], acc.data());
  });
}

}  // namespace
#endif

// out[t] for the query tokens of each chunk: rows chunk_starts[s] .. chunk_starts[s] +
// chunk_lens[s] - 1 of query are the last tokens of sequence s, whose context (the
// chunk's keys already stored) is context_lens[s]. Other rows of `out` are left as
// they are.
void prefill_attention(const at::Tensor& query, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& block_tables,
                       const at::Tensor& context_lens, const at::Tensor& chunk_starts,
                       const at::Tensor& chunk_lens, double scale, double softcap,
                       at::Tensor& out) {
  TORCH_CHECK(prefill_attention_available(), "built without AVX-512 (BW)");
  const auto dtype = query.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) &&
                  k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype &&
                  out.scalar_type() == dtype,
              "bf16 or fp32, query, caches and out alike");
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1 && query.stride(1) == query.size(2) &&
                  out.is_contiguous() && out.sizes() == query.sizes(),
              "query [tokens, heads, dim] with contiguous heads; out like it, contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  const int64_t head_dim = query.size(2);
  TORCH_CHECK(dtype == at::kFloat ? head_dim % 16 == 0 && head_dim >= 16 && head_dim <= 128
                                  : head_dim == 32 || head_dim == 64 || head_dim == 96 ||
                                        head_dim == 128,
              "head_dim 32, 64, 96 or 128 (fp32: a multiple of 16 up to 128)");
  TORCH_CHECK(query.size(1) % k_cache.size(2) == 0, "heads a multiple of KV heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt &&
                  chunk_starts.scalar_type() == at::kInt && chunk_lens.scalar_type() == at::kInt,
              "block_tables, context_lens, chunk_starts and chunk_lens must be int32");
#if defined(__AVX512BW__)
  const float scale_f = static_cast<float>(scale), softcap_f = static_cast<float>(softcap);
  if (dtype == at::kFloat) {
    prefill_attention_of<float>(query, k_cache, v_cache, block_tables, context_lens, chunk_starts,
                                chunk_lens, scale_f, softcap_f, out);
  } else {
    prefill_attention_of<at::BFloat16>(query, k_cache, v_cache, block_tables, context_lens,
                                       chunk_starts, chunk_lens, scale_f, softcap_f, out);
  }
#endif
}
