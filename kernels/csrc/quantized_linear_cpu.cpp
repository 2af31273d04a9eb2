// y = x W^T + b with W kept in its GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K, Q6_K) or as weight-only int8 with one scale per output row (I8), on
// AVX512-VNNI (below), or on AVX2 where the CPU lacks it (quantized_linear_avx2.cpp,
// the same sums): a decode step streams 0.56-1.06 bytes per weight instead of bf16's 2.
//
// Each call first quantizes x to int8 per block of 32 values (scale amax / 127, as
// llama.cpp quantizes its activations). The weights' values are small unsigned
// integers (nibbles, nibbles plus Q5's 1 or Q6_K's 2 high bits, Q8_0's int8 plus 128),
// so one VPDPBUSD multiplies 64 weight bytes (unsigned) by one broadcast word of 4
// activation bytes (signed) and adds into 16 int32 lanes, one output each. Per block
// (Q6_K: per 16 values) the int sum becomes fp32: times weight scale x activation
// scale, its start being minus the values' offset (Q4_0 8, Q5_0 16, Q8_0 and I8 128,
// Q6_K 32) times the activations' int sum; the types with mins (Q4_1, Q5_1, Q4_K, Q5_K)
// add min x the activations' sum. Against unquantized activations the int8 rounding
// costs ~0.5% relative error (a step of amax / 127).
//
// A model whose activations have outlier channels (Gemma 3: a block's largest value
// sets its step, leaving its other values few levels) asks for 16-bit activations
// instead: v = round(x * 32639 / amax), split as v = 256 h + l with h and l int8, each
// weight word multiplied by both (two VPDPBUSD where one did, 256x finer steps), the
// group's sum 256 x (h's sum) + l's (on Gemma-3-270M's shapes, one thread, in cache:
// 5-17% more time than int8 at 1 row, 1.4-1.8x at 8-128).
//
// Why int8 and not the weight dequantized to bf16 for linear_packed's dot instruction:
// one VPDPBUSD is 64 multiply-adds where VDPBF16PS is 32; in cache, at 64-512 rows, one
// Zen 5 core ran 510 (Q6_K) to 800 GOP/s here against the bf16 kernel's 550 GFLOP/s. At
// 1 row all are bound by memory, where the per-call costs (waking a second thread,
// quantizing x) weigh most on the small 4-bit weights.
//
// The weights come in panels of 16 outputs (quantized_pack_cpu.cpp lays them out).
// Tiles: up to 8 rows x 1 panel for up to 16 rows (kFewRows), else 6 rows x 2 panels
// (24 of the 32 registers hold sums); each weight word is loaded and unpacked once per
// tile for all its rows. A thread walks its run of panels in memory order and asks for
// the step after next while it multiplies one.

#include "tensor_api.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
#include "parallel_by_work.h"
#include "quantized_format.h"
#include "vector_math.h"
#include "work_in_shares.h"

// Without AVX512-VNNI the tiles are AVX2's (quantized_linear_avx2.cpp); the rest (the
// activations' quantization, the threads' shares) is this file's either way.
// AVX512-BF16 is not needed (Cascade Lake and Ice Lake have VNNI without it): only a
// bf16 output's rounding would use it, and integer arithmetic rounds the same
// (vector_math.h's round_to_bf16).
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QUANTIZED_LINEAR_BUILT 1
#include "quantized_activations.h"  // with <immintrin.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QUANTIZED_LINEAR_VNNI 1
#include "quantized_linear_amx.h"
#include "quantized_weights.h"
#elif defined(QUANTIZED_LINEAR_BUILT)
#include "quantized_linear_avx2.h"
#endif

using namespace quantized_format;
#if defined(QUANTIZED_LINEAR_BUILT)
using namespace quantized_activations;
#endif
#if defined(QUANTIZED_LINEAR_VNNI)
using namespace quantized_weights;
#endif

namespace {

// A thread's least share of a call, in weight bytes x rows: below it, waking the
// other thread costs more than it saves (at 1 row, a 192 x 576 Q4_1 weight ran
// alone 5% faster; SmolLM2's merged projections all split).
constexpr int64_t kMinThreadWork = 128 << 10;
// quantized_linear_grouped's unit of work: about 256 KiB of weights, an even count of
// panels (the 2-panel steps).
constexpr int64_t kGroupedUnitBytes = 256 << 10;

}  // namespace

bool quantized_linear_available() {
#if defined(QUANTIZED_LINEAR_BUILT)
  return true;
#else
  return false;
#endif
}

#if defined(QUANTIZED_LINEAR_VNNI)
namespace {

// One activation word (4 values) of a row times a weight word of 16 outputs, added
// into the int32 sums: int8 values into `sum`; wide ones' high bytes into `sum` and
// low bytes into `low_sum` (the group's sum is then 256 sum + low_sum).
template <bool WIDE>
inline void dot_word(__m512i& sum, __m512i& low_sum, __m512i w, const int32_t* x,
                     const int32_t* x_low, int64_t word) {
  sum = _mm512_dpbusd_epi32(sum, w, _mm512_set1_epi32(x[word]));
  if constexpr (WIDE) low_sum = _mm512_dpbusd_epi32(low_sum, w, _mm512_set1_epi32(x_low[word]));
}

// ROWS rows of the activations from row0 times PANELS adjacent panels -> ROWS x
// (16 x PANELS) outputs. Per scale group: int32 dot products of 4 values per lane
// (VNNI), then scaled into fp32 sums. `ahead` (or null): panels to ask for meanwhile.
// WIDE: 16-bit activations, two dot products per word (high and low bytes).
template <QType T, bool WIDE, int ROWS, int PANELS, typename out_t>
inline void multiply_tile(const Activations& a, int64_t row0, const uint8_t* panel,
                          int64_t panel_bytes, const char* ahead, const float* bias, out_t* out,
                          int64_t out_stride) {
  const int64_t blocks = a.blocks;
  const TileRows<ROWS> rows(a, row0);
  const auto& [x, x_low, x_scale, x_offset, x_sum] = rows;
  __m512 acc[ROWS][PANELS];
  for (int r = 0; r < ROWS; ++r) {
    for (int j = 0; j < PANELS; ++j) {
      acc[r][j] = bias ? _mm512_loadu_ps(bias + j * kPanel) : _mm512_setzero_ps();
    }
  }
  const uint8_t* block_factors[PANELS];
  const uint8_t* super_factors[PANELS];
  for (int j = 0; j < PANELS; ++j) {
    block_factors[j] = panel + j * panel_bytes + blocks * value_bytes(T);
    super_factors[j] = block_factors[j] + blocks * block_factor_bytes(T);
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // A lone tile row sums each block in two chains of dot instructions (halving their
  // latency); more rows or panels give the core independent chains enough, as do
  // wide activations' high and low sums.
  constexpr int kChains = ROWS * PANELS <= 2 && groups(T) == 1 && !WIDE ? 2 : 1;
  // Each block's share of the panels ahead, in memory order.
  const int64_t ahead_bytes = (panel_bytes + blocks - 1) / blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    if (ahead) {
      for (int j = 0; j < PANELS; ++j) {
        for (int64_t at = b * ahead_bytes & ~int64_t{63}; at < (b + 1) * ahead_bytes; at += 64) {
          _mm_prefetch(ahead + j * panel_bytes + at, _MM_HINT_T0);
        }
      }
    }
    const uint8_t* w = panel + b * value_bytes(T);
    for (int g = 0; g < groups(T); ++g) {
      // WIDE: the offset (of the 16-bit values' sum) goes into the low bytes' sums,
      // which are not multiplied by 256.
      __m512i isum[kChains][ROWS][PANELS];
      __m512i low_sum[ROWS][PANELS];
      for (int r = 0; r < ROWS; ++r) {
        for (int j = 0; j < PANELS; ++j) {
          const __m512i offset = _mm512_set1_epi32(x_offset[r][2 * b + g]);
          isum[0][r][j] = WIDE ? _mm512_setzero_si512() : offset;
          if constexpr (WIDE) low_sum[r][j] = offset;
          if constexpr (kChains == 2) isum[1][r][j] = _mm512_setzero_si512();
        }
      }
      if constexpr (is_8_bit(T)) {
        for (int i = 0; i < 8; ++i) {  // word i: values 4i .. 4i + 3
          __m512i wv[PANELS];
          for (int j = 0; j < PANELS; ++j) wv[j] = _mm512_loadu_si512(w + j * panel_bytes + i * 64);
          for (int r = 0; r < ROWS; ++r) {
            for (int j = 0; j < PANELS; ++j) {
              dot_word<WIDE>(isum[i % kChains][r][j], low_sum[r][j], wv[j], x[r], x_low[r],
                             b * 8 + i);
            }
          }
        }
      } else if constexpr (T == QType::Q6_K) {
        // Group g: the low (g = 0) or high nibbles of the 4 words, values 16g + 4i ..
        __m512i highs[PANELS];
        for (int j = 0; j < PANELS; ++j) {
          highs[j] = _mm512_loadu_si512(w + j * panel_bytes + 256 + g * 64);
        }
        for (int i = 0; i < 4; ++i) {
          __m512i wv[PANELS];
          for (int j = 0; j < PANELS; ++j) {
            const __m512i nibbles = _mm512_loadu_si512(w + j * panel_bytes + i * 64);
            const __m512i low = g == 0 ? _mm512_and_si512(nibbles, low4)
                                       : _mm512_and_si512(_mm512_srli_epi16(nibbles, 4), low4);
            wv[j] = q6_values(low, highs[j], i);
          }
          for (int r = 0; r < ROWS; ++r) {
            for (int j = 0; j < PANELS; ++j) {
              dot_word<WIDE>(isum[0][r][j], low_sum[r][j], wv[j], x[r], x_low[r],
                             b * 8 + 4 * g + i);
            }
          }
        }
      } else {
        __m512i highs[PANELS];  // the 5-bit types' fifth bits, after the 4 words
        if constexpr (is_5_bit(T)) {
          for (int j = 0; j < PANELS; ++j) highs[j] = _mm512_loadu_si512(w + j * panel_bytes + 256);
        }
        for (int i = 0; i < 4; ++i) {  // word i: values 4i .. 4i + 3 low, 16 + 4i .. high
          __m512i lo[PANELS], hi[PANELS];
          for (int j = 0; j < PANELS; ++j) {
            const __m512i wv = _mm512_loadu_si512(w + j * panel_bytes + i * 64);
            lo[j] = _mm512_and_si512(wv, low4);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(wv, 4), low4);
            if constexpr (is_5_bit(T)) q5_values(lo[j], hi[j], highs[j], i);
          }
          for (int r = 0; r < ROWS; ++r) {
            for (int j = 0; j < PANELS; ++j) {
              dot_word<WIDE>(isum[0][r][j], low_sum[r][j], lo[j], x[r], x_low[r], b * 8 + i);
            }
          }
          for (int r = 0; r < ROWS; ++r) {
            for (int j = 0; j < PANELS; ++j) {
              dot_word<WIDE>(isum[kChains - 1][r][j], low_sum[r][j], hi[j], x[r], x_low[r],
                             b * 8 + 4 + i);
            }
          }
        }
      }
      for (int j = 0; j < PANELS; ++j) {
        const __m512 d = weight_scale<T>(block_factors[j], super_factors[j], b, g);
        for (int r = 0; r < ROWS; ++r) {
          __m512i sum = isum[0][r][j];
          if constexpr (kChains == 2) sum = _mm512_add_epi32(sum, isum[1][r][j]);
          if constexpr (WIDE) sum = _mm512_add_epi32(_mm512_slli_epi32(sum, 8), low_sum[r][j]);
          acc[r][j] = add_scaled(acc[r][j], sum, d, x_scale[r][b]);
        }
      }
    }
    if constexpr (has_min(T)) {
      for (int j = 0; j < PANELS; ++j) {
        const __m512 m = weight_min<T>(block_factors[j], super_factors[j], b);
        for (int r = 0; r < ROWS; ++r) {
          acc[r][j] = _mm512_fmadd_ps(m, _mm512_set1_ps(x_sum[r][b]), acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int j = 0; j < PANELS; ++j) store16(out + r * out_stride + j * kPanel, acc[r][j]);
  }
}

// Rows per tile: PANELS x ROWS fp32 sums and as many int32 sums stay in registers
// (2 x 6: 24 of the 32); wide activations keep twice the int32 sums (2 x 4: 24).
template <bool WIDE, int PANELS>
constexpr int kTileRows = PANELS == 1 ? (WIDE ? 6 : 8) : (WIDE ? 4 : 6);
// Up to this many rows a thread walks its panels one at a time (one stream from
// memory, which a lone row reads faster); past it two at a time, each activation
// word then feeding two dot instructions. With the weights streamed from memory, as
// in a decode step, one panel's tiles stay ahead to 16 rows: a 16-row Gemma-3-270M
// step (2 threads) took 15.3 ms where two panels' tiles of 6 (16-bit: 4) rows took
// 17.2, its Q8_0 lm_head 4.6 ms where they took 5.5; in cache two panels are faster
// there (by 8-13% on its 16-bit projections).
constexpr int64_t kFewRows = 16;

template <QType T, bool WIDE, int PANELS, typename out_t, int ROWS = kTileRows<WIDE, PANELS>>
inline void multiply_rows(int64_t rows, const Activations& a, int64_t row0, const uint8_t* panel,
                          int64_t panel_bytes, const char* ahead, const float* bias, out_t* out,
                          int64_t out_stride) {
  if constexpr (ROWS > 1) {
    if (rows < ROWS) {
      multiply_rows<T, WIDE, PANELS, out_t, ROWS - 1>(rows, a, row0, panel, panel_bytes, ahead,
                                                      bias, out, out_stride);
      return;
    }
  }
  multiply_tile<T, WIDE, ROWS, PANELS>(a, row0, panel, panel_bytes, ahead, bias, out, out_stride);
}

// PANELS adjacent panels from p for all rows: rows spread evenly over the fewest
// tiles (17 rows: 6 + 6 + 5, not 8 + 8 + 1).
template <QType T, bool WIDE, int PANELS, typename out_t>
inline void multiply_panels(const Activations& a, int64_t rows, const uint8_t* packed, int64_t p,
                            int64_t panel_bytes, const char* ahead, const float* bias, out_t* out,
                            int64_t n) {
  constexpr int64_t kRows = kTileRows<WIDE, PANELS>;
  const uint8_t* panel = packed + p * panel_bytes;
  const int64_t tiles = (rows + kRows - 1) / kRows;
  for (int64_t t = 0, r0 = 0; t < tiles; ++t) {
    const int64_t count = rows / tiles + (t < rows % tiles ? 1 : 0);
    // The first tile asks for what comes next; later ones find it in cache.
    multiply_rows<T, WIDE, PANELS>(count, a, r0, panel, panel_bytes, r0 == 0 ? ahead : nullptr,
                             bias ? bias + p * kPanel : nullptr, out + r0 * n + p * kPanel, n);
    r0 += count;
  }
}

// Panels begin .. end - 1, STEP at a time, each step asking for the step after next
// (at 1 row 5-8% faster than for the next one; the hardware's prefetch covers the
// first two).
template <QType T, bool WIDE, int STEP, typename out_t>
void multiply_range(const Activations& a, int64_t rows, const uint8_t* packed, int64_t begin,
                    int64_t end, int64_t panel_bytes, const float* bias, out_t* out, int64_t n) {
  int64_t p = begin;
  for (; p + STEP <= end; p += STEP) {
    const uint8_t* ahead = p + 3 * STEP <= end ? packed + (p + 2 * STEP) * panel_bytes : nullptr;
    multiply_panels<T, WIDE, STEP>(a, rows, packed, p, panel_bytes, reinterpret_cast<const char*>(ahead),
                             bias, out, n);
  }
  for (; p < end; ++p) {
    multiply_panels<T, WIDE, 1>(a, rows, packed, p, panel_bytes, nullptr, bias, out, n);
  }
}

}  // namespace
#endif

#if defined(QUANTIZED_LINEAR_BUILT)
namespace {

// The least panels a thread takes: waking the other thread for fewer costs more than it
// saves (kMinThreadWork).
int64_t panel_grain(int64_t rows, int64_t panel_bytes) {
  return std::max<int64_t>(1, kMinThreadWork / (panel_bytes * rows));
}

// The threads worth waking for `panels` panels: each takes at least a grain of them.
int64_t panel_shares(int64_t rows, int64_t panels, int64_t panel_bytes, int64_t threads) {
  const int64_t grain = panel_grain(rows, panel_bytes);
  return std::max<int64_t>(1, std::min(threads, (panels + grain - 1) / grain));
}

// Share `thread` of `threads` of the panels (none past the shares worth a thread), as
// at::parallel_for(0, panels, grain) splits them.
template <QType T, bool WIDE, typename out_t>
void multiply_share(const Activations& a, int64_t rows, const uint8_t* packed, int64_t panels,
                    int64_t panel_bytes, const float* bias, out_t* out, int64_t thread,
                    int64_t threads) {
  const int64_t used = panel_shares(rows, panels, panel_bytes, threads);
  if (thread >= used) return;
  const auto [begin, end] = even_share(panels, thread, used);
  const int64_t n = panels * kPanel;
#if defined(QUANTIZED_LINEAR_VNNI)
  if (rows >= quantized_linear_amx::kAmxRows &&
      quantized_linear_amx::multiply_range(T, WIDE, a, rows, packed, begin, end, panel_bytes,
                                           bias, out, n)) {
    return;
  }
  if (rows <= kFewRows) {
    multiply_range<T, WIDE, 1>(a, rows, packed, begin, end, panel_bytes, bias, out, n);
  } else {
    multiply_range<T, WIDE, 2>(a, rows, packed, begin, end, panel_bytes, bias, out, n);
  }
#else
  quantized_linear_avx2::multiply_range(T, WIDE, a, rows, packed, begin, end, panel_bytes, bias,
                                        out, n);
#endif
}

}  // namespace
#endif

struct QuantizedLinearWork::Plan {
  QType type;
  bool wide;
  int64_t rows, panels, panel_bytes;
  at::Tensor packed, bias, activations;  // activations: the buffer `quantized` points into
#if defined(QUANTIZED_LINEAR_BUILT)
  Activations quantized;
#endif
};

QuantizedLinearWork::QuantizedLinearWork(const at::Tensor& x, const at::Tensor& packed,
                                         const std::string& qtype,
                                         const std::optional<at::Tensor>& bias,
                                         int64_t activation_bits) {
  TORCH_CHECK(quantized_linear_available(), "built without AVX2, FMA and F16C");
  auto made = std::make_shared<Plan>();
  plan_ = made;
  Plan& plan = *made;
  plan.type = parse_qtype(qtype);
  TORCH_CHECK(activation_bits == 8 || activation_bits == 16, "activation_bits is 8 or 16");
  plan.wide = activation_bits == 16;
  TORCH_CHECK(x.is_cpu() && x.dim() == 2 &&
                  (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "x [M, K] bf16 or fp32 on the CPU");
  const int64_t rows = x.size(0), k = x.size(1);
  TORCH_CHECK(k % file_block_values(plan.type) == 0, "K must be whole ", qtype, " blocks");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(1) == kPanel * packed_row_bytes(plan.type, k),
              "packed weight does not fit x");
  plan.rows = rows;
  plan.panels = packed.size(0);
  plan.panel_bytes = packed.size(1);
  plan.packed = packed;
  const int64_t n = plan.panels * kPanel;
  if (bias.has_value() && bias->defined()) {
    plan.bias = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(plan.bias.numel() == n, "bias [N]");
  }
  out = tensors::empty({rows, n}, x.options());
#if defined(QUANTIZED_LINEAR_BUILT)
  if (rows == 0) return;
  const at::Tensor xc = x.contiguous();
  plan.quantized =
      x.scalar_type() == at::kFloat
          ? quantize_activations(xc.data_ptr<float>(), rows, k, plan.type, plan.wide,
                                 plan.activations)
          : quantize_activations(xc.data_ptr<at::BFloat16>(), rows, k, plan.type, plan.wide,
                                 plan.activations);
#endif
}

void QuantizedLinearWork::run_share(int64_t thread, int64_t threads) const {
#if defined(QUANTIZED_LINEAR_BUILT)
  const Plan& plan = *plan_;
  if (plan.rows == 0) return;
  const float* bp = plan.bias.defined() ? plan.bias.data_ptr<float>() : nullptr;
  const uint8_t* wp = plan.packed.data_ptr<uint8_t>();
  auto run = [&](auto* op) {
    using out_t = std::remove_pointer_t<decltype(op)>;
    auto with = [&](auto type) {
      constexpr QType T = decltype(type)::value;
      if (plan.wide) {
        multiply_share<T, true, out_t>(plan.quantized, plan.rows, wp, plan.panels,
                                       plan.panel_bytes, bp, op, thread, threads);
      } else {
        multiply_share<T, false, out_t>(plan.quantized, plan.rows, wp, plan.panels,
                                        plan.panel_bytes, bp, op, thread, threads);
      }
    };
    with_qtype(plan.type, with);
  };
  if (out.scalar_type() == at::kFloat) {
    run(out.data_ptr<float>());
  } else {
    run(out.data_ptr<at::BFloat16>());
  }
#endif
}

int64_t QuantizedLinearWork::useful_shares() const {
#if defined(QUANTIZED_LINEAR_BUILT)
  const Plan& plan = *plan_;
  if (plan.rows == 0) return 1;
  return panel_shares(plan.rows, plan.panels, plan.panel_bytes, at::get_num_threads());
#else
  return 1;
#endif
}

// x [M, K] bf16 or fp32, packed from pack_quantized_weight(qtype), bias [N] or None
// -> [M, N] in x's dtype. activation_bits: x quantized per block of 32 to int8 (8), or
// to 16 bits (16: 256x finer steps, for activations whose blocks hold an outlier that
// leaves the others few of int8's levels; each weight word then feeds two dot
// instructions instead of one).
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& packed, const std::string& qtype,
                            const std::optional<at::Tensor>& bias, int64_t activation_bits) {
  const QuantizedLinearWork work(x, packed, qtype, bias, activation_bits);
  run_in_shares(work);
  return work.out;
}

// x [R, K] fp32 whose rows come in groups (group g: rows row_offsets[g] ..
// row_offsets[g + 1] - 1), each group times its own packed weight (weights[g]: `panels`
// panels of panel_bytes, as pack_quantized_weight lays them out) -> out [R, panels x 16]
// fp32. One pass over all groups' weights, split among the threads by work (a unit is
// ~256 KiB of one weight's panels, its cost its bytes times its rows plus a constant
// for streaming them): a mixture-of-experts step's active experts, each read once for
// all its tokens (kernels/csrc/moe_cpu.cpp).
void quantized_linear_grouped(const at::Tensor& x, const std::vector<int64_t>& row_offsets,
                              const std::vector<const uint8_t*>& weights, int64_t panels,
                              int64_t panel_bytes, const std::string& qtype,
                              int64_t activation_bits, at::Tensor& out) {
  TORCH_CHECK(quantized_linear_available(), "built without AVX2, FMA and F16C");
  const QType t = parse_qtype(qtype);
  TORCH_CHECK(activation_bits == 8 || activation_bits == 16, "activation_bits is 8 or 16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x [R, K] fp32, contiguous");
  TORCH_CHECK(row_offsets.size() == weights.size() + 1, "one run of rows per weight");
  const int64_t rows = x.size(0), k = x.size(1), n = panels * kPanel;
  TORCH_CHECK(k % file_block_values(t) == 0, "K must be whole ", qtype, " blocks");
  TORCH_CHECK(panel_bytes == kPanel * packed_row_bytes(t, k), "packed weights do not fit x");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) == rows &&
                  out.size(1) == n,
              "out [R, N] fp32");
  TORCH_CHECK(row_offsets.front() == 0 && row_offsets.back() == rows, "the groups cover x");
  if (rows == 0) return;
#if defined(QUANTIZED_LINEAR_BUILT)
  at::Tensor buffer;
  const Activations a =
      quantize_activations(x.data_ptr<float>(), rows, k, t, activation_bits == 16, buffer);
  const bool wide = activation_bits == 16;
  // Units of work: (group, first panel, end panel).
  const int64_t unit = std::max<int64_t>(2, kGroupedUnitBytes / panel_bytes / 2 * 2);
  std::vector<std::array<int64_t, 3>> units;
  std::vector<int64_t> work;
  for (size_t g = 0; g + 1 < row_offsets.size(); ++g) {
    const int64_t group_rows = row_offsets[g + 1] - row_offsets[g];
    if (group_rows == 0) continue;
    for (int64_t p = 0; p < panels; p += unit) {
      const int64_t end = std::min(panels, p + unit);
      units.push_back({static_cast<int64_t>(g), p, end});
      work.push_back((end - p) * (group_rows + 4));
    }
  }
  float* op = out.data_ptr<float>();
  parallel_for_by_work(work, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t g = units[i][0], begin = units[i][1], end = units[i][2];
      const int64_t row0 = row_offsets[g], group_rows = row_offsets[g + 1] - row0;
      const Activations ag = rows_from(a, row0);
#if defined(QUANTIZED_LINEAR_VNNI)
      if (group_rows >= quantized_linear_amx::kAmxRows &&
          quantized_linear_amx::multiply_range(t, wide, ag, group_rows, weights[g], begin, end,
                                               panel_bytes, nullptr, op + row0 * n, n)) {
        continue;  // an expert with many tokens (a prefill's) on AMX's tiles
      }
      with_qtype(t, [&](auto type) {
        auto run = [&](auto wide_values) {
          constexpr QType T = decltype(type)::value;
          constexpr bool W = decltype(wide_values)::value;
          if (group_rows <= kFewRows) {
            multiply_range<T, W, 1, float>(ag, group_rows, weights[g], begin, end, panel_bytes,
                                           nullptr, op + row0 * n, n);
          } else {
            multiply_range<T, W, 2, float>(ag, group_rows, weights[g], begin, end, panel_bytes,
                                           nullptr, op + row0 * n, n);
          }
        };
        if (wide) {
          run(std::true_type{});
        } else {
          run(std::false_type{});
        }
      });
#else
      quantized_linear_avx2::multiply_range(t, wide, ag, group_rows, weights[g], begin, end,
                                            panel_bytes, nullptr, op + row0 * n, n);
#endif
    }
  });
#endif
}
