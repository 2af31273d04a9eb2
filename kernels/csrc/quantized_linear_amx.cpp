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

#include "quantized_format.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QUANTIZED_LINEAR_BUILT 1
#include "quantized_linear_amx.h"
#endif
#if defined(QUANTIZED_LINEAR_BUILT) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
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
