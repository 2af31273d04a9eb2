// y = x W^T + b with W kept in its GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K, Q6_K) or as weight-only int8 with one scale per output row (I8), on
// AVX512-VNNI: a decode step streams 0.56-1.06 bytes per weight instead of bf16's 2.
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
// group's sum 256 x (h's sum) + l's. Measured on one thread, in cache, on Gemma-3-270M's
// shapes: at 1 row 5-17% more time than int8, at 8-128 rows 1.4-1.8x.
//
// Why int8 and not tiles of the weight dequantized to bf16 for linear_packed's dot
// instruction: one VPDPBUSD is 64 multiply-adds where VDPBF16PS is 32, and in cache,
// at 64-512 rows, one core (Zen 5) ran 750-800 GOP/s on Q8_0 and Q4_0, 700 on Q4_1,
// 670 on Q4_K and 510 on Q6_K (whose 6-bit unpacking and two scales per block cost
// more) where the bf16 kernel ran 550 GFLOP/s: a dequantizing kernel, bounded by the
// bf16 rate, would be slower for every type but maybe Q6_K, and that only by ~10%. At
// 1 row all are bound by memory; there the per-call costs (the fork of a second
// thread: ~2.5 us; quantizing x) weigh most on the small 4-bit weights.
//
// Layout (pack_quantized_weight): panels of 16 outputs, per block of 32 values their
// words of 4 values for the 16 lanes, then the blocks' scales, then the super-blocks'.
// Tiles: up to 8 rows x 1 panel for up to 16 rows (kFewRows), else 6 rows x 2 panels
// (24 of the 32 registers hold sums); each weight word is loaded and unpacked once per
// tile for all its rows. A thread walks its run of panels in memory order and asks for the step
// after next while it multiplies one.
//
// Measured (python -m bench.kernels --cpu-linear: SmolLM2-135M's projections, 2
// threads, weights streamed from memory, a shared 2-core machine): at 1 row Q8_0 1.9x
// the bf16 kernel's speed, Q4_0 / Q4_1 2.9x, Q4_K 2.6x, Q6_K 2.4x (42-52 GB/s of
// weights, bf16 52-56); at 128-512 rows Q8_0 and Q4_0 1.4-1.5x, Q4_1 1.3-1.4x, Q4_K
// 1.2x, Q6_K 0.9x (1.0-1.5 TFLOP/s, i.e. int8 TOP/s).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
#include "parallel_by_work.h"
#include "vector_math.h"
#include "work_in_shares.h"

// AVX512-BF16 is not needed (Cascade Lake and Ice Lake have VNNI without it): only a
// bf16 output's rounding would use it, and integer arithmetic rounds the same
// (vector_math.h's round_to_bf16).
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QUANTIZED_LINEAR_BUILT 1
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kPanel = 16;   // outputs per panel: one int32 lane each
constexpr int64_t kBlock = 32;   // values per block of activations, and of weights' scales
constexpr int64_t kSuper = 256;  // values per K-quant super-block
constexpr int64_t kBlocksPerSuper = kSuper / kBlock;
constexpr int64_t kQuantizeGrain = 16;  // activation rows per task
// A thread's least share of a call, in weight bytes x rows: below it, waking the
// other thread costs more than it saves (at 1 row, a 192 x 576 Q4_1 weight ran
// alone 5% faster; SmolLM2's merged projections all split).
constexpr int64_t kMinThreadWork = 128 << 10;

enum class QType { Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, I8 };

QType parse_qtype(const std::string& name) {
  if (name == "Q8_0") return QType::Q8_0;
  if (name == "Q4_0") return QType::Q4_0;
  if (name == "Q4_1") return QType::Q4_1;
  if (name == "Q5_0") return QType::Q5_0;
  if (name == "Q5_1") return QType::Q5_1;
  if (name == "Q4_K") return QType::Q4_K;
  if (name == "Q5_K") return QType::Q5_K;
  if (name == "Q6_K") return QType::Q6_K;
  if (name == "I8") return QType::I8;
  TORCH_CHECK(false, "quantized_linear does not take ", name);
}

constexpr bool is_k_quant(QType t) {
  return t == QType::Q4_K || t == QType::Q5_K || t == QType::Q6_K;
}
// A byte per value, offset by 128 when packed: the same panels and dot products.
constexpr bool is_8_bit(QType t) { return t == QType::Q8_0 || t == QType::I8; }
// The 4-bit types' nibbles plus a fifth bit per value: their panels add a word of those.
constexpr bool is_5_bit(QType t) {
  return t == QType::Q5_0 || t == QType::Q5_1 || t == QType::Q5_K;
}
// Q4_K and Q5_K: d, dmin and 6-bit scales and mins per 32 values, packed in 12 bytes.
constexpr bool has_6_bit_scales(QType t) { return t == QType::Q4_K || t == QType::Q5_K; }
// One block of one row in the file: its values, its bytes.
constexpr int64_t file_block_values(QType t) { return is_k_quant(t) ? kSuper : kBlock; }
constexpr int64_t file_block_bytes(QType t) {
  switch (t) {
    case QType::Q8_0: return 34;   // fp16 d, 32 int8
    case QType::Q4_0: return 18;   // fp16 d, 16 bytes of nibbles
    case QType::Q4_1: return 20;   // fp16 d, fp16 m, 16 bytes of nibbles
    case QType::Q5_0: return 22;   // fp16 d, 4 bytes of fifth bits, 16 of nibbles
    case QType::Q5_1: return 24;   // fp16 d, fp16 m, 4 bytes of fifth bits, 16 of nibbles
    case QType::Q4_K: return 144;  // fp16 d, fp16 dmin, 12 of scales and mins, 128 of nibbles
    case QType::Q5_K: return 176;  // as Q4_K, with 32 bytes of fifth bits before the nibbles
    case QType::I8: return 32;     // 32 int8; the row's scale comes beside the data
    default: return 210;           // Q6_K: 128 of low nibbles, 64 of 2-bit highs, 16 scales, d
  }
}
// Per 32 values of a panel's 16 outputs: the values' bytes (Q8_0, I8 a byte each, Q6_K a
// nibble plus 2 bits, the 5-bit types a nibble plus 1, the others a nibble) and their
// scales' (see pack_quantized_weight).
constexpr int64_t value_bytes(QType t) {
  return is_8_bit(t) ? 512 : t == QType::Q6_K ? 384 : is_5_bit(t) ? 320 : 256;
}
constexpr int64_t block_factor_bytes(QType t) {
  return t == QType::Q4_1 || t == QType::Q5_1 ? 64 : t == QType::I8 ? 0 : 32;
}
// Per 256 values of a panel's 16 outputs (K-quants): the super-block's fp16 scales.
constexpr int64_t super_factor_bytes(QType t) {
  return has_6_bit_scales(t) ? 64 : t == QType::Q6_K ? 32 : 0;
}
// Per panel (I8): the 16 rows' fp32 scales.
constexpr int64_t panel_factor_bytes(QType t) { return t == QType::I8 ? 64 : 0; }
// value = d q + m: the dot product also needs the activations' sum, times m.
constexpr bool has_min(QType t) {
  return t == QType::Q4_1 || t == QType::Q5_1 || has_6_bit_scales(t);
}
// Scales per 32 values (Q6_K has one per 16).
constexpr int groups(QType t) { return t == QType::Q6_K ? 2 : 1; }
// What the stored unsigned values are offset by: sum (q - c) x = sum q x - c sum x.
constexpr int32_t value_offset(QType t) {
  if (is_8_bit(t)) return 128;
  return t == QType::Q6_K ? 32 : t == QType::Q5_0 ? 16 : t == QType::Q4_0 ? 8 : 0;
}

// Packed bytes per output of k inputs: the file's (Q4_K, Q5_K: 4 more per 256 values;
// I8: k plus its fp32 scale).
int64_t packed_row_bytes(QType t, int64_t k) {
  return k / kBlock * (value_bytes(t) + block_factor_bytes(t)) / kPanel +
         k / kSuper * super_factor_bytes(t) / kPanel + panel_factor_bytes(t) / kPanel;
}

// One file block of one row, decoded: each value as the kernel multiplies it (Q8_0's
// int8 plus 128, Q6_K's 6 bits, the 5-bit types' 5, the others' 4) and the fp16 bits /
// small ints of its scales.
struct Decoded {
  uint8_t q[kSuper];
  uint16_t d, m;       // blocks of 32: scale and (Q4_1, Q5_1) min; K-quants: d and dmin
  uint8_t scale[16];   // Q4_K, Q5_K: 6-bit scale per 32 values; Q6_K: int8 scale per 16
  uint8_t min[8];      // Q4_K, Q5_K: 6-bit min per 32 values
};

void decode(QType t, const uint8_t* block, Decoded& out) {
  switch (t) {
    case QType::Q8_0:
      std::memcpy(&out.d, block, 2);
      for (int i = 0; i < 32; ++i) out.q[i] = static_cast<uint8_t>(block[2 + i] ^ 0x80);
      break;
    case QType::I8:
      for (int i = 0; i < 32; ++i) out.q[i] = static_cast<uint8_t>(block[i] ^ 0x80);
      break;
    case QType::Q4_0:
    case QType::Q4_1:
    case QType::Q5_0:
    case QType::Q5_1: {  // d, (m), (the 5-bit types: 32 fifth bits), 16 bytes of nibbles
      const uint8_t* highs = block + (has_min(t) ? 4 : 2);
      const uint8_t* nibbles = highs + (is_5_bit(t) ? 4 : 0);
      std::memcpy(&out.d, block, 2);
      if (has_min(t)) std::memcpy(&out.m, block + 2, 2);
      for (int i = 0; i < 16; ++i) {
        out.q[i] = nibbles[i] & 0x0F;
        out.q[i + 16] = nibbles[i] >> 4;
      }
      if (is_5_bit(t)) {  // value i's: bit i of a little-endian uint32
        for (int i = 0; i < 32; ++i) out.q[i] |= ((highs[i / 8] >> (i % 8)) & 1) << 4;
      }
      break;
    }
    case QType::Q4_K:
    case QType::Q5_K: {  // d, dmin, 12 bytes of 6-bit scales and mins, (Q5_K: 32 bytes of
                         // fifth bits), 128 of nibbles
      std::memcpy(&out.d, block, 2);
      std::memcpy(&out.m, block + 2, 2);
      const uint8_t* s = block + 4;
      for (int j = 0; j < 4; ++j) {
        out.scale[j] = s[j] & 63;
        out.min[j] = s[j + 4] & 63;
        out.scale[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 6) << 4);
        out.min[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
      }
      const uint8_t* qh = block + 16;  // Q5_K: bit p of byte i is value 32p + i's fifth
      const uint8_t* qs = qh + (t == QType::Q5_K ? 32 : 0);
      for (int p = 0; p < 4; ++p) {  // 32 bytes per 64 values: low nibbles, then high
        for (int i = 0; i < 32; ++i) {
          out.q[64 * p + i] = qs[32 * p + i] & 0x0F;
          out.q[64 * p + 32 + i] = qs[32 * p + i] >> 4;
        }
      }
      if (t == QType::Q5_K) {
        for (int v = 0; v < kSuper; ++v) out.q[v] |= ((qh[v % 32] >> (v / 32)) & 1) << 4;
      }
      break;
    }
    case QType::Q6_K: {  // 128 bytes of low nibbles, 64 of 2-bit highs, 16 scales, d
      const uint8_t *ql = block, *qh = block + 128;
      std::memcpy(out.scale, block + 192, 16);
      std::memcpy(&out.d, block + 208, 2);
      for (int h = 0; h < 2; ++h) {  // halves of 128 values
        for (int v = 0; v < 128; ++v) {
          const int low = (ql[64 * h + v % 64] >> (4 * (v / 64))) & 0x0F;
          const int high = (qh[32 * h + v % 32] >> (2 * (v / 32))) & 0x03;
          out.q[128 * h + v] = static_cast<uint8_t>(low | high << 4);
        }
      }
      break;
    }
  }
}

}  // namespace

bool quantized_linear_available() {
#if defined(QUANTIZED_LINEAR_BUILT)
  return true;
#else
  return false;
#endif
}

// data uint8 [N, row_bytes] (each row its file blocks; I8: its int8 values as bytes,
// with `scales` fp32 [N]), N % 16 == 0 -> uint8 [N / 16, panel bytes]: panel p holds
// outputs 16p .. 16p + 15 in three parts (I8: values, then the 16 scales).
//
// Values, per block of 32: [words][16 outputs][4 bytes], so that one 64-byte load
// gives each of the 16 int32 lanes one output's 4 bytes.
//   Q8_0, I8: 8 words, word w = values 4w .. 4w + 3 plus 128 (unsigned bytes).
//   4-bit: 4 words of nibbles, word w = values 4w .. 4w + 3 in the low nibbles and
//     16 + 4w .. 16 + 4w + 3 in the high ones (Q4_0/Q4_1: the file's bytes 4w .. 4w + 3).
//   Q6_K: the low 4 bits as the 4-bit types, then two words of the top 2 bits: byte t
//     of the first holds those of values 4w + t (w = 0..3) at bits 2w, 2w + 1; the
//     second those of values 16 + 4w + t.
//   5-bit (Q5_0, Q5_1, Q5_K): the low 4 bits as the 4-bit types, then one word of the
//     fifth bits: byte t holds those of values 4w + t (w = 0..3) at bit w and of values
//     16 + 4w + t at bit 4 + w.
// Block factors, per block of 32, [16 outputs] each: Q8_0/Q4_0/Q5_0: fp16 scale;
//   Q4_1/Q5_1: fp16 scale, then fp16 min; Q4_K/Q5_K: 6-bit scale, then 6-bit min, a
//   byte each; Q6_K: the two int8 scales of its halves.
// Super-block factors (K-quants), per 256 values: Q4_K/Q5_K: fp16 d, then fp16 dmin;
//   Q6_K: fp16 d.
// The same bytes as the file's (Q4_K, Q5_K: 4 more per 256 values: their 6-bit scales
// take a byte each).
at::Tensor pack_quantized_weight(const at::Tensor& data, const std::string& qtype,
                                 const std::optional<at::Tensor>& scales) {
  const QType t = parse_qtype(qtype);
  TORCH_CHECK(data.dim() == 2 && data.scalar_type() == at::kByte, "data [N, row_bytes] uint8");
  const int64_t n = data.size(0), row_bytes = data.size(1), fb = file_block_bytes(t);
  TORCH_CHECK((t == QType::I8) == (scales.has_value() && scales->defined()),
              "scales [N] go with I8 weights, and only with them");
  at::Tensor row_scales;
  if (t == QType::I8) {
    row_scales = scales->to(at::kFloat).contiguous();
    TORCH_CHECK(row_scales.numel() == n, "scales [N]");
  }
  TORCH_CHECK(n % kPanel == 0, "N must be a multiple of 16");
  TORCH_CHECK(row_bytes % fb == 0, "row_bytes must be whole ", qtype, " blocks");
  const int64_t k = row_bytes / fb * file_block_values(t), blocks = k / kBlock;
  auto src_t = data.contiguous();
  const int64_t panel_bytes = kPanel * packed_row_bytes(t, k);
  auto packed = at::zeros({n / kPanel, panel_bytes}, data.options());
  const uint8_t* src = src_t.data_ptr<uint8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  const int64_t vb = value_bytes(t), bfb = block_factor_bytes(t), sfb = super_factor_bytes(t);
  at::parallel_for(0, n / kPanel, 1, [&](int64_t begin, int64_t end) {
    Decoded dec;
    for (int64_t p = begin; p < end; ++p) {
      uint8_t* values = dst + p * panel_bytes;
      uint8_t* block_factors = values + blocks * vb;
      uint8_t* super_factors = block_factors + blocks * bfb;
      if (t == QType::I8) {
        std::memcpy(super_factors, row_scales.data_ptr<float>() + p * kPanel, 4 * kPanel);
      }
      for (int64_t j = 0; j < kPanel; ++j) {
        const uint8_t* row = src + (p * kPanel + j) * row_bytes;
        for (int64_t f = 0; f < row_bytes / fb; ++f) {
          decode(t, row + f * fb, dec);
          const int64_t first = f * file_block_values(t) / kBlock;  // its first block of 32
          if (is_k_quant(t)) {
            uint16_t* s = reinterpret_cast<uint16_t*>(super_factors + f * sfb);
            s[j] = dec.d;
            if (has_min(t)) s[kPanel + j] = dec.m;
          }
          for (int64_t i = 0; i < file_block_values(t) / kBlock; ++i) {
            const uint8_t* q = dec.q + i * kBlock;
            const int64_t b = first + i;
            uint8_t* v = values + b * vb;
            uint8_t* bf = block_factors + b * bfb;
            if (is_8_bit(t)) {
              for (int w = 0; w < 8; ++w) std::memcpy(v + (w * kPanel + j) * 4, q + 4 * w, 4);
            } else {
              for (int w = 0; w < 4; ++w) {
                for (int c = 0; c < 4; ++c) {
                  const int low = q[4 * w + c] & 0x0F, high = q[16 + 4 * w + c] & 0x0F;
                  v[(w * kPanel + j) * 4 + c] = static_cast<uint8_t>(low | high << 4);
                }
              }
            }
            if (is_5_bit(t)) {
              for (int c = 0; c < 4; ++c) {
                uint8_t highs = 0;
                for (int w = 0; w < 4; ++w) {
                  highs |= (q[4 * w + c] >> 4) << w | (q[16 + 4 * w + c] >> 4) << (4 + w);
                }
                v[4 * 64 + j * 4 + c] = highs;
              }
            }
            if (t == QType::Q6_K) {
              for (int g = 0; g < 2; ++g) {
                for (int c = 0; c < 4; ++c) {
                  uint8_t highs = 0;
                  for (int w = 0; w < 4; ++w) highs |= (q[16 * g + 4 * w + c] >> 4) << (2 * w);
                  v[4 * 64 + g * 64 + j * 4 + c] = highs;
                }
                bf[g * kPanel + j] = dec.scale[2 * i + g];
              }
            } else if (has_6_bit_scales(t)) {
              bf[j] = dec.scale[i];
              bf[kPanel + j] = dec.min[i];
            } else if (t != QType::I8) {
              uint16_t* s = reinterpret_cast<uint16_t*>(bf);
              s[j] = dec.d;
              if (has_min(t)) s[kPanel + j] = dec.m;
            }
          }
        }
      }
    }
  });
  return packed;
}

#if defined(QUANTIZED_LINEAR_BUILT)
namespace {

// The activations quantized per block of 32: int8 values and, per row and block, the
// fp32 scale, per half block the int32 added to a scale group's int sum before
// scaling (minus the weights' offset times the values' sum: one group per block but
// Q6_K's two, the second then 0), and for the types with mins, scale times the
// values' sum. Wide (16-bit) activations are each 256 x a high int8 plus a low one,
// both multiplied by the same weight bytes (see quantize_row).
struct Activations {
  const int8_t* values;   // [M, K]: the int8 values, or the wide values' high bytes
  const float* scale;     // [M, blocks]
  const int32_t* offset;  // [M, blocks, 2]
  const float* sum;       // [M, blocks]
  int64_t k, blocks;
  const int8_t* low;      // [M, K]: the wide values' low bytes (null for int8)
};

inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const at::BFloat16* x) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// The largest quantized magnitude: int8's 127, or for wide activations 127 x 257 =
// 32639, the most whose high byte (v + 128) >> 8 stays within int8's -127 .. 127.
template <bool WIDE>
constexpr float kLevels = WIDE ? 32639.f : 127.f;

// Stores 16 quantized values: as int8, or (WIDE) as their high bytes h = (v + 128) >> 8
// in `q` and low bytes v - 256 h (-128 .. 127) in `low`.
template <bool WIDE>
inline void store_values(__m512i v, int8_t* q, int8_t* low) {
  if constexpr (WIDE) {
    const __m512i high = _mm512_srai_epi32(_mm512_add_epi32(v, _mm512_set1_epi32(128)), 8);
    const __m512i rest = _mm512_sub_epi32(v, _mm512_slli_epi32(high, 8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(high));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low), _mm512_cvtepi32_epi8(rest));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(v));
  }
}

// One row: v = round-half-even(x * (L / amax)) per block, scale amax / L, L = kLevels.
// L / amax is one IEEE division (the intrinsic, which -ffast-math does not turn into
// a reciprocal), so that kernels/linear_quantized.py's reference (quantize_activations)
// rounds to the same integers. Wide values' sums stay within int32: 32 x 32639 x 128
// (Q8_0's offset) is 2^27.
template <bool WIDE, typename scalar_t>
void quantize_row(const scalar_t* x, int64_t blocks, QType t, int8_t* q, int8_t* low,
                  float* scale, int32_t* offset, float* sum) {
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const int32_t c = -value_offset(t);
  const float levels = kLevels<WIDE>;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 lo = load16(x + b * kBlock), hi = load16(x + b * kBlock + 16);
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_and_ps(lo, magnitude), _mm512_and_ps(hi, magnitude)));
    const float inv =
        amax > 0.f ? _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(levels), _mm_set_ss(amax))) : 0.f;
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(inv)));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(inv)));
    int8_t* low_b = WIDE ? low + b * kBlock : nullptr;
    store_values<WIDE>(qlo, q + b * kBlock, low_b);
    store_values<WIDE>(qhi, q + b * kBlock + 16, WIDE ? low_b + 16 : nullptr);
    const int32_t s_lo = _mm512_reduce_add_epi32(qlo), s_hi = _mm512_reduce_add_epi32(qhi);
    scale[b] = _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(amax), _mm_set_ss(levels)));
    offset[2 * b] = groups(t) == 2 ? c * s_lo : c * (s_lo + s_hi);
    offset[2 * b + 1] = groups(t) == 2 ? c * s_hi : 0;
    sum[b] = scale[b] * static_cast<float>(s_lo + s_hi);
  }
}

// x [rows, K] quantized row by row (quantize_row) into one buffer, which `buffer` holds:
// values [rows, K] int8 (wide: their high bytes, then their low bytes [rows, K]), then per
// block the scales, 2 offsets and sums, 4 bytes each (K % 32 == 0: all aligned).
template <typename scalar_t>
Activations quantize_activations(const scalar_t* x, int64_t rows, int64_t k, QType t, bool wide,
                                 at::Tensor& buffer) {
  const int64_t blocks = k / kBlock, value_planes = wide ? 2 : 1;
  buffer = at::empty({value_planes * rows * k + 4 * 4 * rows * blocks}, at::kByte);
  int8_t* q = reinterpret_cast<int8_t*>(buffer.data_ptr<uint8_t>());
  int8_t* low = wide ? q + rows * k : nullptr;
  float* scale = reinterpret_cast<float*>(q + value_planes * rows * k);
  int32_t* offsets = reinterpret_cast<int32_t*>(scale + rows * blocks);
  float* sums = reinterpret_cast<float*>(offsets + 2 * rows * blocks);
  at::parallel_for(0, rows, kQuantizeGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (wide) {
        quantize_row<true>(x + r * k, blocks, t, q + r * k, low + r * k, scale + r * blocks,
                           offsets + 2 * r * blocks, sums + r * blocks);
      } else {
        quantize_row<false>(x + r * k, blocks, t, q + r * k, nullptr, scale + r * blocks,
                            offsets + 2 * r * blocks, sums + r * blocks);
      }
    }
  });
  return Activations{q, scale, offsets, sums, k, blocks, low};
}

inline void store16(float* out, __m512 v) { _mm512_storeu_ps(out, v); }
inline void store16(at::BFloat16* out, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), round_to_bf16(v));
}

inline __m512 load_fp16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m128i load16_bytes(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m512 load_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(load16_bytes(p)));
}
inline __m512 load_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16_bytes(p)));
}

// The 16 outputs' weight scale of scale group g of block b, in fp32 (K-quants: the
// super-block's d times the group's small integer scale: exact in fp32; I8: the rows'
// scales, the same for every block, after its 0 bytes of block factors).
template <QType T>
inline __m512 weight_scale(const uint8_t* block_factors, const uint8_t* super_factors, int64_t b,
                           int g) {
  const uint8_t* bf = block_factors + b * block_factor_bytes(T);
  if constexpr (is_k_quant(T)) {
    const __m512 d = load_fp16(super_factors + b / kBlocksPerSuper * super_factor_bytes(T));
    return _mm512_mul_ps(has_6_bit_scales(T) ? load_u8(bf) : load_i8(bf + g * kPanel), d);
  } else if constexpr (T == QType::I8) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(block_factors));
  } else {
    return load_fp16(bf);
  }
}

// The 16 outputs' min of block b: Q4_1's and Q5_1's fp16 m; Q4_K's and Q5_K's -dmin
// times its 6-bit min.
template <QType T>
inline __m512 weight_min(const uint8_t* block_factors, const uint8_t* super_factors, int64_t b) {
  const uint8_t* bf = block_factors + b * block_factor_bytes(T);
  if constexpr (has_6_bit_scales(T)) {
    const __m512 dmin = load_fp16(super_factors + b / kBlocksPerSuper * super_factor_bytes(T) + 32);
    return _mm512_mul_ps(load_u8(bf + kPanel), _mm512_sub_ps(_mm512_setzero_ps(), dmin));
  } else {
    return load_fp16(bf + 32);
  }
}

// Q6_K's 6-bit values of word w (of 4): `low` (the low 4 bits, isolated) or'd with
// the top 2 bits, moved from bits 2w, 2w + 1 of the word of highs to bits 4, 5 (the
// 16-bit shifts move bits across bytes only outside those two, which the mask drops).
inline __m512i q6_values(__m512i low, __m512i highs, int w) {
  const __m512i mask = _mm512_set1_epi8(0x30);
  const __m512i moved = w == 0 ? _mm512_slli_epi16(highs, 4)
                        : w == 1 ? _mm512_slli_epi16(highs, 2)
                        : w == 2 ? highs
                                 : _mm512_srli_epi16(highs, 2);
  return _mm512_ternarylogic_epi32(moved, mask, low, 0xEA);  // (moved & mask) | low
}

// The 5-bit types' values of word w (of 4): `low` and `high` (the low and high nibbles,
// isolated) or'd with their fifth bits, moved from bits w and 4 + w of the word of
// highs to bit 4 (the 16-bit shifts move bits across bytes only into bits the mask
// drops).
inline void q5_values(__m512i& low, __m512i& high, __m512i highs, int w) {
  const __m512i mask = _mm512_set1_epi8(0x10);
  const __m512i for_low = w == 0   ? _mm512_slli_epi16(highs, 4)
                          : w == 1 ? _mm512_slli_epi16(highs, 3)
                          : w == 2 ? _mm512_slli_epi16(highs, 2)
                                   : _mm512_slli_epi16(highs, 1);
  const __m512i for_high = w == 0   ? highs
                           : w == 1 ? _mm512_srli_epi16(highs, 1)
                           : w == 2 ? _mm512_srli_epi16(highs, 2)
                                    : _mm512_srli_epi16(highs, 3);
  low = _mm512_ternarylogic_epi32(for_low, mask, low, 0xEA);  // (for_low & mask) | low
  high = _mm512_ternarylogic_epi32(for_high, mask, high, 0xEA);
}

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
  const int32_t* x[ROWS];  // rows as words of 4 int8 values (WIDE: their high bytes)
  const int32_t* x_low[ROWS];  // WIDE: the low bytes' words
  const float* x_scale[ROWS];
  const int32_t* x_offset[ROWS];
  const float* x_sum[ROWS];
  __m512 acc[ROWS][PANELS];
  for (int r = 0; r < ROWS; ++r) {
    x[r] = reinterpret_cast<const int32_t*>(a.values + (row0 + r) * a.k);
    x_low[r] = WIDE ? reinterpret_cast<const int32_t*>(a.low + (row0 + r) * a.k) : nullptr;
    x_scale[r] = a.scale + (row0 + r) * blocks;
    x_offset[r] = a.offset + (row0 + r) * blocks * 2;
    x_sum[r] = a.sum + (row0 + r) * blocks;
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
          const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), d);
          acc[r][j] = _mm512_fmadd_ps(dot, _mm512_set1_ps(x_scale[r][b]), acc[r][j]);
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
  if (rows <= kFewRows) {
    multiply_range<T, WIDE, 1>(a, rows, packed, begin, end, panel_bytes, bias, out, n);
  } else {
    multiply_range<T, WIDE, 2>(a, rows, packed, begin, end, panel_bytes, bias, out, n);
  }
}

// Calls f with the QType as a compile-time constant.
template <typename F>
void with_qtype(QType t, const F& f) {
  switch (t) {
    case QType::Q8_0: f(std::integral_constant<QType, QType::Q8_0>{}); break;
    case QType::Q4_0: f(std::integral_constant<QType, QType::Q4_0>{}); break;
    case QType::Q4_1: f(std::integral_constant<QType, QType::Q4_1>{}); break;
    case QType::Q5_0: f(std::integral_constant<QType, QType::Q5_0>{}); break;
    case QType::Q5_1: f(std::integral_constant<QType, QType::Q5_1>{}); break;
    case QType::Q4_K: f(std::integral_constant<QType, QType::Q4_K>{}); break;
    case QType::Q5_K: f(std::integral_constant<QType, QType::Q5_K>{}); break;
    case QType::Q6_K: f(std::integral_constant<QType, QType::Q6_K>{}); break;
    case QType::I8: f(std::integral_constant<QType, QType::I8>{}); break;
  }
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
  TORCH_CHECK(quantized_linear_available(), "built without AVX512-VNNI and -BW");
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
  out = at::empty({rows, n}, x.options());
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

#if defined(QUANTIZED_LINEAR_BUILT)
namespace {

// The activations of rows row0 .. of a.
Activations rows_from(const Activations& a, int64_t row0) {
  return Activations{a.values + row0 * a.k,       a.scale + row0 * a.blocks,
                     a.offset + row0 * a.blocks * 2, a.sum + row0 * a.blocks,
                     a.k,                           a.blocks,
                     a.low ? a.low + row0 * a.k : nullptr};
}

// Panels per unit of work: about 256 KiB of weights, an even count (the 2-panel steps).
constexpr int64_t kGroupedUnitBytes = 256 << 10;

}  // namespace
#endif

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
  TORCH_CHECK(quantized_linear_available(), "built without AVX512-VNNI and -BW");
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
    }
  });
#endif
}
