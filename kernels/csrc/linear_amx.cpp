// linear_packed's product (linear_cpu.cpp) on AMX's bf16 tiles, at every row count, on
// the weights as pack_linear_weight lays them out.
//
// A panel's rows of input pairs hold its 32 outputs' bf16 pairs side by side: its first
// 16 outputs' pairs of 16 input pairs, read 128 bytes apart, are one tile of TDPBF16PS's
// second operand, its last 16's the next 64 bytes. Per 16 rows of x (a tile of 16 rows x
// 32 values), two products a step of 32 inputs, the sums of all of K in the tiles; then
// the bias, the addend, the gate's activation and the rounding to bf16 in vector code,
// as linear_cpu.cpp does them.
//
// The tiles' sums are not the AVX-512 dot instruction's (another order of addition), so
// where the tiles are ready they take every call, one row or thousands: a row's result
// does not depend on the rows it was batched with. Against the AVX-512 kernel on SmolLM2's
// shapes (a Xeon with AMX, 2 threads): see docs/cpu.md "AMX tiles".

#include "linear_amx.h"

#include <algorithm>

#include "amx_tiles.h"
#include "vector_math.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define LINEAR_AMX_BUILT 1
#endif

namespace linear_amx {

#if defined(LINEAR_AMX_BUILT)
namespace {

// The tiles, by number (the intrinsics paste it into the instruction): two tiles of 16
// rows of x, a panel's two halves, and the four tiles of sums.
#define ROWS_0 0
#define ROWS_1 1
#define HALF_LO 2
#define HALF_HI 3
#define SUMS_0_LO 4
#define SUMS_0_HI 5
#define SUMS_1_LO 6
#define SUMS_1_HI 7

constexpr int64_t kPanel = 32;  // outputs per panel (pack_linear_weight's)
constexpr int64_t kTileRows = 16;
constexpr int64_t kStepPairs = 16;  // input pairs a product takes: 32 values
// Rows of x a run (a 256 x 1,536 run is 768 KB): its panels are read once per run,
// and the run stays in the core's L2 while they are.
constexpr int64_t kRunRows = 256;
// How far ahead of a step's weights the first tile of rows asks for the weights (two
// steps; across the panel's end, the next panel's): the tiles' loads alone read a
// decode's weights from memory ~10% more slowly than the AVX-512 kernel.
constexpr int64_t kPrefetchBytes = 4096;

// m rows in the tiles of x and of the sums (the second set's 16).
void configure(int64_t m) {
  amx_tiles::TileConfig config;
  config.set(ROWS_0, m, 64);
  config.set(SUMS_0_LO, m, 64);
  config.set(SUMS_0_HI, m, 64);
  for (int tile : {ROWS_1, HALF_LO, HALF_HI, SUMS_1_LO, SUMS_1_HI}) config.set(tile, 16, 64);
  config.load();
}

// The stored sums of `m` rows (and the bias, the addend, the activation) into out.
void write_rows(const float (&lo)[kTileRows][16], const float (&hi)[kTileRows][16], int64_t m,
                const Product& p, int64_t panel, int64_t row0) {
  const int64_t n = p.panels * kPanel;
  const int64_t out_cols = p.gated ? n / 2 : n, panel_cols = p.gated ? kPanel / 2 : kPanel;
  __m512 bias_lo = _mm512_setzero_ps(), bias_hi = _mm512_setzero_ps();
  if (p.bias) {
    bias_lo = load_bf16_16(p.bias + panel * kPanel);
    bias_hi = load_bf16_16(p.bias + panel * kPanel + 16);
  }
  for (int64_t r = 0; r < m; ++r) {
    __m512 sum_lo = _mm512_load_ps(lo[r]), sum_hi = _mm512_load_ps(hi[r]);
    if (p.bias) {
      sum_lo = _mm512_add_ps(bias_lo, sum_lo);
      sum_hi = _mm512_add_ps(bias_hi, sum_hi);
    }
    if (p.addend) {  // the panel's columns: a gated one's 16 gates and their 16 ups
      const float* add_lo = p.addend + (row0 + r) * n + panel * panel_cols;
      const float* add_hi = p.gated ? add_lo + n / 2 : add_lo + 16;
      sum_lo = _mm512_add_ps(sum_lo, _mm512_loadu_ps(add_lo));
      sum_hi = _mm512_add_ps(sum_hi, _mm512_loadu_ps(add_hi));
    }
    auto* row = reinterpret_cast<__m256i*>(p.out + (row0 + r) * out_cols + panel * panel_cols);
    if (p.gated) {
      _mm256_storeu_si256(row, round_to_bf16(silu_mul16(sum_lo, sum_hi)));
    } else {  // both halves rounded by one instruction, as round_to_bf16 rounds
      _mm512_storeu_si512(row, (__m512i)_mm512_cvtne2ps_pbh(sum_hi, sum_lo));
    }
  }
}

// Rows row0 .. row0 + m - 1 (m <= 16 in the configured rows, or 32 in two tiles of 16)
// times one panel, asking for the weights ahead (kPrefetchBytes) where `prefetch`.
void multiply_rows(const Product& p, int64_t panel, int64_t row0, int64_t m, bool prefetch) {
  const bool two = m > kTileRows;
  const int64_t k = 2 * p.pairs, x_stride = k * sizeof(uint16_t);
  const uint16_t* x = p.x + row0 * k;
  const uint32_t* weights = p.packed + panel * p.pairs * kPanel;
  _tile_zero(SUMS_0_LO);
  _tile_zero(SUMS_0_HI);
  if (two) {
    _tile_zero(SUMS_1_LO);
    _tile_zero(SUMS_1_HI);
  }
  for (int64_t kp = 0; kp < p.pairs; kp += kStepPairs) {
    if (prefetch) {
      const char* ahead = reinterpret_cast<const char*>(weights + kp * kPanel) + kPrefetchBytes;
      for (int64_t line = 0; line < kStepPairs * kPanel * 4; line += 64) {
        _mm_prefetch(ahead + line, _MM_HINT_T1);
      }
    }
    _tile_loadd(ROWS_0, x + 2 * kp, x_stride);
    _tile_loadd(HALF_LO, weights + kp * kPanel, kPanel * sizeof(uint32_t));
    _tile_loadd(HALF_HI, weights + kp * kPanel + 16, kPanel * sizeof(uint32_t));
    _tile_dpbf16ps(SUMS_0_LO, ROWS_0, HALF_LO);
    _tile_dpbf16ps(SUMS_0_HI, ROWS_0, HALF_HI);
    if (two) {
      _tile_loadd(ROWS_1, x + kTileRows * k + 2 * kp, x_stride);
      _tile_dpbf16ps(SUMS_1_LO, ROWS_1, HALF_LO);
      _tile_dpbf16ps(SUMS_1_HI, ROWS_1, HALF_HI);
    }
  }
  alignas(64) float lo[kTileRows][16], hi[kTileRows][16];
  _tile_stored(SUMS_0_LO, lo, 64);
  _tile_stored(SUMS_0_HI, hi, 64);
  write_rows(lo, hi, std::min(m, kTileRows), p, panel, row0);
  if (two) {
    _tile_stored(SUMS_1_LO, lo, 64);
    _tile_stored(SUMS_1_HI, hi, 64);
    write_rows(lo, hi, m - kTileRows, p, panel, row0 + kTileRows);
  }
}

}  // namespace
#endif

bool ready(int64_t pairs) {
#if defined(LINEAR_AMX_BUILT)
  return pairs % kStepPairs == 0 && amx_tiles::ready();
#else
  (void)pairs;
  return false;
#endif
}

void multiply_panels(const Product& p, int64_t begin, int64_t end) {
#if defined(LINEAR_AMX_BUILT)
  // Rows in pairs of tiles, a last one of the rest: configured for it, then back.
  const int64_t full = p.rows / kTileRows * kTileRows;
  configure(full ? kTileRows : p.rows);
  for (int64_t r0 = 0; r0 < p.rows; r0 += kRunRows) {
    const int64_t r1 = std::min(p.rows, r0 + kRunRows);
    for (int64_t panel = begin; panel < end; ++panel) {
      // The first tile of a panel asks for its weights; later ones find them in cache.
      for (int64_t t = r0; t < std::min(r1, full); t += 2 * kTileRows) {
        multiply_rows(p, panel, t, std::min(2 * kTileRows, std::min(r1, full) - t), t == r0);
      }
      if (full < r1 && full > 0) configure(r1 - full);
      if (full < r1) multiply_rows(p, panel, full, r1 - full, full == r0);
      if (full < r1 && full > 0) configure(kTileRows);
    }
  }
  _tile_release();
#else
  (void)p, (void)begin, (void)end;
#endif
}

}  // namespace linear_amx
