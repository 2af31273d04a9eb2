// Quantized weights laid out for the quantized linear kernel (quantized_linear_cpu.cpp):
// GGUF blocks (or int8 rows with their scales) repacked at load into panels of 16
// outputs, the same bytes as the file's in the order the kernel reads them.
//
// Layout: panels of 16 outputs, per block of 32 values their words of 4 values for the
// 16 lanes, then the blocks' scales, then the super-blocks' (pack_quantized_weight says
// each type's words and scales).

#include "tensor_api.h"

#include <cstring>
#include <optional>
#include <string>

#include "cpu_kernels.h"
#include "quantized_format.h"

using namespace quantized_format;

namespace {

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
  auto packed = tensors::zeros({n / kPanel, panel_bytes}, data.options());
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
