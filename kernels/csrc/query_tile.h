// A prefill attention query tile's online softmax state, shared by the vector kernel
// (prefill_attention_cpu.cpp) and AMX's (prefill_attention_amx.cpp): each of up to 16
// query tokens' running maximum of its scores and sum of its weights, and its
// probability-weighted value sums in fp32, from which its output row is written.
#pragma once

#include "tensor_api.h"

#include <algorithm>
#include <cstdint>

#include "load_row.h"

constexpr int64_t kQueryTile = 16;
// Masked scores and the running maximum's start: finite, as -ffast-math assumes.
constexpr float kMaskedScore = -1e30f;

struct QueryTile {
  float maxes[kQueryTile];
  float sums[kQueryTile];
  float* acc;  // [16][head_dim] value sums
  int64_t head_dim;

  QueryTile(float* value_sums, int64_t dims) : acc(value_sums), head_dim(dims) {
    std::fill(maxes, maxes + kQueryTile, kMaskedScore);
    std::fill(sums, sums + kQueryTile, 0.f);
    std::fill(acc, acc + kQueryTile * head_dim, 0.f);
  }

  // Rows first .. first + count - 1 of out: each query's value sums over its weights' sum.
  template <typename scalar_t>
  void write(int64_t first, int64_t count, scalar_t* out, int64_t out_stride) const {
    for (int64_t i = 0; i < count; ++i) {
      float* row = acc + i * head_dim;
      const float inv = 1.f / sums[i];
      for (int64_t d = 0; d < head_dim; ++d) row[d] *= inv;
      store_row(row, out + (first + i) * out_stride, head_dim);
    }
  }
};
