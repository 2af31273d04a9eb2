// Prefill attention's query tiles (prefill_attention_cpu.cpp) on AMX's bf16 tiles: per
// 16 query tokens of one head and 64 keys at a time, the scores are tile products
// (TDPBF16PS: the queries' rows of bf16 pairs times a key tile's dim pairs, as the
// tiles are laid out for the vector kernel), the online softmax runs in vector code on
// them, and the probabilities, rounded to bf16 as there, multiply the values in tiles
// of 16 dims, whose sums are added into the output rows rescaled to the running
// maximum. A tile product does what takes the vector kernel a dot instruction per
// (query, pair of dims) or (query, pair of keys, 16 dims); the results are within fp32
// rounding of its own (the sums are taken in another order).

#include "prefill_attention_amx.h"

#include <algorithm>
#include <cmath>

#include "amx_tiles.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__)
#define PREFILL_AMX_BUILT 1
#include "query_tile.h"
#include "vector_math.h"
#endif

bool prefill_attention_amx_ready() {
#if defined(PREFILL_AMX_BUILT)
  return amx_tiles::ready();
#else
  return false;
#endif
}

#if defined(PREFILL_AMX_BUILT)
namespace {

// The tiles, by number (the intrinsics paste it into the instruction). Tiles have no
// renaming: a load into a tile waits for the product reading it, so key and value
// tiles alternate between two, and the four score tiles, stored once a step's scores
// are taken, then hold the sums of four 16-dim chunks of values at once.
#define ROWS_TILE 0  // the queries' dims, or the probabilities of the step's keys 0-31
#define COLUMNS_A 1  // a key tile's dim pairs, or the values' key pairs
#define SUMS_0 2     // the scores of the step's keys 0-15, then values' dims 0-15
#define SUMS_1 3     // keys 16-31, dims 16-31
#define SUMS_2 4     // keys 32-47, dims 32-47
#define SUMS_3 5     // keys 48-63, dims 48-63 (of the 64 dims a pass)
#define COLUMNS_B 6  // as COLUMNS_A, in turn with it
#define PROBS_1 7    // the probabilities of the step's keys 32-63

constexpr int64_t kTile = kQueryTile;
// Keys a step: 64 rather than 32 halved the softmax's reductions per key; with the
// alternating tiles, the four sums at once and the 16 queries' reductions together,
// 1.6x the 32-key kernel on a 1,024-token chunk of SmolLM2's heads (2.83 -> 1.77 ms).
constexpr int64_t kStepKeys = 64;
constexpr float kMasked = kMaskedScore;

// Lane i of the result: op over the 16 lanes of rows[i], for 16 rows at once. Four
// rounds each fold two vectors' halves into one (a blend pair, a lane swap, one op):
// 30 blends and swaps and 15 ops instead of 16 reductions of 4 dependent steps each.
// The rounds leave row j in lane bit-reverse(j), so the rows go in in that order.
template <typename Op>
inline __m512 reduce_each(const __m512* rows, Op op) {
  static constexpr int kBitReversed[16] = {0, 8, 4, 12, 2, 10, 6, 14,
                                           1, 9, 5, 13, 3, 11, 7, 15};
  __m512 v[16];
  for (int j = 0; j < 16; ++j) v[j] = rows[kBitReversed[j]];
  auto fold = [&](int n, __mmask16 upper, auto swap) {
    for (int j = 0; j < n; ++j) {
      const __m512 kept = _mm512_mask_blend_ps(upper, v[2 * j], v[2 * j + 1]);
      const __m512 moved = swap(_mm512_mask_blend_ps(upper, v[2 * j + 1], v[2 * j]));
      v[j] = op(kept, moved);
    }
  };
  fold(8, 0xFF00, [](__m512 x) { return _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)); });
  fold(4, 0xF0F0, [](__m512 x) { return _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)); });
  fold(2, 0xCCCC, [](__m512 x) { return _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)); });
  fold(1, 0xAAAA, [](__m512 x) { return _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)); });
  return v[0];
}

constexpr auto max16 = [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); };
constexpr auto add16 = [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); };

}  // namespace
#endif

void attend_query_tile_amx(const uint16_t* query, int64_t query_stride, int64_t first,
                           int64_t count, int64_t chunk_len, int64_t context,
                           const uint32_t* keys, const uint16_t* values, int64_t head_dim,
                           float scale, float softcap, float* acc, at::BFloat16* out,
                           int64_t out_stride) {
#if defined(PREFILL_AMX_BUILT)
  const int64_t pairs = head_dim / 2;
  amx_tiles::TileConfig config;
  for (int tile : {ROWS_TILE, SUMS_0, SUMS_1, SUMS_2, SUMS_3, PROBS_1}) {
    config.set(tile, count, 64);  // 32 bf16 (dims or probabilities), or 16 fp32 sums
  }
  config.set(COLUMNS_A, 16, 64);  // 16 pairs x 16 columns
  config.set(COLUMNS_B, 16, 64);
  config.load();
  alignas(64) float sums_out[4][kTile][kTile];  // the score tiles, then the value sums
  alignas(64) uint16_t probs[kTile][kStepKeys];
  alignas(64) float rescale[kTile];
  QueryTile state(acc, head_dim);
  float* maxes = state.maxes;
  const int64_t first_pos = context - chunk_len + first;
  const int64_t last_pos = first_pos + count - 1;
  const __m512 scale_v = _mm512_set1_ps(scale);
  // What turns a score as kept into a scaled one: the scale, or 1 once soft-capped.
  const float unit = softcap > 0.f ? 1.f : scale;
  const __m512 unit_v = _mm512_set1_ps(unit);
  const __m512 unit_log2e = _mm512_set1_ps(unit * kLog2E);
  const uint16_t* query_rows = query + first * query_stride;
  const int64_t value_stride = head_dim * 2 * sizeof(uint16_t);  // a key pair's row
  for (int64_t k0 = 0; k0 <= last_pos; k0 += kStepKeys) {
    const int64_t tile = k0 / kTile;
    // The step's 16-key tiles any query sees (1-4); KvTiles has zeros up to 64 keys.
    const int64_t seen_tiles = std::min<int64_t>(4, (last_pos - k0) / kTile + 1);
    _tile_zero(SUMS_0);
    _tile_zero(SUMS_1);
    _tile_zero(SUMS_2);
    _tile_zero(SUMS_3);
    for (int64_t d0 = 0; d0 < head_dim; d0 += 32) {
      const uint32_t* key_dims = keys + (tile * pairs + d0 / 2) * kTile;
      const int64_t next = pairs * kTile;  // the next key tile's same dims
      _tile_loadd(ROWS_TILE, query_rows + d0, query_stride * 2);
      _tile_loadd(COLUMNS_A, key_dims, 64);
      _tile_dpbf16ps(SUMS_0, ROWS_TILE, COLUMNS_A);
      if (seen_tiles > 1) {
        _tile_loadd(COLUMNS_B, key_dims + next, 64);
        _tile_dpbf16ps(SUMS_1, ROWS_TILE, COLUMNS_B);
      }
      if (seen_tiles > 2) {
        _tile_loadd(COLUMNS_A, key_dims + 2 * next, 64);
        _tile_dpbf16ps(SUMS_2, ROWS_TILE, COLUMNS_A);
      }
      if (seen_tiles > 3) {
        _tile_loadd(COLUMNS_B, key_dims + 3 * next, 64);
        _tile_dpbf16ps(SUMS_3, ROWS_TILE, COLUMNS_B);
      }
    }
    _tile_stored(SUMS_0, sums_out[0], 64);
    _tile_stored(SUMS_1, sums_out[1], 64);
    _tile_stored(SUMS_2, sums_out[2], 64);
    _tile_stored(SUMS_3, sums_out[3], 64);
    // Online softmax: each query's maximum so far; what was summed is rescaled to it.
    // Keys a query does not see (past it, or past the context) get no weight. The
    // scores stay as the tiles give them (soft-capped, scaled first) and the maximum is
    // taken on them, as scaling by unit > 0 keeps the order; e^(unit x - max) is
    // 2^(x unit log2e - max log2e), one FMA, and a masked score gives 2^(-1e29): 0.
    // First each query's step maximum, the 16 reduced at once; then the weights.
    __m512 lanes[kTile];
    for (int64_t i = 0; i < kTile; ++i) {
      const int64_t visible = first_pos + i - k0 + 1;  // keys of the step it sees
      lanes[i] = _mm512_set1_ps(kMasked);
      if (i >= count || visible <= 0) continue;
      for (int h = 0; h < 4; ++h) {
        __m512 part = _mm512_load_ps(sums_out[h][i]);
        if (softcap > 0.f) part = softcap16(_mm512_mul_ps(part, scale_v), softcap);
        if (visible < kStepKeys) {
          const int64_t seen = std::clamp<int64_t>(visible - h * kTile, 0, kTile);
          const auto keep = static_cast<__mmask16>((1u << seen) - 1);  // 16: all
          part = _mm512_mask_mov_ps(_mm512_set1_ps(kMasked), keep, part);
        }
        if (softcap > 0.f || visible < kStepKeys) _mm512_store_ps(sums_out[h][i], part);
        lanes[i] = _mm512_max_ps(lanes[i], part);
      }
    }
    // A query that sees none of the step's keys keeps its maximum (rescaled by 1).
    const __m512 old_maxes = _mm512_loadu_ps(maxes);
    const __m512 step_maxes = _mm512_mul_ps(reduce_each(lanes, max16), unit_v);
    const __m512 new_maxes = _mm512_max_ps(old_maxes, step_maxes);
    _mm512_storeu_ps(maxes, new_maxes);
    alignas(64) float shifts[kTile];
    _mm512_store_ps(shifts, _mm512_mul_ps(new_maxes, _mm512_set1_ps(-kLog2E)));
    for (int64_t i = 0; i < kTile; ++i) {
      const int64_t visible = first_pos + i - k0 + 1;
      lanes[i] = _mm512_setzero_ps();
      if (i >= count) continue;
      if (visible <= 0) {  // no weights: the row of probabilities is zeros
        std::fill(probs[i], probs[i] + kStepKeys, uint16_t{0});
        continue;
      }
      const __m512 shift = _mm512_set1_ps(shifts[i]);
      for (int h = 0; h < 4; ++h) {
        const __m512 part = _mm512_load_ps(sums_out[h][i]);
        const __m512 p = exp2_16(_mm512_fmadd_ps(part, unit_log2e, shift));
        lanes[i] = _mm512_add_ps(lanes[i], p);
        _mm256_store_si256(reinterpret_cast<__m256i*>(probs[i] + h * kTile), round_to_bf16(p));
      }
    }
    // The 16 queries' rescales at once (0 on a query's first keys: its sums are 0).
    const __m512 factor = exp16(_mm512_sub_ps(old_maxes, new_maxes));
    _mm512_store_ps(rescale, factor);
    _mm512_storeu_ps(state.sums, _mm512_fmadd_ps(_mm512_loadu_ps(state.sums), factor,
                                                 reduce_each(lanes, add16)));
    // The values of the step's keys (16 key pairs a tile's rows), 64 dims a pass.
    const bool second_half = seen_tiles > 2;
    _tile_loadd(ROWS_TILE, probs, sizeof(probs[0]));
    if (second_half) _tile_loadd(PROBS_1, probs[0] + 32, sizeof(probs[0]));
    const uint16_t* value_rows = values + tile * (kTile / 2) * head_dim * 2;
    const uint16_t* second_rows = value_rows + kTile * head_dim * 2;  // keys 32-63
    for (int64_t d0 = 0; d0 < head_dim; d0 += 64) {
      const int64_t chunks = std::min<int64_t>(4, (head_dim - d0) / 16);
      _tile_zero(SUMS_0);
      _tile_zero(SUMS_1);
      _tile_loadd(COLUMNS_A, value_rows + d0 * 2, value_stride);
      _tile_dpbf16ps(SUMS_0, ROWS_TILE, COLUMNS_A);
      _tile_loadd(COLUMNS_B, value_rows + (d0 + 16) * 2, value_stride);
      _tile_dpbf16ps(SUMS_1, ROWS_TILE, COLUMNS_B);
      if (chunks > 2) {
        _tile_zero(SUMS_2);
        _tile_zero(SUMS_3);
        _tile_loadd(COLUMNS_A, value_rows + (d0 + 32) * 2, value_stride);
        _tile_dpbf16ps(SUMS_2, ROWS_TILE, COLUMNS_A);
        _tile_loadd(COLUMNS_B, value_rows + (d0 + 48) * 2, value_stride);
        _tile_dpbf16ps(SUMS_3, ROWS_TILE, COLUMNS_B);
      }
      if (second_half) {
        _tile_loadd(COLUMNS_A, second_rows + d0 * 2, value_stride);
        _tile_dpbf16ps(SUMS_0, PROBS_1, COLUMNS_A);
        _tile_loadd(COLUMNS_B, second_rows + (d0 + 16) * 2, value_stride);
        _tile_dpbf16ps(SUMS_1, PROBS_1, COLUMNS_B);
        if (chunks > 2) {
          _tile_loadd(COLUMNS_A, second_rows + (d0 + 32) * 2, value_stride);
          _tile_dpbf16ps(SUMS_2, PROBS_1, COLUMNS_A);
          _tile_loadd(COLUMNS_B, second_rows + (d0 + 48) * 2, value_stride);
          _tile_dpbf16ps(SUMS_3, PROBS_1, COLUMNS_B);
        }
      }
      _tile_stored(SUMS_0, sums_out[0], 64);
      _tile_stored(SUMS_1, sums_out[1], 64);
      if (chunks > 2) {
        _tile_stored(SUMS_2, sums_out[2], 64);
        _tile_stored(SUMS_3, sums_out[3], 64);
      }
      for (int64_t i = 0; i < count; ++i) {
        const __m512 r = _mm512_set1_ps(rescale[i]);
        for (int64_t c = 0; c < chunks; ++c) {
          float* a = acc + i * head_dim + d0 + 16 * c;
          _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_loadu_ps(a), r,
                                              _mm512_load_ps(sums_out[c][i])));
        }
      }
    }
  }
  _tile_release();
  state.write(first, count, out, out_stride);
#endif
}
