// The quantized linear kernel (quantized_linear_cpu.cpp) on AMX's int8 tiles, for calls
// of kAmxRows rows and more (prefill chunks, large batches): the same integer sum per
// scale group and the same fp32 steps after it (quantized_weights.h's add_scaled), so
// the same bits as the VNNI kernel at every row count (a request's results do not
// depend on which unit its batch ran on).
//
// Per panel of 16 outputs and tile of 16 activation rows, each scale group (32 values;
// Q6_K's 16) is one TDPBSSD: the rows' int8 values (16 rows x 32 bytes) times the
// weights as signed bytes q - c in VNNI's layout (8 rows of 4 values x 16 outputs),
// unpacked from the panel once per call. Signed, the tile's sum is VNNI's unsigned one
// plus its offset term: the same integer, with no offset to add. The 16 x 16 int32
// sums are stored and scaled into the rows' fp32 sums in vector code, as before; groups
// go in pairs on two sets of tiles, a pair scaled once the next one is stored. The
// tile does the 8,192 multiply-adds for which VNNI takes 8 instructions per row, but
// every group's sums go through memory: on a Xeon with AMX (2 threads, SmolLM2's Q4_1
// shapes) 1.04-1.2x the VNNI kernel's speed from 96 rows, 1.1-1.4x at 4,096; below 96
// rows it was not faster. Where the process is refused the tiles (amx_tiles.h), or the
// engine's cpu_amx is off, the VNNI kernel runs.

#include "tensor_api.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu_kernels.h"
#include "quantized_format.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QUANTIZED_LINEAR_BUILT 1
#include "quantized_linear_amx.h"
#endif
#if defined(QUANTIZED_LINEAR_BUILT) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && \
    defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define QUANTIZED_AMX_BUILT 1
#include "amx_tiles.h"
#include "quantized_weights.h"
#endif

using namespace quantized_format;

#if defined(QUANTIZED_AMX_BUILT)
namespace {

using namespace quantized_activations;
using namespace quantized_weights;

// The tiles, by number (the intrinsics paste it into the instruction): two sets of a
// group's int32 sums, the rows' values and the group's weight rows, so that one group's
// product runs while the other's sums are scaled; wide activations' low bytes take the
// second set's sums and values instead.
#define SUMS_0 0
#define VALUES_0 1
#define WEIGHTS_0 2
#define SUMS_1 3
#define VALUES_1 4
#define WEIGHTS_1 5
constexpr int64_t kTileRows = 16;
constexpr int64_t kRowBytes = 64;  // a weight row: 4 values x 16 outputs
constexpr int64_t kBlockRowBytes = kBlock / 4 * kRowBytes;  // a block's weight rows: 512

// m activation rows, groups of `group_values` values, both sets.
void configure_tiles(int64_t m, int64_t group_values) {
  amx_tiles::TileConfig config;
  for (int set : {SUMS_0, SUMS_1}) {
    config.set(set, m, 16 * sizeof(int32_t));  // sums
    config.set(set + 1, m, group_values);  // values
    config.set(set + 2, group_values / 4, kRowBytes);  // weights
  }
  config.load();
}

// A panel's values as signed bytes q - c (c: the type's value_offset) in the tiles'
// order: per block 8 rows of 4 values x 16 outputs (Q6_K: its first group's 16 values,
// then its second's). Signed, TDPBSSD's product is the VNNI kernel's unsigned one plus
// its offset: the same integer. The nibble types' word i holds values 4i .. in its low
// nibbles and 16 + 4i .. in its high ones (Q6_K: group g in the low or high nibbles),
// with the 5- and 6-bit types' high bits in words after them.
template <QType T>
void unpack_panel(const uint8_t* panel, int64_t blocks, uint8_t* rows) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(value_offset(T)));
  auto put = [&](uint8_t* at, __m512i v) {
    _mm512_storeu_si512(at, _mm512_sub_epi8(v, offset));
  };
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* w = panel + b * value_bytes(T);
    uint8_t* out = rows + b * kBlockRowBytes;
    if constexpr (is_8_bit(T)) {
      for (int i = 0; i < 8; ++i) put(out + i * kRowBytes, _mm512_loadu_si512(w + i * 64));
    } else if constexpr (T == QType::Q6_K) {
      for (int g = 0; g < 2; ++g) {
        const __m512i highs = _mm512_loadu_si512(w + 256 + g * 64);
        for (int i = 0; i < 4; ++i) {
          const __m512i nibbles = _mm512_loadu_si512(w + i * 64);
          const __m512i low = g == 0 ? _mm512_and_si512(nibbles, low4)
                                     : _mm512_and_si512(_mm512_srli_epi16(nibbles, 4), low4);
          put(out + (4 * g + i) * kRowBytes, q6_values(low, highs, i));
        }
      }
    } else {
      __m512i highs = _mm512_setzero_si512();
      if constexpr (is_5_bit(T)) highs = _mm512_loadu_si512(w + 256);
      for (int i = 0; i < 4; ++i) {
        const __m512i word = _mm512_loadu_si512(w + i * 64);
        __m512i lo = _mm512_and_si512(word, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(word, 4), low4);
        if constexpr (is_5_bit(T)) q5_values(lo, hi, highs, i);
        put(out + i * kRowBytes, lo);
        put(out + (4 + i) * kRowBytes, hi);
      }
    }
  }
}

// A tile of m rows (FULL: 16, a constant, so that the sums stay in registers) from
// row0 times one panel, whose signed weight rows are `values`.
template <QType T, bool WIDE, bool FULL, typename out_t>
void multiply_tile(const Activations& a, int64_t row0, int64_t m, const uint8_t* panel,
                   const uint8_t* values, const float* bias, out_t* out, int64_t n) {
  const int64_t blocks = a.blocks;
  const int64_t rows = FULL ? kTileRows : m;
  constexpr int kGroups = groups(T);
  constexpr int64_t kGroupValues = kBlock / kGroups;
  const uint8_t* block_factors = panel + blocks * value_bytes(T);
  const uint8_t* super_factors = block_factors + blocks * block_factor_bytes(T);
  // [pair of groups, alternating][its first or second group]
  alignas(64) int32_t sums[2][2][kTileRows][16];
  const int8_t* x = a.values + row0 * a.k;
  const int8_t* x_low = WIDE ? a.low + row0 * a.k : nullptr;
  const float* x_scale = a.scale + row0 * blocks;
  const float* x_sum = a.sum + row0 * blocks;
  __m512 acc[kTileRows];
  for (int64_t r = 0; r < rows; ++r) acc[r] = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  // Group u's rows' scaled sums into acc (and, a block's last group, its mins).
  auto scale_group = [&](int64_t u, const int32_t (*group_sums)[16]) {
    const int64_t b = u / kGroups;
    const int g = static_cast<int>(u % kGroups);
    const __m512 d = weight_scale<T>(block_factors, super_factors, b, g);
    for (int64_t r = 0; r < rows; ++r) {
      acc[r] = add_scaled(acc[r], _mm512_load_si512(group_sums[r]), d, x_scale[r * blocks + b]);
    }
    if constexpr (has_min(T)) {
      const __m512 min = weight_min<T>(block_factors, super_factors, b);
      for (int64_t r = 0; r < rows; ++r) {
        acc[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(x_sum[r * blocks + b]), acc[r]);
      }
    }
  };
  const int64_t units = blocks * kGroups;
  if constexpr (WIDE) {
    for (int64_t u = 0; u < units; ++u) {
      // 256 x the high bytes' sums plus the low bytes': v's (quantize_row splits v so).
      const uint8_t* weights = values + u * kGroupValues / 4 * kRowBytes;
      _tile_loadd(WEIGHTS_0, weights, kRowBytes);
      _tile_zero(SUMS_0);
      _tile_loadd(VALUES_0, x + u * kGroupValues, a.k);
      _tile_dpbssd(SUMS_0, VALUES_0, WEIGHTS_0);
      _tile_zero(SUMS_1);
      _tile_loadd(VALUES_1, x_low + u * kGroupValues, a.k);
      _tile_dpbssd(SUMS_1, VALUES_1, WEIGHTS_0);
      _tile_stored(SUMS_0, sums[0][0], sizeof(sums[0][0][0]));
      _tile_stored(SUMS_1, sums[0][1], sizeof(sums[0][1][0]));
      for (int64_t r = 0; r < rows; ++r) {
        const __m512i high = _mm512_slli_epi32(_mm512_load_si512(sums[0][0][r]), 8);
        const __m512i low = _mm512_load_si512(sums[0][1][r]);
        _mm512_store_si512(sums[0][0][r], _mm512_add_epi32(high, low));
      }
      scale_group(u, sums[0][0]);
    }
  } else {
    // Groups in pairs, one on each set of tiles; a pair's sums are scaled after the next
    // pair's products are stored, by when its own stores have reached the cache (scaled
    // at once, the loads waited on the stores: at 4,096 rows 1.0-1.3x the VNNI kernel's
    // speed, against 1.1-1.4x so).
    auto scale_pair = [&](int64_t u, const int32_t (*pair)[kTileRows][16]) {
      scale_group(u, pair[0]);
      if (u + 1 < units) scale_group(u + 1, pair[1]);
    };
    for (int64_t u = 0; u < units; u += 2) {
      auto* pair = sums[u / 2 % 2];
      const uint8_t* weights = values + u * kGroupValues / 4 * kRowBytes;
      _tile_loadd(WEIGHTS_0, weights, kRowBytes);
      _tile_zero(SUMS_0);
      _tile_loadd(VALUES_0, x + u * kGroupValues, a.k);
      _tile_dpbssd(SUMS_0, VALUES_0, WEIGHTS_0);
      if (u + 1 < units) {
        _tile_loadd(WEIGHTS_1, weights + kGroupValues / 4 * kRowBytes, kRowBytes);
        _tile_zero(SUMS_1);
        _tile_loadd(VALUES_1, x + (u + 1) * kGroupValues, a.k);
        _tile_dpbssd(SUMS_1, VALUES_1, WEIGHTS_1);
        _tile_stored(SUMS_1, pair[1], sizeof(pair[1][0]));
      }
      _tile_stored(SUMS_0, pair[0], sizeof(pair[0][0]));
      if (u >= 2) scale_pair(u - 2, sums[(u / 2 + 1) % 2]);
    }
    const int64_t last = (units - 1) / 2 * 2;  // the last pair's first group
    scale_pair(last, sums[last / 2 % 2]);
  }
  for (int64_t r = 0; r < rows; ++r) store16(out + (row0 + r) * n, acc[r]);
}

// Panels begin .. end - 1 for all rows, blocked as a GEMM is so that what a loop
// re-reads stays in the core's L2: a run of panels' unpacked weights (kRunBytes) for
// a run of rows' activations (kRunRows; 1,536 values: 384 KB) at a time. Unblocked,
// 4,096 rows of a prefill were re-read from memory for every panel, and the tiles ran
// slower than the VNNI kernel.
constexpr int64_t kRunRows = 256;
constexpr int64_t kRunBytes = 256 << 10;

template <QType T, bool WIDE, typename out_t>
void multiply_panels(const Activations& a, int64_t rows, const uint8_t* packed, int64_t begin,
                     int64_t end, int64_t panel_bytes, const float* bias, out_t* out,
                     int64_t n) {
  const int64_t unpacked_bytes = a.blocks * kBlockRowBytes;  // a panel's
  const int64_t run_panels = std::max<int64_t>(1, kRunBytes / unpacked_bytes);
  // Kept from call to call: a fresh buffer this size comes from mmap, and its page
  // faults cost a 64-row call a third of its time.
  thread_local std::vector<uint8_t> unpacked;
  const size_t wanted = std::min(run_panels, end - begin) * unpacked_bytes;
  if (unpacked.size() < wanted) unpacked.resize(wanted);
  constexpr int64_t kGroupValues = kBlock / groups(T);
  configure_tiles(kTileRows, kGroupValues);  // loading a configuration costs: once a call
  for (int64_t p0 = begin; p0 < end; p0 += run_panels) {
    const int64_t p1 = std::min(end, p0 + run_panels);
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* rows_of_p = unpacked.data() + (p - p0) * unpacked_bytes;
      unpack_panel<T>(packed + p * panel_bytes, a.blocks, rows_of_p);
    }
    for (int64_t r0 = 0; r0 < rows; r0 += kRunRows) {
      const int64_t r1 = std::min(rows, r0 + kRunRows);
      const int64_t full = r0 + (r1 - r0) / kTileRows * kTileRows;
      for (int64_t p = p0; p < p1; ++p) {
        const uint8_t* panel = packed + p * panel_bytes;
        const uint8_t* values = unpacked.data() + (p - p0) * unpacked_bytes;
        const float* panel_bias = bias ? bias + p * kPanel : nullptr;
        for (int64_t t = r0; t < full; t += kTileRows) {
          multiply_tile<T, WIDE, true>(a, t, kTileRows, panel, values, panel_bias,
                                       out + p * kPanel, n);
        }
        if (full < r1) {  // the run's last rows: a shorter configuration for them
          configure_tiles(r1 - full, kGroupValues);
          multiply_tile<T, WIDE, false>(a, full, r1 - full, panel, values, panel_bias,
                                        out + p * kPanel, n);
          configure_tiles(kTileRows, kGroupValues);
        }
      }
    }
  }
  _tile_release();
}

// ---- bf16 tiles on the weights dequantized (cpu_linear_kernel other than "kernel") ----
//
// The weights dequantized panel by panel into bf16 pairs (TDPBF16PS's layout: per pair
// of values, the 16 outputs' two values), the activations in bf16: the sums run over
// the whole row in the tile, with nothing to scale per group. Not the VNNI kernel's
// bits (bf16 activations and weights instead of int8 activations): chosen only where
// the engine gives up batch-independent results for speed, as with oneDNN's bf16.
#define X_TILE 0
#define PAIRS_0 1
#define PAIRS_1 2
#define OUT_0 3
#define OUT_1 4
#define X_TILE_2 5  // a second tile of 16 rows, and its sums of the two panels
#define OUT_2 6
#define OUT_3 7

constexpr int64_t kPairRowWords = 32;  // a pair row: 16 outputs x 2 bf16

void configure_bf16_tiles(int64_t m) {
  amx_tiles::TileConfig config;
  config.set(X_TILE, m, 64);  // 32 bf16 values of each row
  config.set(PAIRS_0, 16, 64);  // 16 pairs x 16 outputs
  config.set(PAIRS_1, 16, 64);
  config.set(OUT_0, m, 64);  // 16 fp32 sums of each row
  config.set(OUT_1, m, 64);
  for (int tile : {X_TILE_2, OUT_2, OUT_3}) config.set(tile, 16, 64);
  config.load();
}

// A panel's weights as bf16 pairs [K / 2][16 outputs][2]: each value d (q - c) + m in
// fp32 (the group's scale, the block's min), rounded to bf16 (to nearest even).
// `signed_rows`: blocks x 512 bytes of scratch for unpack_panel.
template <QType T>
void dequantize_panel(const uint8_t* panel, int64_t blocks, uint8_t* signed_rows,
                      uint16_t* pairs) {
  unpack_panel<T>(panel, blocks, signed_rows);
  const uint8_t* block_factors = panel + blocks * value_bytes(T);
  const uint8_t* super_factors = block_factors + blocks * block_factor_bytes(T);
  // Words 0, 2, .. 30 (the 16 outputs' values 4r, 4r + 1) and 1, 3, .. 31 (4r + 2, 4r + 3)
  // of a row of 4 values x 16 outputs; each output's factor twice, outputs 0-7 and 8-15.
  __m512i even_words, odd_words;
  {
    alignas(64) int16_t even[32], odd[32];
    for (int w = 0; w < 32; ++w) even[w] = static_cast<int16_t>(2 * (w % 16)), odd[w] = even[w] + 1;
    even_words = _mm512_load_si512(even);
    odd_words = _mm512_load_si512(odd);
  }
  alignas(64) int32_t low_index[16], high_index[16];
  for (int i = 0; i < 16; ++i) low_index[i] = i / 2, high_index[i] = 8 + i / 2;
  const __m512i low_outputs = _mm512_load_si512(low_index);
  const __m512i high_outputs = _mm512_load_si512(high_index);
  constexpr int64_t kGroupValues = kBlock / groups(T);
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 min_low = _mm512_setzero_ps(), min_high = _mm512_setzero_ps();
    if constexpr (has_min(T)) {
      const __m512 min = weight_min<T>(block_factors, super_factors, b);
      min_low = _mm512_permutexvar_ps(low_outputs, min);
      min_high = _mm512_permutexvar_ps(high_outputs, min);
    }
    for (int g = 0; g < groups(T); ++g) {
      const __m512 d = weight_scale<T>(block_factors, super_factors, b, g);
      const __m512 d_low = _mm512_permutexvar_ps(low_outputs, d);
      const __m512 d_high = _mm512_permutexvar_ps(high_outputs, d);
      const int64_t first_row = (b * kBlock + g * kGroupValues) / 4;  // of 4 values each
      for (int64_t r = first_row; r < first_row + kGroupValues / 4; ++r) {
        const __m512i row = _mm512_loadu_si512(signed_rows + r * kRowBytes);
        for (int half = 0; half < 2; ++half) {  // values 4r, 4r + 1, then 4r + 2, 4r + 3
          const __m256i bytes =
              _mm512_castsi512_si256(_mm512_permutexvar_epi16(half ? odd_words : even_words, row));
          const __m512 low = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bytes))), d_low,
              min_low);
          const __m512 high = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bytes, 1))),
              d_high, min_high);
          _mm512_storeu_si512(pairs + (2 * r + half) * kPairRowWords,
                              (__m512i)_mm512_cvtne2ps_pbh(high, low));
        }
      }
    }
  }
}

// Rows row0 .. row0 + m - 1 of x (bf16, k values a row; m <= 16 in one tile of the
// configured rows, or 32 in two tiles of 16) times one or two adjacent panels' pairs
// (`pair_panels`: each loaded once for both row tiles), into out with the bias.
template <typename out_t>
void multiply_bf16_rows(const at::BFloat16* x, int64_t k, int64_t row0, int64_t m,
                        const uint16_t* pairs, int pair_panels, int64_t panel_words,
                        const float* bias, out_t* out, int64_t n) {
  const bool two = m > kTileRows;
  alignas(64) float sums[4][kTileRows][16];  // [rows 0-15, 16-31] x [panel 0, 1]
  _tile_zero(OUT_0);
  _tile_zero(OUT_1);
  _tile_zero(OUT_2);
  _tile_zero(OUT_3);
  const at::BFloat16* rows = x + row0 * k;
  const int64_t stride = k * sizeof(at::BFloat16);
  for (int64_t v = 0; v < k; v += 32) {
    _tile_loadd(X_TILE, rows + v, stride);
    if (two) _tile_loadd(X_TILE_2, rows + kTileRows * k + v, stride);
    _tile_loadd(PAIRS_0, pairs + v / 2 * kPairRowWords, 64);
    _tile_dpbf16ps(OUT_0, X_TILE, PAIRS_0);
    if (two) _tile_dpbf16ps(OUT_2, X_TILE_2, PAIRS_0);
    if (pair_panels == 2) {
      _tile_loadd(PAIRS_1, pairs + panel_words + v / 2 * kPairRowWords, 64);
      _tile_dpbf16ps(OUT_1, X_TILE, PAIRS_1);
      if (two) _tile_dpbf16ps(OUT_3, X_TILE_2, PAIRS_1);
    }
  }
  _tile_stored(OUT_0, sums[0], 64);
  _tile_stored(OUT_1, sums[1], 64);
  _tile_stored(OUT_2, sums[2], 64);
  _tile_stored(OUT_3, sums[3], 64);
  for (int j = 0; j < pair_panels; ++j) {
    const __m512 b = bias ? _mm512_loadu_ps(bias + j * kPanel) : _mm512_setzero_ps();
    for (int64_t r = 0; r < m; ++r) {
      const __m512 sum = _mm512_load_ps(sums[2 * (r / kTileRows) + j][r % kTileRows]);
      store16(out + (row0 + r) * n + j * kPanel, _mm512_add_ps(sum, b));
    }
  }
}

// Panels begin .. end - 1 for all rows, dequantized a run at a time (kRunBytes of
// pairs), two panels per tile step.
template <QType T, typename out_t>
void multiply_panels_bf16(const at::BFloat16* x, int64_t rows, int64_t k, const uint8_t* packed,
                          int64_t begin, int64_t end, int64_t panel_bytes, const float* bias,
                          out_t* out, int64_t n) {
  const int64_t blocks = k / kBlock, panel_words = k / 2 * kPairRowWords;
  const int64_t run_panels = std::max<int64_t>(2, kRunBytes / (panel_words * 2) / 2 * 2);
  thread_local std::vector<uint16_t> pairs;
  thread_local std::vector<uint8_t> signed_rows;
  const size_t wanted = std::min(run_panels, end - begin) * panel_words;
  if (pairs.size() < wanted) pairs.resize(wanted);
  if (signed_rows.size() < static_cast<size_t>(blocks * kBlockRowBytes)) {
    signed_rows.resize(blocks * kBlockRowBytes);
  }
  const int64_t full = rows / kTileRows * kTileRows;
  configure_bf16_tiles(kTileRows);  // once a call, and again after a shorter last tile
  for (int64_t p0 = begin; p0 < end; p0 += run_panels) {
    const int64_t p1 = std::min(end, p0 + run_panels);
    for (int64_t p = p0; p < p1; ++p) {
      dequantize_panel<T>(packed + p * panel_bytes, blocks, signed_rows.data(),
                          pairs.data() + (p - p0) * panel_words);
    }
    for (int64_t r0 = 0; r0 < rows; r0 += kRunRows) {
      const int64_t r1 = std::min(rows, r0 + kRunRows);
      for (int64_t p = p0; p < p1; p += 2) {
        const int pair_panels = p + 1 < p1 ? 2 : 1;
        const uint16_t* panel_pairs = pairs.data() + (p - p0) * panel_words;
        const float* panel_bias = bias ? bias + p * kPanel : nullptr;
        for (int64_t t = r0; t < std::min(r1, full); t += 2 * kTileRows) {
          const int64_t m = std::min(2 * kTileRows, std::min(r1, full) - t);
          multiply_bf16_rows(x, k, t, m, panel_pairs, pair_panels, panel_words, panel_bias,
                             out + p * kPanel, n);
        }
        if (full < r1) {
          configure_bf16_tiles(r1 - full);
          multiply_bf16_rows(x, k, full, r1 - full, panel_pairs, pair_panels, panel_words,
                             panel_bias, out + p * kPanel, n);
          configure_bf16_tiles(kTileRows);
        }
      }
    }
  }
  _tile_release();
}

}  // namespace
#endif

#if defined(QUANTIZED_LINEAR_BUILT)
namespace quantized_linear_amx {

template <typename out_t>
bool multiply_range(QType t, bool wide, const quantized_activations::Activations& a,
                    int64_t rows, const uint8_t* packed, int64_t begin, int64_t end,
                    int64_t panel_bytes, const float* bias, out_t* out, int64_t n) {
#if defined(QUANTIZED_AMX_BUILT)
  if (!amx_tiles::ready()) return false;
  with_qtype(t, [&](auto type) {
    constexpr QType T = decltype(type)::value;
    if (wide) {
      multiply_panels<T, true>(a, rows, packed, begin, end, panel_bytes, bias, out, n);
    } else {
      multiply_panels<T, false>(a, rows, packed, begin, end, panel_bytes, bias, out, n);
    }
  });
  return true;
#else
  return false;
#endif
}

template bool multiply_range<float>(QType, bool, const quantized_activations::Activations&,
                                    int64_t, const uint8_t*, int64_t, int64_t, int64_t,
                                    const float*, float*, int64_t);
template bool multiply_range<at::BFloat16>(QType, bool, const quantized_activations::Activations&,
                                           int64_t, const uint8_t*, int64_t, int64_t, int64_t,
                                           const float*, at::BFloat16*, int64_t);

}  // namespace quantized_linear_amx

#endif

// x [M, K] (bf16, or fp32 rounded to bf16) times a packed quantized weight on AMX's bf16
// tiles, the weight dequantized a panel run at a time (see multiply_panels_bf16): ->
// [M, N] in x's dtype. Only where amx_tiles::ready() (quantized_linear_bf16_ready()).
bool quantized_linear_bf16_ready() {
#if defined(QUANTIZED_AMX_BUILT)
  return amx_tiles::ready();
#else
  return false;
#endif
}

at::Tensor quantized_linear_bf16(const at::Tensor& x, const at::Tensor& packed,
                                 const std::string& qtype, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(quantized_linear_bf16_ready(), "AMX's tiles are not ready here");
  const QType t = parse_qtype(qtype);
  TORCH_CHECK(x.is_cpu() && x.dim() == 2 &&
                  (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "x [M, K] bf16 or fp32 on the CPU");
  const int64_t rows = x.size(0), k = x.size(1);
  TORCH_CHECK(k % file_block_values(t) == 0, "K must be whole ", qtype, " blocks");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(1) == kPanel * packed_row_bytes(t, k),
              "packed weight does not fit x");
  const int64_t panels = packed.size(0), n = panels * kPanel;
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    bias_f = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(bias_f.numel() == n, "bias [N]");
  }
  at::Tensor out = tensors::empty({rows, n}, x.options());
#if defined(QUANTIZED_AMX_BUILT)
  if (rows == 0) return out;
  const int64_t panel_bytes = packed.size(1);
  const at::Tensor xb = x.to(at::kBFloat16).contiguous();
  const at::BFloat16* xp = xb.data_ptr<at::BFloat16>();
  const float* bp = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  // Pairs of panels split among the threads.
  at::parallel_for(0, (panels + 1) / 2, 1, [&](int64_t first, int64_t last) {
    const int64_t begin = 2 * first, end = std::min(panels, 2 * last);
    with_qtype(t, [&](auto type) {
      constexpr QType T = decltype(type)::value;
      if (out.scalar_type() == at::kFloat) {
        multiply_panels_bf16<T>(xp, rows, k, wp, begin, end, panel_bytes, bp,
                                out.data_ptr<float>(), n);
      } else {
        multiply_panels_bf16<T>(xp, rows, k, wp, begin, end, panel_bytes, bp,
                                out.data_ptr<at::BFloat16>(), n);
      }
    });
  });
#endif
  return out;
}
