// The rows of an int8 KV cache (kernels/kv_quant.py): each (token, KV head) row holds
// head_dim int8 values, then an fp16 scale per group of 32 values (per row where
// head_dim is not a multiple of 32); keys are stored rotated. What the attention kernels
// read (paged_attention_cpu.cpp) and store_kv writes (store_kv_cpu.cpp).
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "load_row.h"

namespace int8_kv_rows {

// Values per fp16 scale of an int8 row: 32, or the whole row where head_dim is not a
// multiple of 32 (kv_quant.py's scale_group).
inline int64_t scale_group(int64_t head_dim) { return head_dim % 32 == 0 ? 32 : head_dim; }

// An int8 cache keeps keys rotated where head_dim is a multiple of 32: each group of 32
// values times the normalized 32x32 Hadamard matrix (kv_quant.py's rotate_groups, by the
// same butterflies in the same order). The matrix is orthogonal, so the query rotated
// alike gives the same scores.
inline bool rotates_keys(int64_t head_dim) { return head_dim % 32 == 0; }

inline void rotate_groups(float* x, int64_t n) {
  for (int64_t g = 0; g < n; g += 32) {
    float* y = x + g;
    for (int half = 1; half < 32; half *= 2) {
      for (int i = 0; i < 32; i += 2 * half) {
        for (int j = i; j < i + half; ++j) {
          const float low = y[j], high = y[j + half];
          y[j] = low + high;
          y[j + half] = low - high;
        }
      }
    }
    for (int i = 0; i < 32; ++i) y[i] *= 0.17677669529663687f;  // 1 / sqrt(32)
  }
}

// Cache elements a (token, KV head) row takes after its values: in an int8 cache the 2
// bytes of each group's scale, else none.
template <typename cache_t>
inline int64_t scale_elements(int64_t head_dim) {
  return std::is_same_v<cache_t, int8_t> ? 2 * (head_dim / scale_group(head_dim)) : 0;
}

// The scale of value d of the KV head row whose values start at `head`: 1 unless the
// cache is int8.
template <typename cache_t>
inline float value_scale(const cache_t* head, int64_t head_dim, int64_t d) {
  if constexpr (std::is_same_v<cache_t, int8_t>) {
    c10::Half scale;
    std::memcpy(&scale, head + head_dim + 2 * (d / scale_group(head_dim)), sizeof(scale));
    return static_cast<float>(scale);
  } else {
    return 1.f;
  }
}

// `heads` consecutive KV head rows (values and scales each) as fp32 values, head after head.
template <typename cache_t>
inline void load_heads(const cache_t* row, float* dst, int64_t heads, int64_t head_dim) {
  if constexpr (std::is_same_v<cache_t, int8_t>) {
    const int64_t stride = head_dim + scale_elements<cache_t>(head_dim);
    const int64_t values_per_scale = scale_group(head_dim);
    for (int64_t h = 0; h < heads; ++h) {
      const int8_t* head = row + h * stride;
      float* out = dst + h * head_dim;
      // A group's scale read once (a loop the compiler vectorizes), not once a value:
      // where the AVX-512 paths do not run, int8 rows loaded 10x slower than fp32 ones.
      for (int64_t g = 0; g < head_dim; g += values_per_scale) {
        const float scale = value_scale(head, head_dim, g);
        for (int64_t d = g; d < g + values_per_scale; ++d) out[d] = head[d] * scale;
      }
    }
  } else {
    load_row(row, dst, heads * head_dim);
  }
}

}  // namespace int8_kv_rows
