// The quantized linear kernel's larger calls on AMX's int8 tiles
// (quantized_linear_amx.cpp). AVX-512 code: included where the kernel is built.
#pragma once

#include "tensor_api.h"

#include <cstdint>

#include "quantized_activations.h"
#include "quantized_format.h"

namespace quantized_linear_amx {

// Rows from which a call's panels go to the tiles, where they are ready: below it each
// tile would be mostly empty rows, and the VNNI kernel's few-row tiles are as fast.
constexpr int64_t kAmxRows = 96;

// out[r, 16 p ..] for rows 0 .. rows - 1 and panels begin .. end - 1, bit for bit what
// the VNNI kernel's multiply_range writes; false (nothing written) where the tiles are
// not ready (not built, the process not granted them, or turned off).
template <typename out_t>
bool multiply_range(quantized_format::QType t, bool wide,
                    const quantized_activations::Activations& a, int64_t rows,
                    const uint8_t* packed, int64_t begin, int64_t end, int64_t panel_bytes,
                    const float* bias, out_t* out, int64_t n);

}  // namespace quantized_linear_amx
