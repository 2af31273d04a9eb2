// Prefill attention's query tiles (prefill_attention_cpu.cpp) on AMX's bf16 tiles: per
// 16 query tokens of one head and 32 keys at a time, the scores are tile products
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

// The tiles, by number (the intrinsics paste it into the instruction).
#define ROWS_TILE 0     // the queries' dims, or their probabilities
#define COLUMNS_TILE 1  // a key tile's dim pairs, or the values' key pairs
#define SCORES_0 2      // the scores of the step's first 16 keys
#define SCORES_1 3      // and of its second 16
#define VALUES_SUM 4    // 16 dims of the probability-weighted values

constexpr int64_t kTile = kQueryTile;
constexpr int64_t kStepKeys = 32;
constexpr float kMasked = kMaskedScore;

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
  config.set(ROWS_TILE, count, 64);  // 32 bf16: dims, or the step's keys' probabilities
  config.set(COLUMNS_TILE, 16, 64);  // 16 pairs x 16 columns
  for (int tile : {SCORES_0, SCORES_1, VALUES_SUM}) config.set(tile, count, 64);
  config.load();
  alignas(64) float scores[2][kTile][kTile];
  alignas(64) uint16_t probs[kTile][kStepKeys];
  alignas(64) float value_sums[kTile][16];
  QueryTile state(acc, head_dim);
  float* maxes = state.maxes;
  float* sums = state.sums;
  float rescale[kTile];
  const int64_t first_pos = context - chunk_len + first;
  const int64_t last_pos = first_pos + count - 1;
  const __m512 scale_v = _mm512_set1_ps(scale);
  const uint16_t* query_rows = query + first * query_stride;
  for (int64_t k0 = 0; k0 <= last_pos; k0 += kStepKeys) {
    const int64_t tile = k0 / kTile;
    const bool second = k0 + kTile <= last_pos;  // whether any query sees keys k0 + 16 ..
    _tile_zero(SCORES_0);
    _tile_zero(SCORES_1);
    for (int64_t d0 = 0; d0 < head_dim; d0 += 32) {
      _tile_loadd(ROWS_TILE, query_rows + d0, query_stride * 2);
      _tile_loadd(COLUMNS_TILE, keys + (tile * pairs + d0 / 2) * kTile, 64);
      _tile_dpbf16ps(SCORES_0, ROWS_TILE, COLUMNS_TILE);
      if (second) {
        _tile_loadd(COLUMNS_TILE, keys + ((tile + 1) * pairs + d0 / 2) * kTile, 64);
        _tile_dpbf16ps(SCORES_1, ROWS_TILE, COLUMNS_TILE);
      }
    }
    _tile_stored(SCORES_0, scores[0], 64);
    _tile_stored(SCORES_1, scores[1], 64);
    // Online softmax: each query's maximum so far; what was summed is rescaled to it.
    // Keys a query does not see (past it, or past the context) get no weight.
    for (int64_t i = 0; i < count; ++i) {
      const int64_t visible = first_pos + i - k0 + 1;  // keys of the step it sees
      __m512 part[2];
      __mmask16 keep[2];
      float step_max = kMasked;
      for (int h = 0; h < 2; ++h) {
        const int64_t seen = std::clamp<int64_t>(visible - h * kTile, 0, kTile);
        keep[h] = seen == kTile ? static_cast<__mmask16>(0xFFFF)
                                : static_cast<__mmask16>((1u << seen) - 1);
        part[h] = _mm512_mul_ps(_mm512_load_ps(scores[h][i]), scale_v);
        if (softcap > 0.f) part[h] = softcap16(part[h], softcap);
        part[h] = _mm512_mask_mov_ps(_mm512_set1_ps(kMasked), keep[h], part[h]);
        step_max = std::max(step_max, _mm512_reduce_max_ps(part[h]));
      }
      if (visible <= 0) step_max = kMasked;
      const float new_max = std::max(maxes[i], step_max);
      rescale[i] = visible <= 0 ? 1.f : std::exp(maxes[i] - new_max);  // 0 on the first keys
      maxes[i] = new_max;
      float step_sum = 0.f;
      for (int h = 0; h < 2; ++h) {
        const __m512 p = _mm512_maskz_mov_ps(
            keep[h], exp16(_mm512_sub_ps(part[h], _mm512_set1_ps(new_max))));
        step_sum += _mm512_reduce_add_ps(p);
        _mm256_store_si256(reinterpret_cast<__m256i*>(probs[i] + h * kTile), round_to_bf16(p));
      }
      sums[i] = sums[i] * rescale[i] + step_sum;
    }
    // The values of the step's 32 keys (16 key pairs, two tiles' rows), 16 dims a tile.
    _tile_loadd(ROWS_TILE, probs, sizeof(probs[0]));
    const uint16_t* value_rows = values + tile * (kTile / 2) * head_dim * 2;
    for (int64_t d0 = 0; d0 < head_dim; d0 += 16) {
      _tile_loadd(COLUMNS_TILE, value_rows + d0 * 2, head_dim * 2 * sizeof(uint16_t));
      _tile_zero(VALUES_SUM);
      _tile_dpbf16ps(VALUES_SUM, ROWS_TILE, COLUMNS_TILE);
      _tile_stored(VALUES_SUM, value_sums, 64);
      for (int64_t i = 0; i < count; ++i) {
        float* a = acc + i * head_dim + d0;
        _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_loadu_ps(a), _mm512_set1_ps(rescale[i]),
                                            _mm512_load_ps(value_sums[i])));
      }
    }
  }
  _tile_release();
  state.write(first, count, out, out_stride);
#endif
}
