// The quantized linear kernel on AVX2 (quantized_linear_avx2.cpp): where the CPU has
// AVX2, FMA and F16C but not AVX512-VNNI. Included where the kernel is built.
#pragma once

#include "tensor_api.h"

#include <cstdint>

#include "quantized_activations.h"
#include "quantized_format.h"

namespace quantized_linear_avx2 {

// out[r, 16 p ..] for rows 0 .. rows - 1 and panels begin .. end - 1: the products the
// VNNI kernel's multiply_range writes, from the same integer sums.
template <typename out_t>
void multiply_range(quantized_format::QType t, bool wide,
                    const quantized_activations::Activations& a, int64_t rows,
                    const uint8_t* packed, int64_t begin, int64_t end, int64_t panel_bytes,
                    const float* bias, out_t* out, int64_t n);

}  // namespace quantized_linear_avx2
