// The GGUF block formats the quantized linear kernel takes (Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q4_K, Q5_K, Q6_K, and weight-only int8 I8): each type's blocks in the file and
// in the kernel's panels (quantized_pack_cpu.cpp lays the panels out,
// quantized_linear_cpu.cpp multiplies them).
#pragma once

#include "tensor_api.h"

#include <cstdint>
#include <string>
#include <type_traits>

namespace quantized_format {

constexpr int64_t kPanel = 16;   // outputs per panel: one int32 lane each
constexpr int64_t kBlock = 32;   // values per block of activations, and of weights' scales
constexpr int64_t kSuper = 256;  // values per K-quant super-block
constexpr int64_t kBlocksPerSuper = kSuper / kBlock;

enum class QType { Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, I8 };

inline QType parse_qtype(const std::string& name) {
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
inline int64_t packed_row_bytes(QType t, int64_t k) {
  return k / kBlock * (value_bytes(t) + block_factor_bytes(t)) / kPanel +
         k / kSuper * super_factor_bytes(t) / kPanel + panel_factor_bytes(t) / kPanel;
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

}  // namespace quantized_format
