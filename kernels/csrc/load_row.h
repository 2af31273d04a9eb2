// Loading a row of bf16 / fp16 / fp32 values as floats, shared by the CPU kernels.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

// bf16 is the top half of an fp32, so the shift below is exact and, unlike
// c10::BFloat16's conversion, vectorises.
template <typename scalar_t>
inline void load_row(const scalar_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <>
inline void load_row<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;
}
