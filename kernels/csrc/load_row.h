// Rows of bf16 / fp16 / fp32 values to and from fp32 buffers, shared by the CPU kernels.
//
// bf16 is the top half of an fp32, so both directions are integer arithmetic that the
// compiler vectorises; c10::BFloat16's own conversions branch on NaN and do not.
#pragma once

#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

template <typename scalar_t>
inline void load_row(const scalar_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// The fp32 values are written as floats (their bits moved by memcpy, which compiles to
// nothing): written through a uint32_t pointer, -O3 may keep a float read of the same
// buffer from before the write (strict aliasing), and greedy_pick then took a row's
// maximum from the row before it on one thread. (-fno-strict-aliasing for the whole
// build would also do, but cost the offline benchmark 10%.)
template <>
inline void load_row<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t widened = static_cast<uint32_t>(bits[i]) << 16;
    float value;
    __builtin_memcpy(&value, &widened, sizeof(value));
    dst[i] = value;
  }
}

// The largest of n >= 1 values (seeded from the row, not -inf: -ffast-math assumes no
// infinities).
inline float row_max(const float* row, int64_t n) {
  float best = row[0];
  for (int64_t i = 1; i < n; ++i) best = best > row[i] ? best : row[i];  // vectorises
  return best;
}

// The first index holding `value` (a row's maximum: the first of its ties, as
// torch.argmax picks); 0 where none does (an all-NaN row, which real logits never are).
inline int64_t first_index_of(const float* row, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] == value) return i;
  }
  return 0;
}

// Values per partial sum of log_sum_exp_shifted.
constexpr int64_t kSumBlock = 256;

// log(sum exp(row - top)): the row's log-softmax is row - top - this. Summed in blocks
// whose fp32 sums add up in fp64: one fp32 sum over a vocabulary of 49k (8 lanes of 6k
// each on AVX2) drifted 2e-5 from torch's logsumexp.
inline float log_sum_exp_shifted(const float* row, int64_t n, float top) {
  double sum = 0.0;
  for (int64_t begin = 0; begin < n; begin += kSumBlock) {
    const int64_t end = std::min(n, begin + kSumBlock);
    float block = 0.f;
    for (int64_t i = begin; i < end; ++i) block += std::exp(row[i] - top);  // vectorised
    sum += block;
  }
  return static_cast<float>(std::log(sum));
}

// load_row, returning the row's maximum: one pass, by blocks of 256 still in cache as
// their maximum is taken (a 262k-token row of logits is larger than the L2 cache).
template <typename scalar_t>
inline float load_row_max(const scalar_t* src, float* dst, int64_t n) {
  constexpr int64_t kBlock = 256;
  float best = static_cast<float>(src[0]);
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t count = i + kBlock < n ? kBlock : n - i;
    load_row(src + i, dst + i, count);
    best = std::max(best, row_max(dst + i, count));
  }
  return best;
}

// fp32 -> bf16 bits, rounding to nearest even as c10::BFloat16 does (finite values).
inline uint16_t bf16_bits(float value) {
  uint32_t bits;
  __builtin_memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

template <typename scalar_t>
inline void store_row(const float* src, scalar_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<scalar_t>(src[i]);
}

// Written by memcpy for the same reason as load_row's: callers read some of these
// buffers back as 32-bit words (the attention kernel's pairs of probabilities).
template <>
inline void store_row<c10::BFloat16>(const float* src, c10::BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t bits = bf16_bits(src[i]);
    __builtin_memcpy(dst + i, &bits, sizeof(bits));
  }
}
